"""The bundle says how decisive a model is at its "sufficient" level (from validation)."""

import numpy as np

from suffice.training.fit.calibration import decisiveness


def test_decisiveness_numbers():
    scores = np.array([0.05, 0.3, 0.55, 0.82, 0.85, 0.9, 0.95, 0.99])
    labels = np.array([0, 0, 1, 0, 1, 1, 1, 1])
    d = decisiveness(scores, labels, sufficient=0.8, precision=0.9)
    assert d["coverage_at_sufficient"] == 5 / 8
    assert d["recall_at_sufficient"] == 4 / 5 and d["precision_at_sufficient"] == 4 / 5
    assert d["score_at_precision"] == 0.85 and d["precision_reached"] == 1.0 and d["recall_at_precision_score"] == 4 / 5


def test_an_indecisive_model_reaches_nothing():
    d = decisiveness(np.full(10, 0.6), np.array([0, 1] * 5))
    assert d["coverage_at_sufficient"] == 0.0 and np.isnan(d["precision_at_sufficient"])
    assert d["score_at_precision"] == 1.0  # no threshold reaches 90% precision
