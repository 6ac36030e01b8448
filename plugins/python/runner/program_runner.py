"""smallrl's program runner (plugins/python/runner/program-runner.wit): runs one program's
source as `__main__` in the CPython of a fresh component instance, and says how it ended. The
host gives every program its own instance, so nothing a program changes (builtins, modules,
files) reaches another."""

import builtins
import sys
import traceback

# The standard library a program may import: imported here, at build time, so that their code is
# in the component's memory image (the runner has no directory to import others from).
import bisect, collections, copy, dataclasses, decimal, enum, fractions, functools, heapq  # noqa: E401,F401
import io, itertools, json, math, operator, os, random, re, statistics, string, textwrap  # noqa: E401,F401
import types, typing, unicodedata  # noqa: E401,F401

import wit_world
from wit_world import Ending_Normal, Ending_Exit, Ending_Exception

# The most of an exception's message the ending carries (the whole traceback is on stderr).
_MAX_MESSAGE = 4096
_MAX_CODE = 2**31 - 1


def _exit_code(code):
    """SystemExit's code as CPython's own exit status: None is 0, an int itself (clamped to
    32 bits), anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return max(-_MAX_CODE - 1, min(_MAX_CODE, code))
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _message(error):
    try:
        message = str(error)
    except BaseException:
        message = "<the exception's str() failed>"
    return message[:_MAX_MESSAGE]


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


class WitWorld(wit_world.WitWorld):
    def run(self, source):
        # As `python3 program.py` puts the program's directory first: its files import.
        sys.path.insert(0, ".")
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        try:
            exec(compile(source, "<program>", "exec"), namespace)
            ending = Ending_Normal()
        except SystemExit as exit:
            ending = Ending_Exit(_exit_code(exit.code))
        except BaseException as error:
            try:
                traceback.print_exc()
            except BaseException:
                pass
            ending = Ending_Exception((type(error).__name__, _message(error)))
        _flush()
        return ending
