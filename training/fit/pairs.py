"""Contrasts inside a batch: two training features (see :mod:`suffice.training.fit.features`).

Two contrasts, one loss (:func:`ranking_loss`): for every two rows of one contrast in a batch, one
positive and one not, the positive's margin ``logit[positive] - logit[other]`` must exceed the
other's (a logistic pairwise loss, ``softplus(-(m_pos - m_neg))``, averaged), on top of the
cross-entropy.

* The retrieval gate's contrastive pairs (``retrieval-gate/pairs.jsonl``) share a conversation and
  differ in the last user message: one SKIP, one RETRIEVE. :class:`GatePairs`: with
  ``gate.pair_batches`` both threads sit in one batch; :class:`PairRankingLoss`
  (``gate.pair_loss_weight > 0``) ranks SKIP above its partner.
* Sufficiency questions over one passage: :class:`PassageContrast` (``contrast.unit_size``) puts
  units of rows sharing a ``group``, sufficient and not alternating (:func:`group_units`), in one
  batch; :class:`GroupRankingLoss` (``contrast.loss_weight > 0``) ranks every sufficient row of a
  unit above every insufficient one, so the passage alone cannot decide and the question must be read.

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

from suffice.training.fit.features import TrainingFeature


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


class GatePairs(TrainingFeature):
    """The retrieval gate's contrastive pairs: both threads of a pair (rows sharing ``pair``) in one
    batch (``pair_batches``), ranked by :class:`PairRankingLoss` when ``loss_weight > 0``."""

    def __init__(self, pair_batches: bool, loss_weight: float, skip_id: int):
        self.pair_batches = bool(pair_batches)
        self.ranking = PairRankingLoss(loss_weight, skip_id) if loss_weight > 0 else None
        self.columns = ("partner",) if self.ranking else ()

    def add_columns(self, train: Any, accelerator: Any) -> Any:
        # the partner column itself is encoded with every split (encode.encode_split)
        if self.ranking and "partner" in train.column_names and max(train["partner"], default=-1) < 0:
            accelerator.print(f"warning: gate.pair_loss_weight={self.ranking.weight} but no train thread has a pair partner, "
                              "so the pair ranking loss adds nothing (gate.split=domains reads pairs.jsonl; or set gate.pair_loss_weight=0)")
        return train

    def batch_keys(self, train: Any) -> list[str] | None:
        return train["pair"] if self.pair_batches and "pair" in train.column_names else None

    def loss(self, outputs: Any, batch: Mapping[str, Any]) -> Any:
        return self.ranking(outputs, batch) if self.ranking else None


class PassageContrast(TrainingFeature):
    """Sufficiency questions over one passage side by side: a ``unit`` column (:func:`group_units`,
    ``unit_size`` rows of one passage group, sufficient and not alternating), one batch per unit,
    ranked by :class:`GroupRankingLoss` when ``loss_weight > 0``."""

    def __init__(self, unit_size: int, loss_weight: float, positive_id: int, seed: int):
        self.unit_size = int(unit_size)
        self.positive_id = int(positive_id)
        self.seed = int(seed)
        self.ranking = GroupRankingLoss(loss_weight, positive_id) if loss_weight > 0 else None
        self.columns = ("unit",) if self.ranking else ()

    def add_columns(self, train: Any, accelerator: Any) -> Any:
        """The train split with its ``unit`` column (every prepared row has a group: an item without one is its own)."""
        units = group_units(train["group"], train["labels"], self.unit_size, self.positive_id, self.seed)
        covered = sum(u >= 0 for u in units)
        accelerator.print(f"contrast: {max(units, default=-1) + 1:,} units of up to {self.unit_size} rows over one passage group "
                          f"cover {covered:,} of {len(units):,} train rows")
        if not covered:
            accelerator.print("warning: no passage group of the train split holds both classes, so contrast units are empty "
                              "(set --contrast.unit_size=0)")
        return train.add_column("unit", units, new_fingerprint=f"{train._fingerprint}-units{self.unit_size}-{self.seed}")

    def batch_keys(self, train: Any) -> list[str] | None:
        return [str(u) if u >= 0 else "" for u in train["unit"]]

    def loss(self, outputs: Any, batch: Mapping[str, Any]) -> Any:
        return self.ranking(outputs, batch) if self.ranking else None
