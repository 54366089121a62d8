"""Calibrated probabilities from a model's logits: the one place that turns logits into the score a service sees.

Two methods, both fitted on validation by ``suffice train`` and recorded in ``suffice_model.json``
and the bundle's ``suffice.json``:

- ``temperature`` (every bundle before this one): ``softmax(logits / T)``; the argmax never moves.
- ``platt`` (binary models): ``P(positive) = sigmoid(a * (z_pos - z_neg) + b)``, the other class
  gets ``1 - P``. With ``b = 0`` it is temperature scaling with ``T = 1 / a``; ``b`` also moves the
  0.5 point, which a single temperature cannot.

>>> import numpy as np
>>> logits = np.array([[0.0, 2.0], [1.0, -1.0]])
>>> Calibration(temperature=2.0).scores(logits, positive_index=1).round(3).tolist()
[0.731, 0.269]
>>> Calibration("platt", a=0.5, b=0.0).scores(logits, positive_index=1).round(3).tolist()  # the same model
[0.731, 0.269]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

METHODS = ("temperature", "platt")


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``logits / temperature`` in float64.

    >>> softmax(np.array([[0.0, 0.0]])).tolist()
    [[0.5, 0.5]]
    """
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in float64, without overflow for large ``|x|``.

    >>> sigmoid(np.array([0.0, 1000.0, -1000.0])).tolist()
    [0.5, 1.0, 0.0]
    """
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Calibration:
    """How a model's logits become calibrated probabilities.

    method: ``temperature`` or ``platt`` (binary models only).
    temperature: T of ``softmax(logits / T)``; used by ``temperature`` only (1.0 under ``platt``).
    a / b: Platt slope and offset on the logit margin ``z_pos - z_neg``; used by ``platt`` only.
    """

    method: str = "temperature"
    temperature: float = 1.0
    a: float = 1.0
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown calibration method {self.method!r}: expected one of {list(METHODS)}")
        if not (_finite(self.temperature) and self.temperature > 0):
            raise ValueError(f"calibration temperature must be a positive number, got {self.temperature!r}")
        if not (_finite(self.a) and _finite(self.b)):
            raise ValueError(f"Platt parameters a={self.a!r} and b={self.b!r} must be finite numbers")

    def probabilities(self, logits: np.ndarray, positive_index: int) -> np.ndarray:
        """Calibrated probabilities, shape of ``logits`` (rows sum to 1), float64."""
        if self.method == "temperature":
            return softmax(logits, self.temperature)
        z = np.asarray(logits, dtype=np.float64)
        if z.ndim != 2 or z.shape[1] != 2:
            raise ValueError(f"Platt calibration needs two logit columns (a binary model), got logits of shape {z.shape}: "
                             "re-train with calibration.method=temperature")
        pos, neg = positive_index, 1 - positive_index
        p = sigmoid(self.a * (z[:, pos] - z[:, neg]) + self.b)
        out = np.empty_like(z)
        out[:, pos], out[:, neg] = p, 1.0 - p
        return out

    def scores(self, logits: np.ndarray, positive_index: int) -> np.ndarray:
        """The calibrated probability of the positive class, one per row."""
        return self.probabilities(logits, positive_index)[:, positive_index]

    def describe(self) -> str:
        """``temperature 1.3`` or ``platt a=0.8 b=-0.2``: for explanations and logs."""
        return f"temperature {self.temperature:g}" if self.method == "temperature" else f"platt a={self.a:.3g} b={self.b:.3g}"

    def to_record(self) -> dict[str, Any]:
        """``{method, temperature[, platt: {a, b}]}``: the shape ``suffice_model.json`` and ``suffice.json`` store."""
        out: dict[str, Any] = {"method": self.method, "temperature": float(self.temperature)}
        if self.method == "platt":
            out["platt"] = {"a": float(self.a), "b": float(self.b)}
        return out

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Calibration":
        """Read a calibration record; one with only a temperature (every older model and bundle) is temperature scaling.

        Other keys (``pool``, ``validation_levels``...) are left alone.

        >>> Calibration.from_record({"temperature": 1.5}).describe()
        'temperature 1.5'
        >>> Calibration.from_record({"method": "platt", "platt": {"a": 0.8, "b": -0.2}}).describe()
        'platt a=0.8 b=-0.2'
        """
        method = record.get("method", "temperature")
        if method == "platt":
            params = record.get("platt")
            if not isinstance(params, Mapping) or not {"a", "b"} <= set(params):
                raise ValueError(f"calibration record {dict(record)!r} names method 'platt' but has no platt: {{a, b}}")
            return cls("platt", float(record.get("temperature", 1.0)), params["a"], params["b"])
        if "temperature" not in record:
            raise ValueError(f"calibration record {dict(record)!r} has no temperature")
        return cls(str(method), record["temperature"])
