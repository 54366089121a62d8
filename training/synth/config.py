"""What ``suffice synth`` writes, about which passages, and where it goes: :class:`SynthConfig`.

(``suffice.serving.config`` is the generic YAML / ``--key=value`` engine that builds it; the LLM
connection is the autorater's :class:`~suffice.training.autorater.labeling_config.LabelingConfig`.)

>>> SynthConfig(corpus="passages.txt", per_passage=4).resolved_kinds()[:2]
('direct', 'paraphrase')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from suffice.serving.config import ConfigError
from suffice.training.data.formats import FORMATS
from suffice.training.data.schema import SPLITS
from suffice.training.synth.prompt import MODES, MULTI_KINDS, SINGLE_KINDS

JUDGES = ("rater", "lexical")
MAX_PER_PASSAGE = 50


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
