"""Temperature scaling (Guo et al., 2017): one scalar T fitted on validation logits.

Dividing the logits by T keeps every prediction (argmax is unchanged) and fixes over- or
under-confidence; the calibrated score a service sees is ``softmax(logits / T)[positive]``.

>>> import numpy as np
>>> logits = np.array([[4.0, -4.0], [-4.0, 4.0], [4.0, -4.0], [-4.0, 4.0]])
>>> labels = np.array([0, 1, 1, 0])          # half of the confident calls are wrong
>>> fit_temperature(logits, labels) > 5      # so T grows to flatten them
True
"""

from __future__ import annotations

import math

import numpy as np

from suffice.serving.runtime import softmax  # noqa: F401  (the one softmax; re-exported)

T_MIN, T_MAX = 0.05, 20.0


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of ``labels`` under ``softmax(logits / T)``."""
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), np.asarray(labels, dtype=np.int64)].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The T in [0.05, 20] minimising validation NLL (bounded 1-D search over log T).

    Returns 1.0 when there is nothing to fit (no rows, or one class only would let T run off
    to a bound and make the scores meaningless).

    >>> fit_temperature(np.array([[2.0, 0.0], [0.0, 2.0]]), np.array([0, 1])) < 1.0  # right and under-confident
    True
    """
    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    if logits.ndim != 2 or len(logits) != len(labels):
        raise ValueError(f"logits {logits.shape} and labels {labels.shape} must be (n, k) and (n,)")
    if len(labels) == 0 or len(np.unique(labels)) < 2:
        return 1.0
    from scipy.optimize import minimize_scalar

    res = minimize_scalar(
        lambda log_t: nll(logits, labels, math.exp(log_t)),
        bounds=(math.log(T_MIN), math.log(T_MAX)),
        method="bounded",
        options={"xatol": 1e-4},
    )
    t = float(math.exp(res.x))
    # never return something worse than no calibration at all
    return t if nll(logits, labels, t) <= nll(logits, labels, 1.0) else 1.0


def threshold_for_precision(scores: np.ndarray, outcomes: np.ndarray, min_precision: float) -> tuple[float, float]:
    """The lowest threshold t whose decisions ``score >= t`` reach ``min_precision`` on these items
    (most recall at that precision); returns ``(t, precision reached)``.

    When no threshold reaches it, returns ``(1.0, precision at the strictest threshold)``: the
    gate then (almost) never fires, which is the safe failure for a SKIP decision.

    >>> threshold_for_precision(np.array([0.2, 0.6, 0.7, 0.9]), np.array([0, 0, 1, 1]), 0.95)
    (0.7, 1.0)
    """
    scores = np.asarray(scores, dtype=np.float64)
    outcomes = np.asarray(outcomes, dtype=np.int64)
    best: tuple[float, float] | None = None
    strictest = float("nan")
    for t in np.unique(scores)[::-1]:  # from the strictest threshold down
        sel = scores >= t
        prec = float(outcomes[sel].mean())
        if math.isnan(strictest):
            strictest = prec
        if prec >= min_precision:
            best = (float(t), prec)
    if best is None:
        return 1.0, strictest
    return best


def decisiveness(scores: np.ndarray, outcomes: np.ndarray, sufficient: float = 0.8, precision: float = 0.9) -> dict[str, float]:
    """How decisive a sufficiency model is at its "sufficient" threshold, on labelled items.

    ``coverage_at_sufficient``: share of all items scored >= ``sufficient`` (answered without a
    caveat); ``recall_at_sufficient``: share of the sufficient items that reach it;
    ``precision_at_sufficient``: share of those answered that are sufficient;
    ``score_at_precision``: the lowest score at which "sufficient" reaches ``precision`` (1.0 when
    none does) and ``recall_at_precision_score`` there.

    >>> d = decisiveness(np.array([0.1, 0.85, 0.9, 0.95]), np.array([0, 0, 1, 1]))
    >>> d["coverage_at_sufficient"], d["recall_at_sufficient"], d["score_at_precision"]
    (0.75, 1.0, 0.9)
    """
    scores = np.asarray(scores, dtype=np.float64)
    outcomes = np.asarray(outcomes, dtype=np.int64)
    at = scores >= sufficient
    pos = outcomes == 1
    t, reached = threshold_for_precision(scores, outcomes, precision)
    return {
        "sufficient_threshold": float(sufficient), "items": int(len(scores)),
        "coverage_at_sufficient": float(at.mean()) if len(scores) else float("nan"),
        "recall_at_sufficient": float(at[pos].mean()) if pos.any() else float("nan"),
        "precision_at_sufficient": float(outcomes[at].mean()) if at.any() else float("nan"),
        "precision_target": float(precision), "score_at_precision": float(t), "precision_reached": float(reached),
        "recall_at_precision_score": float((scores[pos] >= t).mean()) if pos.any() else float("nan"),
    }
