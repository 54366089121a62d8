"""The config engine moved to :mod:`suffice.serving.config` (one engine for train and serve).

This module re-exports its public names for one release; import from ``suffice.serving.config``.
"""

from __future__ import annotations

from suffice.serving.config import (
    ConfigError,
    build_config,
    config_from_dict,
    config_to_dict,
    deep_merge,
    dump_yaml,
    flatten,
    load_yaml,
    parse_overrides,
)

__all__ = [
    "ConfigError", "build_config", "config_from_dict", "config_to_dict", "deep_merge", "dump_yaml", "flatten",
    "load_yaml", "parse_overrides",
]
