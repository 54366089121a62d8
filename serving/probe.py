"""The parity probe: a few dozen packed validation inputs and their fp32 scores, stored in the bundle.

Export writes ``probe.npz`` (plain arrays, no pickles) next to the models and lists it in the
manifest with its checksum. At load, every model variant a service would run (int8, fp32, and
the ones the runtime makes on the serving machine, such as OpenVINO bf16) scores the probe; a
variant whose calibrated scores drift beyond the export tolerance (mean |score change| above
``max_mean_score_shift``, or a flipped decision on an item whose fp32 score is at least
``confident_margin`` from every threshold) is not used. Kernels differ between CPUs (an int8
model quantised with full-range weights on a VNNI machine saturates on AVX2), so the check runs
where the model runs, not only where it was exported.

>>> probe = ParityProbe.read("bundles/sufficiency-v3/probe.npz")  # doctest: +SKIP
>>> probe.check(scores_of_variant, thresholds=[0.5, 0.8]).ok  # doctest: +SKIP
True
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

PROBE_FILE = "probe.npz"
# The export tolerance (ParityConfig's defaults): the probe file stores the values export used.
MAX_MEAN_SCORE_SHIFT = 0.01
CONFIDENT_MARGIN = 0.1
_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


class ProbeError(ValueError):
    """The probe file is damaged or inconsistent; the message names the file and the fix."""


@dataclass(frozen=True)
class ProbeCheck:
    """How a variant's scores compare with the probe's fp32 scores."""

    ok: bool
    items: int
    mean_abs_score_change: float
    max_abs_score_change: float
    confident_items: int
    confident_flips: int
    max_mean_score_shift: float
    confident_margin: float

    def describe(self) -> str:
        return (f"mean |score change| {self.mean_abs_score_change:.4f} (allowed {self.max_mean_score_shift:g}), "
                f"largest {self.max_abs_score_change:.4f}, {self.confident_flips} of {self.confident_items} confident "
                f"decisions flipped (margin {self.confident_margin:g}) on {self.items} probe items")

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class ParityProbe:
    """Packed int64 inputs (rows padded with mask 0) and the fp32 model's calibrated positive scores."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    scores: np.ndarray
    max_mean_score_shift: float = MAX_MEAN_SCORE_SHIFT
    confident_margin: float = CONFIDENT_MARGIN

    def __post_init__(self) -> None:
        shape = self.input_ids.shape
        if len(shape) != 2 or shape[0] < 1:
            raise ProbeError(f"probe input_ids must be a non-empty (items, tokens) array, got shape {shape}")
        for name in _INPUTS:
            a = getattr(self, name)
            if a.shape != shape or a.dtype != np.int64:
                raise ProbeError(f"probe {name} has shape {a.shape} and dtype {a.dtype}; expected {shape} int64")
        if self.scores.shape != (shape[0],) or not np.all(np.isfinite(self.scores)):
            raise ProbeError(f"probe scores must be {shape[0]} finite numbers, got shape {self.scores.shape}")
        if not np.all(self.attention_mask.sum(axis=1) > 0):
            raise ProbeError("a probe row has no tokens (attention_mask all 0)")

    @property
    def lengths(self) -> np.ndarray:
        return self.attention_mask.sum(axis=1)

    @classmethod
    def from_rows(cls, feeds: dict[str, np.ndarray], scores: Sequence[float], **tolerance: float) -> "ParityProbe":
        return cls(*(np.ascontiguousarray(feeds[n], dtype=np.int64) for n in _INPUTS),
                   scores=np.asarray(scores, dtype=np.float64), **tolerance)

    def batches(self, batch_size: int = 8) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """(row indices, feeds trimmed to the batch's longest row), rows sorted by length."""
        order = np.argsort(self.lengths, kind="stable")
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = int(self.lengths[rows].max())
            yield rows, {n: getattr(self, n)[rows, :width] for n in _INPUTS}

    def check(self, scores: np.ndarray, thresholds: Sequence[float]) -> ProbeCheck:
        """Compare a variant's calibrated positive scores (probe row order) with the stored fp32 ones."""
        s = np.asarray(scores, dtype=np.float64)
        if s.shape != self.scores.shape:
            raise ProbeError(f"got {s.shape[0] if s.ndim else 0} scores for {self.scores.shape[0]} probe items")
        ths = np.asarray(sorted({0.5, *(float(t) for t in thresholds if 0.0 < float(t) < 1.0)}))
        shift = np.abs(s - self.scores)
        confident = (np.abs(self.scores[:, None] - ths) >= self.confident_margin).all(axis=1)
        flips = ((self.scores[:, None] >= ths) != (s[:, None] >= ths)).any(axis=1) & confident
        mean = float(shift.mean())
        return ProbeCheck(ok=bool(mean <= self.max_mean_score_shift and not flips.any()), items=int(s.size),
                          mean_abs_score_change=mean, max_abs_score_change=float(shift.max()),
                          confident_items=int(confident.sum()), confident_flips=int(flips.sum()),
                          max_mean_score_shift=self.max_mean_score_shift, confident_margin=self.confident_margin)

    def write(self, path: str | os.PathLike) -> Path:
        """Write the probe as a plain ``.npz`` (no object arrays, so it loads without pickles)."""
        p = Path(path)
        np.savez(p, input_ids=self.input_ids, token_type_ids=self.token_type_ids, attention_mask=self.attention_mask,
                 scores=self.scores, max_mean_score_shift=np.float64(self.max_mean_score_shift),
                 confident_margin=np.float64(self.confident_margin))
        return p

    @classmethod
    def read(cls, path: str | os.PathLike) -> "ParityProbe":
        """Read and validate a probe file (``allow_pickle=False``)."""
        p = Path(path)
        try:
            with np.load(p, allow_pickle=False) as z:
                missing = [k for k in (*_INPUTS, "scores") if k not in z.files]
                if missing:
                    raise ProbeError(f"{p} lacks {missing}: re-export the bundle with `suffice export`")
                arrays = {k: z[k] for k in (*_INPUTS, "scores")}
                tol = {k: float(z[k]) for k in ("max_mean_score_shift", "confident_margin") if k in z.files}
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            if isinstance(e, ProbeError):
                raise
            raise ProbeError(f"{p} is not a readable probe file ({e}): re-export or re-download the bundle") from e
        try:
            return cls(**arrays, **tol)
        except ProbeError as e:
            raise ProbeError(f"{p}: {e}; re-export the bundle") from None
