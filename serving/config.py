"""YAML configs plus nanoGPT-style ``--key=value`` overrides, checked against a dataclass.

The one config engine of ``suffice train`` and ``suffice serve`` (and every other command): each
concern has one documented dataclass; a config is built from defaults, then a YAML file, then
command-line overrides. Override values are typed by the field they set (``--port=8080`` is an
int, ``--enabled=false`` a bool, ``--name=null`` None for an optional field), ``-`` in a key
means ``_``, nested dataclasses are addressed with dots (``--lora.r=8``), and unknown keys,
values of the wrong type and broken ``__post_init__`` rules are :class:`ConfigError` s that name
the dotted key, the value and the fix.

>>> from dataclasses import dataclass
>>> @dataclass
... class Demo:
...     lr: float = 1e-3
...     epochs: int = 1
>>> build_config(Demo, overrides=["--lr=0.01"]).lr
0.01
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import yaml

T = TypeVar("T")

__all__ = [
    "ConfigError", "build_config", "config_from_dict", "config_to_dict", "deep_merge", "dump_yaml", "flatten",
    "load_yaml", "parse_overrides",
]


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the key, the value and the fix."""


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _yaml_value(key: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: {text!r} is not a YAML value ({e})") from None


def _coerce_union(key: str, value: Any, args: tuple) -> Any:
    if value is None and type(None) in args:
        return None
    if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in args:
        return None
    errors = []
    for a in args:
        if a is type(None):
            continue
        try:
            return _coerce(key, value, a)
        except ConfigError as e:
            errors.append(str(e))
    raise ConfigError(errors[0] if errors else f"{key}: cannot use {value!r}")


def _coerce_list(key: str, value: Any, tp: Any, origin: Any, args: tuple) -> Any:
    if isinstance(value, str):
        s = value.strip()
        value = _yaml_value(key, s) if s.startswith("[") else [v.strip() for v in s.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list, got {value!r}")
    inner = args[0] if args else Any
    out = [_coerce(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    return tuple(out) if (origin is tuple or tp is tuple) else out


def _coerce_scalar(key: str, value: Any, tp: Any) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return value


def _coerce(key: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(key, value, args)
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{key}={value!r} is not allowed: choose one of {list(args)}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, str) and value.strip().startswith("{"):  # --section={key: value, ...}
            value = _yaml_value(key, value)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping of {tp.__name__} fields, got {value!r}")
        return _from_dict(tp, dict(value), prefix=f"{key}.")
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        return _coerce_list(key, value, tp, origin, args)
    if origin is dict or tp is dict:
        if isinstance(value, str):
            value = _yaml_value(key, value)
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{key} must be a mapping with string keys, got {value!r}")
        return dict(value)
    return _coerce_scalar(key, value, tp)


def _from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    aliases = getattr(cls, "CONFIG_KEY_ALIASES", {})
    data = {aliases.get(k, k): v for k, v in data.items()}
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {[prefix + u for u in unknown]} for {cls.__name__}: "
            f"valid keys are {sorted(prefix + k for k in types_)}"
        )
    kwargs = {k: _coerce(prefix + k, v, types_[k]) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:  # missing required fields
        raise ConfigError(f"{cls.__name__}: {e}") from e
    except ValueError as e:  # a __post_init__ rule: say which section broke it
        if prefix:
            raise ConfigError(f"{prefix.rstrip('.')}: {e}") from None
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = {} if nxt is None else (dataclasses.asdict(nxt) if dataclasses.is_dataclass(nxt) else nxt)
            cur[p] = nxt
        cur = nxt
    cur[parts[-1]] = value


def is_override(arg: str) -> bool:
    """Whether ``arg`` has the ``--key=value`` shape of a config override."""
    return arg.startswith("--") and "=" in arg


def not_overrides(args: Sequence[str]) -> list[str]:
    """The arguments that are not ``--key=value`` overrides: what a command reports as unexpected.

    >>> not_overrides(["--lr=1e-4", "train.jsonl", "--resume"])
    ['train.jsonl', '--resume']
    """
    return [a for a in args if not is_override(a)]


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``["--lr=1e-4", "--lora.r=8"]`` -> ``{"lr": "1e-4", "lora": {"r": "8"}}`` (values typed later).

    >>> parse_overrides(["--server.port=8080", "--max-docs=3"])
    {'server': {'port': '8080'}, 'max_docs': '3'}
    """
    out: dict[str, Any] = {}
    for raw in overrides:
        if not is_override(raw):
            raise ConfigError(f"override {raw!r} must look like --key=value (for example --learning_rate=2e-4)")
        key, value = raw[2:].split("=", 1)
        if not key:
            raise ConfigError(f"override {raw!r} has an empty key")
        _set_dotted(out, key.replace("-", "_"), value)
    return out


def deep_merge(base: dict[str, Any], upd: dict[str, Any]) -> dict[str, Any]:
    """``upd`` over ``base``, merging nested mappings key by key (neither input is changed)."""
    out = dict(base)
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_yaml(path: str | Path, example: str = "configs/sufficiency.yaml") -> dict[str, Any]:
    """The mapping a YAML config file holds (an empty file is ``{}``); ``example`` is named in the error."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist: give a path like {example}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of keys to values, got {type(data).__name__}")
    return data


def build_config(cls: type[T], yaml_path: str | Path | None = None, overrides: Sequence[str] = (), section: str | None = None,
                 retired: Mapping[str, str] | None = None) -> T:
    """Defaults <- YAML (optionally one top-level ``section`` of it) <- ``--key=value`` overrides.

    ``retired``: top-level keys older versions wrote into saved YAML files (``key -> why it went``):
    such a file still loads, the key is dropped, with a warning when its value was set (not
    0/False/None). On the command line a retired key stays an unknown-key error.
    """
    data: dict[str, Any] = {}
    if yaml_path is not None:
        data = load_yaml(yaml_path)
        if section is not None:
            data = data.get(section) or {}
        for key, why in (retired or {}).items():
            if key in data and data.pop(key) not in (None, 0, 0.0, False):
                warnings.warn(f"{yaml_path}: {key} is ignored: {why}", stacklevel=2)
    data = deep_merge(data, parse_overrides(overrides))
    return _from_dict(cls, data)


def config_from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build ``cls`` from a (nested) mapping with the same checks as :func:`build_config`."""
    return _from_dict(cls, data)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-safe nested dict of a config dataclass."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to dotted keys (for MLflow params).

    >>> flatten({"lora": {"r": 8}, "lr": 0.1})
    {'lora.r': 8, 'lr': 0.1}
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def dump_yaml(cfg: Any) -> str:
    """The resolved config as YAML (saved with every run)."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
