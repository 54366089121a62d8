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
import random
import re
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from suffice.serving.config import ConfigError, config_to_dict
from suffice.training.data.labels import agreement_by_source, apply_labels
from suffice.training.data.loaders import (LoadReport, gold_label, hash_split, item_answers, load_items,
                                           read_autorater_labels, sha256_file)
from suffice.training.data.pretrain import DEFAULT_KINDS as PRETRAIN_KINDS
from suffice.training.data.pretrain import check_kinds, pretrain_rows
from suffice.training.data.schema import SPLITS, SYNTHETIC_SUFFIX, DataFormatError, Item
from suffice.training.data.variants import RULES, make_variants, retrieval_like_variants
from suffice.training.paths import data_dir as resolve_data_dir
from suffice.training.paths import prepared_dir

COLUMNS = ("id", "question", "passages", "label", "level", "label_source", "split", "source", "group",
           "variant", "parent_id", "gold_label", "kind", "generator", "answers")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class SharedSource:
    """A raw file of the shared data directory read as its own input (``DataConfig.train_sources``).

    path: relative to the data directory; source: the source name its items carry in every table;
    split: the split every item of it goes to (these files are train material: none shares an
    article or paragraph with a validation/test item).
    """

    path: str
    source: str
    split: str = "train"


SHARED_SOURCES: dict[str, SharedSource] = {
    # 4,733 real SQuAD 2.0 dev questions (2,254 crowd-written unanswerables) over 15 articles not in items.jsonl
    "squad2-dev-rest": SharedSource("sources/squad2-dev-rest.json", "squad2"),
    # SQuAD 1.1 train: 87,461 answerable questions with answer spans over 442 articles (disjoint from SQuAD dev)
    "squad1-train": SharedSource("sources/squad1-train.json", "squad1"),
    # QED train: 7,167 Natural Questions with answer spans, disjoint from qed-dev
    "qed-train": SharedSource("sources/qed-train.jsonl", "qed"),
}


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
    extra_split: put every extra-file item without a split in this split instead (e.g. ``train``).
    train_sources: raw files of the shared data directory read as inputs of their own, by name
        (see ``SHARED_SOURCES``: ``squad2-dev-rest`` as squad2 train, ``squad1-train`` as source
        ``squad1``, ``qed-train`` as qed train). Their labels are gold (none has a teacher label).
    max_train_per_source: at most this many train items of a source (a seeded sample, before
        labels, variants and stage 0), e.g. ``{squad1: 12000}``; sources not named are not capped.
    validation_articles: ``{train source name: n}``: a seeded choice of ``n`` whole articles of that
        train source moves to validation (never test), e.g. ``{squad2-dev-rest: 5}`` to select on more
        squad2 articles than items.jsonl's two; their items keep gold labels (label_source ``gold``).
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
        see ``suffice.training.data.pretrain``; pretrain_kinds: which of its kinds; pretrain_kind_share:
        ``{kind: share}``, a seeded share of a kind's train rows kept (1 when not named), to weigh the
        pool, e.g. towards the question-side negatives of ``labelled``;
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
    extra_split: str | None = None
    train_sources: list[str] = field(default_factory=list)
    max_train_per_source: dict[str, int] = field(default_factory=dict)
    validation_articles: dict[str, int] = field(default_factory=dict)
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
    pretrain_kind_share: dict[str, float] = field(default_factory=dict)
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
        bad = {k: v for k, v in self.pretrain_kind_share.items() if k not in self.pretrain_kinds or isinstance(v, bool)
               or not isinstance(v, (int, float)) or not 0.0 < v <= 1.0}
        if bad:
            raise ConfigError(f"pretrain_kind_share {bad}: name kinds of pretrain_kinds ({self.pretrain_kinds}) with a share in (0, 1]")
        bad = [n for n in self.train_sources if n not in SHARED_SOURCES]
        if bad:
            raise ConfigError(f"train_sources {bad} unknown: choose from {list(SHARED_SOURCES)}")
        if len(set(self.train_sources)) != len(self.train_sources):
            raise ConfigError(f"train_sources={self.train_sources} names a source twice: list each once")
        bad = {k: v for k, v in self.validation_articles.items() if k not in self.train_sources or not isinstance(v, int)
               or isinstance(v, bool) or v < 1}
        if bad:
            raise ConfigError(f"validation_articles {bad}: name sources of train_sources ({self.train_sources}) with a count >= 1 "
                              "of whole articles to move to validation")
        if self.extra_split is not None and self.extra_split not in SPLITS:
            raise ConfigError(f"extra_split={self.extra_split!r} unknown: choose one of {list(SPLITS)} or leave it out")
        bad = {k: v for k, v in self.max_train_per_source.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
        if bad:
            raise ConfigError(f"max_train_per_source {bad}: each cap must be an integer >= 1 (leave a source out to keep all of it)")
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
            "generator": str(it.meta.get("generator") or ""), "answers": item_answers(it)}


