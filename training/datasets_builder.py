"""Moved to :mod:`suffice.training.data.builder`; this path re-exports its names for one release."""

from suffice.training.data.builder import (  # noqa: F401
    COLUMNS, DataConfig, MANIFEST, agreement_by_source, build, cohen_kappa, load_prepared, prepare)

__all__ = [name for name in dir() if not name.startswith("_")]
