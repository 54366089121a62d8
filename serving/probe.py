"""The parity probe: a few dozen packed validation inputs and their fp32 scores, stored in the bundle.

Export writes ``probe.npz`` (plain arrays, no pickles) next to the models and lists it in the
manifest with its checksum. At load, every model variant a service would run (int8, fp32, and
the ones the runtime makes on the serving machine, such as OpenVINO bf16) scores the probe; a
variant whose calibrated scores drift beyond the export tolerance (mean |score change| above
``max_mean_score_shift``, or a flipped decision on an item whose fp32 score is at least
``confident_margin`` from every threshold) is not used. Kernels differ between CPUs (an int8
model quantised with full-range weights on a VNNI machine saturates on AVX2), so the check runs
where the model runs, not only where it was exported.

The variants export ships (the int8 models) were judged by export's int8 rule on all its
validation items; the probe also stores their scores as export measured them
(``variant_scores``), and at load such a variant is compared with those: the check asks "does
this CPU reproduce the variant export judged?", not "is a few-dozen-item sample as close to fp32
as the whole validation set was" (a few dozen items are too few to judge a mean of 0.01: a variant
export passed could drift past it on the probe alone and be refused at every load). Variants the
runtime makes (OpenVINO fp32/bf16) and bundles written before this are compared with the fp32 scores.

>>> probe = ParityProbe.read("bundles/sufficiency-v3/probe.npz")  # doctest: +SKIP
>>> probe.check(scores_of_variant, thresholds=[0.5, 0.8], variant="openvino-int8").ok  # doctest: +SKIP
True
"""

from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from suffice.serving.calibration import Calibration

PROBE_FILE = "probe.npz"
# The export tolerance (ParityConfig's defaults): the probe file stores the values export used.
MAX_MEAN_SCORE_SHIFT = 0.01
CONFIDENT_MARGIN = 0.1
_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
_VARIANT_PREFIX = "variant_scores."  # npz key of a shipped variant's export-time scores: variant_scores.openvino-int8
_VARIANT = re.compile(r"[a-z0-9][a-z0-9-]*")


class ProbeError(ValueError):
    """The probe file is damaged or inconsistent; the message names the file and the fix."""


@dataclass(frozen=True)
class ProbeCheck:
    """How a variant's scores compare with the probe's reference: export's scores of that variant, else fp32."""

    ok: bool
    items: int
    mean_abs_score_change: float
    max_abs_score_change: float
    confident_items: int
    confident_flips: int
    max_mean_score_shift: float
    confident_margin: float
    reference: str = "fp32"

    def describe(self) -> str:
        vs = "" if self.reference == "fp32" else f" from export's {self.reference} scores"
        return (f"mean |score change|{vs} {self.mean_abs_score_change:.4f} (allowed {self.max_mean_score_shift:g}), "
                f"largest {self.max_abs_score_change:.4f}, {self.confident_flips} of {self.confident_items} confident "
                f"decisions flipped (margin {self.confident_margin:g}) on {self.items} probe items")

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class ParityProbe:
    """Packed int64 inputs (rows padded with mask 0), the fp32 model's calibrated positive scores and, per
    shipped variant name (``openvino-int8``...), that variant's scores as export measured them."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    scores: np.ndarray
    max_mean_score_shift: float = MAX_MEAN_SCORE_SHIFT
    confident_margin: float = CONFIDENT_MARGIN
    variant_scores: Mapping[str, np.ndarray] = field(default_factory=dict)

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
        for name, v in self.variant_scores.items():
            if not _VARIANT.fullmatch(name) or np.shape(v) != self.scores.shape or not np.all(np.isfinite(v)):
                raise ProbeError(f"probe scores of variant {name!r} must be {shape[0]} finite numbers and the name "
                                 f"letters, digits and '-', got shape {np.shape(v)}")

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

    def with_variant_scores(self, scores: Mapping[str, Sequence[float]]) -> "ParityProbe":
        """This probe plus export's scores of the variants it ships (name -> scores in probe row order)."""
        merged = {**self.variant_scores, **{k: np.asarray(v, dtype=np.float64) for k, v in scores.items()}}
        return replace(self, variant_scores=merged)

    def scores_of(self, run: Callable[[dict[str, np.ndarray]], np.ndarray], calibrator: Calibration, positive_index: int) -> np.ndarray:
        """This probe's calibrated positive scores (row order) under ``run`` (feeds -> logits), one row per call
        as a service scores (batches of 8 x 256 tokens left OpenVINO holding 34 MB more). Export records the
        shipped variants' scores with it and serving checks every variant with it: one owner for both."""
        scores = np.zeros(len(self.scores))
        for rows, feeds in self.batches(batch_size=1):
            scores[rows] = calibrator.scores(np.asarray(run(feeds)), positive_index)
        return scores

    def check(self, scores: np.ndarray, thresholds: Sequence[float], variant: str | None = None) -> ProbeCheck:
        """Compare a variant's calibrated positive scores (probe row order) with export's scores of that
        variant when the probe has them, else with the fp32 ones. Which items count as confident (at least
        ``confident_margin`` from every threshold) is always decided on the fp32 scores."""
        s = np.asarray(scores, dtype=np.float64)
        if s.shape != self.scores.shape:
            raise ProbeError(f"got {s.shape[0] if s.ndim else 0} scores for {self.scores.shape[0]} probe items")
        reference = variant if variant in self.variant_scores else "fp32"
        ref = self.variant_scores[variant] if reference != "fp32" else self.scores
        ths = np.asarray(sorted({0.5, *(float(t) for t in thresholds if 0.0 < float(t) < 1.0)}))
        shift = np.abs(s - ref)
        confident = (np.abs(self.scores[:, None] - ths) >= self.confident_margin).all(axis=1)
        flips = ((ref[:, None] >= ths) != (s[:, None] >= ths)).any(axis=1) & confident
        mean = float(shift.mean())
        return ProbeCheck(ok=bool(mean <= self.max_mean_score_shift and not flips.any()), items=int(s.size),
                          mean_abs_score_change=mean, max_abs_score_change=float(shift.max()),
                          confident_items=int(confident.sum()), confident_flips=int(flips.sum()),
                          max_mean_score_shift=self.max_mean_score_shift, confident_margin=self.confident_margin,
                          reference=reference)

    def write(self, path: str | os.PathLike) -> Path:
        """Write the probe as a plain ``.npz`` (no object arrays, so it loads without pickles)."""
        p = Path(path)
        np.savez(p, input_ids=self.input_ids, token_type_ids=self.token_type_ids, attention_mask=self.attention_mask,
                 scores=self.scores, max_mean_score_shift=np.float64(self.max_mean_score_shift),
                 confident_margin=np.float64(self.confident_margin),
                 **{_VARIANT_PREFIX + k: np.asarray(v, dtype=np.float64) for k, v in self.variant_scores.items()})
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
                variants = {k[len(_VARIANT_PREFIX):]: z[k] for k in z.files if k.startswith(_VARIANT_PREFIX)}
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            if isinstance(e, ProbeError):
                raise
            raise ProbeError(f"{p} is not a readable probe file ({e}): re-export or re-download the bundle") from e
        try:
            return cls(**arrays, **tol, variant_scores=variants)
        except ProbeError as e:
            raise ProbeError(f"{p}: {e}; re-export the bundle") from None
