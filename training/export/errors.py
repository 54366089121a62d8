"""Export errors and the parity tolerances."""

from __future__ import annotations

from dataclasses import dataclass


class ExportError(RuntimeError):
    """The model cannot be exported; the message names what is wrong and the fix."""


class ParityError(ExportError):
    """An exported model disagrees with its reference beyond the tolerance.

    check: ``fp32_vs_torch``, ``int8_confident_agreement``, ``int8_score_shift``, ``int8_macro_f1``,
    ``int8_auroc``, ``int8_agreement`` (models with more than two labels) or ``bundle_roundtrip``;
    largest_difference: the largest |logit difference| (or the shortfall for agreement/F1).
    """

    def __init__(self, message: str, *, check: str, largest_difference: float, tolerance: float):
        super().__init__(message)
        self.check, self.largest_difference, self.tolerance = check, float(largest_difference), float(tolerance)


@dataclass(frozen=True)
class ParityConfig:
    """Export checks.

    fp32 ONNX vs PyTorch: max |logit diff| <= ``atol`` on ``parity_items`` items.

    int8 vs fp32, on the calibrated positive score of a binary model (what serving decides on):
    the decision (which side of every stored threshold) agrees on >= ``min_confident_agreement`` of
    the items whose fp32 score is at least ``confident_margin`` from every threshold; the mean
    |score change| is <= ``max_mean_score_shift``; where at least ``min_metric_items`` items carry
    labels of both classes, macro-F1 and AUROC drop by <= ``max_metric_drop`` (0.005 = 0.5 point;
    on fewer items one item moves them by more than that, so they are reported, not enforced). Items near a threshold flip on any
    perturbation, so full agreement is reported, not required. Models with more than two labels
    keep the argmax rule: agreement >= ``min_agreement``.
    """

    parity_items: int = 200
    atol: float = 1e-4
    confident_margin: float = 0.1
    min_confident_agreement: float = 0.99
    max_mean_score_shift: float = 0.01
    max_metric_drop: float = 0.005
    min_metric_items: int = 100
    min_agreement: float = 0.99
    batch_size: int = 16
