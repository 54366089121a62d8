"""Moved to :mod:`suffice.training.data.schema`; this path re-exports its names for one release."""

from suffice.training.data.schema import (  # noqa: F401
    DataFormatError, Item, LABEL_SOURCES, LEVELS, Passage, SPLITS, level_to_label)

__all__ = ['DataFormatError', 'Item', 'LABEL_SOURCES', 'LEVELS', 'Passage', 'SPLITS', 'level_to_label']
