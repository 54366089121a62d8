"""Moved to :mod:`suffice.training.synth.generate`; this path re-exports its public names for one release."""

from suffice.training.synth.generate import *  # noqa: F401,F403
from suffice.training.synth.generate import __all__  # noqa: F401
