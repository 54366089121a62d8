"""Train a sufficiency (or retrieval-gate) cross-encoder with accelerate, tracked in MLflow.

    accelerate launch -m suffice.training.train --config configs/sufficiency.yaml [--key=value ...]
    suffice train --config configs/sufficiency.yaml --lora.r=8 --num_train_epochs=3
    suffice train --config configs/sufficiency.yaml --output_dir=models/x --resume   # continue a killed run

Shaped like accelerate's ``examples/by_feature``: :func:`get_dataloaders`, :func:`train`,
:func:`main`. Encoding goes only through ``suffice.serving.packing.ContextPacker`` (the code
serving runs), inside ``main_process_first``; batches are padded per batch and grouped by
length; ``accelerator.accumulate`` does gradient accumulation, ``gather_for_metrics`` collects
evaluation outputs from every process, ``save_state``/``load_state`` checkpoint and resume.
Nothing here assumes a single process: only the main process writes files or talks to MLflow.

After training: the best epoch's weights (early stopping on validation), temperature scaling
fitted on validation logits, thresholds, test metrics per source next to the baselines, the
model directory (merged model + adapter + suffice_model.json), MLflow artifacts and a new
registered model version; then an ONNX bundle if ``export: true``.

>>> main(["--config", "configs/sufficiency.yaml", "--max_train_items=300", "--num_train_epochs=1"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from suffice.training.config import ConfigError, dump_yaml
from suffice.training.train_config import TrainConfig, build_train_config

THREE_LEVEL_INDEX = {"insufficient": 0, "partial": 1, "sufficient": 2}
EVAL_COLUMNS = ("input_ids", "token_type_ids", "labels", "row")
STATE_FILE = "trainer_state.json"
BEST_FILE = "best-trainable.safetensors"


# ------------------------------------------------------------------------------------------
# data: canonical items -> rows -> encoded datasets
# ------------------------------------------------------------------------------------------
@dataclass
class Splits:
    """Raw (not yet encoded) train/validation/test datasets and where they came from."""

    train: Any
    validation: Any
    test: Any
    data_hash: str
    label_source: str
    manifest: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str):
        return getattr(self, name)


def items_to_rows(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Canonical :class:`~suffice.training.schema.Item` objects -> rows with the prepared-data columns
    (plus ``answers``: the gold answer strings, which the answer-in-context baseline reads)."""
    from suffice.training.loaders import gold_label

    rows = []
    for it in items:
        g = gold_label(it)
        rows.append({
            "id": it.id, "question": it.question,
            "passages": [{"title": p.title, "text": p.text} for p in it.passages],
            "label": -1 if it.label is None else int(it.label), "level": it.level or "",
            "label_source": it.label_source or "", "split": it.split or "", "source": it.source or "unknown",
            "group": it.group or it.id, "variant": it.variant or "", "parent_id": it.parent_id or "",
            "gold_label": -1 if g is None else int(g), "kind": str((it.meta or {}).get("kind") or ""),
            "answers": [str(a) for a in (it.gold or {}).get("answers") or []],
        })
    return rows


