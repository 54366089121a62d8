"""``suffice synth``: a teacher LLM writes new training questions about your passages, a second look filters them.

    suffice synth --corpus PASSAGES --per-passage K [--rater openai-compatible] [--kinds KIND ...] [--multi]
                  [--existing FILE ...] [--splits train ...] [--out FILE] [--key=value ...]
    suffice synth import [--path squad2-questions.jsonl] [--store PATH]
    suffice synth judge --input SYNTHETIC.jsonl [--rater openai-compatible|lexical] [--out FILE]

For each passage of the corpus (any format the data loaders read, or plain text / JSON Lines
passages) the LLM writes K questions, half answerable (``direct``, ``paraphrase``, ``combine``)
and half plausibly unanswerable (``premise_date``, ``premise_number``, ``premise_entity``,
``premise_negation``, ``missing_attribute``, ``related_entity``), each with label, level, answer
and kind. ``--multi`` writes questions that need two passages (``bridge``, ``comparison``) and adds
for each one the two variants that drop a passage (label 0, level partial).

Then every item is re-judged with the autorater prompt (``suffice label``'s rater, labels cached in
the same store); items where writer and judge disagree are dropped and counted: the disagreement
rate is the noise estimate. Questions that repeat an existing question (the corpus's own, and
``--existing`` files) or each other are dropped. Every item inherits its passage's split, so a test
passage never feeds training. Generation replies are cached per (generator, prompt version,
passage): a re-run asks only for what is missing. The output is canonical JSONL that
``suffice data prepare`` reads with ``include_synthetic`` (``--synthetic_path=FILE``).

The LLM connection (``--base_url``, ``--model``, ``--api_key_env``, ``--concurrency``, prices...)
is the LabelingConfig of ``suffice label`` (``configs/labeling.yaml``); ``--key=value`` sets a
SynthConfig or a LabelingConfig field.

>>> main(["--corpus", "tests/fixtures/passages.txt", "--per-passage", "4", "--model=qwen2.5-7b",  # doctest: +SKIP
...       "--base_url=http://127.0.0.1:8000/v1", "--api_key_env="])
0
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import re
import sys
import time
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from suffice.training.autorater.config import DEFAULT_CONFIG, RATERS, LabelingConfig
from suffice.training.config import ConfigError, build_config, config_from_dict, parse_overrides
from suffice.training.data.schema import SPLITS, DataFormatError, Item, Passage
from suffice.training.synth.generate import (
    ALL_KINDS,
    MODES,
    MULTI_KINDS,
    SINGLE_KINDS,
    GenerationAccounting,
    GenerationPrompt,
    QuestionGenerator,
    Seed,
    SynthStore,
    generate_async,
    validate_question,
)

PROG = "suffice synth"
ACTIONS = ("import", "judge")
JUDGES = ("rater", "lexical")
SHIPPED_GENERATOR = "llm-generator-v1"
MAX_PER_PASSAGE = 50
_SPLIT_RANK = {"train": 0, "validation": 1, "test": 2}  # a passage seen in several splits takes the strictest
_PASSAGE_SUFFIXES = (".txt", ".text", ".md")


@dataclass
class SynthConfig:
    """What ``suffice synth`` writes, about which passages, and where it goes.

    corpus: the passages to write about: any file the data loaders read (SQuAD, HotPotQA, MuSiQue, QED,
        canonical JSONL: every passage of every item, deduplicated) or plain passages (``.txt``, one per
        non-empty line; JSON Lines / JSON list of strings or ``{title, text}``).
    format: ``auto`` (detected), ``passages``, or a loader format (squad2, hotpotqa, musique, qed, canonical).
    per_passage: questions asked for per passage (single mode) or per pair of passages (multi mode).
    kinds: the kinds to ask for; empty = every kind of the mode (single: direct, paraphrase, combine and the
        six unanswerable kinds; multi: bridge, comparison).
    mode: ``single`` (one passage) or ``multi`` (questions that need two passages, plus their partial variants).
    judge: who re-judges every item: ``rater`` (the same LLM with the autorater prompt and ``scheme``) or
        ``lexical`` (keyword coverage: a cheap offline check, blind to unanswerable questions).
    existing: files (any loader format) whose questions must not be repeated, besides the corpus's own.
    splits: only passages of these splits get questions (empty = all; ``[train]`` saves the cost of the others).
    split: the split of passages that carry none (plain passages, raw SQuAD files); null = a hash of the
        passage (80/10/10), as ``suffice data prepare`` splits extra files.
    source: the source name of plain passages (items keep their own); outputs are ``<source>-synthetic``.
    limit: ask only for the first N passages (pairs) after the split filter; null = all.
    out: the output JSONL; null = ``data/synthetic/<generator>.jsonl`` under the prepared-data directory.
    generator_id: the name generations are cached under; null = ``gen:<model>``.
    retry_unparsed: ask again for passages whose stored reply held no questions (and items the judge left unparsed).
    experiment: the MLflow experiment of the run.
    """

    corpus: str = ""
    format: str = "auto"
    per_passage: int = 10
    kinds: list[str] = field(default_factory=list)
    mode: str = "single"
    judge: str = "rater"
    existing: list[str] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)
    split: str | None = None
    source: str = "passages"
    limit: int | None = None
    out: str | None = None
    generator_id: str | None = None
    retry_unparsed: bool = False
    experiment: str = "synth"

    def __post_init__(self) -> None:
        from suffice.training.data.loaders import FORMATS

        if self.format not in ("auto", "passages", *FORMATS):
            raise ConfigError(f"format={self.format!r} is unknown: choose auto, passages or one of {list(FORMATS)}")
        if not self.corpus:
            raise ConfigError("no corpus: give the passages to write about with --corpus FILE (.txt, .jsonl or an items file)")
        if not 1 <= self.per_passage <= MAX_PER_PASSAGE:
            raise ConfigError(f"per_passage={self.per_passage} must be between 1 and {MAX_PER_PASSAGE}, e.g. --per-passage 10")
        if self.mode not in MODES:
            raise ConfigError(f"mode={self.mode!r} is unknown: choose one of {list(MODES)} (--multi sets multi)")
        allowed = SINGLE_KINDS if self.mode == "single" else tuple(MULTI_KINDS)
        bad = [k for k in self.kinds if k not in allowed]
        if bad:
            hint = " (bridge / comparison need --multi)" if any(k in MULTI_KINDS for k in bad) else ""
            raise ConfigError(f"kinds {bad} are not {self.mode}-passage kinds: choose from {list(allowed)}{hint}")
        if self.judge not in JUDGES:
            raise ConfigError(f"judge={self.judge!r} is unknown: choose one of {list(JUDGES)}")
        bad = [s for s in self.splits if s not in SPLITS]
        if bad:
            raise ConfigError(f"splits {bad} are unknown: choose from {list(SPLITS)}")
        if self.split is not None and self.split not in SPLITS:
            raise ConfigError(f"split={self.split!r} is unknown: choose one of {list(SPLITS)} or null (hash of the passage)")
        if self.limit is not None and self.limit < 0:
            raise ConfigError(f"limit={self.limit} must be >= 0")
        if self.generator_id is not None and (not self.generator_id.strip() or "@" in self.generator_id):
            raise ConfigError(f"generator_id={self.generator_id!r} must be a non-empty name without '@' (e.g. gen:gpt-4o-mini)")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.source or ""):
            raise ConfigError(f"source={self.source!r} must be a plain name (letters, digits, '._-'), e.g. wiki")

    def resolved_kinds(self) -> tuple[str, ...]:
        """``kinds``, or every kind of the mode."""
        return tuple(self.kinds) or (SINGLE_KINDS if self.mode == "single" else tuple(MULTI_KINDS))

    def out_path(self, generator_id: str) -> Path:
        if self.out:
            return Path(self.out)
        from suffice.training.paths import prepared_dir

        return prepared_dir() / "synthetic" / (re.sub(r"[^A-Za-z0-9._-]+", "_", generator_id) + f"-{self.mode}.jsonl")


# ---------------------------------------------------------------- the corpus


@dataclass
class CorpusEntry:
    """One record of the corpus: its passages, split, group and source, and its question if it has one."""

    passages: tuple[Passage, ...]
    split: str
    group: str
    source: str
    question: str | None = None
    supporting: tuple[int, ...] = ()


def passage_id(p: Passage) -> str:
    """The stable id a passage's generations are cached under (title and text, nothing else).

    >>> passage_id(Passage("Lima", "Lima is in Peru."))
    'p:60d4b38fec1ecbde'
    """
    return "p:" + hashlib.sha256(f"{p.title}\x1f{p.text}".encode("utf-8")).hexdigest()[:16]


def load_corpus(path: str | Path, format: str = "auto", *, split: str | None = None, source: str = "passages") -> list[CorpusEntry]:
    """The corpus as entries: items files keep each item's split and group; plain passages get ``split``
    (or a hash of the passage) and a group of their own.

    >>> [e.split for e in load_corpus("tests/fixtures/passages.txt", split="train")]  # doctest: +SKIP
    ['train', 'train']
    """
    from suffice.training.data.loaders import detect_format, hash_split, load_items, load_passages, supporting_positions

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"corpus {p} does not exist: give a passages file (.txt, .jsonl) or an items file "
                                "(SQuAD, HotPotQA, MuSiQue, QED, canonical JSONL) with --corpus")
    fmt = format
    if fmt == "auto":
        fmt = "passages"
        if p.suffix.lower() not in _PASSAGE_SUFFIXES:
            try:
                fmt = detect_format(p)
            except DataFormatError:
                fmt = "passages"  # no question in the records: a passage collection
    if fmt == "passages":
        out = []
        for ps in load_passages(p):
            pid = passage_id(ps)
            out.append(CorpusEntry((ps,), split or hash_split(pid), pid, source))
        return out
    entries = []
    for it in load_items(p, fmt):
        sp = it.split or split or hash_split(str(it.meta.get("article") or it.group or it.id))
        entries.append(CorpusEntry(tuple(ps for ps in it.passages if ps.text.strip()), sp, it.group or it.id,
                                   it.source or source, it.question, tuple(supporting_positions(it) or ())))
    return entries


def _stricter(a: str, b: str) -> bool:
    return _SPLIT_RANK[a] > _SPLIT_RANK[b]


def make_seeds(entries: Sequence[CorpusEntry], mode: str) -> list[Seed]:
    """What to ask about, in corpus order: each distinct passage (single), or (multi) one pair per item
    with two or more passages (its supporting passages when the gold names them) and consecutive pairs
    of plain passages. A passage found in several splits takes the
    strictest (test > validation > train) with that entry's group, so a test passage never feeds training.

    >>> e = [CorpusEntry((Passage("A", "a."),), "train", "g1", "s"), CorpusEntry((Passage("A", "a."),), "test", "g2", "s")]
    >>> [(s.split, s.group) for s in make_seeds(e, "single")]
    [('test', 'g2')]
    """
    seeds: dict[str, dict[str, Any]] = {}

    def add(sid: str, passages: tuple[Passage, ...], entry_split: str, group: str, source: str, questions: Sequence[str]) -> None:
        cur = seeds.get(sid)
        if cur is None:
            seeds[sid] = {"passages": passages, "split": entry_split, "group": group, "source": source, "asked": list(questions)}
            return
        if _stricter(entry_split, cur["split"]):
            cur.update(split=entry_split, group=group, source=source)
        cur["asked"] += [q for q in questions if q not in cur["asked"]]

    if mode == "single":
        for e in entries:
            for ps in e.passages:
                add(passage_id(ps), (ps,), e.split, e.group, e.source, [e.question] if e.question else [])
    else:
        singles = [e for e in entries if len(e.passages) == 1 and e.question is None]  # plain passages only
        for e in entries:
            if len(e.passages) < 2:
                continue
            pos = list(e.supporting) if len(e.supporting) >= 2 else [0, 1]
            pair = (e.passages[pos[0]], e.passages[pos[1]])
            add(_pair_id(pair), pair, e.split, e.group, e.source, [e.question] if e.question else [])
        for a, b in zip(singles[0::2], singles[1::2]):  # plain passages: consecutive pairs
            strict = b if _stricter(b.split, a.split) else a
            pair = (a.passages[0], b.passages[0])
            add(_pair_id(pair), pair, strict.split, strict.group, strict.source,
                [q for q in (a.question, b.question) if q])
    return [Seed(sid, s["passages"], s["split"], s["group"], s["source"], tuple(s["asked"])) for sid, s in seeds.items()]


def _pair_id(pair: tuple[Passage, Passage]) -> str:
    return "pp:" + hashlib.sha256("\x1e".join(passage_id(p) for p in pair).encode()).hexdigest()[:16]


def normalize_question(q: str) -> str:
    """The form two questions are compared in for deduplication (case, punctuation and spacing ignored).

    >>> normalize_question("  When was the Tower BUILT?? ") == normalize_question("when was the tower built")
    True
    """
    s = unicodedata.normalize("NFKC", q).casefold()
    return " ".join(re.sub(r"[^\w\s]", " ", s).split())


def existing_questions(entries: Sequence[CorpusEntry], files: Sequence[str]) -> set[str]:
    """Normalised questions not to repeat: the corpus's own and those of every ``files`` entry (any loader format)."""
    from suffice.training.data.loaders import load_items

    out = {normalize_question(e.question) for e in entries if e.question}
    for f in files:
        out.update(normalize_question(it.question) for it in load_items(f))
    return out


