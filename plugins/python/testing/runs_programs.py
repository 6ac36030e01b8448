"""A Python reward that runs each completion as a program through the host's program runner
(`smallrl.run_programs`, contract 0.4; tests/plugins_python.rs): the Python SDK's helper, with
the scores of plugins/testing/programs (normal 1, exit 2 + code / 100, exception 3, out of fuel
4, out of memory 5, output over limit 6, stack overflow 7, crashed 8; plus 0.5 when stdout is
exactly "42\\n"), and a program with stdin and a file for each sample whose completion is "io"."""

import smallrl

_SCORES = {"normal": 1.0, "exception": 3.0, "out-of-fuel": 4.0, "out-of-memory": 5.0, "output-over-limit": 6.0, "stack-overflow": 7.0, "crashed": 8.0}


def _program(completion):
    if completion == "io":
        return smallrl.Program("import sys\nprint(int(sys.stdin.read()) * int(open('n.txt').read()))", stdin="6", files={"n.txt": "7"})
    return completion


def _score(outcome):
    base = 2.0 + outcome.exit_code / 100 if outcome.status == "exit" else _SCORES[outcome.status]
    return base + (0.5 if outcome.stdout == "42\n" else 0.0)


class RunsPrograms(smallrl.Reward):
    name = "runs_programs_py"
    version = "0.1.0"
    description = "each completion run as a program: its status as a number (+0.5 for stdout \"42\\n\") (test plugin)"

    def score_batch(self, samples):
        return [_score(o) for o in smallrl.run_programs([_program(s.completion) for s in samples])]
