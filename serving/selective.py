"""Moved to :mod:`suffice.serving.gates.selective`; this shim re-exports its public names for one release."""

from __future__ import annotations

from suffice.serving.gates.selective import FEATURES, FORMAT, SelectiveAnswerer, SelectiveDecision, fit_logistic, selective_curve

__all__ = ["FEATURES", "FORMAT", "SelectiveAnswerer", "SelectiveDecision", "fit_logistic", "selective_curve"]