# ---------------------------------------------------------------- candidates, judging, filtering


def _synthetic_source(source: str) -> str:
    return source if source.endswith("-synthetic") else f"{source}-synthetic"


def build_candidates(seeds: Sequence[Seed], generations: dict[str, Any], prompt: GenerationPrompt, generator_id: str,
                     existing: set[str], report: "SynthReport") -> list[Item]:
    """The items to judge, in seed order: each usable, new question as an :class:`Item` inheriting its
    seed's split and group; in multi mode each is followed by its variants without one passage."""
    seen: set[str] = set()
    out: list[Item] = []
    for seed in seeds:
        rec = generations.get(seed.id)
        if rec is None:
            report.not_generated += 1
            continue
        if rec.status != "ok":
            report.unparsed += 1
            continue
        for obj in rec.questions:
            q, why = validate_question(obj, prompt.kinds)
            if q is None:
                report.invalid[why] += 1
                continue
            report.questions += 1
            key = normalize_question(q.question)
            if key in existing:
                report.dup_existing += 1
                continue
            if key in seen:
                report.dup_batch += 1
                continue
            seen.add(key)
            src = seed.source.removesuffix("-synthetic")
            digest = hashlib.sha256(f"{generator_id}\x1f{seed.id}\x1f{q.question}".encode("utf-8")).hexdigest()[:16]
            meta = {"kind": q.kind, "answer": q.answer, "generator": generator_id, "generator_prompt": prompt.version}
            parent = Item(id=f"{src}-synth:{digest}", question=q.question, passages=list(seed.passages), label=q.label,
                          level=q.level, label_source="synthetic", split=seed.split, source=_synthetic_source(src),
                          group=seed.group, meta=meta)
            out.append(parent)
            if prompt.mode == "multi":
                for i in range(len(seed.passages)):
                    kept = [ps for k, ps in enumerate(seed.passages) if k != i]
                    out.append(dataclasses.replace(
                        parent, id=f"{parent.id}#drop_passage-{i + 1}", passages=kept, label=0, level="partial",
                        variant="drop_passage", parent_id=parent.id, meta={**meta, "answer": None, "dropped": seed.passages[i].title}))
                    report.variants += 1
    report.candidates = len(out)
    return out


