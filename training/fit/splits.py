"""Raw (not yet encoded) train/validation/test splits for both tasks.

Sufficiency items come from canonical JSONL files (``train_file`` ...) or from the prepared
DatasetDict (``prepare(cfg.data)``); retrieval-gate threads from ``gate.path``, split by a hash
of (seed, thread group) so every thread opening with the same message lands in one split.

>>> load_splits(build_train_config(None, ["--train_file=tests/fixtures/train20.jsonl"])).train.num_rows  # doctest: +SKIP
12
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from suffice.serving.config import ConfigError
from suffice.training.fit.config import TrainConfig


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
    """Canonical :class:`~suffice.training.data.schema.Item` objects -> rows with the prepared-data columns
    (plus ``answers``: the gold answer strings, which the answer-in-context baseline reads)."""
    from suffice.training.data.loaders import gold_label

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


def file_hash(paths: Sequence[str | Path]) -> str:
    """The first 16 hex digits of the SHA-256 of the files' bytes, in order (the run's ``data_hash``)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes())
    return h.hexdigest()[:16]


def load_jsonl_splits(cfg: TrainConfig) -> Splits:
    """Splits from canonical JSONL: ``train_file`` / ``validation_file`` / ``test_file``, or one file whose rows carry their split."""
    from datasets import Dataset

    from suffice.training.data.loaders import load_items

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
        data_hash=file_hash(used), label_source=",".join(sorted(sources)) or "file",
        manifest={"files": used},
    )


def load_gate_splits(cfg: TrainConfig) -> Splits:
    """Retrieval-gate splits from ``gate.path`` (default ``data/retrieval-gate/train.jsonl``)."""
    from datasets import Dataset

    from suffice.training.paths import data_dir

    path = Path(cfg.gate.path) if cfg.gate.path else data_dir() / "retrieval-gate" / "train.jsonl"
    if not path.is_file():
        raise ConfigError(f"retrieval-gate data {path} does not exist: set gate.path to the threads JSONL")
    from suffice.training.data.schema import DataFormatError
    from suffice.training.data.threads import gate_splits

    extra = [Path(f) for f in cfg.gate.extra_paths]
    missing = [str(f) for f in extra if not f.is_file()]
    if missing:
        raise ConfigError(f"gate.extra_paths: {missing} do not exist: give thread JSONL files (paths are read from {Path.cwd()})")
    try:
        out = gate_splits(path, cfg.gate.split, cfg.seed, cfg.gate.test_fraction, cfg.gate.validation_fraction, cfg.gate.pairs_path, extra)
    except (DataFormatError, FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{e}; fix the thread, or set gate.path / gate.pairs_path / gate.extra_paths / gate.split") from e
    files = [path] + ([Path(cfg.gate.pairs_path) if cfg.gate.pairs_path else path.parent / "pairs.jsonl"] if cfg.gate.split == "domains" else []) + extra
    out = add_styled_copies(out, cfg)
    styled = f"-styles{'+'.join(cfg.gate.styles)}x{cfg.gate.style_copies}{'v' if cfg.gate.style_validation else ''}" if cfg.gate.styles else ""
    return Splits(
        train=Dataset.from_list(out["train"]), validation=Dataset.from_list(out["validation"]), test=Dataset.from_list(out["test"]),
        data_hash=file_hash(files) + f"-s{cfg.seed}" + ("-domains" if cfg.gate.split == "domains" else "") + styled,
        label_source="gate-dataset", manifest={"files": [str(f) for f in files], "split": cfg.gate.split},
    )


def add_styled_copies(splits: dict[str, list[dict[str, Any]]], cfg: TrainConfig) -> dict[str, list[dict[str, Any]]]:
    """The gate splits with ``gate.styles`` applied (:mod:`suffice.training.data.styles`): ``style_copies``
    styled copies of each train thread, and (``style_validation``) one copy of each validation thread per
    style, for the per-style SKIP threshold. Test stays the writer's own: held-out styles are the benchmark's."""
    from suffice.training.data.styles import styled_copies

    g = cfg.gate
    if not g.styles:
        return splits
    out = dict(splits)
    out["train"] = [*splits["train"], *styled_copies(splits["train"], g.styles, g.style_copies, cfg.seed)]
    if g.style_validation:
        out["validation"] = [*splits["validation"], *styled_copies(splits["validation"], g.styles, len(g.styles), cfg.seed)]
    return out


def load_prepared_splits(cfg: TrainConfig, is_main: bool = True) -> Splits:
    """Splits of the prepared DatasetDict for ``cfg.data`` (built by the main process, read by the others)."""
    from suffice.training.data.builder import load_prepared, prepare

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
        return load_gate_splits(cfg)
    if cfg.train_file:
        return load_jsonl_splits(cfg)
    return load_prepared_splits(cfg, is_main)


def answer_lookup(cfg: TrainConfig, ds=None) -> dict[str, list[str]]:
    """``id -> gold answer strings`` of the rows of ``ds`` (their ``answers`` column), else of the train
    split the config's data: section builds (:func:`suffice.training.data.builder.answers_by_id`)."""
    from suffice.training.data.builder import answers_by_id, build

    return answers_by_id(ds if ds is not None else build(cfg.data_config(), progress=False)[0]["train"])
