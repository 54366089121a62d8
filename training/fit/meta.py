"""``suffice_model.json``: what a trained-model directory says about itself, as one dataclass.

Written by ``suffice train`` and ``suffice soup`` (:func:`suffice.training.fit.finalize.finalize`),
read by evaluation, soup and export through :meth:`ModelMeta.read`, with one rule: the seven keys
that say how to pack, label and calibrate (:data:`REQUIRED`) must be there; everything else
(base model, data hash, run, metrics, the soup's ingredients...) is optional and kept as written.

>>> m = ModelMeta(task="sufficiency", label_scheme="binary", id2label={"0": "insufficient", "1": "sufficient"},
...               positive_label="sufficient", max_length=256, long_context_strategy="select",
...               calibration={"method": "temperature", "temperature": 1.3})
>>> m.positive_index, m.labels, m.calibrator.describe()
(1, {0: 'insufficient', 1: 'sufficient'}, 'temperature 1.3')
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from suffice.serving.calibration import Calibration
from suffice.serving.jsonl import json_safe

MODEL_META = "suffice_model.json"
REQUIRED = ("task", "label_scheme", "id2label", "positive_label", "max_length", "long_context_strategy", "calibration")
OMIT_WHEN_NONE = ("train_seconds", "soup")


class ModelMetaError(ValueError):
    """A ``suffice_model.json`` is missing, unreadable or incomplete; the message names the file and the fix."""


@dataclass
class ModelMeta:
    """The metadata of a trained-model directory (field order = key order in the file).

    task / label_scheme / id2label (``"0" -> name``) / positive_label: what the classes are.
    max_length / long_context_strategy: how items are packed. calibration: ``{method, temperature,
    [platt: {a, b},] pool, ...}`` (:attr:`calibrator` applies it; a record with only a temperature,
    as older versions wrote, is temperature scaling).
    thresholds: decision thresholds on the calibrated positive score. The rest records where the
    model came from: base model, fine-tuning (``lora`` / ``full`` / ``soup``), labels and data, the
    git commit, the MLflow run and registered version, metrics, training time, a soup's recipe.
    extra: keys this version does not know (kept, and written back).
    """

    task: str
    label_scheme: str
    id2label: dict[str, str]
    positive_label: str
    max_length: int
    long_context_strategy: str
    calibration: dict[str, Any]
    thresholds: dict[str, float] = field(default_factory=dict)
    base_model: str | None = None
    finetune: str | None = None
    label_source: str | None = None
    data_hash: str | None = None
    git_commit: str | None = None
    mlflow: dict[str, Any] = field(default_factory=lambda: {"run_id": None, "registered_model": None, "version": None})
    metrics: dict[str, Any] = field(default_factory=dict)
    train_seconds: float | None = None
    soup: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id2label = {str(k): str(v) for k, v in self.id2label.items()}
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ModelMetaError` when the labels or the window cannot be used."""
        if not self.id2label:
            raise ModelMetaError("id2label is empty: a model has at least two classes")
        if self.positive_label not in self.id2label.values():
            raise ModelMetaError(f"positive_label {self.positive_label!r} is not one of the labels {sorted(self.id2label.values())}")
        if not isinstance(self.max_length, int) or self.max_length < 1:
            raise ModelMetaError(f"max_length={self.max_length!r} must be a positive integer")
        try:
            cal = self.calibrator
        except ValueError as e:
            raise ModelMetaError(f"calibration: {e}: re-train, or write a calibration record {{method, temperature[, platt: {{a, b}}]}}") from None
        if cal.method == "platt" and len(self.id2label) != 2:
            raise ModelMetaError(f"calibration method 'platt' needs a binary model, but id2label has {len(self.id2label)} labels")

    @property
    def labels(self) -> dict[int, str]:
        """``id2label`` with integer class indices."""
        return {int(k): v for k, v in self.id2label.items()}

    @property
    def positive_index(self) -> int:
        return next(int(i) for i, name in self.id2label.items() if name == self.positive_label)

    @property
    def temperature(self) -> float:
        """The calibration temperature (1.0 under Platt scaling, which does not use it)."""
        return float(self.calibration.get("temperature", 1.0))

    @property
    def calibrator(self) -> Calibration:
        """The fitted calibration (:class:`suffice.serving.calibration.Calibration`): logits -> calibrated probabilities."""
        return Calibration.from_record(self.calibration)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "suffice_model.json") -> "ModelMeta":
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise ModelMetaError(f"{source} is missing {missing}: it was not written by this version of `suffice train`; "
                                 "re-train or add them")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        try:
            return cls(**{k: v for k, v in d.items() if k in known}, extra={k: v for k, v in d.items() if k not in known})
        except ModelMetaError as e:
            raise ModelMetaError(f"{source}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out = {k: v for k, v in out.items() if not (k in OMIT_WHEN_NONE and v is None)}
        return {**out, **self.extra}

    @classmethod
    def read(cls, model_dir: str | Path) -> "ModelMeta":
        """The checked metadata of ``model_dir``.

        >>> ModelMeta.read("models/demo").task  # doctest: +SKIP
        'sufficiency'
        """
        p = Path(model_dir) / MODEL_META
        if not p.is_file():
            raise ModelMetaError(f"{Path(model_dir)} has no {MODEL_META}: give a directory written by `suffice train`")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ModelMetaError(f"{p} is not valid JSON: {e}") from e
        if not isinstance(d, dict):
            raise ModelMetaError(f"{p} holds a JSON {type(d).__name__}, not an object")
        return cls.from_dict(d, str(p))

    def write(self, model_dir: str | Path) -> Path:
        """Write ``suffice_model.json`` into ``model_dir`` (NaN as null)."""
        p = Path(model_dir) / MODEL_META
        p.write_text(json.dumps(json_safe(self.to_dict()), indent=2, sort_keys=False) + "\n")
        return p


def read_model_meta(model_dir: str | Path) -> dict[str, Any]:
    """``suffice_model.json`` of a trained-model directory as a dict, checked by :class:`ModelMeta`."""
    return ModelMeta.read(model_dir).to_dict()


def write_model_meta(model_dir: str | Path, meta: ModelMeta | Mapping[str, Any]) -> Path:
    """Write ``meta`` (a :class:`ModelMeta` or its dict) as ``model_dir/suffice_model.json``."""
    m = meta if isinstance(meta, ModelMeta) else ModelMeta.from_dict(meta)
    return m.write(model_dir)
