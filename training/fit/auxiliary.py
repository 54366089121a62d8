"""The auxiliary-loss hook: an optional training feature as one visible addition.

An :class:`AuxiliaryLoss` declares the encoded columns its batches need and returns a loss per
batch, which :func:`suffice.training.fit.loop.train` adds to the classification loss. The loop
knows nothing else about it, so a feature lives in one file and is switched on by passing it to
:func:`suffice.training.fit.run.run` (``aux_losses=[...]``), the way accelerate's
``examples/by_feature`` add one feature each.

The ranking losses of :mod:`suffice.training.fit.pairs` are built on this shape (the retrieval
gate's pair loss, sufficiency's passage-group loss; ``run`` adds the ones the config switches on).
The answer-span head, an earlier feature on it, lost 11-30 macro-F1 points in both measured runs
and was deleted.

>>> class ZeroLoss:
...     columns = ()
...     output_hidden_states = False
...     def __call__(self, outputs, batch):
...         return 0.0 * outputs.logits.sum()
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence


class AuxiliaryLoss(Protocol):
    """An extra training loss.

    columns: encoded train-split columns (integers per row) that must travel in each batch.
    output_hidden_states: whether the loss reads ``outputs.hidden_states``.
    ``__call__(outputs, batch)``: the loss to add for this batch (a scalar tensor; its weight included).
    """

    columns: Sequence[str]
    output_hidden_states: bool

    def __call__(self, outputs: Any, batch: Mapping[str, Any]) -> Any: ...


def needs_hidden_states(aux_losses: Sequence[AuxiliaryLoss]) -> bool:
    """True when any of ``aux_losses`` reads the encoder's hidden states."""
    return any(a.output_hidden_states for a in aux_losses)


def extra_columns(aux_losses: Sequence[AuxiliaryLoss]) -> list[str]:
    """The columns ``aux_losses`` need, each once, in declaration order."""
    out: list[str] = []
    for a in aux_losses:
        out += [c for c in a.columns if c not in out]
    return out
