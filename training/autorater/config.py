"""Moved to :mod:`suffice.training.autorater.labeling_config` (the name says it holds :class:`LabelingConfig`,
not the generic config engine); this path re-exports its names for one release."""

from suffice.training.autorater.labeling_config import (  # noqa: F401
    DEFAULT_CONFIG, LabelingConfig, RATERS, SCHEMES)

__all__ = ['DEFAULT_CONFIG', 'LabelingConfig', 'RATERS', 'SCHEMES']
