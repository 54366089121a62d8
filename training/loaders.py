"""Moved to :mod:`suffice.training.data.loaders` (and its ``formats``, ``records``, ``splits``, ``threads``
modules); this path re-exports the public names for one release."""

from suffice.training.data.loaders import *  # noqa: F401,F403
from suffice.training.data.loaders import __all__  # noqa: F401
