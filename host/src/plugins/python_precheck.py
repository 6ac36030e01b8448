"""The pre-check of `smallrl plugin build` (host/src/plugins/python_check.rs), run in a fresh
instance of the program runner, whose CPython is the one componentize-py embeds (3.14), so a
module is parsed by the grammar it will be built with.

stdin: a JSON object {file name: source}. stdout: one JSON object: `stdlib` (the interpreter's
`sys.stdlib_module_names`), `version`, and per file either `syntax_error` (message, line,
column, the line's text) or `imports`: every import statement at any depth, with its line, its
relative level (and for `from X import a, b` the names), and whether it is guarded (inside a `try` that catches ImportError, under
`if TYPE_CHECKING:`, or in a function body, which the build does not run) and whether it is
deferred (in a function body or under `if TYPE_CHECKING:`: not run when the module is
imported), so the host resolves it without running the module.
The runner has no `ast` module (only what it imported at build time), so the tree is walked
through the nodes' `_fields`; `compile` itself is a builtin.
"""

import json
import sys

_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _children(node):
    for field in node._fields:
        value = getattr(node, field, None)
        for child in value if isinstance(value, list) else [value]:
            if hasattr(child, "_fields"):
                yield child


def _names(expression):
    """The exception names an `except` clause catches (a name, an attribute or a tuple)."""
    if expression is None:
        return {"BaseException"}
    kind = type(expression).__name__
    if kind == "Name":
        return {expression.id}
    if kind == "Attribute":
        return {expression.attr}
    if kind == "Tuple":
        return set().union(*(_names(element) for element in expression.elts))
    return set()


def _is_type_checking(test):
    kind = type(test).__name__
    return (kind == "Name" and test.id == "TYPE_CHECKING") or (kind == "Attribute" and test.attr == "TYPE_CHECKING")


def _walk(node, guarded, imports, deferred=False):
    kind = type(node).__name__
    if kind == "Import":
        for alias in node.names:
            imports.append({"module": alias.name, "level": 0, "line": node.lineno, "guarded": guarded, "deferred": deferred})
    elif kind == "ImportFrom":
        names = [alias.name for alias in node.names]
        imports.append({"module": node.module or "", "names": names, "level": node.level, "line": node.lineno, "guarded": guarded, "deferred": deferred})
    elif kind in ("Try", "TryStar"):
        catches = any(_names(handler.type) & _IMPORT_ERRORS for handler in node.handlers)
        for child in node.body:
            _walk(child, guarded or catches, imports, deferred)
        for part in (node.handlers, node.orelse, node.finalbody):
            for child in part:
                _walk(child, guarded, imports, deferred)
        return
    elif kind in ("FunctionDef", "AsyncFunctionDef", "Lambda"):
        # A function's imports run when it is called, never at build time: the build does not
        # need them, and one that is missing fails that call, as it would in the component.
        for child in _children(node):
            _walk(child, True, imports, True)
        return
    elif kind == "If" and _is_type_checking(node.test):
        for child in node.body:
            _walk(child, True, imports, True)
        for child in node.orelse:
            _walk(child, guarded, imports, deferred)
        return
    for child in _children(node):
        _walk(child, guarded, imports, deferred)


def _check(name, source):
    try:
        # The whole compiler first: it reports what the parser alone accepts ('return' outside
        # a function, a misplaced nonlocal).
        compile(source, name, "exec")
        tree = compile(source, name, "exec", _ONLY_AST)
    except SyntaxError as error:
        kind = type(error).__name__
        return {"syntax_error": {"type": kind, "message": error.msg, "line": error.lineno, "column": error.offset, "text": error.text}}
    except ValueError as error:  # a NUL byte in the source
        return {"syntax_error": {"type": "ValueError", "message": str(error), "line": None, "column": None, "text": None}}
    imports = []
    _walk(tree, False, imports)
    return {"imports": imports}


files = json.loads(sys.stdin.read())
report = {"stdlib": sorted(sys.stdlib_module_names), "version": ".".join(map(str, sys.version_info[:3])), "files": {}}
for name, source in files.items():
    report["files"][name] = _check(name, source)
print(json.dumps(report))