def _features():
    import datasets

    s = datasets.Value("string")
    return datasets.Features({"id": s, "question": s, "passages": [{"title": s, "text": s}], "label": datasets.Value("int64"),
                              "level": s, "label_source": s, "split": s, "source": s, "group": s, "variant": s,
                              "parent_id": s, "gold_label": datasets.Value("int64"), "kind": s, "generator": s,
                              "answers": [s]})


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


def synthetic_items(cfg: DataConfig, log: BuildLog, items: list[Item], progress: bool) -> list[Item]:
    """The teacher-written questions of ``cfg.synthetic_paths`` that may join ``items``: each keeps its
    train/validation split, never a test one, never across the split of a real passage it reuses."""
    out: list[Item] = []
    group_split = {it.group: it.split for it in items}
    paths = cfg.synthetic_paths or [cfg.synthetic_path or log.root / "synthetic" / "squad2-questions.jsonl"]
    # a relative path that is not there from here is read from the shared data directory
    for spath in (Path(p) if Path(p).is_absolute() or Path(p).exists() else log.root / p for p in paths):
        for it in log.load(spath, "synthetic", "canonical", progress=progress):
            if it.split not in ("train", "validation") or group_split.get(it.group, it.split) != it.split:
                log.dropped["synthetic outside train/validation or across a split"] += 1
                continue
            # "squad2-synthetic" questions are written over squad2 passages: sources=[qed] leaves them out
            if cfg.sources and it.source not in cfg.sources and it.source.removesuffix(SYNTHETIC_SUFFIX) not in cfg.sources:
                log.dropped["synthetic filtered out by sources"] += 1
                continue
            it.label_source = "synthetic"
            out.append(it)
    return out


@dataclass
class BuildLog:
    """What a build read and dropped, kept for its manifest: one object the build steps share."""

    root: Path
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    loads: list[LoadReport] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    known_ids: set[str] = field(default_factory=set)
    agreement: dict[str, Any] = field(default_factory=dict)
    teacher_unmatched: int = 0
    pretrain: dict[str, Any] | None = None
    moved_to_validation: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self, path: Path, role: str) -> None:
        self.inputs[str(path)] = {"role": role, "sha256": sha256_file(path), "bytes": path.stat().st_size}

    def load(self, path: Path, role: str, format: str = "auto", source: str | None = None, progress: bool = False) -> list[Item]:
        """Load one input file, record its hash and load report, and check its ids against every earlier input."""
        self.record(path, role)
        loaded = load_items(path, format, source=source, progress=progress)
        self.loads.append(loaded.report)
        for it in loaded:
            if it.id in self.known_ids:
                raise DataFormatError(f"id {it.id!r} is already in another input: give distinct ids (or a distinct --source)",
                                      path=str(path), field="id")
            self.known_ids.add(it.id)
        return list(loaded)


def read_items(cfg: DataConfig, log: BuildLog, progress: bool) -> list[Item]:
    """items.jsonl, the shared train sources and the user's extra files, filtered by ``sources`` and capped."""
    items = log.load(log.root / "items.jsonl", "items", "canonical", progress=progress)
    for name in cfg.train_sources:
        shared = SHARED_SOURCES[name]
        loaded = log.load(log.root / shared.path, "shared-source", source=shared.source, progress=progress)
        for it in loaded:
            it.split = shared.split
        if name in cfg.validation_articles:
            move_articles_to_validation(loaded, name, cfg.validation_articles[name], cfg.seed, log)
        items.extend(loaded)
    for extra in cfg.extra_files:
        for it in log.load(Path(extra), "extra", progress=progress):
            if it.split is None:
                it.split = cfg.extra_split or hash_split(str(it.meta.get("article") or it.group or it.id), cfg.extra_split_fractions)
            items.append(it)
    if cfg.sources:
        available = sorted({it.source or "" for it in items})
        missing = [s for s in cfg.sources if s not in available]
        if missing:
            raise ValueError(f"sources {missing} match no item: available sources are {available}")
        log.dropped["filtered out by sources"] += sum(it.source not in cfg.sources for it in items)
        items = [it for it in items if it.source in cfg.sources]
    return cap_train_items(items, cfg.max_train_per_source, cfg.seed, log.dropped)


