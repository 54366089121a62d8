"""The pair ranking loss of the retrieval gate: an auxiliary loss (see :mod:`suffice.training.fit.auxiliary`).

The contrastive pairs of ``retrieval-gate/pairs.jsonl`` share a conversation and differ in the last
user message: one SKIP, one RETRIEVE. With ``gate.pair_batches`` both threads sit in one batch;
this loss then asks, for every pair whose two rows are in the batch, that the SKIP thread's
margin ``logit[SKIP] - logit[RETRIEVE]`` exceed its partner's (a logistic pairwise loss,
``softplus(-(m_skip - m_retrieve))``), on top of the cross-entropy. Switched on by
``gate.pair_loss_weight > 0``.

>>> import torch
>>> from types import SimpleNamespace
>>> loss = PairRankingLoss(weight=1.0, skip_id=1)
>>> out = SimpleNamespace(logits=torch.tensor([[0.0, 2.0], [0.0, -2.0], [0.0, 0.0]]))
>>> batch = {"row": torch.tensor([10, 11, 12]), "partner": torch.tensor([11, 10, -1]), "labels": torch.tensor([1, 0, 1])}
>>> round(float(loss(out, batch)), 4)  # margins 2 vs -2: softplus(-4)
0.0181
"""

from __future__ import annotations

from typing import Any, Mapping


class PairRankingLoss:
    """``weight x mean softplus(-(m_skip - m_retrieve))`` over the pairs complete in a batch (0 when none is)."""

    columns = ("partner",)
    output_hidden_states = False

    def __init__(self, weight: float, skip_id: int):
        self.weight = float(weight)
        self.skip_id = int(skip_id)

    def __call__(self, outputs: Any, batch: Mapping[str, Any]) -> Any:
        import torch
        import torch.nn.functional as F

        logits = outputs.logits.float()
        margin = logits[:, self.skip_id] - logits[:, 1 - self.skip_id]
        rows, partner, labels = batch["row"], batch["partner"], batch["labels"]
        # position in this batch of each row's partner (-1: no partner, or not in this batch)
        match = (partner.unsqueeze(1) == rows.unsqueeze(0)) & (partner.unsqueeze(1) >= 0)
        has = match.any(dim=1) & (labels == self.skip_id)
        if not bool(has.any()):
            return logits.sum() * 0.0
        other = match.float().argmax(dim=1)
        diff = margin[has] - margin[other[has]]
        return self.weight * F.softplus(-diff).mean()


def gate_aux_losses(cfg) -> list[PairRankingLoss]:
    """The auxiliary losses ``cfg`` switches on: the pair ranking loss for a retrieval gate with
    ``gate.pair_loss_weight > 0``, else none."""
    if cfg.task != "retrieval_gate" or cfg.gate.pair_loss_weight <= 0:
        return []
    return [PairRankingLoss(cfg.gate.pair_loss_weight, cfg.positive_index)]
