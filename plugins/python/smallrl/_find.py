"""Finding the plugin a module declares (natively in tests, and in the component)."""

import inspect

import smallrl

_BASES = {"reward": smallrl.Reward, "detector": smallrl.Detector, "environment": smallrl.Environment, "episode": smallrl.EpisodeEnvironment}


def find_plugin(module, kind):
    """The one plugin class `module` declares for `kind`, or a TRL reward function wrapped."""
    declared = [
        value for value in vars(module).values()
        if inspect.isclass(value) and value.__module__ == module.__name__ and any(issubclass(value, base) for base in _BASES.values())
    ]
    if len(declared) > 1:
        names = ", ".join(value.__name__ for value in declared)
        raise TypeError(f"{module.__name__}: declares {len(declared)} plugins ({names}); a module is one plugin")
    if declared:
        plugin = declared[0]
        if not issubclass(plugin, _BASES[kind]):
            shown = "an episode environment" if kind == "episode" else f"a {kind}"
            raise TypeError(f"{module.__name__}: {plugin.__name__} is not {shown} but it is built as one (smallrl plugin build --kind)")
        return plugin
    if kind == "reward":
        trl = [value for value in vars(module).values() if inspect.isfunction(value) and value.__module__ == module.__name__ and _trl_shaped(value)]
        if len(trl) == 1:
            return smallrl.trl_reward(trl[0])
        if len(trl) > 1:
            names = ", ".join(value.__name__ for value in trl)
            raise TypeError(f"{module.__name__}: {len(trl)} TRL reward functions ({names}); keep one per module")
    raise TypeError(
        f"{module.__name__}: declares no {kind}: "
        + (f"decorate a function with @smallrl.{kind}(...) or subclass " if kind in ("reward", "detector") else "subclass ")
        + f"smallrl.{_BASES[kind].__name__}"
        + (" (or write a TRL reward function f(prompts, completions, **kwargs))" if kind == "reward" else "")
    )


def _trl_shaped(function):
    parameters = inspect.signature(function).parameters.values()
    names = {parameter.name for parameter in parameters}
    return "completions" in names and any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters)


def load(module, params_json=""):
    """The plugin `module` declares (any kind), instantiated and configured with `params_json`
    as the host would: for a module's native tests."""
    kinds = [kind for kind, base in _BASES.items() if any(inspect.isclass(v) and v.__module__ == module.__name__ and issubclass(v, base) for v in vars(module).values())]
    plugin_class = find_plugin(module, kinds[0] if kinds else "reward")
    plugin = plugin_class()
    params = smallrl.Params(plugin_class.name, plugin_class.params, params_json)
    plugin.params = params
    plugin.configure(params)
    return plugin
