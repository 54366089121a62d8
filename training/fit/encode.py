"""Rows -> packed, labelled datasets, and the batches the loop and evaluation read.

Encoding goes only through ``suffice.serving.packing.ContextPacker`` (the code serving runs);
batches are padded per batch (dynamic padding) and grouped by length.

>>> class_weights([0, 0, 0, 1], 2, "balanced").tolist()
[0.6666666666666666, 2.0]
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from suffice.serving.bundle import SUFFICIENCY
from suffice.serving.config import ConfigError
from suffice.training.fit.features import TrainingFeature, batch_keys, feature_columns
from suffice.training.fit.config import TrainConfig
from suffice.training.fit.splits import Splits

THREE_LEVEL_INDEX = {name: i for i, name in SUFFICIENCY.id2label("three_level").items()}
EVAL_COLUMNS = ("input_ids", "token_type_ids", "labels", "row")


def scheme_labels(batch: dict[str, list], label_scheme: str) -> list[int]:
    """The class index of each row in ``label_scheme`` (-1 = no label: left out of loss and metrics)."""
    if label_scheme == "binary":
        return [int(x) if x is not None else -1 for x in batch["label"]]
    out = []
    for level, label in zip(batch["level"], batch["label"]):
        if level in THREE_LEVEL_INDEX:
            out.append(THREE_LEVEL_INDEX[level])
        else:  # a bare "sufficient" label still says which level; a bare 0 does not
            out.append(2 if label == 1 else -1)
    return out


def subsample(ds, n: int, seed: int):
    """``n`` rows of ``ds`` drawn with ``seed`` (all of them when ``n`` is 0 or covers the split)."""
    if not n or ds is None or len(ds) <= n:
        return ds
    return ds.shuffle(seed=seed).select(range(n))


def encode_split(ds, packer, cfg: TrainConfig, tokenizer_hash: str):
    """Pack every (question, passages) row with the ContextPacker; add labels and lengths, keep the
    labelled rows, and number them (``row``)."""
    from suffice.serving.packing import QuestionTooLongError

    def encode(batch):
        ids, types, totals, kept = [], [], [], []
        for rid, q, ps in zip(batch["id"], batch["question"], batch["passages"]):
            try:
                p = packer.pack(q, ps)
            except QuestionTooLongError as e:
                raise QuestionTooLongError(f"item {rid}: {e}") from None
            ids.append(p.input_ids)
            types.append(p.token_type_ids)
            totals.append(p.context_tokens_total)
            kept.append(p.context_tokens_kept)
        return {"input_ids": ids, "token_type_ids": types, "length": [len(x) for x in ids], "labels": scheme_labels(batch, cfg.label_scheme),
                "context_tokens_total": totals, "context_tokens_kept": kept}

    # an explicit fingerprint: the packer is not hashable, and the cache must change with the window
    key = f"{ds._fingerprint}|{tokenizer_hash}|{cfg.max_length}|{cfg.long_context_strategy}|{cfg.label_scheme}|v1"
    fp = hashlib.sha256(key.encode()).hexdigest()[:16]
    ds = ds.map(encode, batched=True, batch_size=256, new_fingerprint=fp, desc="packing")
    # unlabelled rows (no level for three_level, say) stay out of the loss and the metrics
    ds = ds.filter(lambda lab: lab >= 0, input_columns="labels", new_fingerprint=f"{fp}-labelled", desc="labelled only")
    # "row" lets gathered evaluation outputs be put back in dataset order
    ds = ds.add_column("row", list(range(len(ds))), new_fingerprint=f"{fp}-rows")
    if "pair" in ds.column_names or cfg.task == "retrieval_gate":  # contrastive pairs: each row's partner row (-1 = none)
        pairs = ds["pair"] if "pair" in ds.column_names else [""] * len(ds)
        ds = ds.add_column("partner", partner_rows(pairs), new_fingerprint=f"{fp}-partners")
    return ds


def partner_rows(pairs: Sequence[str | None]) -> list[int]:
    """For each row, the row of the other member of its pair (``-1`` when it has none).

    >>> partner_rows(["a", "", "a", "b"])
    [2, -1, 0, -1]
    """
    members: dict[str, list[int]] = {}
    for i, key in enumerate(pairs):
        if key:
            members.setdefault(key, []).append(i)
    out = [-1] * len(pairs)
    for rows in members.values():
        if len(rows) == 2:
            out[rows[0]], out[rows[1]] = rows[1], rows[0]
    return out


def packing_stats(ds) -> dict[str, float]:
    """Mean tokens per example and the share of items whose context did not fit the window."""
    if ds is None or len(ds) == 0:
        return {}
    total = np.asarray(ds["context_tokens_total"])
    kept = np.asarray(ds["context_tokens_kept"])
    return {"mean_tokens": float(np.mean(ds["length"])), "truncated_share": float((kept < total).mean()),
            "mean_context_kept_share": float(np.mean(np.where(total > 0, kept / np.maximum(total, 1), 1.0)))}


class LengthGroupedSampler:
    """Shuffled indices, sorted by length within mega-batches of ``50 x batch_size``.

    Batches then hold examples of similar length, so per-batch padding wastes little, while the
    order stays random across mega-batches. Deterministic for a (seed, epoch): resume-safe.

    ``together``: an optional key per row (``""`` = none); rows sharing a key (the two threads of a
    contrastive pair) are placed next to each other inside one batch, so the model sees both sides
    of the contrast in the same optimiser step. Every batch but the last still holds exactly
    ``batch_size`` rows (the loader cuts the order into fixed-size batches); with an even batch
    size, pairs are never split (single rows are packed two by two); with an odd one, a group is
    split only when no smaller group is left to fill a batch's last slots.

    >>> s = LengthGroupedSampler([5, 1, 9, 3], batch_size=2, seed=0)
    >>> sorted(s) == [0, 1, 2, 3]
    True
    >>> order = list(LengthGroupedSampler([5, 1, 9, 3, 4, 2], batch_size=2, seed=0, together=["a", "", "b", "a", "", "b"]))
    >>> any(set(order[k:k + 2]) == {0, 3} for k in (0, 2, 4)), sorted(order) == list(range(6))
    (True, True)
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0, group: bool = True,
                 together: Sequence[str] | None = None):
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.group = group
        self.together = list(together) if together is not None else None
        if self.together is not None and len(self.together) != len(self.lengths):
            raise ValueError(f"together has {len(self.together)} keys for {len(self.lengths)} rows")
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        if self.together is not None:
            return iter(self._grouped_order(rng))
        order = list(range(len(self.lengths)))
        rng.shuffle(order)
        if not self.group:
            return iter(order)
        mega = self.batch_size * 50
        out = []
        for i in range(0, len(order), mega):
            chunk = sorted(order[i : i + mega], key=lambda j: -self.lengths[j])
            batches = [chunk[k : k + self.batch_size] for k in range(0, len(chunk), self.batch_size)]
            rng.shuffle(batches)  # keep the longest batch from always coming first
            out += [j for b in batches for j in b]
        return iter(out)

    def _grouped_order(self, rng: random.Random) -> list[int]:
        """Rows of one key as one unit: units shuffled, sorted by length within mega-batches, packed
        whole into fixed-size batches; full batches shuffled, a short last batch kept last."""
        keyed: dict[str, list[int]] = {}
        units: list[list[int]] = []
        for i, key in enumerate(self.together or []):
            if key:
                if key not in keyed:
                    keyed[key] = []
                    units.append(keyed[key])
                keyed[key].append(i)
            else:
                units.append([i])
        rng.shuffle(units)
        mega, bs = self.batch_size * 50, self.batch_size
        lone: list[list[int]] = []
        if bs % 2 == 0:  # even batches: single rows travel two by two, so pairs never have to be split
            singles = [u for u in units if len(u) == 1]
            units = [u for u in units if len(u) != 1] + [singles[k] + singles[k + 1] for k in range(0, len(singles) - 1, 2)]
            rng.shuffle(units)
            lone = singles[len(singles) - len(singles) % 2:]
        batches: list[list[int]] = []
        current: list[int] = []
        start = 0
        while start < len(units):
            end, rows = start, 0
            while end < len(units) and rows < mega:
                rows += len(units[end])
                end += 1
            pending = units[start:end]
            if self.group:
                pending.sort(key=lambda u: -max(self.lengths[j] for j in u))
            start = end
            while pending:
                room = bs - len(current)
                k = next((n for n, u in enumerate(pending) if len(u) <= room), None)
                if k is None:  # nothing fits whole: split the first unit across two batches
                    unit = pending.pop(0)
                    current += unit[:room]
                    pending.insert(0, unit[room:])
                else:
                    current += pending.pop(k)
                if len(current) == bs:
                    batches.append(current)
                    current = []
        rng.shuffle(batches)
        for unit in lone:  # an odd row out goes last, into the short last batch (it always has room)
            current += unit
            if len(current) == bs:
                batches.append(current)
                current = []
        if current:
            batches.append(current)
        return [j for b in batches for j in b]


