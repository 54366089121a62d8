"""Selective answering (Joren et al., 2025, sec. 5): abstain using sufficiency AND self-confidence.

A tiny logistic model over (sufficiency score, the generator's self-rated confidence) predicts
whether an answer will be correct; answering only when that probability clears a threshold
chosen for a target coverage trades coverage for accuracy. Fitted by ``suffice fit-selective``,
stored as JSON (never a pickle), evaluated with :func:`selective_curve`.

>>> m = SelectiveAnswerer.fit([0.9, 0.8, 0.2, 0.1], [0.9, 0.4, 0.8, 0.2], [1, 1, 0, 0], coverage=0.5)
>>> m.decide(0.95, 0.9).abstain, m.decide(0.05, 0.1).abstain
(False, True)
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

FEATURES = ("sufficiency", "confidence")
FORMAT = "suffice-selective/1"


@dataclass(frozen=True)
class SelectiveDecision:
    abstain: bool
    p_correct: float
    threshold: float


def _design(suff: Sequence[float], conf: Sequence[float]) -> np.ndarray:
    s = np.asarray(suff, dtype=np.float64).reshape(-1)
    c = np.asarray(conf, dtype=np.float64).reshape(-1)
    if s.shape != c.shape:
        raise ValueError(f"got {s.size} sufficiency scores but {c.size} confidences: give one of each per item")
    if s.size and (not np.isfinite(s).all() or not np.isfinite(c).all()):
        raise ValueError("sufficiency scores and confidences must be finite numbers")
    return np.column_stack([s, c, s * c])


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1e-2, iters: int = 50) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression by Newton's method (no sklearn needed at serving time)."""
    n, d = X.shape
    A = np.column_stack([X, np.ones(n)])
    w = np.zeros(d + 1)
    reg = np.full(d + 1, l2)
    reg[-1] = 0.0  # the bias is not shrunk
    for _ in range(iters):
        p = _sigmoid(A @ w)
        g = A.T @ (p - y) + reg * w
        H = (A * (p * (1 - p))[:, None]).T @ A + np.diag(reg) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w[:-1], float(w[-1])


@dataclass(frozen=True)
class SelectiveAnswerer:
    """Logistic P(correct | sufficiency, confidence) and the abstention threshold for a coverage.

    weights: for (sufficiency, confidence, sufficiency x confidence); bias; threshold: answer when
    P(correct) >= threshold; coverage: the share of the fitting data answered at that threshold.
    """

    weights: tuple[float, float, float]
    bias: float
    threshold: float
    coverage: float
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fit(cls, sufficiency: Sequence[float], confidence: Sequence[float], correct: Sequence[int],
            coverage: float = 0.8, l2: float = 1e-2) -> "SelectiveAnswerer":
        """Fit on labelled items (correct = 1 when the generated answer was right)."""
        if not 0.0 < coverage <= 1.0:
            raise ValueError(f"coverage={coverage!r} must be in (0, 1]: the share of questions to answer")
        X = _design(sufficiency, confidence)
        y = np.asarray(correct, dtype=np.float64).reshape(-1)
        if y.size != X.shape[0]:
            raise ValueError(f"got {y.size} correctness labels for {X.shape[0]} items")
        if y.size < 2 or not set(np.unique(y)) <= {0.0, 1.0}:
            raise ValueError("correct must hold 0/1 labels for at least 2 items")
        w, b = fit_logistic(X, y, l2=l2)
        p = _sigmoid(X @ w + b)
        threshold = float(np.quantile(p, 1.0 - coverage, method="lower")) if coverage < 1.0 else 0.0
        answered = p >= threshold
        metrics = {"n": int(y.size), "base_accuracy": float(y.mean()),
                   "selective_accuracy": float(y[answered].mean()) if answered.any() else None,
                   "achieved_coverage": float(answered.mean())}
        return cls(weights=tuple(float(x) for x in w), bias=b, threshold=threshold, coverage=float(coverage), metrics=metrics)

    def p_correct(self, sufficiency: Sequence[float] | float, confidence: Sequence[float] | float) -> np.ndarray:
        X = _design(np.atleast_1d(sufficiency), np.atleast_1d(confidence))
        return _sigmoid(X @ np.asarray(self.weights) + self.bias)

    def decide(self, sufficiency: float, confidence: float) -> SelectiveDecision:
        """Answer or abstain for one item.

        >>> m.decide(0.9, 0.7)  # doctest: +SKIP
        SelectiveDecision(abstain=False, p_correct=0.91, threshold=0.55)
        """
        p = float(self.p_correct(sufficiency, confidence)[0])
        return SelectiveDecision(abstain=p < self.threshold, p_correct=p, threshold=self.threshold)

    def with_coverage(self, coverage: float, sufficiency: Sequence[float], confidence: Sequence[float]) -> "SelectiveAnswerer":
        """The same model with the threshold re-chosen for another coverage on the given items."""
        if not 0.0 < coverage <= 1.0:
            raise ValueError(f"coverage={coverage!r} must be in (0, 1]")
        p = self.p_correct(sufficiency, confidence)
        t = float(np.quantile(p, 1.0 - coverage, method="lower")) if coverage < 1.0 else 0.0
        return SelectiveAnswerer(self.weights, self.bias, t, float(coverage), dict(self.metrics))

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "features": list(FEATURES) + ["sufficiency*confidence"], "weights": list(self.weights),
                "bias": self.bias, "threshold": self.threshold, "coverage": self.coverage, "metrics": self.metrics}

    def save(self, path: str | os.PathLike) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SelectiveAnswerer":
        """Load a model saved by :meth:`save` (JSON)."""
        p = Path(path)
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"selective model {p} does not exist: fit one with `suffice fit-selective`") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"selective model {p} is not valid JSON: {e}") from e
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"{p} is not a suffice selective model (format {d.get('format') if isinstance(d, dict) else None!r}, expected {FORMAT!r})")
        w = d.get("weights")
        if not isinstance(w, list) or len(w) != 3 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in w):
            raise ValueError(f"{p}: weights must be 3 finite numbers, got {w!r}")
        return cls(weights=tuple(float(x) for x in w), bias=float(d["bias"]), threshold=float(d["threshold"]),
                   coverage=float(d["coverage"]), metrics=dict(d.get("metrics") or {}))


def selective_curve(scores: Sequence[float], correct: Sequence[int], points: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Selective accuracy at each coverage: answer the top-``coverage`` share by ``scores``.

    >>> cov, acc = selective_curve([0.9, 0.1], [1, 0], points=2)
    >>> cov.tolist(), acc.tolist()
    ([0.5, 1.0], [1.0, 0.5])
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(correct, dtype=np.float64)
    if s.shape != y.shape or s.size == 0:
        raise ValueError(f"scores ({s.size}) and correct ({y.size}) must be non-empty and of equal length")
    order = np.argsort(-s, kind="stable")
    cum = np.cumsum(y[order]) / np.arange(1, s.size + 1)
    cov = np.linspace(1.0 / points, 1.0, points)
    k = np.maximum(1, np.ceil(cov * s.size).astype(int))
    return cov, cum[k - 1]