def _file_hash(paths: Sequence[str | Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes())
    return h.hexdigest()[:16]


def _load_jsonl_splits(cfg: TrainConfig) -> Splits:
    from datasets import Dataset

    from suffice.training.loaders import load_items

    files = {"train": cfg.train_file, "validation": cfg.validation_file, "test": cfg.test_file}
    by_split: dict[str, list[dict[str, Any]]] = {}
    if cfg.validation_file:
        for split, path in files.items():
            if path:
                by_split[split] = items_to_rows(list(load_items(path)))
    else:
        # one file whose rows carry their split (like tests/fixtures/train20.jsonl)
        rows = items_to_rows(list(load_items(cfg.train_file)))
        for r in rows:
            by_split.setdefault(r["split"] or "train", []).append(r)
    for split in ("train", "validation"):
        if not by_split.get(split):
            raise ConfigError(
                f"no {split} items: {cfg.train_file} has no rows with split={split!r}; give --validation_file=PATH "
                "or mark rows with \"split\": \"validation\""
            )
    used = [p for p in files.values() if p]
    sources = {r["label_source"] for r in by_split["train"] if r["label_source"]}
    return Splits(
        train=Dataset.from_list(by_split["train"]), validation=Dataset.from_list(by_split["validation"]),
        test=Dataset.from_list(by_split.get("test", [])) if by_split.get("test") else None,
        data_hash=_file_hash(used), label_source=",".join(sorted(sources)) or "file",
        manifest={"files": used},
    )


def gate_rows(path: str | Path) -> list[dict[str, Any]]:
    """Retrieval-gate threads -> rows: question = latest user message, passages = earlier turns
    (title = role), label 1 = SKIP, 0 = RETRIEVE; threads opening with the same message share a group."""
    from suffice.serving.retrieval_gate import turns_as_passages

    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                msgs, label = d["messages"], d["label"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError(f"{path}, line {n}: not a gate thread ({e}); expected {{id, messages, label}}") from e
            if label not in ("RETRIEVE", "SKIP") or not msgs or msgs[-1].get("role") != "user":
                raise ConfigError(f"{path}, line {n}: label must be RETRIEVE or SKIP and the last message the user's, got {label!r}")
            first = msgs[0]["content"]
            rows.append({
                "id": str(d["id"]), "question": msgs[-1]["content"],
                "passages": turns_as_passages(msgs[:-1]),
                "label": 1 if label == "SKIP" else 0, "level": "", "label_source": "gate-dataset",
                "source": "retrieval-gate", "group": hashlib.sha1(first.encode()).hexdigest()[:12],
                "gold_label": 1 if label == "SKIP" else 0, "variant": "", "parent_id": "", "kind": str(d.get("category") or ""),
                "answers": [],
            })
    return rows


def _load_gate_splits(cfg: TrainConfig) -> Splits:
    from datasets import Dataset

    from suffice.training.paths import data_dir

    path = Path(cfg.gate.path) if cfg.gate.path else data_dir() / "retrieval-gate" / "train.jsonl"
    if not path.is_file():
        raise ConfigError(f"retrieval-gate data {path} does not exist: set gate.path to the threads JSONL")
    rows = gate_rows(path)
    out: dict[str, list] = {"train": [], "validation": [], "test": []}
    for r in rows:
        u = int(hashlib.sha256(f"{cfg.seed}:{r['group']}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        split = "test" if u < cfg.gate.test_fraction else "validation" if u < cfg.gate.test_fraction + cfg.gate.validation_fraction else "train"
        out[split].append(r)
    return Splits(
        train=Dataset.from_list(out["train"]), validation=Dataset.from_list(out["validation"]), test=Dataset.from_list(out["test"]),
        data_hash=_file_hash([path]) + f"-s{cfg.seed}", label_source="gate-dataset", manifest={"files": [str(path)]},
    )


def _load_prepared_splits(cfg: TrainConfig, is_main: bool) -> Splits:
    from suffice.training.datasets_builder import load_prepared, prepare

    data_cfg = cfg.data_config()
    # the main process builds and saves; the others (after it, under main_process_first) read that copy
    dsd, manifest = prepare(data_cfg, progress=False) if is_main else load_prepared(data_cfg.name)
    missing = [s for s in ("train", "validation") if s not in dsd or len(dsd[s]) == 0]
    if missing:
        raise ConfigError(f"the prepared data has no {missing} rows: check the data: section (sources, splits)")
    sources = sorted({s for s in dsd["train"]["label_source"] if s})
    return Splits(
        train=dsd["train"], validation=dsd["validation"], test=dsd["test"] if "test" in dsd and len(dsd["test"]) else None,
        data_hash=str(manifest.get("data_hash", "")), label_source=",".join(sources) or "unknown", manifest=dict(manifest),
    )


def load_splits(cfg: TrainConfig, is_main: bool = True) -> Splits:
    """The raw splits for ``cfg``: retrieval-gate threads, canonical JSONL files, or ``prepare(cfg.data)``.

    >>> load_splits(build_train_config(None, ["--train_file=tests/fixtures/train20.jsonl"])).train.num_rows  # doctest: +SKIP
    12
    """
    if cfg.task == "retrieval_gate":
        return _load_gate_splits(cfg)
    if cfg.train_file:
        return _load_jsonl_splits(cfg)
    return _load_prepared_splits(cfg, is_main)


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


def _subsample(ds, n: int, seed: int):
    if not n or ds is None or len(ds) <= n:
        return ds
    return ds.shuffle(seed=seed).select(range(n))


def answer_lookup(cfg: TrainConfig, ds=None) -> dict[str, list[str]]:
    """``id -> gold answer strings`` for the answer-span head: the rows' own ``answers`` column (JSONL
    inputs), the shared items (``gold.answers``) and the teacher-written synthetic questions (``answer``)."""
    from suffice.training.baselines import load_gold_answers
    from suffice.training.paths import data_dir

    d = data_dir(required=False)
    out: dict[str, list[str]] = {}
    if ds is not None and "answers" in ds.column_names:
        out.update({str(i): [str(a) for a in (ans or [])] for i, ans in zip(ds["id"], ds["answers"]) if ans})
    if d is not None and (d / "items.jsonl").is_file():
        out.update(load_gold_answers(d / "items.jsonl"))
    synth = cfg.data_config().synthetic_path or (d / "synthetic" / "squad2-questions.jsonl" if d is not None else None)
    if synth and Path(synth).is_file():
        out.update(load_gold_answers(synth))
    return out


def find_answer_span(input_ids: Sequence[int], token_type_ids: Sequence[int], answer_ids: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(start, end) token positions of the first answer found inside the packed context (segment 1),
    or (-1, -1) when none of the answers is in the window.

    >>> find_answer_span([101, 7, 102, 5, 6, 7, 8, 102], [0, 0, 0, 1, 1, 1, 1, 1], [[9], [6, 7]])
    (4, 5)
    """
    ctx = [i for i, t in enumerate(token_type_ids) if t == 1]
    if not ctx:
        return -1, -1
    lo, hi = ctx[0], ctx[-1]  # the context run ends with its [SEP]
    for ans in answer_ids:
        n = len(ans)
        if n == 0:
            continue
        first = ans[0]
        for s in range(lo, hi - n + 1):
            if input_ids[s] == first and list(input_ids[s:s + n]) == list(ans):
                return s, s + n - 1
    return -1, -1


def encode_split(ds, packer, cfg: TrainConfig, tokenizer_hash: str, answers: Mapping[str, list[str]] | None = None):
    """Pack every (question, passages) row with the ContextPacker; add labels and lengths, keep the
    labelled rows, and number them (``row``).

    With ``answers`` (``id -> answer strings``; see :func:`answer_lookup`) each row also gets the
    answer-span targets ``span_start`` / ``span_end``: the answer's token positions in the packed
    context for a sufficient item whose answer is in the window, 0 / 0 ([CLS], "no answer") for an
    insufficient one, -1 / -1 (no span loss) otherwise."""
    from suffice.serving.packing import QuestionTooLongError

    def encode(batch):
        ids, types, totals, kept, starts, ends = [], [], [], [], [], []
        parents = batch.get("parent_id") or [""] * len(batch["id"])
        for rid, parent, q, ps, label in zip(batch["id"], parents, batch["question"], batch["passages"], batch["label"]):
            try:
                p = packer.pack(q, ps)
            except QuestionTooLongError as e:
                raise QuestionTooLongError(f"item {rid}: {e}") from None
            ids.append(p.input_ids)
            types.append(p.token_type_ids)
            totals.append(p.context_tokens_total)
            kept.append(p.context_tokens_kept)
            if answers is not None:
                if label == 0:
                    span = (0, 0)
                elif label == 1:
                    strings = answers.get(rid) or (answers.get(parent) if parent else None) or []
                    span = find_answer_span(p.input_ids, p.token_type_ids, packer._encode_many([a for a in strings if a.strip()]))
                else:
                    span = (-1, -1)
                starts.append(span[0])
                ends.append(span[1])
        out = {"input_ids": ids, "token_type_ids": types, "length": [len(x) for x in ids], "labels": scheme_labels(batch, cfg.label_scheme),
               "context_tokens_total": totals, "context_tokens_kept": kept}
        if answers is not None:
            out |= {"span_start": starts, "span_end": ends}
        return out

    # an explicit fingerprint: the packer is not hashable, and the cache must change with the window
    key = f"{ds._fingerprint}|{tokenizer_hash}|{cfg.max_length}|{cfg.long_context_strategy}|{cfg.label_scheme}|v1"
    if answers is not None:
        key += "|spans-" + hashlib.sha256(json.dumps(sorted(answers.items())).encode()).hexdigest()[:12]
    fp = hashlib.sha256(key.encode()).hexdigest()[:16]
    ds = ds.map(encode, batched=True, batch_size=256, new_fingerprint=fp, desc="packing")
    # unlabelled rows (no level for three_level, say) stay out of the loss and the metrics
    ds = ds.filter(lambda lab: lab >= 0, input_columns="labels", new_fingerprint=f"{fp}-labelled", desc="labelled only")
    # "row" lets gathered evaluation outputs be put back in dataset order
    return ds.add_column("row", list(range(len(ds))), new_fingerprint=f"{fp}-rows")


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

    >>> s = LengthGroupedSampler([5, 1, 9, 3], batch_size=2, seed=0)
    >>> sorted(s) == [0, 1, 2, 3]
    True
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0, group: bool = True):
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.group = group
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
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


def make_collate(pad_id: int):
    """Pad a list of encoded rows to the longest in the batch (dynamic padding)."""
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
        if "span_start" in rows[0]:
            out["span_start"] = torch.tensor([r["span_start"] for r in rows], dtype=torch.long)
            out["span_end"] = torch.tensor([r["span_end"] for r in rows], dtype=torch.long)
        return out

    return collate


def eval_dataloader(ds, batch_size: int, pad_id: int):
    """Evaluation batches in length order (least padding); rows are re-aligned by their index."""
    from torch.utils.data import DataLoader

    order = sorted(range(len(ds)), key=lambda i: ds[i]["length"]) if len(ds) else []
    view = ds.select_columns(list(EVAL_COLUMNS))
    return DataLoader(view, batch_size=batch_size, sampler=order, collate_fn=make_collate(pad_id))


def get_dataloaders(accelerator, cfg: TrainConfig, splits: Splits, packer, tokenizer_hash: str):
    """Encode the splits (main process first, so a cache is written once) and build the loaders.

    Returns ``(encoded splits dict, train_loader, validation_loader, test_loader or None)``;
    loaders are not yet passed through ``accelerator.prepare``.
    """
    from torch.utils.data import DataLoader

    encoded: dict[str, Any] = {}
    answers = answer_lookup(cfg, splits.train) if cfg.answer_span_weight > 0 else None
    with accelerator.main_process_first():
        for name in ("train", "validation", "test"):
            ds = splits[name]
            if ds is None:
                encoded[name] = None
                continue
            ds = _subsample(ds, cfg.max_train_items if name == "train" else cfg.max_eval_items, cfg.seed)
            encoded[name] = encode_split(ds, packer, cfg, tokenizer_hash, answers if name == "train" else None)
    for name in ("train", "validation"):
        if len(encoded[name]) == 0:
            raise ConfigError(f"the {name} split has no labelled items for label_scheme={cfg.label_scheme!r}")
    present = set(encoded["train"]["labels"])
    if len(present) < 2:
        raise ConfigError(f"the train split holds only class(es) {sorted(present)}: a classifier needs at least two")
    pad_id = packer.pad_id
    train_view = encoded["train"].select_columns(list(EVAL_COLUMNS) + (["span_start", "span_end"] if answers is not None else []))
    sampler = LengthGroupedSampler(encoded["train"]["length"], cfg.per_device_train_batch_size, cfg.seed, cfg.length_grouping)
    train_dl = DataLoader(train_view, batch_size=cfg.per_device_train_batch_size, sampler=sampler, collate_fn=make_collate(pad_id))
    val_dl = eval_dataloader(encoded["validation"], cfg.per_device_eval_batch_size, pad_id)
    test_dl = eval_dataloader(encoded["test"], cfg.per_device_eval_batch_size, pad_id) if encoded["test"] is not None and len(encoded["test"]) else None
    return encoded, train_dl, val_dl, test_dl


def class_weights(labels: Sequence[int], num_labels: int, scheme: str) -> np.ndarray:
    """Balanced weights N / (K x n_c) (``scheme='balanced'``) or ones.

    >>> class_weights([0, 0, 0, 1], 2, "balanced").tolist()
    [0.6666666666666666, 2.0]
    """
    if scheme == "none":
        return np.ones(num_labels)
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_labels).astype(np.float64)
    return np.where(counts > 0, counts.sum() / (num_labels * np.maximum(counts, 1)), 0.0)


# ------------------------------------------------------------------------------------------
# predicting
# ------------------------------------------------------------------------------------------
def predict(accelerator, model, dataloader) -> tuple[np.ndarray, np.ndarray]:
    """Logits for every row of a prepared evaluation loader, gathered from all processes and
    returned in row order: ``(logits (n, k) float64, row indices (n,))``."""
    import torch

    model.eval()
    logits_all, rows_all = [], []
    with torch.no_grad():
        for batch in dataloader:
            out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"])
            logits, rows = accelerator.gather_for_metrics((out.logits.float(), batch["row"]))
            logits_all.append(logits.cpu().numpy())
            rows_all.append(rows.cpu().numpy())
    if not logits_all:
        return np.zeros((0, 0)), np.zeros(0, dtype=np.int64)
    logits = np.concatenate(logits_all).astype(np.float64)
    rows = np.concatenate(rows_all)
    order = np.argsort(rows, kind="stable")
    return logits[order], rows[order]


# ------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------
@dataclass
class TrainState:
    """Where a run is (saved as JSON next to every checkpoint; resume reads it back)."""

    run_name: str
    epoch: int = 0
    batch_in_epoch: int = 0
    global_step: int = 0
    best_metric: float | None = None
    best_epoch: int | None = None
    bad_epochs: int = 0
    stopped_early: bool = False
    history: list[dict[str, float]] = field(default_factory=list)
    mlflow_run_id: str | None = None

    @classmethod
    def load(cls, path: Path) -> "TrainState":
        return cls(**json.loads(path.read_text()))


class Checkpoints:
    """``<output_dir>/checkpoints/step-NNNNNNN`` written with ``accelerator.save_state``.

    A checkpoint counts only once its ``trainer_state.json`` exists (written last), so a run
    killed while saving resumes from the previous one.
    """

    def __init__(self, root: Path, total_limit: int):
        self.root = root
        self.total_limit = total_limit

    def complete(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted((p for p in self.root.glob("step-*") if (p / STATE_FILE).is_file()), key=lambda p: int(p.name.split("-")[1]))

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, accelerator, state: TrainState) -> Path:
        path = self.root / f"step-{state.global_step:07d}"
        accelerator.wait_for_everyone()
        accelerator.save_state(str(path))
        if accelerator.is_main_process:
            (path / STATE_FILE).write_text(json.dumps(dataclasses.asdict(state), indent=1))
            for old in self.complete()[: -self.total_limit]:
                shutil.rmtree(old, ignore_errors=True)
        accelerator.wait_for_everyone()
        return path

    @property
    def best_path(self) -> Path:
        return self.root / BEST_FILE


def _improved(cfg: TrainConfig, value: float, best: float | None) -> bool:
    if value is None or not math.isfinite(value):
        return False
    if best is None:
        return True
    return value < best if cfg.early_stopping_metric == "loss" else value > best


def validation_metrics(accelerator, model, val_dl, val_ds, cfg: TrainConfig, weights) -> tuple[dict[str, float], np.ndarray]:
    """Validation loss, accuracy, macro-F1, AUROC and ECE (uncalibrated) on the whole split, the
    means over sources of macro-F1 and AUROC (``source_macro_f1``, ``source_auroc``), and the logits."""
    from suffice.training.calibration import softmax
    from suffice.training.metrics import per_source_metrics, source_means

    logits, rows = predict(accelerator, model, val_dl)
    labels = np.asarray(val_ds["labels"])[rows]
    probs = softmax(logits)
    sources = np.asarray(val_ds["source"])[rows] if "source" in val_ds.column_names else np.full(len(labels), "all", dtype=object)
    table = per_source_metrics(probs, labels, sources, label_names=list(cfg.id2label.values()), positive_index=cfg.positive_index,
                               ece_bins=cfg.calibration.ece_bins)
    m = {**table["overall"], **source_means(table)}
    w = np.asarray(weights)[labels]
    logp = np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, 1.0))
    m["loss"] = float(-(w * logp).sum() / w.sum())  # the training objective (class-weighted)
    keep = {k: v for k, v in m.items()
            if k in ("loss", "accuracy", "macro_f1", "auroc", "ece", "nll", "binary_macro_f1", "source_macro_f1", "source_auroc")
            or k.startswith("f1_")}
    return keep, logits


def span_loss(span_head, hidden, attention_mask, start, end):
    """Cross-entropy of the answer-span head's start and end logits over the unpadded positions, on
    the rows that have a target (``start >= 0``); None when no row of the batch has one."""
    import torch
    import torch.nn.functional as F

    keep = start >= 0
    if not bool(keep.any()):
        return None
    logits = span_head(hidden[keep]).float()  # (n, L, 2)
    logits = logits.masked_fill(attention_mask[keep].unsqueeze(-1) == 0, torch.finfo(logits.dtype).min)
    return 0.5 * (F.cross_entropy(logits[..., 0], start[keep]) + F.cross_entropy(logits[..., 1], end[keep]))


def train(cfg: TrainConfig, accelerator, model, optimizer, scheduler, train_dl, val_dl, val_ds, weights, state: TrainState,
          checkpoints: Checkpoints, tracker, total_steps: int, num_epochs: int, span_head=None) -> tuple[TrainState, np.ndarray | None]:
    """The loop: accumulate, step, log; validate each epoch; keep the best weights; early-stop; checkpoint.

    ``span_head`` (``cfg.answer_span_weight > 0``): the auxiliary answer-span layer, whose loss on the
    last hidden states is added to the classification loss.

    Returns the final state and the best epoch's validation logits (None if that epoch ran
    before a resume), which temperature scaling then uses without another pass.
    """
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    from suffice.training.model import trainable_state_dict

    weight_t = torch.tensor(weights, dtype=torch.float32, device=accelerator.device)
    progress = tqdm(total=total_steps, initial=state.global_step, disable=not accelerator.is_local_main_process, desc="train", dynamic_ncols=True)
    resumed_mid_epoch = state.batch_in_epoch > 0
    best_logits = None
    for epoch in range(state.epoch, num_epochs):
        model.train()
        train_dl.set_epoch(epoch)
        skip = state.batch_in_epoch if (resumed_mid_epoch and epoch == state.epoch) else 0
        loader = accelerator.skip_first_batches(train_dl, skip) if skip else train_dl
        if not skip:
            state.batch_in_epoch = 0
        run_loss, run_n, seen, t0 = 0.0, 0, 0, time.perf_counter()
        for batch in loader:
            with accelerator.accumulate(model):
                out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"],
                            output_hidden_states=span_head is not None)
                loss = F.cross_entropy(out.logits.float(), batch["labels"], weight=weight_t)
                if span_head is not None:
                    aux = span_loss(span_head, out.hidden_states[-1], batch["attention_mask"], batch["span_start"], batch["span_end"])
                    if aux is not None:
                        loss = loss + cfg.answer_span_weight * aux
                    else:  # keep the head in the graph: DDP expects a gradient for every parameter
                        loss = loss + 0.0 * sum(p.sum() for p in span_head.parameters())
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            state.batch_in_epoch += 1
            run_loss += float(loss.detach())
            run_n += 1
            seen += len(batch["labels"]) * accelerator.num_processes
            if not accelerator.sync_gradients:
                continue
            state.global_step += 1
            rate = seen / max(time.perf_counter() - t0, 1e-9)
            progress.update(1)
            progress.set_postfix(epoch=epoch + 1, loss=f"{run_loss / run_n:.4f}", ex_s=f"{rate:.1f}")
            if state.global_step % cfg.log_every_steps == 0 or state.global_step == total_steps:
                mean_loss = float(accelerator.reduce(torch.tensor(run_loss / run_n, device=accelerator.device), "mean"))
                tracker.log_metrics({"train_loss": mean_loss, "train_examples_per_s": rate,
                                     "lr_encoder": scheduler.get_last_lr()[0], "epoch_progress": epoch + state.batch_in_epoch / len(train_dl)},
                                    step=state.global_step)
                run_loss, run_n = 0.0, 0
            if cfg.checkpoint_every_steps and state.global_step % cfg.checkpoint_every_steps == 0:
                checkpoints.save(accelerator, state)
            if state.global_step >= total_steps:
                break
        resumed_mid_epoch = False
        # -- end of epoch: validate, early stopping, checkpoint ----------------------------
        val, val_logits = validation_metrics(accelerator, model, val_dl, val_ds, cfg, weights)
        epoch_rate = seen / max(time.perf_counter() - t0, 1e-9)
        tracker.log_metrics({f"val_{k}": v for k, v in val.items()} | {"epoch_train_examples_per_s": epoch_rate}, step=epoch + 1)
        val["epoch"], val["train_examples_per_s"] = epoch + 1, epoch_rate
        state.history.append(val)
        if accelerator.is_main_process:  # tqdm.write keeps the line off the progress bar
            progress.write(
                f"epoch {epoch + 1}/{num_epochs}: val loss {val['loss']:.4f} acc {val.get('accuracy', float('nan')):.3f} "
                f"macro-F1 {val.get('macro_f1', float('nan')):.3f} AUROC {val.get('auroc', float('nan')):.3f} "
                f"ECE {val.get('ece', float('nan')):.3f}; per-source mean macro-F1 {val.get('source_macro_f1', float('nan')):.3f} "
                f"AUROC {val.get('source_auroc', float('nan')):.3f} ({val['train_examples_per_s']:.1f} train ex/s)"
            )
        if _improved(cfg, val.get(cfg.early_stopping_metric), state.best_metric):
            state.best_metric, state.best_epoch, state.bad_epochs = float(val[cfg.early_stopping_metric]), epoch + 1, 0
            best_logits = val_logits
            if accelerator.is_main_process:
                from safetensors.torch import save_file

                checkpoints.root.mkdir(parents=True, exist_ok=True)
                save_file(trainable_state_dict(accelerator.unwrap_model(model)), str(checkpoints.best_path))
        else:
            state.bad_epochs += 1
        state.epoch, state.batch_in_epoch = epoch + 1, 0
        stop = cfg.early_stopping_patience > 0 and state.bad_epochs >= cfg.early_stopping_patience
        state.stopped_early = stop and epoch + 1 < num_epochs
        checkpoints.save(accelerator, state)
        if stop or state.global_step >= total_steps:
            if state.stopped_early and accelerator.is_main_process:
                progress.write(f"early stopping: no {cfg.early_stopping_metric} improvement for {state.bad_epochs} epoch(s)")
            break
    progress.close()
    return state, best_logits


# ------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------
def _resolve_mixed_precision(setting: str) -> str | None:
    if setting != "auto":
        return setting
    if os.environ.get("ACCELERATE_MIXED_PRECISION"):
        return None  # what `accelerate config` / `accelerate launch --mixed_precision` chose
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "no"


def _cpu_threads(cfg: TrainConfig) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return cfg.torch_threads or max(1, cores // max(local, 1))


def _find_resume_dir(cfg: TrainConfig) -> Path:
    from suffice.training.paths import REPO_ROOT

    if cfg.output_dir:
        return Path(cfg.output_dir)
    candidates = sorted((REPO_ROOT / "models").glob(f"{cfg.task}-*/checkpoints/step-*/{STATE_FILE}"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise ConfigError("--resume found no checkpoint under models/: give --output_dir=DIR of the run to continue")
    return candidates[-1].parents[2]


def _temperature_and_thresholds(cfg: TrainConfig, val_logits: np.ndarray, val_labels: np.ndarray) -> tuple[float, dict[str, float], dict[str, Any]]:
    from suffice.training.calibration import fit_temperature, softmax, threshold_for_precision

    from suffice.training.calibration import T_MAX

    t = fit_temperature(val_logits, val_labels) if cfg.calibration.temperature == "fit" else 1.0
    if t >= 0.99 * T_MAX:
        print(f"warning: the fitted temperature {t:.1f} sits at its bound: the validation logits carry almost no signal, "
              "so calibration flattens every score towards the base rate (train longer or check the data)", file=sys.stderr)
    info: dict[str, Any] = {}
    if cfg.task == "retrieval_gate":
        p_skip = softmax(val_logits, t)[:, cfg.positive_index]
        th, achieved = threshold_for_precision(p_skip, (val_labels == cfg.positive_index).astype(int), cfg.calibration.skip_min_precision)
        info = {"skip_min_precision": cfg.calibration.skip_min_precision, "validation_skip_precision": achieved}
        return t, {"skip": th}, info
    return t, {"sufficient": cfg.calibration.sufficient, "partial": cfg.calibration.partial}, info


def _run_dir(cfg: TrainConfig, accelerator) -> tuple[str, Path, TrainState | None]:
    """Run name, output directory and (with ``--resume``) the state of the newest checkpoint.

    The name carries a timestamp, so the main process picks it and the others receive it.
    """
    from accelerate.utils import broadcast_object_list

    if cfg.resume:
        out_dir = _find_resume_dir(cfg)
        latest = Checkpoints(out_dir / "checkpoints", cfg.checkpoints_total_limit).latest()
        if latest is None:
            raise ConfigError(f"--resume: {out_dir}/checkpoints holds no complete checkpoint; start without --resume")
        state = TrainState.load(latest / STATE_FILE)
        return state.run_name, out_dir, state
    run_name = cfg.tracking.run_name or f"{cfg.task}-{cfg.finetune}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_name = broadcast_object_list([run_name])[0]
    out_dir = cfg.resolved_output_dir(run_name)
    ckpt = out_dir / "checkpoints"
    if accelerator.is_main_process and ckpt.exists():
        accelerator.print(f"note: clearing old checkpoints in {ckpt} (a fresh run; pass --resume to continue one)")
        shutil.rmtree(ckpt)
    accelerator.wait_for_everyone()
    return run_name, out_dir, None


def _describe(cfg: TrainConfig, accelerator, run_name: str, out_dir: Path, encoded, weights, n_params: tuple[int, int],
              steps_per_epoch: int, total_steps: int, num_epochs: int) -> dict[str, Any]:
    """Print the derived numbers of the run (nanoGPT-style) and return them for tracking."""
    import torch

    stats = {name: packing_stats(encoded[name]) for name in ("train", "validation", "test")}
    counts = {name: (0 if encoded[name] is None else len(encoded[name])) for name in ("train", "validation", "test")}
    balance = np.bincount(np.asarray(encoded["train"]["labels"]), minlength=cfg.num_labels).tolist()
    n_trainable, n_total = n_params
    accelerator.print(
        f"suffice train: {run_name}\n"
        f"  task {cfg.task} / {cfg.label_scheme}, base {cfg.base_model}, {cfg.finetune}"
        + (f" (r={cfg.lora.r}, alpha={cfg.lora.alpha})" if cfg.finetune == "lora" else "") + "\n"
        f"  items train/validation/test {counts['train']}/{counts['validation']}/{counts['test']}; train classes "
        f"{dict(zip(cfg.id2label.values(), balance))}; class weights {np.round(weights, 3).tolist()}\n"
        f"  window {cfg.max_length} tokens, strategy {cfg.long_context_strategy}: mean tokens/example "
        f"{stats['train'].get('mean_tokens', 0):.0f}, contexts cut {stats['train'].get('truncated_share', 0):.1%} (train)\n"
        f"  processes {accelerator.num_processes} on {accelerator.device} (mixed precision {accelerator.mixed_precision}, "
        f"{torch.get_num_threads()} threads); effective batch {cfg.effective_batch_size(accelerator.num_processes)}; "
        f"{steps_per_epoch} steps/epoch, {total_steps} steps over {num_epochs} epoch(s), warm-up {int(cfg.warmup_ratio * total_steps)}\n"
        f"  trainable parameters {n_trainable:,} of {n_total:,} ({n_trainable / n_total:.1%}); lr {cfg.learning_rate:g}, "
        f"head lr {cfg.resolved_head_learning_rate():g}\n"
        f"  output {out_dir}"
        + (_span_line(encoded["train"], cfg) if cfg.answer_span_weight > 0 else "")
    )
    return {"stats": stats, "counts": counts, "span": span_coverage(encoded["train"])}


def span_coverage(ds) -> dict[str, float]:
    """How many train rows the answer-span head learns from: answer spans found in the window, [CLS]
    targets (insufficient rows), and sufficient rows without a usable answer."""
    if ds is None or "span_start" not in ds.column_names or len(ds) == 0:
        return {}
    start, labels = np.asarray(ds["span_start"]), np.asarray(ds["labels"])
    sufficient = labels == (labels.max() if labels.size else 1)
    return {"span_rows_answer": int((start > 0).sum()), "span_rows_no_answer": int((start == 0).sum()),
            "span_rows_none": int((start < 0).sum()),
            "span_answer_found_share_of_sufficient": float((start[sufficient] > 0).mean()) if sufficient.any() else 0.0}


def _span_line(ds, cfg: TrainConfig) -> str:
    c = span_coverage(ds)
    return (f"\n  answer-span head (weight {cfg.answer_span_weight:g}): {c['span_rows_answer']} rows with the answer in the window "
            f"({c['span_answer_found_share_of_sufficient']:.0%} of sufficient rows), {c['span_rows_no_answer']} [CLS] targets, "
            f"{c['span_rows_none']} without a span target")


def _start_tracking(cfg: TrainConfig, accelerator, tracker, state: TrainState, splits: Splits, derived: dict[str, Any],
                    resumed: bool, commit: str | None, total_steps: int, n_trainable: int) -> None:
    """Open (or, resumed, reopen) the MLflow run; a fresh run logs params, data stats and the resolved config."""
    from suffice.training.config import config_to_dict, flatten
    from suffice.training.tracking import config_params

    state.mlflow_run_id = tracker.start(state.run_name, run_id=state.mlflow_run_id, tags={
        "task": cfg.task, "base_model": cfg.base_model, "finetune": cfg.finetune, "label_source": splits.label_source,
        "data_hash": splits.data_hash, "mlflow.source.git.commit": commit or "unknown"})
    if resumed:
        return
    params = config_params(cfg)
    if cfg.task == "sufficiency" and not cfg.train_file:  # the data section with its defaults filled in
        params.update({f"data.{k}": str(v) for k, v in flatten(config_to_dict(cfg.data_config())).items()})
    tracker.log_params({**params, "git_commit": commit or "unknown", "data_hash": splits.data_hash,
                        "label_source": splits.label_source, "num_processes": accelerator.num_processes,
                        "effective_batch_size": cfg.effective_batch_size(accelerator.num_processes),
                        "total_steps": total_steps, "trainable_parameters": n_trainable,
                        **{f"items_{k}": v for k, v in derived["counts"].items()}})
    tracker.log_metrics({f"data_{s}_{k}": v for s, m in derived["stats"].items() for k, v in m.items()}
                        | {f"data_train_{k}": v for k, v in derived.get("span", {}).items()}, step=0)
    tracker.log_text(dump_yaml(cfg), "resolved_config.yaml")
    if splits.manifest:
        tracker.log_text(json.dumps(splits.manifest, indent=2, default=str), "data_manifest.json")


def _save_and_register(cfg: TrainConfig, model, base_dir: Path, out_dir: Path, meta: dict[str, Any], test_report, tracker,
                       state: TrainState, val_ds) -> dict[str, Any]:
    """Main process: model directory, evaluation artifacts, registered version, model artifacts, bundle."""
    from suffice.training import evaluate as ev
    from suffice.training.model import save_model_dir, write_model_meta

    out: dict[str, Any] = {}
    save_model_dir(model, out_dir, base_dir, meta)
    (out_dir / "train_config.yaml").write_text(dump_yaml(cfg))
    if test_report is not None:
        ev_dir = out_dir / "evaluation"
        out["plots"] = [str(p) for p in ev.save_plots(test_report, ev_dir)]
        (ev_dir / "test_metrics.json").write_text(json.dumps(ev.report_json(test_report), indent=2))
        (ev_dir / "test_table.txt").write_text(ev.render_report(test_report) + "\n")
        tracker.log_metrics(ev.report_metrics(test_report, "test"), step=state.epoch)
        tracker.log_artifacts(ev_dir, "evaluation")
    test = meta["metrics"].get("test") or {}
    finetune = meta.get("finetune", cfg.finetune)  # "soup" for an averaged model (suffice soup)
    if cfg.tracking.register and tracker.enabled:
        version = tracker.register(cfg.registered_model, "model", tags={
            "task": cfg.task, "base_model": cfg.base_model, "label_source": meta["label_source"], "data_hash": meta["data_hash"],
            "finetune": finetune, "label_scheme": cfg.label_scheme,
            "test_macro_f1": f"{test['macro_f1']:.4f}" if test.get("macro_f1") is not None else "n/a",
            "test_auroc": f"{test['auroc']:.4f}" if test.get("auroc") is not None else "n/a"},
            description=f"{state.run_name}: {finetune} on {cfg.base_model}, {meta['label_source']} labels, data {meta['data_hash']}")
        meta["mlflow"] = {"run_id": state.mlflow_run_id, "registered_model": cfg.registered_model, "version": version}
        write_model_meta(out_dir, meta)
        out["registered"] = f"models:/{cfg.registered_model}/{version}"
    if cfg.tracking.log_model_artifacts:
        _log_model_dir(tracker, out_dir)
    out["bundle"] = _maybe_export(cfg, out_dir, val_ds, meta, tracker)
    return out


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train, calibrate, evaluate, save, track and register one model; returns a summary dict.

    >>> run(build_train_config("configs/sufficiency.yaml", ["--num_train_epochs=1"]))["registered"]  # doctest: +SKIP
    'models:/suffice-sufficiency/4'
    """
    import datasets
    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed
    from transformers import get_scheduler

    from suffice.serving.bundle import sha256_file
    from suffice.serving.packing import ContextPacker
    from suffice.training import evaluate as ev
    from suffice.training.calibration import softmax
    from suffice.training.metrics import json_safe
    from suffice.training.model import (build_model, load_tokenizer, load_trainable_state_dict, optimizer_groups,
                                        resolve_base_dir, trainable_parameters)
    from suffice.training.tracking import RunTracker, git_commit, ui_command

    wall0 = time.perf_counter()
    accelerator = Accelerator(
        mixed_precision=_resolve_mixed_precision(cfg.mixed_precision),
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        project_config=ProjectConfiguration(automatic_checkpoint_naming=False),
    )
    if accelerator.device.type == "cpu":
        torch.set_num_threads(_cpu_threads(cfg))
    set_seed(cfg.seed)
    datasets.disable_progress_bars()
    run_name, out_dir, resume_state = _run_dir(cfg, accelerator)
    checkpoints = Checkpoints(out_dir / "checkpoints", cfg.checkpoints_total_limit)

    # -- data: packed by the serving code, main process first ------------------------------------
    base_dir = resolve_base_dir(cfg.base_model)
    if not isinstance(base_dir, Path):
        from huggingface_hub import snapshot_download

        base_dir = Path(snapshot_download(str(base_dir)))
    packer = ContextPacker(load_tokenizer(base_dir), max_length=cfg.max_length, strategy=cfg.long_context_strategy)
    with accelerator.main_process_first():
        splits = load_splits(cfg, accelerator.is_main_process)
    encoded, train_dl, val_dl, test_dl = get_dataloaders(accelerator, cfg, splits, packer, sha256_file(base_dir / "tokenizer.json"))
    weights = class_weights(encoded["train"]["labels"], cfg.num_labels, cfg.class_weighting)

    # -- model, optimiser, schedule -----------------------------------------------------------------
    model = build_model(base_dir, num_labels=cfg.num_labels, id2label=cfg.id2label, finetune=cfg.finetune, lora_r=cfg.lora.r,
                        lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout, target_modules=cfg.lora.target_modules,
                        modules_to_save=cfg.lora.modules_to_save, freeze_layers=cfg.freeze_layers,
                        encoder_layers=cfg.encoder_layers)
    n_params = trainable_parameters(model)
    groups = optimizer_groups(model, cfg.learning_rate, cfg.resolved_head_learning_rate(), cfg.weight_decay)
    span_head = None
    if cfg.answer_span_weight > 0:  # training-only: not part of the saved model (see TrainConfig.answer_span_weight)
        span_head = torch.nn.Linear(model.config.hidden_size, 2)
        groups.append({"params": list(span_head.parameters()), "lr": cfg.resolved_head_learning_rate(), "weight_decay": 0.0,
                       "name": "answer-span-head"})
    optimizer = torch.optim.AdamW(groups)
    # the schedule counts steps on the unsharded loader: accelerate steps it once per process
    sched_total = (cfg.max_steps * accelerator.num_processes if cfg.max_steps
                   else math.ceil(len(train_dl) / cfg.gradient_accumulation_steps) * cfg.num_train_epochs)
    scheduler = get_scheduler(cfg.lr_scheduler if cfg.lr_scheduler != "constant" else "constant_with_warmup", optimizer,
                              num_warmup_steps=int(cfg.warmup_ratio * sched_total), num_training_steps=sched_total)
    model, optimizer, train_dl, val_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, val_dl, scheduler)
    if span_head is not None:
        span_head = accelerator.prepare(span_head)
    test_dl = accelerator.prepare(test_dl) if test_dl is not None else None
    steps_per_epoch = math.ceil(len(train_dl) / cfg.gradient_accumulation_steps)
    total_steps = cfg.max_steps or steps_per_epoch * cfg.num_train_epochs
    num_epochs = math.ceil(total_steps / steps_per_epoch)
    derived = _describe(cfg, accelerator, run_name, out_dir, encoded, weights, n_params, steps_per_epoch, total_steps, num_epochs)

    tracker = RunTracker(cfg.tracking.enabled, cfg.tracking.tracking_uri, cfg.tracking.experiment, accelerator.is_main_process)
    state = resume_state or TrainState(run_name=run_name)
    commit = git_commit()
    _start_tracking(cfg, accelerator, tracker, state, splits, derived, resume_state is not None, commit, total_steps, n_params[0])
    try:
        if resume_state is not None:
            latest = checkpoints.latest()
            accelerator.print(f"resuming from {latest} (epoch {state.epoch + 1}, batch {state.batch_in_epoch}, step {state.global_step})")
            accelerator.load_state(str(latest))

        # -- train, then go back to the best epoch ----------------------------------------------
        train_t0 = time.perf_counter()
        state, val_logits = train(cfg, accelerator, model, optimizer, scheduler, train_dl, val_dl, encoded["validation"], weights,
                                  state, checkpoints, tracker, total_steps, num_epochs, span_head=span_head)
        train_seconds = time.perf_counter() - train_t0
        accelerator.wait_for_everyone()
        if checkpoints.best_path.is_file():
            from safetensors.torch import load_file

            load_trainable_state_dict(accelerator.unwrap_model(model), load_file(str(checkpoints.best_path)))
        if val_logits is None:  # the best epoch ran before a resume: score validation again
            val_logits, _ = predict(accelerator, model, val_dl)

        # -- calibrate on validation, evaluate on test --------------------------------------------
        temperature, thresholds, threshold_info = _temperature_and_thresholds(cfg, val_logits, np.asarray(encoded["validation"]["labels"]))
        val_report = ev.classification_report(softmax(val_logits, temperature), encoded["validation"], label_names=list(cfg.id2label.values()),
                                              positive_index=cfg.positive_index, ece_bins=cfg.calibration.ece_bins)
        tracker.log_metrics({"val_temperature": temperature, **{f"val_calibrated_{k}": v for k, v in val_report["overall"].items()
                                                                  if k in ("ece", "nll", "macro_f1", "auroc", "accuracy")}}, step=state.epoch)
        test_report = None
        if cfg.evaluate_test and test_dl is not None:
            test_logits, _ = predict(accelerator, model, test_dl)
            if accelerator.is_main_process:
                test_report = ev.full_report(softmax(test_logits, temperature), encoded["test"], train_ds=encoded["train"],
                                             id2label=cfg.id2label, positive_index=cfg.positive_index, ece_bins=cfg.calibration.ece_bins,
                                             thresholds=thresholds, baselines=cfg.resolved_baselines(), split="test")
                accelerator.print(ev.render_report(test_report))

        # -- save, register, export (main process) -----------------------------------------------
        summary: dict[str, Any] = {"run_name": run_name, "output_dir": str(out_dir), "temperature": temperature, "thresholds": thresholds,
                                   "train_seconds": train_seconds, "best_epoch": state.best_epoch, "history": state.history,
                                   "mlflow_run_id": state.mlflow_run_id}
        if accelerator.is_main_process:
            test_overall = (test_report or {}).get("model", {}).get("overall", {})
            meta = {
                "task": cfg.task, "label_scheme": cfg.label_scheme, "id2label": {str(k): v for k, v in cfg.id2label.items()},
                "positive_label": cfg.positive_label, "max_length": cfg.max_length, "long_context_strategy": cfg.long_context_strategy,
                "calibration": {"method": "temperature", "temperature": temperature, **threshold_info}, "thresholds": thresholds,
                "base_model": cfg.base_model, "finetune": cfg.finetune, "label_source": splits.label_source, "data_hash": splits.data_hash,
                "git_commit": commit, "mlflow": {"run_id": state.mlflow_run_id, "registered_model": None, "version": None},
                "metrics": json_safe({"test": test_overall, "validation": val_report["overall"], "best_epoch": state.best_epoch}),
                "train_seconds": round(train_seconds, 1),
            }
            summary.update(_save_and_register(cfg, accelerator.unwrap_model(model), base_dir, out_dir, meta, test_report, tracker,
                                              state, encoded["validation"]))
            summary["test"] = test_overall
            total = time.perf_counter() - wall0
            tracker.log_metrics({"train_seconds": train_seconds, "wall_seconds": total, "best_epoch": float(state.best_epoch or 0)},
                                step=state.epoch)
            tracker.set_tags({"stopped_early": state.stopped_early, "output_dir": str(out_dir)})
            accelerator.print(
                f"\nmodel: {out_dir}" + (f"\nregistered: {summary['registered']}" if summary.get("registered") else "")
                + (f"\nbundle: {summary['bundle']}" if summary.get("bundle") else "")
                + (f"\nMLflow run {state.mlflow_run_id}: {ui_command(cfg.tracking.tracking_uri)}" if tracker.enabled else "")
                + f"\nwall time {total:.0f} s (training {train_seconds:.0f} s)"
            )
    except BaseException as e:
        tracker.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    tracker.end("FINISHED")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


def _log_model_dir(tracker, out_dir: Path) -> None:
    """Log the model directory as the ``model`` artifact, without checkpoints/evaluation/bundle."""
    for p in sorted(out_dir.iterdir()):
        if p.name in ("checkpoints", "evaluation", "bundle"):
            continue
        if p.is_dir():
            tracker.log_artifacts(p, f"model/{p.name}")
        else:
            tracker.log_artifact(p, "model")


def _maybe_export(cfg: TrainConfig, out_dir: Path, val_ds, meta: dict[str, Any], tracker) -> str | None:
    """``export: true``: write the ONNX bundle with suffice.training.export (when that module exists).

    A failed export (a parity check, say) is reported and tagged on the run, but the trained,
    registered model stays: export can be re-run later with ``suffice export --model DIR``.
    """
    if not cfg.export:
        return None
    try:
        from suffice.training.export import ExportError, ParityError, export_bundle
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("suffice"):
            print(f"export: skipped, {e.name} is not available in this version (the model directory is complete)", file=sys.stderr)
            return None
        raise
    bundle_dir = Path(cfg.export_dir) if cfg.export_dir else out_dir / "bundle"
    pos = meta_positive(meta)
    n = min(200, len(val_ds))
    items = [{"question": q, "passages": p, "label": int(lab == pos)}
             for q, p, lab in zip(val_ds["question"][:n], val_ds["passages"][:n], val_ds["labels"][:n])]
    mlflow_info = meta.get("mlflow") or {}
    kwargs = dict(validation_items=items, overwrite=True, registered_model=mlflow_info.get("registered_model"),
                  model_version=mlflow_info.get("version"))
    try:
        try:
            path = export_bundle(out_dir, bundle_dir, **kwargs)
        except ParityError as e:
            if not e.check.startswith("int8"):
                raise
            # int8 refused (its decisions drift from fp32 on near-threshold items): still ship the
            # checked fp32 bundle, and say so on the run
            print(f"int8 refused by its parity check ({e}); writing the fp32 bundle only", file=sys.stderr)
            tracker.set_tags({"export_int8_refused": str(e)[:500]})
            path = export_bundle(out_dir, bundle_dir, quantize=False, **kwargs)
    except ExportError as e:
        print(f"export failed: {e}\nthe model directory {out_dir} is complete; retry with `suffice export --model {out_dir}`", file=sys.stderr)
        tracker.set_tags({"export_error": str(e)[:500]})
        return None
    tracker.log_artifacts(path, "bundle")
    return str(path)


def meta_positive(meta: dict[str, Any]) -> int:
    return next(int(i) for i, name in meta["id2label"].items() if name == meta["positive_label"])


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="suffice train",
        description="Train a sufficiency / retrieval-gate cross-encoder. Any TrainConfig field can be overridden with "
                    "--key=value (nested: --lora.r=8, --data.sources=[squad2]); --resume continues the newest checkpoint.",
    )
    ap.add_argument("--config", help="YAML config (configs/sufficiency.yaml, configs/sufficiency-full.yaml, configs/retrieval-gate.yaml)")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return ap


def main(argv: list[str] | None = None) -> int:
    """``suffice train`` and ``accelerate launch -m suffice.training.train``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, overrides = build_parser().parse_known_args(argv)
    try:
        cfg = build_train_config(args.config, overrides)
    except ConfigError as e:
        print(f"suffice train: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return 0
    try:
        run(cfg)
    except ConfigError as e:
        print(f"suffice train: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
