"""Calibration fitted on validation logits: temperature scaling (Guo et al., 2017) or Platt scaling,
on the pooled validation items or with every validation source weighted equally.

Temperature scaling divides the logits by one scalar T: every prediction stays (the argmax is
unchanged) and over- or under-confidence is fixed. Platt scaling (binary models) fits
``P(positive) = sigmoid(a * (z_pos - z_neg) + b)``: T = 1/a plus an offset ``b`` that moves the 0.5
point. What a service applies is :class:`suffice.serving.calibration.Calibration` (the one owner of
logits -> calibrated probabilities); this module only fits it (:func:`fit_calibration`).

Why ``source_balanced``: the validation pool is one population only by accident. In the full config
the synthetic wiki validation source holds 2,509 of 3,449 items, so a pooled fit calibrates for
that source and leaves the real ones (squad2, qed, hotpotqa-fullwiki) off; weighting each item by
``1 / n_source`` makes every source count the same (:func:`source_weights`). ``real`` fits on the
real sources' items only (the teacher-written ``*-synthetic`` ones get weight 0), pooled among them:
the populations a service meets, which is also what every test split holds.

>>> import numpy as np
>>> logits = np.array([[4.0, -4.0], [-4.0, 4.0], [4.0, -4.0], [-4.0, 4.0]])
>>> labels = np.array([0, 1, 1, 0])          # half of the confident calls are wrong
>>> fit_temperature(logits, labels) > 5      # so T grows to flatten them
True
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from suffice.serving.bundle import PARTIAL, SUFFICIENCY, SUFFICIENT
from suffice.serving.calibration import Calibration, sigmoid
from suffice.serving.config import ConfigError

T_MIN, T_MAX = 0.05, 20.0
PLATT_B_MAX = 10.0  # |b|: an offset beyond this sends every score to 0 or 1; the data never asks for it


@dataclass
class CalibrationSettings:
    """How the calibration is fitted on validation logits, and the decision thresholds stored with the model.

    temperature: fit the calibration (``fit``) or keep raw scores, T=1 (``none``; for comparisons only).
    method: ``temperature`` (one T: ``softmax(logits / T)``) or ``platt`` (binary models only:
        ``sigmoid(a * (z_pos - z_neg) + b)``, a slope and an offset, so the 0.5 point can move).
    pool: which validation items the fit weighs: ``pooled`` (every item alike: the biggest
        source decides), ``source_balanced`` (each item 1 / n_source, normalised: every source
        counts the same, see :func:`source_weights`) or ``real`` (only the real sources' items, pooled;
        the teacher-written ``*-synthetic`` ones are left out; all items when there are no real ones). The thresholds are not re-weighted: the
        sufficiency levels are fixed by meaning (>= 0.8 / >= 0.5 calibrated P), and the retrieval
        gate's SKIP threshold is a precision target on its validation threads, one source, where
        balanced and pooled are the same population.
    sufficient / partial: thresholds on the calibrated P(sufficient) for the three levels (what
        RAG gateways use: >= 0.8 sufficient, >= 0.5 partial, else insufficient).
    skip_min_precision: retrieval gate only: the SKIP threshold is the lowest one whose SKIP
        precision on validation is at least this (so a skipped retrieval is rarely a wrong skip).
    ece_bins: equal-width bins for the expected calibration error and reliability diagram.
    """

    temperature: Literal["fit", "none"] = "fit"
    method: Literal["temperature", "platt"] = "temperature"
    pool: Literal["pooled", "source_balanced", "real"] = "pooled"
    sufficient: float = SUFFICIENCY.default_thresholds[SUFFICIENT]
    partial: float = SUFFICIENCY.default_thresholds[PARTIAL]
    skip_min_precision: float = 0.95
    ece_bins: int = 15

    def __post_init__(self) -> None:
        for name in ("sufficient", "partial", "skip_min_precision"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"calibration.{name}={v} must be in [0, 1]")
        if self.partial > self.sufficient:
            raise ConfigError(
                f"calibration.partial={self.partial} > calibration.sufficient={self.sufficient}: "
                "partial is the lower threshold; swap them"
            )
        hints = typing.get_type_hints(type(self))  # the Literal annotations are the one list of choices
        for name in ("method", "pool"):
            allowed = typing.get_args(hints[name])
            if getattr(self, name) not in allowed:
                raise ConfigError(f"calibration.{name}={getattr(self, name)!r} is not one of {list(allowed)}")
        if self.ece_bins < 2:
            raise ConfigError(f"calibration.ece_bins={self.ece_bins} must be >= 2 (15 is usual)")
        if self.temperature == "none" and self.method != "temperature":
            raise ConfigError(f"calibration.temperature=none keeps the raw scores but calibration.method={self.method!r} fits "
                              "one: use --calibration.temperature=fit, or --calibration.method=temperature for raw scores")

    def check_label_scheme(self, label_scheme: str) -> None:
        """Platt scaling reads one logit margin: refuse it for three-level models."""
        if self.method == "platt" and label_scheme != "binary":
            raise ConfigError(f"calibration.method=platt with label_scheme={label_scheme!r}: Platt scaling calibrates one "
                              "binary margin (z_pos - z_neg); use --calibration.method=temperature for three levels, "
                              "or --label_scheme=binary")


def source_weights(sources: Sequence[str]) -> np.ndarray:
    """Per-item weights that give every source the same total: ``1 / n_source``, normalised to mean 1.

    >>> source_weights(["wiki", "wiki", "wiki", "squad2"]).tolist()
    [0.6666666666666666, 0.6666666666666666, 0.6666666666666666, 2.0]
    """
    src = np.asarray(list(sources), dtype=object)
    if len(src) == 0:
        return np.zeros(0)
    _, inverse, counts = np.unique(src.astype(str), return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse]
    return w * (len(w) / w.sum())


def pool_weights(pool: str, sources: Sequence[str] | None) -> np.ndarray | None:
    """The per-item weights of ``calibration.pool`` (None = every item alike).

    >>> pool_weights("real", ["wiki-synthetic", "squad2", "qed"]).tolist()
    [0.0, 1.0, 1.0]
    """
    from suffice.training.data.schema import is_synthetic_source

    if sources is None or pool == "pooled":
        return None
    if pool == "source_balanced":
        return source_weights(sources)
    real = np.array([not is_synthetic_source(s) for s in sources], dtype=np.float64)
    return real if real.any() else None


def _weights(weights: np.ndarray | None, n: int) -> np.ndarray:
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or (w < 0).any() or (n and w.sum() <= 0):
        raise ValueError(f"weights must be n={n} non-negative numbers with a positive sum, got shape {w.shape}")
    return w


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0, weights: np.ndarray | None = None) -> float:
    """(Weighted) mean negative log-likelihood of ``labels`` under ``softmax(logits / T)``."""
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    item = -logp[np.arange(len(labels)), np.asarray(labels, dtype=np.int64)]
    w = _weights(weights, len(item))
    return float((w * item).sum() / w.sum())


def fit_temperature(logits: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The T in [0.05, 20] minimising (weighted) validation NLL (bounded 1-D search over log T).

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
        lambda log_t: nll(logits, labels, math.exp(log_t), weights),
        bounds=(math.log(T_MIN), math.log(T_MAX)),
        method="bounded",
        options={"xatol": 1e-4},
    )
    t = float(math.exp(res.x))
    # never return something worse than no calibration at all
    return t if nll(logits, labels, t, weights) <= nll(logits, labels, 1.0, weights) else 1.0


def platt_nll(margin: np.ndarray, outcomes: np.ndarray, a: float, b: float, weights: np.ndarray | None = None) -> float:
    """(Weighted) mean binary NLL of ``outcomes`` under ``sigmoid(a * margin + b)``."""
    x = a * np.asarray(margin, dtype=np.float64) + b
    y = np.asarray(outcomes, dtype=np.float64)
    # -log sigmoid(x) = logaddexp(0, -x); -log(1 - sigmoid(x)) = logaddexp(0, x)
    item = y * np.logaddexp(0.0, -x) + (1 - y) * np.logaddexp(0.0, x)
    w = _weights(weights, len(item))
    return float((w * item).sum() / w.sum())


def fit_platt(logits: np.ndarray, labels: np.ndarray, positive_index: int = 1,
              weights: np.ndarray | None = None) -> tuple[float, float]:
    """Platt scaling of a binary model: ``(a, b)`` minimising (weighted) validation NLL of
    ``sigmoid(a * (z_pos - z_neg) + b)``, with ``a`` in [1/20, 1/0.05] (the temperature bounds; a
    positive slope keeps the ranking) and ``|b| <= 10``.

    Returns ``(1.0, 0.0)`` (raw softmax) when there is nothing to fit or the fit is no better.

    >>> rng = np.random.default_rng(0); m = rng.normal(0, 3, 5000)
    >>> y = (rng.random(5000) < 1 / (1 + np.exp(-(0.5 * m - 1.0)))).astype(int)
    >>> a, b = fit_platt(np.stack([np.zeros(5000), m], 1), y)
    >>> round(a, 1), round(b, 1)
    (0.5, -1.0)
    """
    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    if logits.ndim != 2 or logits.shape[1] != 2 or len(logits) != len(labels):
        raise ValueError(f"Platt scaling needs binary logits (n, 2) and labels (n,), got {logits.shape} and {labels.shape}")
    y = (labels == positive_index).astype(np.float64)
    if len(y) == 0 or y.min() == y.max():
        return 1.0, 0.0
    margin = logits[:, positive_index] - logits[:, 1 - positive_index]
    w = _weights(weights, len(y))
    w = w / w.sum()
    from scipy.optimize import minimize

    def loss_and_grad(ab: np.ndarray) -> tuple[float, np.ndarray]:
        r = w * (sigmoid(ab[0] * margin + ab[1]) - y)
        return platt_nll(margin, y, ab[0], ab[1], w), np.array([(r * margin).sum(), r.sum()])

    res = minimize(loss_and_grad, np.array([1.0, 0.0]), jac=True, method="L-BFGS-B",
                   bounds=[(1 / T_MAX, 1 / T_MIN), (-PLATT_B_MAX, PLATT_B_MAX)])
    a, b = float(res.x[0]), float(res.x[1])
    if platt_nll(margin, y, a, b, weights) > platt_nll(margin, y, 1.0, 0.0, weights):
        return 1.0, 0.0
    return a, b


def fit_calibration(settings: CalibrationSettings, logits: np.ndarray, labels: np.ndarray, sources: Sequence[str] | None,
                    positive_index: int) -> Calibration:
    """The calibration ``settings`` ask for, fitted on validation ``logits``/``labels`` (``sources``: each
    item's source, for ``pool: source_balanced``; None = one source).

    >>> s = CalibrationSettings(method="platt", pool="source_balanced")
    >>> fit_calibration(s, np.array([[2.0, 0.0], [0.0, 2.0], [0.0, 1.0]]), np.array([0, 1, 0]), ["a", "a", "b"], 1).method
    'platt'
    """
    if settings.temperature == "none":
        return Calibration()
    weights = pool_weights(settings.pool, sources)
    if settings.method == "platt":
        a, b = fit_platt(logits, labels, positive_index, weights)
        return Calibration("platt", a=a, b=b)
    return Calibration(temperature=fit_temperature(logits, labels, weights))


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


def decisiveness(scores: np.ndarray, outcomes: np.ndarray, sufficient: float = SUFFICIENCY.default_thresholds[SUFFICIENT],
                 precision: float = 0.9) -> dict[str, float]:
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