def apply_verdicts(candidates: Sequence[Item], verdicts: dict[str, int], report: "SynthReport") -> list[Item]:
    """Keep the items the judge labels as their writer did; count the disagreements (the noise estimate).
    A variant is kept only with its question (a partial variant of a bad question proves nothing).

    >>> r = SynthReport()
    >>> items = [Item(id="a", question="q?", passages=[], label=1, meta={"kind": "direct"})]
    >>> [it.id for it in apply_verdicts(items, {"a": 0}, r)], r.disagree
    ([], 1)
    """
    kept_ids: set[str] = set()
    out = []
    for it in candidates:
        kind = str(it.meta.get("kind") or "")
        judged = verdicts.get(it.id)
        if judged is None:
            report.unjudged += 1
            continue
        report.judged += 1
        report.judged_by_kind[kind] += 1
        if judged != it.label:
            report.disagree += 1
            report.disagree_by_kind[kind] += 1
            report.disagree_by_direction[f"writer {it.label} / judge {judged}"] += 1
            continue
        report.agree += 1
        if it.parent_id and it.parent_id not in kept_ids:
            report.parent_dropped += 1
            continue
        kept_ids.add(it.id)
        out.append(it)
    report.kept = len(out)
    for it in out:
        report.kept_by_split[it.split] += 1
        report.kept_by_label[it.label] += 1
        report.kept_by_kind[str(it.meta.get("kind") or "")] += 1
    return out


def synthetic_row(it: Item, judge: str | None) -> dict[str, Any]:
    """One output line: the items.jsonl schema plus label, level, label_source, kind, answer, generator."""
    row: dict[str, Any] = {"id": it.id, "source": it.source, "split": it.split, "group": it.group, "question": it.question,
                           "passages": [p.to_dict() for p in it.passages], "label": it.label, "level": it.level,
                           "label_source": "synthetic", "kind": it.meta.get("kind"), "answer": it.meta.get("answer"),
                           "generator": it.meta.get("generator")}
    if it.meta.get("generator_prompt"):
        row["generator_prompt"] = it.meta["generator_prompt"]
    if judge:
        row["judge"] = judge
    if it.variant:
        row.update(variant=it.variant, parent_id=it.parent_id, dropped=it.meta.get("dropped"))
    return row


