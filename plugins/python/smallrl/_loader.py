"""The export classes of every component `smallrl plugin build` writes (issue 47): a *base*
component, built by componentize-py once per world, SDK and set of imported modules, whose app
module holds these classes in place of the user's module. The user's files travel in the
component file (a custom section the host strips before compiling, so a rebuild after an edit
reuses the compiled base) and the host puts them in the sandbox's read-only preopened directory
`.`, with the module's name in `.smallrl-module`. The first call of an instance imports the module
from there, under that call's fuel, and binds it with :func:`smallrl._component.bind`.

A module that cannot be imported or declares no plugin fails that first call (`plugin build`
makes it, so the build fails): a call with an error result returns the error; `info`, which has
none, logs it through the host's `log` and traps, and the host reports the logged message.
"""

import sys

from componentize_py_types import Err

from ._component import _describe, bind
from . import _episode_component  # noqa: F401 (bind imports it at run time, when only modules imported at build time exist)

_MODULE_FILE = ".smallrl-module"
_NAMES = {"reward": ("Plugin", "Scorer"), "detector": ("Plugin", "Flagger"), "environment": ("Env",), "episode": ("Env", "Episodes")}
_METHODS = {
    "Plugin": ("info", "configure"),
    "Scorer": ("score",),
    "Flagger": ("detect",),
    "Env": ("info", "configure", "generate", "score", "monitor", "ground_truth"),
    "Episodes": ("start", "step"),
}

_instances = {}


def _log(message):
    from wit_world.imports import host

    host.log(message)


def _bound(kind):
    """The user's export objects, the module imported and bound on the first call."""
    if not _instances:
        try:
            with open(_MODULE_FILE) as file:
                name = file.read().strip()
            sys.path.insert(0, ".")
            module = __import__(name)
            classes = bind(module, kind)
        except BaseException as error:  # an import's SystemExit is the module's failure too
            message = f"cannot load the plugin's module: {_describe(error)}"
            _log(message)
            raise Err(message) from None
        classes = classes if isinstance(classes, tuple) else (classes,)
        _instances.update((export, cls()) for export, cls in zip(_NAMES[kind], classes))
    return _instances


def exports(kind):
    """The classes componentize-py instantiates at build time for `kind`'s world: each method
    calls the same method of the user's bound object."""
    from wit_world import exports as wit

    def forward(export, method):
        def call(self, *args):
            return getattr(_bound(kind)[export], method)(*args)

        call.__name__ = method
        return call

    classes = tuple(type(export, (getattr(wit, export),), {method: forward(export, method) for method in _METHODS[export]}) for export in _NAMES[kind])
    return classes if len(classes) > 1 else classes[0]
