"""Moved to :mod:`suffice.training.evaluation.baselines`; this name re-exports it for one release."""

from suffice.training.evaluation.baselines import *  # noqa: F401,F403
