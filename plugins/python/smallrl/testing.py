"""Helpers for a plugin module's native tests (plain Python: `python test_my_reward.py`)."""

import json

import smallrl

from ._find import load

__all__ = ["load", "sample", "run_tests"]


def sample(completion, prompt="", metadata=None, tokens=None, ended_with_eos=True):
    """A sample as the host sends it; `tokens` default to the completion's whitespace-separated
    words (the host sends the model's token strings)."""
    tokens = completion.split() if tokens is None else list(tokens)
    ends, offset = [], 0
    for token in tokens:
        offset += len(token.encode("utf-8"))
        ends.append(offset)
    metadata_json = None if metadata is None else json.dumps(metadata, sort_keys=True, separators=(",", ":"))
    return smallrl.Sample(prompt, completion, "".join(tokens), ends, list(range(len(tokens))), ended_with_eos, metadata_json)


def run_tests(namespace):
    """Runs every `test_*` function of `namespace` (a module's globals()), prints one line each
    and exits non-zero when one fails."""
    import sys
    import traceback

    tests = [(name, value) for name, value in namespace.items() if name.startswith("test_") and callable(value)]
    failed = 0
    for name, test in tests:
        try:
            test()
            print(f"ok     {name}")
        except Exception:
            failed += 1
            print(f"FAILED {name}\n{traceback.format_exc()}")
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