def write_jsonl(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write atomically (a killed run never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- the report


@dataclass
class SynthReport:
    """What a ``suffice synth`` run did: passages, questions, duplicates, the judge's disagreement, the cost."""

    generator: str = ""
    prompt_version: str = ""
    judge: str = ""
    mode: str = "single"
    per_passage: int = 0
    seeds: int = 0
    seeds_by_split: Counter = field(default_factory=Counter)
    not_generated: int = 0  # no stored reply (failed this run): the next run asks again
    unparsed: int = 0  # stored replies without questions (raw kept)
    questions: int = 0  # usable questions read from the replies
    invalid: Counter = field(default_factory=Counter)
    dup_existing: int = 0
    dup_batch: int = 0
    variants: int = 0
    candidates: int = 0
    judged: int = 0
    agree: int = 0
    disagree: int = 0
    judged_by_kind: Counter = field(default_factory=Counter)
    disagree_by_kind: Counter = field(default_factory=Counter)
    disagree_by_direction: Counter = field(default_factory=Counter)
    unjudged: int = 0
    parent_dropped: int = 0
    kept: int = 0
    kept_by_split: Counter = field(default_factory=Counter)
    kept_by_label: Counter = field(default_factory=Counter)
    kept_by_kind: Counter = field(default_factory=Counter)
    out_path: str | None = None
    generation: GenerationAccounting | None = None
    judging: Any = None  # the judge's runner.Accounting
    stopped: str | None = None
    elapsed_s: float = 0.0

    @property
    def disagreement_rate(self) -> float | None:
        """Share of judged items where the judge's label differs from the writer's (None before any verdict)."""
        return self.disagree / self.judged if self.judged else None

    @property
    def cost_usd(self) -> float:
        return sum(a.cost_usd for a in (self.generation, self.judging) if a is not None)

    def summary(self) -> dict[str, Any]:
        """Everything as plain JSON-ready values (what MLflow and ``--json`` get)."""
        return {
            "generator": self.generator, "prompt_version": self.prompt_version, "judge": self.judge, "mode": self.mode,
            "per_passage": self.per_passage, "passages": self.seeds, "passages_by_split": dict(sorted(self.seeds_by_split.items())),
            "not_generated": self.not_generated, "unparsed_replies": self.unparsed, "questions": self.questions,
            "invalid": dict(sorted(self.invalid.items())), "invalid_total": sum(self.invalid.values()),
            "duplicates_existing": self.dup_existing, "duplicates_batch": self.dup_batch,
            "duplicates_dropped": self.dup_existing + self.dup_batch, "variants": self.variants, "candidates": self.candidates,
            "judged": self.judged, "agree": self.agree, "disagree": self.disagree, "disagreement_rate": self.disagreement_rate,
            "disagree_by_kind": dict(sorted(self.disagree_by_kind.items())),
            "judged_by_kind": dict(sorted(self.judged_by_kind.items())),
            "disagree_by_direction": dict(sorted(self.disagree_by_direction.items())),
            "unjudged": self.unjudged, "parent_dropped": self.parent_dropped, "kept": self.kept,
            "kept_by_split": dict(sorted(self.kept_by_split.items())),
            "kept_by_label": {str(k): v for k, v in sorted(self.kept_by_label.items())},
            "kept_by_kind": dict(sorted(self.kept_by_kind.items())), "out": self.out_path,
            "generation": None if self.generation is None else self.generation.summary(),
            "judging": None if self.judging is None else self.judging.summary(),
            "cost_usd": round(self.cost_usd, 6), "stopped": self.stopped, "elapsed_s": round(self.elapsed_s, 3),
        }

    def format(self) -> str:
        """The closing printout."""
        g, j = self.generation, self.judging
        lines = [f"synth with {self.generator or 'imported questions'}"
                 + (f" (prompt {self.prompt_version}, {self.per_passage} per {'passage' if self.mode == 'single' else 'pair'})" if g else "")
                 + f", judged by {self.judge or 'nobody'}: {'stopped: ' + self.stopped if self.stopped else 'finished'} "
                 f"in {self.elapsed_s:.1f} s"]
        if g is not None:
            by_split = ", ".join(f"{s} {self.seeds_by_split[s]}" for s in SPLITS if self.seeds_by_split[s])
            unit = "passages" if self.mode == "single" else "pairs"
            lines += [
                f"  {unit:<10}: {self.seeds} ({by_split or 'none'}); {g.skipped} already generated (skipped), {g.to_label} asked",
                f"  generation: {g.stored_ok} replies stored, {g.stored_unparsed} unparsed (raw kept; --retry-unparsed asks again), "
                f"{g.failed} failed (not stored; re-run to retry)",
            ]
        reqs = [f"{name} {a.requests} ({a.retries} retries)" for name, a in (("generation", g), ("judging", j)) if a is not None]
        fails: Counter = Counter()
        tin = tout = est = 0
        for a in (g, j):
            if a is not None:
                fails.update(a.failures)
                tin, tout, est = tin + a.tokens_in, tout + a.tokens_out, est + a.usage_estimated
        lines += [f"  requests  : {', '.join(reqs) or 'none'}",
                  f"  failures  : {', '.join(f'{k} {v}' for k, v in sorted(fails.items())) or 'none'}",
                  f"  tokens    : {tin:,} in / {tout:,} out" + (f" (estimated for {est} replies without usage)" if est else "")]
        inv = ", ".join(f"{k} {v}" for k, v in sorted(self.invalid.items()))
        lines.append(f"  questions : {self.questions} usable" + (f", {sum(self.invalid.values())} invalid ({inv})" if inv else "")
                     + f"; {self.dup_existing + self.dup_batch} duplicates dropped ({self.dup_existing} of an existing question, "
                     f"{self.dup_batch} within the batch)" + (f"; {self.variants} partial variants" if self.variants else ""))
        rate = "n/a" if self.disagreement_rate is None else f"{self.disagreement_rate:.1%}"
        lines.append(f"  re-judged : {self.judged} of {self.candidates} ({self.unjudged} without a verdict; re-run to retry); "
                     f"{self.disagree} disagree with the writer: disagreement rate {rate} (the noise estimate)")
        if self.disagree:
            kinds = ", ".join(f"{k} {v}/{self.judged_by_kind[k]}" for k, v in sorted(self.disagree_by_kind.items()))
            dirs = ", ".join(f"{k}: {v}" for k, v in sorted(self.disagree_by_direction.items()))
            lines.append(f"              {dirs}; by kind: {kinds}")
        splits = ", ".join(f"{s} {self.kept_by_split[s]}" for s in SPLITS if self.kept_by_split[s])
        labels = ", ".join(f"label {k}: {self.kept_by_label[k]}" for k in (1, 0) if self.kept_by_label[k])
        dropped = f" ({self.parent_dropped} variants of dropped questions left out)" if self.parent_dropped else ""
        lines.append(f"  kept      : {self.kept}{dropped} -> {self.out_path or '(not written)'} ({splits or 'none'}; {labels or 'none'})")
        parts = " + ".join(f"{name} ${a.cost_usd:.4f}" for name, a in (("generation", g), ("judging", j)) if a is not None)
        lines.append(f"  cost est. : ${self.cost_usd:.4f}" + (f" ({parts})" if parts else ""))
        return "\n".join(lines)


# ---------------------------------------------------------------- the run


def build_judge(judge: str, cfg: LabelingConfig):
    """The rater that re-judges every item: the LLM with the autorater prompt, or the lexical baseline."""
    from suffice.training.autorater.raters import LexicalRater, OpenAICompatibleRater

    if judge == "lexical":
        return LexicalRater(dataclasses.replace(cfg, rater_id=None))  # rater_id names the LLM, not the baseline
    return OpenAICompatibleRater(cfg)


async def _judge(candidates: Sequence[Item], judge: Any, store: SynthStore, cfg: LabelingConfig, synth: SynthConfig,
                 progress: bool, report: SynthReport) -> list[Item]:
    from suffice.training.autorater.runner import label_items_async

    report.judge = f"{judge.id}@{judge.prompt_version}"
    report.judging = await label_items_async(candidates, judge, store, concurrency=cfg.concurrency, progress=progress,
                                             retry_unparsed=synth.retry_unparsed, price_per_1k_input=cfg.price_per_1k_input,
                                             price_per_1k_output=cfg.price_per_1k_output)
    ids = {it.id for it in candidates}
    verdicts = {r.item_id: r.label for r in store.rows(judge.id, judge.prompt_version, status="ok") if r.item_id in ids}
    return apply_verdicts(candidates, verdicts, report)


def synthesize(synth: SynthConfig, cfg: LabelingConfig, *, progress: bool = True) -> SynthReport:
    """Write, re-judge, deduplicate and save synthetic questions for ``synth.corpus``; returns the report.

    Raises :class:`~suffice.training.autorater.raters.RaterConfigError` (no API key...) before any request;
    a server that refuses every request ends the run with ``report.stopped`` set (what was stored stays).

    >>> report = synthesize(SynthConfig(corpus="passages.txt", per_passage=4),  # doctest: +SKIP
    ...                     LabelingConfig(rater="openai-compatible", model="m", api_key_env=""))
    >>> report.kept, report.disagreement_rate  # doctest: +SKIP
    (7, 0.125)
    """
    from suffice.training.autorater.raters import RaterFatalError

    started = time.monotonic()
    entries = load_corpus(synth.corpus, synth.format, split=synth.split, source=synth.source)
    seeds = make_seeds(entries, synth.mode)
    if not seeds:
        need = "an item with two passages, or two plain passages" if synth.mode == "multi" else "a non-empty passage"
        raise DataFormatError(f"the corpus holds no {'pairs' if synth.mode == 'multi' else 'passages'} to write about "
                              f"(need {need})", path=synth.corpus)
    if synth.splits:
        seeds = [s for s in seeds if s.split in synth.splits]
    if synth.limit is not None:
        seeds = seeds[: synth.limit]
    existing = existing_questions(entries, synth.existing)
    prompt = GenerationPrompt(mode=synth.mode, kinds=synth.resolved_kinds(), per_passage=synth.per_passage)
    generator = QuestionGenerator(cfg, prompt, generator_id=synth.generator_id)
    judge = build_judge(synth.judge, cfg)
    report = SynthReport(generator=generator.id, prompt_version=prompt.version, mode=synth.mode, per_passage=synth.per_passage,
                         seeds=len(seeds), seeds_by_split=Counter(s.split for s in seeds))
    out_path = synth.out_path(generator.id)

    async def run(store: SynthStore) -> list[Item] | None:
        try:
            report.generation = await generate_async(
                seeds, generator, store, concurrency=cfg.concurrency, progress=progress, retry_unparsed=synth.retry_unparsed,
                price_per_1k_input=cfg.price_per_1k_input, price_per_1k_output=cfg.price_per_1k_output)
        except RaterFatalError as e:
            report.generation, report.stopped = e.accounting, str(e)
            await judge.aclose()
            return None
        candidates = build_candidates(seeds, store.generations(generator.id, prompt.version), prompt, generator.id, existing, report)
        try:
            return await _judge(candidates, judge, store, cfg, synth, progress, report)
        except RaterFatalError as e:
            report.judging, report.stopped = e.accounting, str(e)
            return None

    with SynthStore(cfg.store_path()) as store:
        kept = asyncio.run(run(store))
    if kept is not None:
        write_jsonl([synthetic_row(it, report.judge) for it in kept], out_path)
        report.out_path = str(out_path)
    report.elapsed_s = time.monotonic() - started
    return report


def rejudge(path: str | Path, synth: SynthConfig, cfg: LabelingConfig, *, progress: bool = True) -> SynthReport:
    """Re-judge already written synthetic questions (the shipped ``squad2-questions.jsonl``, an earlier
    output) and keep those the judge labels as their writer did.

    >>> rejudge("../shared/data/synthetic/squad2-questions.jsonl", synth, cfg).disagreement_rate  # doctest: +SKIP
    0.04
    """
    from suffice.training.autorater.raters import RaterFatalError
    from suffice.training.data.loaders import load_items

    started = time.monotonic()
    items = list(load_items(path, "canonical"))
    unlabelled = [it.id for it in items if it.label is None]
    if unlabelled:
        raise DataFormatError(f"{len(unlabelled)} question(s) carry no writer label (first: {unlabelled[0]!r}): "
                              "only labelled synthetic questions can be re-judged", path=str(path), field="label")
    report = SynthReport(generator=", ".join(sorted({str(it.meta.get('generator') or '?') for it in items})), mode="imported",
                         questions=len(items), candidates=len(items))
    judge = build_judge(synth.judge, cfg)

    async def run(store: SynthStore) -> list[Item] | None:
        try:
            return await _judge(items, judge, store, cfg, synth, progress, report)
        except RaterFatalError as e:
            report.judging, report.stopped = e.accounting, str(e)
            return None

    with SynthStore(cfg.store_path()) as store:
        kept = asyncio.run(run(store))
    if kept is not None:
        out = Path(synth.out) if synth.out else Path(path).with_name(Path(path).stem + ".judged.jsonl")
        write_jsonl([{**synthetic_row(it, report.judge), **{k: v for k, v in it.meta.items() if k not in ("generator_prompt",)}}
                     for it in kept], out)
        report.out_path = str(out)
    report.elapsed_s = time.monotonic() - started
    return report


def log_to_mlflow(report: SynthReport, *, synth: SynthConfig, cfg: LabelingConfig, prompt_text: str | None = None,
                  judge_prompt_text: str | None = None) -> str:
    """Record a synth run in the MLflow experiment ``synth.experiment``: both configs as params (no secrets
    exist in them), generation and judging accounting, the disagreement rate, duplicates, the prompts.

    >>> log_to_mlflow(report, synth=synth, cfg=cfg)  # doctest: +SKIP
    '3f2a...'
    """
    import mlflow
    from mlflow.entities import Metric, Param, RunStatus
    from mlflow.tracking import MlflowClient

    from suffice.training.config import config_to_dict
    from suffice.training.tracking import config_params, git_commit, setup

    exp_id = setup(experiment=synth.experiment)
    client = MlflowClient(tracking_uri=mlflow.get_tracking_uri())
    tags = {"generator": report.generator, "prompt_version": report.prompt_version, "judge": report.judge,
            "corpus": synth.corpus, "label_store": str(cfg.store_path()), "git_commit": git_commit() or "unknown"}
    if report.out_path:
        tags["output"] = report.out_path
    run = client.create_run(exp_id, run_name=f"{report.generator}@{report.prompt_version}", tags=tags)
    rid = run.info.run_id
    s = report.summary()
    metrics = {k: float(s[k]) for k in ("passages", "not_generated", "unparsed_replies", "questions", "invalid_total",
                                         "duplicates_existing", "duplicates_batch", "duplicates_dropped", "variants",
                                         "candidates", "judged", "agree", "disagree", "unjudged", "parent_dropped", "kept",
                                         "cost_usd", "elapsed_s")}
    if report.disagreement_rate is not None:
        metrics["disagreement_rate"] = report.disagreement_rate
    for prefix, counter in (("kept", report.kept_by_split), ("kept_kind", report.kept_by_kind), ("invalid", report.invalid),
                            ("disagree_kind", report.disagree_by_kind)):
        metrics.update({f"{prefix}.{k}": float(v) for k, v in counter.items()})
    metrics.update({f"kept_label.{k}": float(v) for k, v in report.kept_by_label.items()})
    for phase, acc in (("generation", report.generation), ("judging", report.judging)):
        if acc is None:
            continue
        a = acc.summary()
        for k in ("skipped_already_stored", "to_label", "stored_ok", "stored_unparsed", "failed", "requests", "retries",
                  "tokens_in", "tokens_out", "cost_usd", "latency_p50_s", "latency_p95_s"):
            if a.get(k) is not None:
                metrics[f"{phase}.{k}"] = float(a[k])
        metrics.update({f"{phase}.failures.{k}": float(v) for k, v in acc.failures.items()})
    params = [Param(k, v) for k, v in config_params(cfg).items()]
    params += [Param(f"synth.{k}", v) for k, v in config_params(synth).items()]
    now = int(time.time() * 1000)
    client.log_batch(rid, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()], params=params[:100])
    for i in range(100, len(params), 100):
        client.log_batch(rid, params=params[i: i + 100])
    client.log_dict(rid, s, "accounting.json")
    client.log_dict(rid, {"synth": config_to_dict(synth), "llm": config_to_dict(cfg)}, "resolved_config.json")
    if prompt_text:
        client.log_text(rid, prompt_text, "generation_prompt.md")
    if judge_prompt_text:
        client.log_text(rid, judge_prompt_text, "judge_prompt.md")
    client.set_terminated(rid, RunStatus.to_string(RunStatus.FINISHED if not report.stopped else RunStatus.FAILED))
    return rid


# ---------------------------------------------------------------- import


def import_synthetic(path: str | Path, cfg: LabelingConfig) -> list[tuple[str, int, int]]:
    """Bring already written synthetic questions (the shipped ``synthetic/squad2-questions.jsonl``) into
    the label store as their writer's labels, rater ``<generator>@shipped``, like ``suffice label import``
    does for the teacher's labels. Returns ``(rater, read, new)`` per writer; importing twice adds nothing.

    >>> import_synthetic("tests/fixtures/shared/synthetic/squad2-questions.jsonl", LabelingConfig(store="/tmp/s.sqlite"))  # doctest: +SKIP
    [('llm-generator-v1', 3, 3)]
    """
    from suffice.training.autorater.raters import CACHED_VERSION
    from suffice.training.autorater.store import LabelRecord
    from suffice.training.data.loaders import load_items

    items = load_items(path, "canonical")
    by_writer: dict[str, list[tuple[str, LabelRecord]]] = defaultdict(list)
    for it in items:
        if it.label is None:
            raise DataFormatError(f"question {it.id!r} carries no label: a synthetic question needs its writer's label "
                                  "(label 0/1 or level)", path=str(path), field="label")
        writer = cfg.rater_id or str(it.meta.get("generator") or SHIPPED_GENERATOR)
        why = f"synthetic {it.meta.get('kind') or '?'}" + (f"; answer: {it.meta['answer']}" if it.meta.get("answer") else "")
        by_writer[writer].append((it.id, LabelRecord(status="ok", label=int(it.label), level=it.level, rationale=why, attempts=0)))
    out = []
    with SynthStore(cfg.store_path()) as store:
        for writer, rows in sorted(by_writer.items()):
            store.register_rater(writer, CACHED_VERSION, kind="synthetic", scheme="three_level",
                                 prompt_text=f"synthetic questions imported from {path}")
            out.append((writer, len(rows), store.put_many(writer, CACHED_VERSION, rows)))
    return out


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Write synthetic training questions about a corpus with a teacher LLM, re-judge them with the "
                    f"autorater prompt, drop duplicates and disagreements. Other forms: `{PROG} import|judge --help`.",
        epilog="Any other --key=value sets a SynthConfig field (see suffice.training.synth.SynthConfig) or a "
               "LabelingConfig field (configs/labeling.yaml), e.g. --model=gpt-4o-mini --base_url=https://api.openai.com/v1")
    p.add_argument("--corpus", required=True, help="passages (.txt, JSONL) or an items file (SQuAD / HotPotQA / MuSiQue / QED / canonical)")
    p.add_argument("--per-passage", type=int, default=None, help="questions per passage (multi: per pair); default 10")
    p.add_argument("--kinds", nargs="+", default=None, metavar="KIND",
                   help=f"kinds to ask for (default: all of the mode): {', '.join(ALL_KINDS)}")
    p.add_argument("--multi", action="store_true", help="questions that need two passages (bridge / comparison) plus partial variants")
    p.add_argument("--judge", choices=JUDGES, default=None, help="who re-judges: the same LLM with the autorater prompt (rater) or lexical")
    p.add_argument("--existing", nargs="+", default=None, metavar="FILE", help="files whose questions must not be repeated")
    p.add_argument("--splits", nargs="+", default=None, choices=SPLITS, help="only passages of these splits (default: all)")
    p.add_argument("--out", default=None, help="output JSONL (default: data/synthetic/<generator>-<mode>.jsonl)")
    p.add_argument("--limit", type=int, default=None, help="only the first N passages (pairs)")
    p.add_argument("--retry-unparsed", action="store_true", help="ask again where the stored reply held no questions")
    _common(p)
    return p


