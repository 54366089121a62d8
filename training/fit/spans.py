"""The extractive-QA objective in the SQuAD 2.0 manner: a training feature (:mod:`suffice.training.fit.features`).

A SQuAD 2.0 reader points at the answer: a start and an end logit per token of the passage, and
the ``[CLS]`` token for "no answer". :class:`AnswerSpan` trains that pointer beside the
sufficiency head (``span.loss_weight > 0``), on the same packed window the classifier reads:

* a sufficient train row whose gold answer (its ``answers`` column: the real sources' spans, the
  stage-0 rows' parents', the teacher's) is found in the packed context: start / end = the
  answer's first and last token;
* an insufficient row: start = end = 0 (``[CLS]``), the "no answer" of SQuAD 2.0;
* any other row (a sufficient row whose answer is not in the window, or has none; a ``partial``
  row): no span target (``-1``), no span loss.

The span layer (hidden size -> 2) is training-only: it is not saved in the model directory, so the
exported bundle and serving are unchanged; it is checkpointed with the run (exact resume).

>>> find_answer_span([101, 7, 102, 5, 6, 7, 8, 102], [0, 0, 0, 1, 1, 1, 1, 1], [[9], [6, 7]])
(4, 5)
>>> find_answer_span([101, 7, 102, 5, 6, 102], [0, 0, 0, 1, 1, 1], [[7]])  # in the question only
(-1, -1)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from suffice.training.fit.features import TrainingFeature

NO_TARGET = -1


def find_answer_span(input_ids: Sequence[int], token_type_ids: Sequence[int], answer_ids: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(start, end) token positions of the first of ``answer_ids`` found inside the packed context
    (segment 1, before its closing ``[SEP]``), or (-1, -1) when none is in the window."""
    ctx = [i for i, t in enumerate(token_type_ids) if t == 1]
    if not ctx:
        return NO_TARGET, NO_TARGET
    lo, hi = ctx[0], ctx[-1]  # the context run ends with its [SEP]
    for ans in answer_ids:
        n = len(ans)
        if n == 0:
            continue
        first = ans[0]
        for s in range(lo, hi - n + 1):
            if input_ids[s] == first and list(input_ids[s:s + n]) == list(ans):
                return s, s + n - 1
    return NO_TARGET, NO_TARGET


def span_targets(rows: Mapping[str, Sequence[Any]], encode_answer, positive_id: int, negative_id: int) -> tuple[list[int], list[int]]:
    """Start and end targets of encoded rows (``input_ids``, ``token_type_ids``, ``labels``, ``answers``).

    ``encode_answer``: answer text -> token ids (no special tokens), the packer's tokenizer.

    >>> rows = {"input_ids": [[101, 7, 102, 5, 6, 102], [101, 7, 102, 5, 102], [101, 7, 102, 5, 102]],
    ...         "token_type_ids": [[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1]] + [[0, 0, 0, 1, 1]], "labels": [1, 0, 1],
    ...         "answers": [["six"], ["six"], ["nine"]]}
    >>> span_targets(rows, {"six": [6], "nine": [9]}.get, positive_id=1, negative_id=0)
    ([4, 0, -1], [4, 0, -1])
    """
    starts, ends = [], []
    cache: dict[str, list[int]] = {}
    for ids, types, label, answers in zip(rows["input_ids"], rows["token_type_ids"], rows["labels"], rows["answers"]):
        if label == negative_id:
            start, end = 0, 0
        elif label == positive_id:
            strings = [a for a in (answers or []) if a and a.strip()]
            encoded = [cache.setdefault(a, list(encode_answer(a))) for a in strings]
            start, end = find_answer_span(ids, types, encoded)
        else:
            start, end = NO_TARGET, NO_TARGET
        starts.append(start)
        ends.append(end)
    return starts, ends


