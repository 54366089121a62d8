"""Build the prepared ``datasets.DatasetDict`` (train / validation / test) and its manifest.

Inputs: the shared ``items.jsonl`` (fixed splits), ``autorater-labels.jsonl`` (the teacher), optional
user files in any loader format, constructed variants and the teacher-written synthetic questions.
Output, under ``prepared_dir()/<name>/``: ``DatasetDict.save_to_disk`` files plus ``manifest.json``
(counts per split/source/label/label_source/variant, empty-passage and dropped counts, sha256 of
every input file, the resolved config, teacher-vs-gold agreement and a ``data_hash`` over all rows
and the config) so a training run can record exactly what it saw.

Columns: id, question, passages (list of {title, text}), label (int, -1 = none), level, label_source,
split, source, group, variant, parent_id, gold_label (int, -1 = none), kind, generator. Missing
strings are "" (so filters like ``ds.filter(lambda r: r["variant"] == "")`` need no None checks).

Nothing here imports torch.

>>> ds, manifest = prepare(DataConfig(name="demo", include_variants=False))  # doctest: +SKIP
>>> manifest["counts"]["by_split"]["test"]["total"]  # doctest: +SKIP
1629
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from suffice.serving.config import ConfigError, config_to_dict
from suffice.training.data.labels import agreement_by_source, apply_labels, cohen_kappa  # noqa: F401  (cohen_kappa: re-exported)
from suffice.training.data.loaders import (LoadReport, gold_label, hash_split, load_items,
                                           read_autorater_labels, sha256_file)
from suffice.training.data.pretrain import KINDS as PRETRAIN_KINDS
from suffice.training.data.pretrain import check_kinds, pretrain_rows
from suffice.training.data.schema import SPLITS, SYNTHETIC_SUFFIX, DataFormatError, Item
from suffice.training.data.variants import RULES, make_variants, retrieval_like_variants
from suffice.training.paths import data_dir as resolve_data_dir
from suffice.training.paths import prepared_dir

COLUMNS = ("id", "question", "passages", "label", "level", "label_source", "split", "source", "group",
           "variant", "parent_id", "gold_label", "kind", "generator")
MANIFEST = "manifest.json"


@dataclass
class DataConfig:
    """How to turn the shared data (plus optional user files) into a prepared dataset.

    name: output folder under ``prepared_dir()`` (letters, digits, ``._-``).
    data_dir: the shared data directory; None = ``$SUFFICE_DATA_DIR`` or ``../shared/data``.
    label_source: ``autorater`` (the teacher's labels) or ``gold`` (derived from each dataset's own
        annotations: SQuAD answerable, QED explanation_type != none, HotPotQA/MuSiQue all
        supporting passages present).
    fallback: what an item without a label from ``label_source`` gets (hotpotqa-distractor and
        musique have no autorater labels): ``other`` = the other source (gold <-> autorater),
        ``unlabelled`` = keep it with label -1, ``drop`` = drop it (counted in the manifest).
    sources: keep only these sources of items.jsonl / extra_files (empty = all); synthetic questions
        (source ``<base>-synthetic``) are kept only when their base source is listed.
    extra_files: user files in any loader format (SQuAD, HotPotQA, MuSiQue, QED, canonical);
        items without a split get ``hash_split(article or group, extra_split_fractions)``.
    extra_split_fractions: (train, validation, test) shares for extra files without splits.
    include_variants: add constructed variants (see ``suffice.training.data.variants``).
    variant_rules: which rules; variants_per_item: at most this many per parent per rule;
    variant_parent_fraction: seeded share of eligible parents that get variants;
    variant_splits: splits whose items get variants (each variant stays in its parent's split).
    include_synthetic: add the teacher-written questions of ``synthetic_paths`` (default
        ``[<data_dir>/synthetic/squad2-questions.jsonl]``; a relative path not found from the working
        directory is read from the data directory; ``synthetic_path``, one file, is kept for
        older configs; label_source ``synthetic``). Each question keeps its file's split when that is
        train or validation (``wiki-questions.jsonl`` has a validation split of unseen titles, reported
        as its own source ``wiki-synthetic``); synthetic test questions and questions over a real
        passage of another split are dropped (counted).
    retrieval_like_fraction: seeded share of single-paragraph train items (real and synthetic) that
        also appear as a *retrieval-like* copy: their paragraph among 2-9 paragraphs of other titles
        (``suffice.training.data.variants.retrieval_like_variants``; label unchanged). 0 = none.
    pretrain: build stage-0 pair-reading rows instead of the train split (validation/test unchanged):
        see ``suffice.training.data.pretrain``; pretrain_kinds: which of its kinds;
        pretrain_weak_file: also the rule-labelled rows of a ``suffice weak --out`` file.
    seed: seed for every random choice.
    """

    name: str = "default"
    data_dir: str | None = None
    label_source: Literal["autorater", "gold"] = "autorater"
    fallback: Literal["other", "unlabelled", "drop"] = "other"
    sources: list[str] = field(default_factory=list)
    extra_files: list[str] = field(default_factory=list)
    extra_split_fractions: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    include_variants: bool = True
    variant_rules: list[str] = field(default_factory=lambda: list(RULES))
    variants_per_item: int = 1
    variant_parent_fraction: float = 0.3
    variant_splits: list[str] = field(default_factory=lambda: ["train"])
    include_synthetic: bool = True
    synthetic_path: str | None = None
    synthetic_paths: list[str] = field(default_factory=list)
    retrieval_like_fraction: float = 0.0
    pretrain: bool = False
    pretrain_kinds: list[str] = field(default_factory=lambda: list(PRETRAIN_KINDS))
    pretrain_weak_file: str | None = None
    seed: int = 13

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.name or "") or self.name in (".", ".."):
            raise ConfigError(f"name={self.name!r} must be a plain folder name (letters, digits, '._-'), e.g. 'default'")
        if self.label_source not in ("autorater", "gold"):
            raise ConfigError(f"label_source={self.label_source!r}: choose 'autorater' or 'gold'")
        if self.fallback not in ("other", "unlabelled", "drop"):
            raise ConfigError(f"fallback={self.fallback!r}: choose 'other', 'unlabelled' or 'drop'")
        bad = [r for r in self.variant_rules if r not in RULES]
        if bad:
            raise ConfigError(f"variant_rules {bad} unknown: choose from {list(RULES)}")
        bad = [s for s in self.variant_splits if s not in SPLITS]
        if bad:
            raise ConfigError(f"variant_splits {bad} unknown: choose from {list(SPLITS)}")
        if self.variants_per_item < 1:
            raise ConfigError(f"variants_per_item={self.variants_per_item} must be >= 1 (set include_variants=false to have none)")
        if self.synthetic_path and self.synthetic_paths:
            raise ConfigError(f"give synthetic_paths (a list) or the older synthetic_path, not both: got {self.synthetic_path!r} "
                              f"and {self.synthetic_paths!r}")
        if not 0.0 <= self.retrieval_like_fraction <= 1.0:
            raise ConfigError(f"retrieval_like_fraction={self.retrieval_like_fraction} must be between 0 and 1")
        if not 0.0 <= self.variant_parent_fraction <= 1.0:
            raise ConfigError(f"variant_parent_fraction={self.variant_parent_fraction} must be between 0 and 1")
        if self.pretrain:
            check_kinds(self.pretrain_kinds)
        try:
            hash_split("check", self.extra_split_fractions)
        except ValueError as e:
            raise ConfigError(f"extra_split_fractions: {e}") from None


# ---------------------------------------------------------------- building


def _row(it: Item) -> dict[str, Any]:
    g = gold_label(it)
    return {"id": it.id, "question": it.question, "passages": [p.to_dict() for p in it.passages],
            "label": -1 if it.label is None else int(it.label), "level": it.level or "",
            "label_source": it.label_source or "", "split": it.split or "", "source": it.source or "",
            "group": it.group or it.id, "variant": it.variant or "", "parent_id": it.parent_id or "",
            "gold_label": -1 if g is None else g, "kind": str(it.meta.get("kind") or ""),
            "generator": str(it.meta.get("generator") or "")}


def _features():
    import datasets

    s = datasets.Value("string")
    return datasets.Features({"id": s, "question": s, "passages": [{"title": s, "text": s}], "label": datasets.Value("int64"),
                              "level": s, "label_source": s, "split": s, "source": s, "group": s, "variant": s,
                              "parent_id": s, "gold_label": datasets.Value("int64"), "kind": s, "generator": s})


def _counts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def tally(rs: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"total": len(rs)}
        for col in ("source", "label", "level", "label_source", "variant", "split"):
            out[col] = dict(sorted(Counter(str(r[col]) for r in rs).items()))
        return out

    by_split = {s: tally([r for r in rows if r["split"] == s]) for s in SPLITS}
    for d in by_split.values():
        d.pop("split")
    sources = sorted({r["source"] for r in rows})
    return {"total": len(rows), "by_split": by_split,
            "by_source": {src: tally([r for r in rows if r["source"] == src]) for src in sources}}


def _check_no_leak(rows: list[dict[str, Any]]) -> None:
    """Groups and SQuAD articles never cross splits; raise (naming the offender) if one does."""
    where: dict[str, str] = {}
    for r in rows:
        prev = where.setdefault(r["group"], r["split"])
        if prev != r["split"]:
            raise DataFormatError(f"group {r['group']!r} appears in both {prev} and {r['split']} (row {r['id']}): "
                                  "split boundaries must never cut a group; fix the input splits", field="group")


def synthetic_items(cfg: DataConfig, root: Path, items: list[Item], known_ids: set[str], dropped: Counter,
                    record, loads: list[LoadReport], progress: bool) -> list[Item]:
    """The teacher-written questions of ``cfg.synthetic_paths`` that may join ``items``: each keeps its
    train/validation split, never a test one, never across the split of a real passage it reuses."""
    out: list[Item] = []
    group_split = {it.group: it.split for it in items}
    paths = cfg.synthetic_paths or [cfg.synthetic_path or root / "synthetic" / "squad2-questions.jsonl"]
    # a relative path that is not there from here is read from the shared data directory
    for spath in (Path(p) if Path(p).is_absolute() or Path(p).exists() else root / p for p in paths):
        record(spath, "synthetic")
        synth = load_items(spath, "canonical", progress=progress)
        loads.append(synth.report)
        for it in synth:
            if it.split not in ("train", "validation") or group_split.get(it.group, it.split) != it.split:
                dropped["synthetic outside train/validation or across a split"] += 1
                continue
            # "squad2-synthetic" questions are written over squad2 passages: sources=[qed] leaves them out
            if cfg.sources and it.source not in cfg.sources and it.source.removesuffix(SYNTHETIC_SUFFIX) not in cfg.sources:
                dropped["synthetic filtered out by sources"] += 1
                continue
            if it.id in known_ids:
                raise DataFormatError(f"synthetic id {it.id!r} collides with another input", path=str(spath), field="id")
            known_ids.add(it.id)
            it.label_source = "synthetic"
            out.append(it)
    return out


def build(cfg: DataConfig, progress: bool = True) -> tuple[Any, dict[str, Any]]:
    """The DatasetDict and manifest for ``cfg``, in memory (nothing written). See :func:`prepare`.

    >>> ds, manifest = build(DataConfig(include_variants=False, include_synthetic=False), progress=False)  # doctest: +SKIP
    >>> sorted(ds)  # doctest: +SKIP
    ['test', 'train', 'validation']
    """
    import datasets

    root = resolve_data_dir(cfg.data_dir)
    inputs: dict[str, dict[str, Any]] = {}
    loads: list[LoadReport] = []
    dropped: Counter = Counter()

    def record(path: Path, role: str) -> None:
        inputs[str(path)] = {"role": role, "sha256": sha256_file(path), "bytes": path.stat().st_size}

    items_path = root / "items.jsonl"
    record(items_path, "items")
    items = load_items(items_path, "canonical", progress=progress)
    loads.append(items.report)
    items = list(items)
    known_ids = {it.id for it in items}
    for extra in cfg.extra_files:
        path = Path(extra)
        record(path, "extra")
        loaded = load_items(path, progress=progress)
        loads.append(loaded.report)
        for it in loaded:
            if it.id in known_ids:
                raise DataFormatError(f"id {it.id!r} is already in another input: give distinct ids (or a distinct --source)", path=str(path), field="id")
            known_ids.add(it.id)
            if it.split is None:
                it.split = hash_split(str(it.meta.get("article") or it.group or it.id), cfg.extra_split_fractions)
            items.append(it)
    if cfg.sources:
        available = sorted({it.source or "" for it in items})
        missing = [s for s in cfg.sources if s not in available]
        if missing:
            raise ValueError(f"sources {missing} match no item: available sources are {available}")
        dropped["filtered out by sources"] += sum(it.source not in cfg.sources for it in items)
        items = [it for it in items if it.source in cfg.sources]

    labels_path = root / "autorater-labels.jsonl"
    teacher: dict[str, dict[str, Any]] = {}
    if labels_path.is_file():
        record(labels_path, "autorater")
        teacher = read_autorater_labels(labels_path)
    elif cfg.label_source == "autorater" and cfg.fallback != "other":
        raise FileNotFoundError(f"{labels_path} is missing but label_source=autorater: add it, or use --label_source=gold or --fallback=other")
    agreement = agreement_by_source(items, teacher)
    teacher_unmatched = len(set(teacher) - known_ids)
    items = apply_labels(items, teacher, cfg.label_source, cfg.fallback, dropped)

    if cfg.include_variants:
        items += make_variants(items, rules=cfg.variant_rules, per_item=cfg.variants_per_item, seed=cfg.seed,
                               parent_fraction=cfg.variant_parent_fraction, splits=cfg.variant_splits, progress=progress)

    if cfg.include_synthetic:
        items += synthetic_items(cfg, root, items, known_ids, dropped, record, loads, progress)

    if cfg.retrieval_like_fraction:
        items += retrieval_like_variants(items, fraction=cfg.retrieval_like_fraction, seed=cfg.seed)

    rows = [_row(it) for it in items]
    pretrain = None
    if cfg.pretrain:  # stage 0: the train split becomes pair-reading rows (suffice.training.data.pretrain)
        if cfg.pretrain_weak_file and Path(cfg.pretrain_weak_file).is_file():
            record(Path(cfg.pretrain_weak_file), "weak")
        rows, pretrain = pretrain_rows(rows, [Path(p) for p, v in inputs.items() if v["role"] in ("items", "synthetic")],
                                       cfg.seed, cfg.pretrain_kinds, cfg.pretrain_weak_file)
    bad = [r["id"] for r in rows if r["split"] not in SPLITS]
    if bad:
        raise DataFormatError(f"{len(bad)} item(s) have no valid split (first: {bad[0]!r}): give each a split in {list(SPLITS)}", field="split")
    _check_no_leak(rows)

    for rep in loads:
        for reason, n in rep.dropped.items():
            dropped[f"{Path(rep.path).name}: {reason}"] += n
    features = _features()
    ds = datasets.DatasetDict({
        s: datasets.Dataset.from_dict({c: [r[c] for r in rows if r["split"] == s] for c in COLUMNS}, features=features)
        for s in SPLITS})
    empty = Counter(r["source"] for r in rows if not r["passages"])
    text_splits: dict[str, set] = defaultdict(set)
    for r in rows:
        for p in r["passages"]:
            text_splits[p["text"]].add(r["split"])
    shared_texts = Counter(r["source"] for r in rows if any(len(text_splits[p["text"]]) > 1 for p in r["passages"]))
    cfg_dict = config_to_dict(cfg)
    cfg_dict["data_dir"] = str(root)
    h = hashlib.sha256(json.dumps(cfg_dict, sort_keys=True).encode())
    for r in rows:
        h.update(json.dumps(r, sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    manifest = {
        "name": cfg.name,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "datasets_version": datasets.__version__,
        "config": cfg_dict,
        "label_policy": {"label_source": cfg.label_source, "fallback": cfg.fallback,
                         "rows_by_label_source": dict(sorted(Counter(r["label_source"] or "none" for r in rows).items()))},
        "inputs": inputs,
        "counts": _counts(rows),
        "pretrain": pretrain,
        "empty_passages": {"total": sum(empty.values()), "by_source": dict(sorted(empty.items()))},
        # rows with a passage whose exact text is also in another split (the input's own overlaps:
        # one retrieved paragraph under different questions); variants never add to these
        "rows_sharing_passage_text_across_splits": dict(sorted(shared_texts.items())),
        "dropped": dict(sorted(dropped.items())),
        "loads": [rep.to_dict() for rep in loads],
        "agreement": agreement,
        "autorater_labels_without_item": teacher_unmatched,
        "columns": list(COLUMNS),
        "data_hash": h.hexdigest(),
    }
    return ds, manifest


def prepare(cfg: DataConfig, progress: bool = True) -> tuple[Any, dict[str, Any]]:
    """Build the dataset for ``cfg`` and save it to ``prepared_dir()/<cfg.name>/`` (replacing an older one).

    >>> ds, manifest = prepare(DataConfig(name="default"))  # doctest: +SKIP
    >>> (prepared_dir() / "default" / "manifest.json").is_file()  # doctest: +SKIP
    True
    """
    ds, manifest = build(cfg, progress=progress)
    out = prepared_dir() / cfg.name
    if out.exists() and not (out / MANIFEST).is_file():
        raise FileExistsError(f"{out} exists and is not a prepared dataset (no {MANIFEST}): choose another --name or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    # write beside the target and swap, so a failed run never leaves a half-written dataset
    tmp = Path(tempfile.mkdtemp(prefix=f".{cfg.name}-", dir=out.parent))
    import datasets

    bars_were_on = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bars()
    try:
        ds.save_to_disk(str(tmp))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if bars_were_on:
            datasets.enable_progress_bars()
        if tmp.exists():
            shutil.rmtree(tmp)
    manifest["path"] = str(out)
    return ds, manifest


def load_prepared(name_or_path: str | os.PathLike) -> tuple[Any, dict[str, Any]]:
    """A prepared DatasetDict and its manifest, by name (under ``prepared_dir()``) or path.

    Row counts are checked against the manifest, so a partly overwritten folder is caught.

    >>> ds, manifest = load_prepared("default")  # doctest: +SKIP
    >>> manifest["data_hash"] == load_prepared("default")[1]["data_hash"]  # doctest: +SKIP
    True
    """
    import datasets

    p = Path(name_or_path)
    if not (p / MANIFEST).is_file():
        p = prepared_dir() / str(name_or_path)
    if not (p / MANIFEST).is_file():
        base = prepared_dir()
        names = sorted(d.name for d in base.iterdir() if (d / MANIFEST).is_file()) if base.is_dir() else []
        raise FileNotFoundError(f"no prepared dataset {str(name_or_path)!r} (looked in {Path(name_or_path)} and {p}); "
                                f"available under {base}: {names or 'none'}; run `suffice data prepare --name=...` first")
    manifest = json.loads((p / MANIFEST).read_text())
    ds = datasets.load_from_disk(str(p))
    for split, info in manifest["counts"]["by_split"].items():
        n = len(ds[split]) if split in ds else 0
        if n != info["total"]:
            raise ValueError(f"{p}: split {split} has {n} rows but the manifest says {info['total']}: re-run `suffice data prepare`")
    manifest["path"] = str(p)
    return ds, manifest
