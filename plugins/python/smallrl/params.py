"""Parameter declaration and checking, as the Rust SDK's (plugins/sdk/src/params.rs): the
host's JSON is refused with a clear message on unknown keys or wrong types."""

import json

# JSON type names, as `param-info.type-name` and the messages write them.
NUMBER, INTEGER, BOOLEAN, STRING, STRING_LIST, HF_DATASET = "number", "integer", "boolean", "string", "list<string>", "hf-dataset"


def _accepts(type_name, value):
    if type_name == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_name == INTEGER:
        # A non-negative integer (serde_json's u64): 3.0 is a number, not an integer.
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64
    if type_name == BOOLEAN:
        return isinstance(value, bool)
    if type_name == STRING:
        return isinstance(value, str)
    if type_name == STRING_LIST:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if type_name == HF_DATASET:
        return value is None or (isinstance(value, dict) and isinstance(value.get("repo"), str) and isinstance(value.get("splits"), dict))
    raise ValueError(f"unknown parameter type {type_name!r}")


class Param:
    """One declared parameter: a name, a JSON type, a default, a description and, for numbers,
    the least value accepted."""

    __slots__ = ("name", "type_name", "default", "description", "minimum")

    def __init__(self, name, type_name, default, description, minimum=None):
        if not _accepts(type_name, default):
            raise ValueError(f"parameter `{name}`: default {default!r} is not of type {type_name}")
        self.name, self.type_name, self.default, self.description, self.minimum = name, type_name, default, description, minimum

    def check(self, plugin, value):
        """Raises ValueError, naming the plugin and the parameter, unless `value` fits."""
        if not _accepts(self.type_name, value):
            shown = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            raise ValueError(f"{plugin}: parameter `{self.name}` must be of type {self.type_name}, got {shown}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"{plugin}: parameter `{self.name}` must be at least {self.minimum}")

    def default_json(self):
        return json.dumps(self.default, separators=(",", ":"), ensure_ascii=False)


def number(name, default, description, minimum=None):
    return Param(name, NUMBER, float(default), description, minimum)


def integer(name, default, description, minimum=None):
    """A non-negative integer; `minimum=1` for a divisor (checked when the plugin is configured)."""
    return Param(name, INTEGER, default, description, minimum)


def boolean(name, default, description):
    return Param(name, BOOLEAN, default, description)


def string(name, default, description):
    return Param(name, STRING, default, description)


def string_list(name, default, description):
    return Param(name, STRING_LIST, list(default), description)


def hf_dataset(name, description):
    """A HuggingFace dataset the host reads for the plugin: the user names it ("owner/name" or
    "owner/name:config") and the plugin receives {"repo", "config", "splits": {split: [row]}}."""
    return Param(name, HF_DATASET, None, description)


class Params:
    """Checked parameter values: every declared parameter, the user's value or its default.
    Read them as ``params["max_count"]`` or with the typed readers below."""

    def __init__(self, plugin, declared, params_json):
        given = _parse_object(plugin, params_json)
        by_name = {param.name: param for param in declared}
        for key, value in given.items():
            if key not in by_name:
                accepted = ", ".join(param.name for param in declared) or "none"
                raise ValueError(f"{plugin}: unknown parameter `{key}` (accepted: {accepted})")
            by_name[key].check(plugin, value)
        self.plugin = plugin
        self._values = {param.name: given.get(param.name, param.default) for param in declared}

    def __getitem__(self, name):
        if name not in self._values:
            raise KeyError(f"{self.plugin}: parameter `{name}` is read but not declared")
        return self._values[name]


def _parse_object(plugin, params_json):
    if not params_json.strip():
        return {}
    try:
        value = json.loads(params_json)
    except ValueError as error:
        raise ValueError(f"{plugin}: parameters are not valid JSON ({error}): {params_json}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{plugin}: parameters must be a JSON object, got {params_json}")
    return value
