"""The training-feature hook: an optional training feature as one visible addition.

A :class:`TrainingFeature` brings the three things an optional feature can add to a run, and the
run knows nothing else about it, so a feature lives in one file and is switched on by passing it to
:func:`suffice.training.fit.run.run` (``features=[...]``), the way accelerate's
``examples/by_feature`` add one feature each:

* its columns: :meth:`~TrainingFeature.add_columns` adds columns to the encoded train split, and
  :attr:`~TrainingFeature.columns` names the ones that must travel in each batch;
* its batch grouping: :meth:`~TrainingFeature.batch_keys`, a key per train row (``""`` = none);
  rows sharing a key sit in one batch (:class:`~suffice.training.fit.encode.LengthGroupedSampler`);
* its loss: :meth:`~TrainingFeature.loss`, added to the classification loss of every batch;
* its layers: :meth:`~TrainingFeature.modules`, trainable layers beside the model (training only:
  trained at the head learning rate, checkpointed with the run, not saved in the model directory)
  and :meth:`~TrainingFeature.prepare`, which hands them to the Accelerator;
* its figures: :meth:`~TrainingFeature.metrics`, logged with the run's data statistics.

Built on it: the contrasts of :mod:`suffice.training.fit.pairs` (the retrieval gate's pairs,
sufficiency's passage groups) and the extractive-QA objective of :mod:`suffice.training.fit.spans`;
:func:`suffice.training.fit.run.features_for` returns the ones a config switches on, and ``run``
adds them (it lives with the run, so the features import this hook and nothing imports back).

>>> class ZeroLoss(TrainingFeature):
...     def loss(self, outputs, batch):
...         return 0.0 * outputs.logits.sum()
>>> ZeroLoss().columns, ZeroLoss().batch_keys(None)
((), None)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from suffice.serving.config import ConfigError


class TrainingFeature:
    """An optional training feature; override what it adds (the defaults add nothing).

    columns: encoded train-split columns (integers per row) that must travel in each batch.
    output_hidden_states: whether :meth:`loss` reads ``outputs.hidden_states``.
    """

    columns: Sequence[str] = ()
    output_hidden_states: bool = False

    def add_columns(self, train: Any, accelerator: Any) -> Any:
        """The encoded train split (a ``datasets.Dataset``) with this feature's columns added."""
        return train

    def batch_keys(self, train: Any) -> list[str] | None:
        """A key per train row (``""`` = none): rows sharing one travel in one batch; None: no grouping."""
        return None

    def loss(self, outputs: Any, batch: Mapping[str, Any]) -> Any:
        """The loss to add for this batch (a scalar tensor, its weight included), or None to add nothing."""
        return None

    def modules(self, model: Any) -> list[Any]:
        """Trainable ``torch.nn.Module`` s this feature adds beside ``model`` (built once; the optimizer
        trains them at the head learning rate); none by default."""
        return []

    def prepare(self, accelerator: Any) -> None:
        """Hand this feature's :meth:`modules` to ``accelerator`` (device, mixed precision, checkpoints)."""

    def metrics(self) -> dict[str, float]:
        """Figures about the train split this feature saw (logged as ``data_train_<name>``); none by default."""
        return {}


def needs_hidden_states(features: Sequence[TrainingFeature]) -> bool:
    """True when any of ``features`` reads the encoder's hidden states."""
    return any(f.output_hidden_states for f in features)


def feature_columns(features: Sequence[TrainingFeature]) -> list[str]:
    """The batch columns ``features`` need, each once, in declaration order."""
    out: list[str] = []
    for f in features:
        out += [c for c in f.columns if c not in out]
    return out


def batch_keys(features: Sequence[TrainingFeature], train: Any) -> list[str] | None:
    """The one grouping of train rows into batches that ``features`` ask for (None: none does)."""
    keys = [(type(f).__name__, k) for f in features if (k := f.batch_keys(train)) is not None]
    if len(keys) > 1:
        raise ConfigError(f"features {[name for name, _ in keys]} each group the train batches: a run keeps one grouping; "
                          "switch one of them off")
    return keys[0][1] if keys else None


def feature_modules(features: Sequence[TrainingFeature], model: Any) -> list[Any]:
    """Every trainable layer ``features`` add beside ``model``."""
    return [m for f in features for m in f.modules(model)]
