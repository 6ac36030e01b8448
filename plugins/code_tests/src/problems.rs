//! The generated problems: small arithmetic, string and list functions, each a family with a
//! constant `k` (so "add_k with k = 7" is one problem), its signature, docstring and reference
//! solution written here in Rust. A problem's inputs (examples, the grader's tests, the hidden
//! tests) are drawn per prompt from the generator's seeded stream.

use smallrl_plugin_sdk::environment::SplitMix64;

/// A Python value of the problems' types, rendered as a Python literal.
#[derive(Clone, Debug, PartialEq)]
pub enum Py {
    Int(i64),
    Bool(bool),
    /// Lowercase ASCII letters only, so its literal is `'...'`.
    Str(String),
    List(Vec<i64>),
}

impl Py {
    pub fn literal(&self) -> String {
        match self {
            Py::Int(n) => n.to_string(),
            Py::Bool(b) => if *b { "True" } else { "False" }.to_string(),
            Py::Str(s) => {
                assert!(s.bytes().all(|b| b.is_ascii_lowercase()), "generated strings are lowercase letters: {s:?}");
                format!("'{s}'")
            }
            Py::List(xs) => format!("[{}]", xs.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")),
        }
    }
}

/// What a family's function takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    Int,
    Str,
    List,
}

/// A family: function name, parameter, signature's types, docstring (with `{k}`), the range of
/// k, and the reference solution.
struct Family {
    name: &'static str,
    input: Input,
    returns: &'static str,
    doc: &'static str,
    k: (i64, i64),
    solve: fn(&Py, i64) -> Py,
    /// An int family's input for k, when 0..=60 would make its tests trivial.
    draw: Option<fn(&mut SplitMix64, i64) -> i64>,
}

fn int(x: &Py) -> i64 {
    match x {
        Py::Int(n) => *n,
        other => panic!("an int family got {other:?}"),
    }
}

fn text(x: &Py) -> &str {
    match x {
        Py::Str(s) => s,
        other => panic!("a str family got {other:?}"),
    }
}

fn list(x: &Py) -> &[i64] {
    match x {
        Py::List(xs) => xs,
        other => panic!("a list family got {other:?}"),
    }
}

/// The letter a string family's k stands for (k = 0 is 'a').
pub fn letter(k: i64) -> char {
    (b'a' + k as u8) as char
}

const FAMILIES: &[Family] = &[
    Family { name: "add_k", input: Input::Int, returns: "int", doc: "Return x plus {k}.", k: (1, 20), solve: |x, k| Py::Int(int(x) + k), draw: None },
    Family { name: "times_k", input: Input::Int, returns: "int", doc: "Return x multiplied by {k}.", k: (2, 12), solve: |x, k| Py::Int(int(x) * k), draw: None },
    Family { name: "square_plus_k", input: Input::Int, returns: "int", doc: "Return the square of x plus {k}.", k: (1, 15), solve: |x, k| Py::Int(int(x) * int(x) + k), draw: None },
    Family { name: "cap_at_k", input: Input::Int, returns: "int", doc: "Return x, or {k} when x is greater than {k}.", k: (10, 40), solve: |x, k| Py::Int(int(x).min(k)), draw: Some(|rng, k| rng.range(0, 2 * k as u64) as i64) },
    Family { name: "is_multiple", input: Input::Int, returns: "bool", doc: "Return True when x is divisible by {k}, else False.", k: (2, 9), solve: |x, k| Py::Bool(int(x) % k == 0), draw: Some(|rng, k| k * rng.range(0, 9) as i64 + rng.range(0, 1) as i64 * rng.range(1, k as u64 - 1) as i64) },
    Family { name: "count_letter", input: Input::Str, returns: "int", doc: "Return how many times the letter '{c}' occurs in s.", k: (0, 4), solve: |s, k| Py::Int(text(s).chars().filter(|&c| c == letter(k)).count() as i64), draw: None },
    Family { name: "repeat_text", input: Input::Str, returns: "str", doc: "Return s repeated {k} times.", k: (2, 4), solve: |s, k| Py::Str(text(s).repeat(k as usize)), draw: None },
    Family { name: "first_chars", input: Input::Str, returns: "str", doc: "Return the first {k} characters of s.", k: (1, 5), solve: |s, k| Py::Str(text(s).chars().take(k as usize).collect()), draw: None },
    Family { name: "add_letter", input: Input::Str, returns: "str", doc: "Return s with the letter '{c}' added at its end.", k: (0, 4), solve: |s, k| Py::Str(format!("{}{}", text(s), letter(k))), draw: None },
    Family { name: "sum_above", input: Input::List, returns: "int", doc: "Return the sum of the numbers in xs that are greater than {k}.", k: (0, 15), solve: |xs, k| Py::Int(list(xs).iter().filter(|&&x| x > k).sum()), draw: None },
    Family { name: "count_above", input: Input::List, returns: "int", doc: "Return how many numbers in xs are greater than {k}.", k: (0, 15), solve: |xs, k| Py::Int(list(xs).iter().filter(|&&x| x > k).count() as i64), draw: None },
    Family { name: "add_to_each", input: Input::List, returns: "list", doc: "Return a new list with {k} added to each number of xs.", k: (1, 12), solve: |xs, k| Py::List(list(xs).iter().map(|x| x + k).collect()), draw: None },
    Family { name: "last_k", input: Input::List, returns: "list", doc: "Return the last {k} numbers of xs.", k: (1, 3), solve: |xs, k| Py::List(list(xs)[list(xs).len().saturating_sub(k as usize)..].to_vec()), draw: None },
];