def make_collate(pad_id: int, extra: Sequence[str] = ()):
    """Pad a list of encoded rows to the longest in the batch (dynamic padding).

    ``extra``: further integer columns (a training feature's) stacked as long tensors."""
    import torch

    def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(r["input_ids"]) for r in rows)
        n = len(rows)
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        types = torch.zeros((n, width), dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(rows):
            L = len(r["input_ids"])
            ids[i, :L] = torch.tensor(r["input_ids"], dtype=torch.long)
            types[i, :L] = torch.tensor(r["token_type_ids"], dtype=torch.long)
            mask[i, :L] = 1
        out = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
               "labels": torch.tensor([r["labels"] for r in rows], dtype=torch.long),
               "row": torch.tensor([r["row"] for r in rows], dtype=torch.long)}
        for name in extra:
            out[name] = torch.tensor([r[name] for r in rows], dtype=torch.long)
        return out

    return collate


def eval_dataloader(ds, batch_size: int, pad_id: int):
    """Evaluation batches in length order (least padding); rows are re-aligned by their index."""
    from torch.utils.data import DataLoader

    order = sorted(range(len(ds)), key=lambda i: ds[i]["length"]) if len(ds) else []
    view = ds.select_columns(list(EVAL_COLUMNS))
    return DataLoader(view, batch_size=batch_size, sampler=order, collate_fn=make_collate(pad_id))