def _action_parser(action: str) -> argparse.ArgumentParser:
    if action == "import":
        p = argparse.ArgumentParser(prog=f"{PROG} import", allow_abbrev=False,
                                    description="Import already written synthetic questions (default: the shipped "
                                                "synthetic/squad2-questions.jsonl) into the label store as <generator>@shipped.")
        p.add_argument("--path", default=None, help="synthetic JSONL (default: <shared data>/synthetic/squad2-questions.jsonl)")
        p.add_argument("--config", type=Path, default=None, help=f"YAML LabelingConfig (default: {DEFAULT_CONFIG} if present)")
        p.add_argument("--store", default=None, help="the SQLite label store (default: data/labels.sqlite)")
        return p
    p = argparse.ArgumentParser(prog=f"{PROG} judge", allow_abbrev=False,
                                description="Re-judge already written synthetic questions with a rater and keep those it agrees with.")
    p.add_argument("--input", required=True, help="synthetic JSONL (e.g. <shared data>/synthetic/squad2-questions.jsonl)")
    p.add_argument("--out", default=None, help="output JSONL (default: <input>.judged.jsonl)")
    p.add_argument("--retry-unparsed", action="store_true", help="ask again for items the judge left unparsed")
    _common(p, judge_choices=("openai-compatible", "lexical"))
    return p