def move_articles_to_validation(items: list[Item], name: str, n: int, seed: int, log: BuildLog) -> None:
    """Move a seeded choice of ``n`` whole articles (``meta['article']``) of a train source to validation, in place.

    >>> its = [Item(id=f"s:{i}", question="q", passages=[], split="train", source="s", meta={"article": f"a{i % 3}"})
    ...        for i in range(6)]
    >>> log = BuildLog(Path("."))
    >>> move_articles_to_validation(its, "s", 1, 13, log); sorted({it.split for it in its})
    ['train', 'validation']
    >>> log.moved_to_validation["s"]["items"]
    2
    """
    titles = sorted({str(it.meta.get("article") or "") for it in items} - {""})
    if n > len(titles):
        raise ConfigError(f"validation_articles[{name}]={n} but {name} has {len(titles)} articles: give at most {len(titles)}")
    chosen = sorted(random.Random(f"{seed}:validation:{name}").sample(titles, n))
    moved = [it for it in items if it.meta.get("article") in chosen]
    for it in moved:
        it.split = "validation"
    log.moved_to_validation[name] = {"articles": chosen, "items": len(moved)}


def cap_train_items(items: list[Item], caps: dict[str, int], seed: int, dropped: Counter) -> list[Item]:
    """At most ``caps[source]`` train items of each capped source: a seeded sample, in input order.

    >>> its = [Item(id=f"s:{i}", question="q", passages=[], split="train", source="s") for i in range(5)]
    >>> len(cap_train_items(its, {"s": 2}, 13, Counter()))
    2
    """
    keep = set(range(len(items)))
    for source in sorted(caps):
        idx = [i for i, it in enumerate(items) if it.source == source and it.split == "train"]
        if len(idx) > caps[source]:
            chosen = set(random.Random(f"{seed}:cap:{source}").sample(idx, caps[source]))
            keep -= set(idx) - chosen
            dropped[f"train items over max_train_per_source[{source}]"] += len(idx) - caps[source]
    return [it for i, it in enumerate(items) if i in keep]


def label_items(cfg: DataConfig, log: BuildLog, items: list[Item]) -> list[Item]:
    """Give every item its label (teacher or gold, with the fallback) and measure teacher-vs-gold agreement."""
    labels_path = log.root / "autorater-labels.jsonl"
    teacher: dict[str, dict[str, Any]] = {}
    if labels_path.is_file():
        log.record(labels_path, "autorater")
        teacher = read_autorater_labels(labels_path)
    elif cfg.label_source == "autorater" and cfg.fallback != "other":
        raise FileNotFoundError(f"{labels_path} is missing but label_source=autorater: add it, or use --label_source=gold or --fallback=other")
    log.agreement = agreement_by_source(items, teacher)
    log.teacher_unmatched = len(set(teacher) - log.known_ids)
    return apply_labels(items, teacher, cfg.label_source, cfg.fallback, log.dropped)


def add_constructed(cfg: DataConfig, log: BuildLog, items: list[Item], progress: bool) -> list[Item]:
    """Constructed variants, the teacher-written questions and retrieval-like copies, as the config asks."""
    if cfg.include_variants:
        items = items + make_variants(items, rules=cfg.variant_rules, per_item=cfg.variants_per_item, seed=cfg.seed,
                                      parent_fraction=cfg.variant_parent_fraction, splits=cfg.variant_splits, progress=progress)
    if cfg.include_synthetic:
        items = items + synthetic_items(cfg, log, items, progress)
    if cfg.retrieval_like_fraction:
        items = items + retrieval_like_variants(items, fraction=cfg.retrieval_like_fraction, seed=cfg.seed)
    return items


