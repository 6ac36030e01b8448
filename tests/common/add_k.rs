//! One `code_tests` problem written by hand (`add_k` with k = 7: its prompt's header, the
//! grader's tests and the hidden tests, computed by hand) and completions of it, shared by the
//! single-turn and the multi-turn environment's tests.

pub const HEADER: &str = "def add_k(x: int) -> int:\n    \"\"\"Return x plus 7.\"\"\"\n";
/// The grader's tests and the hidden tests of `add_k` with k = 7, computed by hand.
pub const TESTS: &str = "[((1,), 8), ((2,), 9), ((10,), 17), ((0,), 7), ((33,), 40)]";
pub const HIDDEN: &str = "[((5,), 12), ((-3,), 4)]";

pub const CORRECT: &str = "def add_k(x):\n    return x + 7\n";
/// Right below 10 only: tests 1, 2 and 4 of 5 (inputs 1, 2, 0); both hidden tests.
pub const PARTLY: &str = "```python\ndef add_k(x: int) -> int:\n    return x + 7 if x < 10 else 0\n```\nThis adds seven.";
pub const WRONG: &str = "def add_k(x):\n    return x * 7\n";
pub const BROKEN: &str = "def add_k(x:\n    return x +\n";