def _common(p: argparse.ArgumentParser, judge_choices: Sequence[str] | None = None) -> None:
    if judge_choices:
        p.add_argument("--rater", choices=judge_choices, default=None, help="the judge (default: openai-compatible)")
    else:
        p.add_argument("--rater", choices=RATERS, default=None, help="the teacher LLM's client (openai-compatible, the default)")
    p.add_argument("--concurrency", type=int, default=None, help="requests in flight at once")
    p.add_argument("--config", type=Path, default=None, help=f"YAML LabelingConfig (default: {DEFAULT_CONFIG} if present)")
    p.add_argument("--store", default=None, help="the SQLite label store, shared with `suffice label` (default: data/labels.sqlite)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    p.add_argument("-v", "--verbose", action="store_true", help="log every retry")


def _split_overrides(rest: list[str]) -> tuple[list[str], list[str]]:
    """``--key=value`` arguments for SynthConfig and for LabelingConfig (unknown keys: an error naming both)."""
    bad = [a for a in rest if not (a.startswith("--") and "=" in a)]
    if bad:
        raise ConfigError(f"unexpected argument(s) {bad}: options are listed by --help, config overrides look like --key=value")
    synth_keys = {f.name for f in dataclasses.fields(SynthConfig)}
    llm_keys = {f.name for f in dataclasses.fields(LabelingConfig)}
    synth, llm = [], []
    for a in rest:
        key = a[2:].split("=", 1)[0].replace("-", "_").split(".")[0]
        if key in synth_keys:
            synth.append(a)
        elif key in llm_keys:
            llm.append(a)
        else:
            raise ConfigError(f"unknown config key {key!r}: SynthConfig keys are {sorted(synth_keys)}, "
                              f"LabelingConfig keys are {sorted(llm_keys)}")
    return synth, llm


def _labeling_config(args: argparse.Namespace, overrides: list[str], default_rater: str = "openai-compatible") -> LabelingConfig:
    config = args.config if args.config is not None else (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    extra = [f"--rater={getattr(args, 'rater', None) or default_rater}"]
    for key in ("concurrency", "store"):
        v = getattr(args, key, None)
        if v is not None:
            extra.append(f"--{key}={v}")
    return build_config(LabelingConfig, config, [*extra, *overrides])


def _synth_config(args: argparse.Namespace, overrides: list[str], corpus: str) -> SynthConfig:
    data: dict[str, Any] = parse_overrides(overrides)
    given = {"corpus": corpus, "per_passage": getattr(args, "per_passage", None), "kinds": getattr(args, "kinds", None),
             "mode": "multi" if getattr(args, "multi", False) else None, "judge": getattr(args, "judge", None),
             "existing": getattr(args, "existing", None), "splits": getattr(args, "splits", None),
             "out": getattr(args, "out", None), "limit": getattr(args, "limit", None),
             "retry_unparsed": True if getattr(args, "retry_unparsed", False) else None}
    data.update({k: v for k, v in given.items() if v is not None})
    if isinstance(data.get("kinds"), list):  # --kinds a,b c
        data["kinds"] = [k.strip() for v in data["kinds"] for k in str(v).split(",") if k.strip()]
    return config_from_dict(SynthConfig, data)


def _finish(report: SynthReport, args: argparse.Namespace, synth: SynthConfig, cfg: LabelingConfig,
            prompt_text: str | None, judge_prompt_text: str | None) -> int:
    print(report.format())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.summary(), indent=2, sort_keys=True))
    if cfg.mlflow:
        run_id = log_to_mlflow(report, synth=synth, cfg=cfg, prompt_text=prompt_text, judge_prompt_text=judge_prompt_text)
        print(f"MLflow run {run_id} (experiment {synth.experiment})")
    return 2 if report.stopped else 0