def to_rows(cfg: DataConfig, log: BuildLog, items: list[Item]) -> list[dict[str, Any]]:
    """The prepared rows; for stage 0 the train split becomes pair-reading rows (suffice.training.data.pretrain)."""
    rows = [_row(it) for it in items]
    if cfg.pretrain:
        if cfg.pretrain_weak_file and Path(cfg.pretrain_weak_file).is_file():
            log.record(Path(cfg.pretrain_weak_file), "weak")
        rows, log.pretrain = pretrain_rows(rows, cfg.seed, cfg.pretrain_kinds, cfg.pretrain_weak_file, cfg.pretrain_kind_share)
    bad = [r["id"] for r in rows if r["split"] not in SPLITS]
    if bad:
        raise DataFormatError(f"{len(bad)} item(s) have no valid split (first: {bad[0]!r}): give each a split in {list(SPLITS)}", field="split")
    _check_no_leak(rows)
    return rows


def to_dataset(rows: list[dict[str, Any]]):
    import datasets

    features = _features()
    return datasets.DatasetDict({
        s: datasets.Dataset.from_dict({c: [r[c] for r in rows if r["split"] == s] for c in COLUMNS}, features=features)
        for s in SPLITS})


def data_hash(cfg_dict: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """sha256 over the resolved config and every row: what a training run records as the data it saw."""
    h = hashlib.sha256(json.dumps(cfg_dict, sort_keys=True).encode())
    for r in rows:
        h.update(json.dumps(r, sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def build_manifest(cfg: DataConfig, log: BuildLog, rows: list[dict[str, Any]]) -> dict[str, Any]:
    import datasets

    for rep in log.loads:
        for reason, n in rep.dropped.items():
            log.dropped[f"{Path(rep.path).name}: {reason}"] += n
    empty = Counter(r["source"] for r in rows if not r["passages"])
    text_splits: dict[str, set] = defaultdict(set)
    for r in rows:
        for p in r["passages"]:
            text_splits[p["text"]].add(r["split"])
    shared_texts = Counter(r["source"] for r in rows if any(len(text_splits[p["text"]]) > 1 for p in r["passages"]))
    cfg_dict = config_to_dict(cfg)
    cfg_dict["data_dir"] = str(log.root)
    return {
        "name": cfg.name,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "datasets_version": datasets.__version__,
        "config": cfg_dict,
        "label_policy": {"label_source": cfg.label_source, "fallback": cfg.fallback,
                         "rows_by_label_source": dict(sorted(Counter(r["label_source"] or "none" for r in rows).items()))},
        "inputs": log.inputs,
        "counts": _counts(rows),
        "pretrain": log.pretrain,
        "moved_to_validation": log.moved_to_validation,
        "empty_passages": {"total": sum(empty.values()), "by_source": dict(sorted(empty.items()))},
        # rows with a passage whose exact text is also in another split (the input's own overlaps:
        # one retrieved paragraph under different questions); variants never add to these
        "rows_sharing_passage_text_across_splits": dict(sorted(shared_texts.items())),
        "dropped": dict(sorted(log.dropped.items())),
        "loads": [rep.to_dict() for rep in log.loads],
        "agreement": log.agreement,
        "autorater_labels_without_item": log.teacher_unmatched,
        "columns": list(COLUMNS),
        "data_hash": data_hash(cfg_dict, rows),
    }


def build(cfg: DataConfig, progress: bool = True) -> tuple[Any, dict[str, Any]]:
    """The DatasetDict and manifest for ``cfg``, in memory (nothing written). See :func:`prepare`.

    >>> ds, manifest = build(DataConfig(include_variants=False, include_synthetic=False), progress=False)  # doctest: +SKIP
    >>> sorted(ds)  # doctest: +SKIP
    ['test', 'train', 'validation']
    """
    log = BuildLog(root=resolve_data_dir(cfg.data_dir))
    items = read_items(cfg, log, progress)
    items = label_items(cfg, log, items)
    items = add_constructed(cfg, log, items, progress)
    rows = to_rows(cfg, log, items)
    return to_dataset(rows), build_manifest(cfg, log, rows)


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


def answers_by_id(ds) -> dict[str, list[str]]:
    """``id -> gold answer strings`` of a prepared split (its ``answers`` column; rows without answers left out).

    >>> answers_by_id(load_prepared("default")[0]["train"])["squad2:5ad3ed86604f3c001a3ff7b2"]  # doctest: +SKIP
    ['Normandy']
    """
    if "answers" not in ds.column_names:
        raise ValueError("these rows carry no 'answers' column: re-run `suffice data prepare` (prepared data stores the "
                         "gold answers of every input), or give a JSONL with an 'answers' list per row")
    return {str(i): [str(a) for a in ans] for i, ans in zip(ds["id"], ds["answers"]) if ans}


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