/// One problem: a family and its constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    family: usize,
    pub k: i64,
}

/// Every problem, in a fixed order.
pub fn all() -> Vec<Problem> {
    FAMILIES.iter().enumerate().flat_map(|(family, f)| (f.k.0..=f.k.1).map(move |k| Problem { family, k })).collect()
}

impl Problem {
    fn family(&self) -> &'static Family {
        &FAMILIES[self.family]
    }

    /// The split key: "add_k:7".
    pub fn key(&self) -> String {
        format!("{}:{}", self.name(), self.k)
    }

    pub fn name(&self) -> &'static str {
        self.family().name
    }

    /// `def add_k(x: int) -> int:` and its docstring, indented as the body's first line.
    pub fn header(&self) -> String {
        let family = self.family();
        let (param, ty) = match family.input {
            Input::Int => ("x", "int"),
            Input::Str => ("s", "str"),
            Input::List => ("xs", "list"),
        };
        let doc = family.doc.replace("{k}", &self.k.to_string()).replace("{c}", &letter(self.k).to_string());
        format!("def {}({param}: {ty}) -> {}:\n    \"\"\"{doc}\"\"\"\n", family.name, family.returns)
    }

    /// One input drawn for this problem.
    pub fn draw_input(&self, rng: &mut SplitMix64) -> Py {
        match self.family().input {
            Input::Int => Py::Int(match self.family().draw {
                Some(draw) => draw(rng, self.k),
                None => rng.range(0, 60) as i64,
            }),
            Input::Str => {
                let n = rng.range(2, 7);
                Py::Str((0..n).map(|_| letter(rng.range(0, 4) as i64)).collect())
            }
            Input::List => {
                let n = rng.range(2, 6);
                Py::List((0..n).map(|_| rng.range(0, 20) as i64).collect())
            }
        }
    }

    /// The reference solution's result.
    pub fn solve(&self, input: &Py) -> Py {
        (self.family().solve)(input, self.k)
    }

    /// Tests as a Python literal: `[((input,), expected), ...]`.
    pub fn tests_literal(&self, inputs: &[Py]) -> String {
        let items: Vec<String> = inputs.iter().map(|input| format!("(({},), {})", input.literal(), self.solve(input).literal())).collect();
        format!("[{}]", items.join(", "))
    }

    /// An example line for the prompt: `add_k(3) == 10`.
    pub fn example(&self, input: &Py) -> String {
        format!("{}({}) == {}", self.name(), input.literal(), self.solve(input).literal())
    }
}