def _judge_prompt_text(synth: SynthConfig, cfg: LabelingConfig) -> str | None:
    if synth.judge == "lexical":
        return None
    from suffice.training.autorater.prompts import get_prompt

    return get_prompt(cfg.scheme).full_text()


def run_synth(argv: list[str]) -> int:
    from suffice.training.autorater.cli import setup_logging
    from suffice.training.autorater.raters import RaterConfigError

    args, rest = _parser().parse_known_args(argv)
    setup_logging(args.verbose)
    try:
        synth_over, llm_over = _split_overrides(rest)
        cfg = _labeling_config(args, llm_over)
        if cfg.rater != "openai-compatible":
            fix = ("to bring in the shipped synthetic questions use `suffice synth import`" if cfg.rater == "cached"
                   else "the lexical rater can only judge: use --judge lexical with an LLM writer")
            raise ConfigError(f"{PROG} writes questions with an LLM: --rater must be openai-compatible (got {cfg.rater!r}); {fix}")
        synth = _synth_config(args, synth_over, args.corpus)
        print(f"{PROG}: {synth.per_passage} questions per {'passage' if synth.mode == 'single' else 'pair'} of {synth.corpus} "
              f"({synth.mode}, kinds {', '.join(synth.resolved_kinds())}), writer {cfg.model} at {cfg.base_url}, "
              f"judge {synth.judge}, concurrency {cfg.concurrency}, store {cfg.store_path()}", file=sys.stderr)
        report = synthesize(synth, cfg, progress=cfg.progress and not args.no_progress)
    except (ConfigError, DataFormatError, FileNotFoundError, RaterConfigError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if report.stopped:
        print(f"{PROG}: stopped: {report.stopped}", file=sys.stderr)
    prompt = GenerationPrompt(mode=synth.mode, kinds=synth.resolved_kinds(), per_passage=synth.per_passage)
    return _finish(report, args, synth, cfg, prompt.full_text(), _judge_prompt_text(synth, cfg))


def run_judge(argv: list[str]) -> int:
    from suffice.training.autorater.cli import setup_logging
    from suffice.training.autorater.raters import RaterConfigError

    args, rest = _action_parser("judge").parse_known_args(argv)
    setup_logging(args.verbose)
    try:
        synth_over, llm_over = _split_overrides(rest)
        cfg = _labeling_config(args, llm_over)
        judge = "lexical" if cfg.rater == "lexical" else "rater"
        synth = _synth_config(args, [*synth_over, f"--judge={judge}"], args.input)
        report = rejudge(args.input, synth, cfg, progress=cfg.progress and not args.no_progress)
    except (ConfigError, DataFormatError, FileNotFoundError, RaterConfigError, ValueError) as e:
        print(f"{PROG} judge: error: {e}", file=sys.stderr)
        return 2
    if report.stopped:
        print(f"{PROG} judge: stopped: {report.stopped}", file=sys.stderr)
    return _finish(report, args, synth, cfg, None, _judge_prompt_text(synth, cfg))


def run_import(argv: list[str]) -> int:
    args, rest = _action_parser("import").parse_known_args(argv)
    try:
        _, llm_over = _split_overrides(rest)
        cfg = _labeling_config(args, llm_over, default_rater="cached")
        if args.path:
            path = Path(args.path)
        else:
            from suffice.training.paths import data_dir

            path = data_dir() / "synthetic" / "squad2-questions.jsonl"
        results = import_synthetic(path, cfg)
    except (ConfigError, DataFormatError, FileNotFoundError, ValueError) as e:
        print(f"{PROG} import: error: {e}", file=sys.stderr)
        return 2
    for writer, read, new in results:
        print(f"imported {writer}@shipped: {read} synthetic labels read from {path}, {new} new, "
              f"{read - new} already in {cfg.store_path()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``suffice synth`` (and its ``import`` and ``judge`` forms)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "import":
        return run_import(argv[1:])
    if argv and argv[0] == "judge":
        return run_judge(argv[1:])
    return run_synth(argv)


if __name__ == "__main__":
    sys.exit(main())
