"""Moved to :mod:`suffice.training.fit.calibration`; this name re-exports it for one release."""

from suffice.training.fit.calibration import T_MAX, T_MIN, fit_temperature, nll, softmax, threshold_for_precision  # noqa: F401
