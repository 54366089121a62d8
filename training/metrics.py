"""Moved to :mod:`suffice.training.evaluation.metrics`; this name re-exports it for one release."""

from suffice.training.evaluation.metrics import *  # noqa: F401,F403
