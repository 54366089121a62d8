"""Ranking losses over contrasts inside a batch: auxiliary losses (see :mod:`suffice.training.fit.auxiliary`).

Two contrasts, one loss (:func:`ranking_loss`): for every two rows of one contrast in a batch, one
positive and one not, the positive's margin ``logit[positive] - logit[other]`` must exceed the
other's (a logistic pairwise loss, ``softplus(-(m_pos - m_neg))``, averaged), on top of the
cross-entropy.

* The retrieval gate's contrastive pairs (``retrieval-gate/pairs.jsonl``) share a conversation and
  differ in the last user message: one SKIP, one RETRIEVE. With ``gate.pair_batches`` both threads
  sit in one batch; :class:`PairRankingLoss` (``gate.pair_loss_weight > 0``) ranks SKIP above its partner.
* Sufficiency questions over one passage (``contrast.unit_size``): units of rows sharing a
  ``group``, sufficient and not alternating (:func:`group_units`), travel in one batch;
  :class:`GroupRankingLoss` (``contrast.loss_weight > 0``) ranks every sufficient row of a unit
  above every insufficient one, so the passage alone cannot decide and the question must be read.

>>> import torch
>>> from types import SimpleNamespace
>>> loss = PairRankingLoss(weight=1.0, skip_id=1)
>>> out = SimpleNamespace(logits=torch.tensor([[0.0, 2.0], [0.0, -2.0], [0.0, 0.0]]))
>>> batch = {"row": torch.tensor([10, 11, 12]), "partner": torch.tensor([11, 10, -1]), "labels": torch.tensor([1, 0, 1])}
>>> round(float(loss(out, batch)), 4)  # margins 2 vs -2: softplus(-4)
0.0181
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


class PairRankingLoss:
    """``weight x mean softplus(-(m_skip - m_retrieve))`` over the pairs complete in a batch (0 when none is)."""

    columns = ("partner",)
    output_hidden_states = False

    def __init__(self, weight: float, skip_id: int):
        self.weight = float(weight)
        self.skip_id = int(skip_id)

    def __call__(self, outputs: Any, batch: Mapping[str, Any]) -> Any:
        rows, partner = batch["row"], batch["partner"]
        # same[i, j]: row j is row i's partner (-1: no partner, or not in this batch)
        same = (partner.unsqueeze(1) == rows.unsqueeze(0)) & (partner.unsqueeze(1) >= 0)
        return self.weight * ranking_loss(outputs.logits, batch["labels"], same, self.skip_id)


class GroupRankingLoss:
    """``weight x mean softplus(-(m_pos - m_neg))`` over every (sufficient, insufficient) two rows of
    one unit in a batch (``unit`` column: the unit's id, -1 = none); 0 when no unit holds both.

    >>> import torch
    >>> from types import SimpleNamespace
    >>> loss = GroupRankingLoss(weight=1.0, positive_id=1)
    >>> out = SimpleNamespace(logits=torch.tensor([[0.0, 2.0], [0.0, -2.0], [0.0, 3.0], [0.0, 0.0]]))
    >>> batch = {"unit": torch.tensor([4, 4, 4, -1]), "labels": torch.tensor([1, 0, 1, 0])}
    >>> round(float(loss(out, batch)), 4)  # (softplus(-4) + softplus(-5)) / 2
    0.0124
    """

    columns = ("unit",)
    output_hidden_states = False

    def __init__(self, weight: float, positive_id: int):
        self.weight = float(weight)
        self.positive_id = int(positive_id)

    def __call__(self, outputs: Any, batch: Mapping[str, Any]) -> Any:
        unit = batch["unit"]
        same = (unit.unsqueeze(1) == unit.unsqueeze(0)) & (unit.unsqueeze(1) >= 0)
        return self.weight * ranking_loss(outputs.logits, batch["labels"], same, self.positive_id)


def ranking_loss(logits: Any, labels: Any, same: Any, positive_id: int) -> Any:
    """Mean ``softplus(-(m_i - m_j))`` over ``same[i, j]`` with row i positive and row j not, where
    ``m = logit[positive] - logit[other]`` (binary heads); 0 (with a gradient path) when there is none."""
    import torch.nn.functional as F

    logits = logits.float()
    margin = logits[:, positive_id] - logits[:, 1 - positive_id]
    pos = labels == positive_id
    take = same & pos.unsqueeze(1) & ~pos.unsqueeze(0)
    if not bool(take.any()):
        return logits.sum() * 0.0
    diff = margin.unsqueeze(1) - margin.unsqueeze(0)
    return F.softplus(-diff[take]).mean()


def group_units(groups: Sequence[str], labels: Sequence[int], size: int, positive_id: int, seed: int = 0) -> list[int]:
    """A unit id per row (-1 = none): the rows of each group that holds both classes, shuffled
    (seeded), positives and negatives alternating, cut into units of ``size`` rows; a last unit
    of one row gets none. Groups of one class get none (nothing to contrast).

    >>> group_units(["a", "a", "a", "a", "b", "b", ""], [1, 0, 1, 0, 1, 1, 0], size=2, positive_id=1)
    [0, 0, 1, 1, -1, -1, -1]
    """
    import random

    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if g:
            members.setdefault(g, []).append(i)
    out = [-1] * len(groups)
    rng = random.Random(seed)
    unit = 0
    for g in sorted(members):
        rows = members[g]
        pos = [i for i in rows if labels[i] == positive_id]
        neg = [i for i in rows if labels[i] != positive_id]
        if not pos or not neg:
            continue
        rng.shuffle(pos)
        rng.shuffle(neg)
        order = [r for k in range(max(len(pos), len(neg))) for r in (pos[k:k + 1] + neg[k:k + 1])]
        for k in range(0, len(order), size):
            chunk = order[k:k + size]
            if len(chunk) < 2:
                continue
            for i in chunk:
                out[i] = unit
            unit += 1
    return out


def aux_losses_for(cfg) -> list[Any]:
    """The ranking losses ``cfg`` switches on: the pair loss for a retrieval gate with
    ``gate.pair_loss_weight > 0``, the group loss for sufficiency with ``contrast.loss_weight > 0``."""
    if cfg.task == "retrieval_gate" and cfg.gate.pair_loss_weight > 0:
        return [PairRankingLoss(cfg.gate.pair_loss_weight, cfg.positive_index)]
    if cfg.contrast.loss_weight > 0:  # sufficiency only (the config refuses contrast for the gate)
        return [GroupRankingLoss(cfg.contrast.loss_weight, cfg.positive_index)]
    return []
