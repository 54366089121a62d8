"""Moved to :mod:`suffice.training.data.weak`; this path re-exports its names for one release."""

from suffice.training.data.weak import (  # noqa: F401
    POSITIVE_RULES, RULES, WeakConfig, WeakConfigError, build_parser, build_weak_file, examples, main,
    make_weak_pairs)

__all__ = [name for name in dir() if not name.startswith("_")]
