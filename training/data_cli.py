"""Moved to :mod:`suffice.training.data.cli`; this path re-exports its names for one release."""

from suffice.training.data.cli import (  # noqa: F401
    DEFAULT_CONFIG, format_stats, main)

__all__ = ['DEFAULT_CONFIG', 'format_stats', 'main']