def span_coverage(starts: Sequence[int], labels: Sequence[int], positive_id: int) -> dict[str, float]:
    """How many rows the span objective learns from: answer spans found in the window, ``[CLS]``
    targets, rows without a target, and the share of sufficient rows whose answer was found.

    >>> span_coverage([4, 0, -1], [1, 0, 1], positive_id=1)
    {'span_rows_answer': 1, 'span_rows_no_answer': 1, 'span_rows_none': 1, 'span_answer_found_share_of_sufficient': 0.5}
    """
    s, y = np.asarray(starts), np.asarray(labels)
    positive = y == positive_id
    return {"span_rows_answer": int((s > 0).sum()), "span_rows_no_answer": int((s == 0).sum()), "span_rows_none": int((s < 0).sum()),
            "span_answer_found_share_of_sufficient": float((s[positive] > 0).mean()) if positive.any() else 0.0}


class AnswerSpan(TrainingFeature):
    """Start / end logits over the packed window, ``[CLS]`` for "no answer" (``span.loss_weight``).

    tokenizer_dir: the base model's tokenizer (answers are encoded as the packer encodes passages).
    """

    columns = ("span_start", "span_end")
    output_hidden_states = True

    def __init__(self, loss_weight: float, positive_id: int, negative_id: int, tokenizer_dir: Any):
        self.loss_weight = float(loss_weight)
        self.positive_id = int(positive_id)
        self.negative_id = int(negative_id)
        self.tokenizer_dir = tokenizer_dir
        self.head = None
        self.coverage: dict[str, float] = {}

    def add_columns(self, train: Any, accelerator: Any) -> Any:
        from suffice.serving.config import ConfigError
        from suffice.serving.packing import ContextPacker
        from suffice.training.fit.model import load_tokenizer

        if "answers" not in train.column_names:
            raise ConfigError("span.loss_weight > 0 needs the train rows' gold answers (an 'answers' column): prepared data "
                              "carries them (re-run `suffice data prepare`); a train_file needs an 'answers' list per row; "
                              "or set --span.loss_weight=0")
        packer = ContextPacker(load_tokenizer(self.tokenizer_dir))  # its encoding of text, not its window
        starts, ends = span_targets({k: train[k] for k in ("input_ids", "token_type_ids", "labels", "answers")},
                                    lambda text: packer.encode_texts([text])[0], self.positive_id, self.negative_id)
        self.coverage = span_coverage(starts, train["labels"], self.positive_id)
        c = self.coverage
        accelerator.print(f"answer span (weight {self.loss_weight:g}): {c['span_rows_answer']:,} rows with the answer in the window "
                          f"({c['span_answer_found_share_of_sufficient']:.0%} of sufficient rows), {c['span_rows_no_answer']:,} "
                          f"[CLS] targets, {c['span_rows_none']:,} without a span target")
        if not c["span_rows_answer"]:
            accelerator.print("warning: no train row's answer was found in its window, so the span objective only learns "
                              "[CLS] (set --span.loss_weight=0)")
        fp = f"{train._fingerprint}-spans"
        train = train.add_column("span_start", starts, new_fingerprint=fp + "-s")
        return train.add_column("span_end", ends, new_fingerprint=fp + "-e")

    def metrics(self) -> dict[str, float]:
        return dict(self.coverage)

    def modules(self, model: Any) -> list[Any]:
        import torch

        if self.head is None:
            self.head = torch.nn.Linear(model.config.hidden_size, 2)
        return [self.head]

    def prepare(self, accelerator: Any) -> None:
        self.head = accelerator.prepare_model(self.head)

    def loss(self, outputs: Any, batch: Mapping[str, Any]) -> Any:
        import torch
        import torch.nn.functional as F

        start, end = batch["span_start"], batch["span_end"]
        params = list(self.head.parameters())
        keep = start >= 0
        if not bool(keep.any()):  # keep the layer in the graph: DDP expects a gradient for every parameter
            return 0.0 * sum(p.sum() for p in params)
        hidden = outputs.hidden_states[-1][keep]
        logits = self.head(hidden.to(params[0].dtype)).float()  # (n, L, 2)
        logits = logits.masked_fill(batch["attention_mask"][keep].unsqueeze(-1) == 0, torch.finfo(logits.dtype).min)
        return self.loss_weight * 0.5 * (F.cross_entropy(logits[..., 0], start[keep]) + F.cross_entropy(logits[..., 1], end[keep]))