def encode_splits(accelerator, cfg: TrainConfig, splits: Splits, packer, tokenizer_hash: str) -> dict[str, Any]:
    """Subsample and encode each split (main process first, so a cache is written once); check
    that train and validation have labelled rows and train at least two classes."""
    encoded: dict[str, Any] = {}
    with accelerator.main_process_first():
        for name in ("train", "validation", "test"):
            ds = splits[name]
            if ds is None:
                encoded[name] = None
                continue
            ds = subsample(ds, cfg.max_train_items if name == "train" else cfg.max_eval_items, cfg.seed)
            encoded[name] = encode_split(ds, packer, cfg, tokenizer_hash)
    for name in ("train", "validation"):
        if len(encoded[name]) == 0:
            raise ConfigError(f"the {name} split has no labelled items for label_scheme={cfg.label_scheme!r}")
    present = set(encoded["train"]["labels"])
    if len(present) < 2:
        raise ConfigError(f"the train split holds only class(es) {sorted(present)}: a classifier needs at least two")
    return encoded


@dataclass(frozen=True)
class Loaders:
    """The train, validation and (None without a test split) test loaders of a run."""

    train: Any
    validation: Any
    test: Any | None = None


def get_dataloaders(accelerator, cfg: TrainConfig, splits: Splits, packer, tokenizer_hash: str,
                    features: Sequence[TrainingFeature] = ()) -> tuple[dict[str, Any], Loaders]:
    """Encode the splits and build the loaders; each of ``features`` adds its train columns and
    may group the train batches (:mod:`suffice.training.fit.features`).

    Returns ``(encoded splits dict, loaders)``; loaders are not yet passed through ``accelerator.prepare``.
    """
    from torch.utils.data import DataLoader

    encoded = encode_splits(accelerator, cfg, splits, packer, tokenizer_hash)
    for feature in features:
        encoded["train"] = feature.add_columns(encoded["train"], accelerator)
    pad_id = packer.pad_id
    extra = feature_columns(features)
    missing = [c for c in extra if c not in encoded["train"].column_names]
    if missing:
        raise ConfigError(f"a training feature needs the train column(s) {missing}, which this data lacks")
    train_view = encoded["train"].select_columns(list(EVAL_COLUMNS) + extra)
    sampler = LengthGroupedSampler(encoded["train"]["length"], cfg.per_device_train_batch_size, cfg.seed, cfg.length_grouping,
                                   together=batch_keys(features, encoded["train"]))
    train_dl = DataLoader(train_view, batch_size=cfg.per_device_train_batch_size, sampler=sampler, collate_fn=make_collate(pad_id, extra))
    val_dl = eval_dataloader(encoded["validation"], cfg.per_device_eval_batch_size, pad_id)
    test_dl = eval_dataloader(encoded["test"], cfg.per_device_eval_batch_size, pad_id) if encoded["test"] is not None and len(encoded["test"]) else None
    return encoded, Loaders(train_dl, val_dl, test_dl)


def class_weights(labels: Sequence[int], num_labels: int, scheme: str) -> np.ndarray:
    """Balanced weights N / (K x n_c) (``scheme='balanced'``) or ones.

    >>> class_weights([0, 0, 0, 1], 2, "balanced").tolist()
    [0.6666666666666666, 2.0]
    """
    if scheme == "none":
        return np.ones(num_labels)
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_labels).astype(np.float64)
    return np.where(counts > 0, counts.sum() / (num_labels * np.maximum(counts, 1)), 0.0)
