"""Export errors and the parity tolerances."""

from __future__ import annotations

from dataclasses import dataclass


class ExportError(RuntimeError):
    """The model cannot be exported; the message names what is wrong and the fix."""


class ParityError(ExportError):
    """An exported model disagrees with its reference beyond the tolerance.

    check: ``fp32_vs_torch``, ``int8_agreement``, ``int8_f1`` or ``bundle_roundtrip``;
    largest_difference: the largest |logit difference| (or the shortfall for agreement/F1).
    """

    def __init__(self, message: str, *, check: str, largest_difference: float, tolerance: float):
        super().__init__(message)
        self.check, self.largest_difference, self.tolerance = check, float(largest_difference), float(tolerance)


@dataclass(frozen=True)
class ParityConfig:
    """Export checks. parity_items: items for the fp32-vs-torch check; atol: its tolerance;
    min_agreement: int8-vs-fp32 decision agreement; max_f1_drop: allowed F1 drop (0.005 = 0.5 point)."""

    parity_items: int = 200
    atol: float = 1e-4
    min_agreement: float = 0.99
    max_f1_drop: float = 0.005
    batch_size: int = 16
