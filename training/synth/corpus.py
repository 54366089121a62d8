"""The corpus ``suffice synth`` writes about: its entries (passages with split, group and source), the
seeds asked about (one passage, or a pair in multi mode), and the questions not to repeat.

>>> passage_id(Passage("Lima", "Lima is in Peru."))
'p:60d4b38fec1ecbde'
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from suffice.training.data.loaders import detect_format, load_items, load_passages, supporting_positions
from suffice.training.data.schema import DataFormatError, Passage
from suffice.training.data.splits import hash_split
from suffice.training.synth.generate import Seed

_SPLIT_RANK = {"train": 0, "validation": 1, "test": 2}  # a passage seen in several splits takes the strictest
_PASSAGE_SUFFIXES = (".txt", ".text", ".md")


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
    out = {normalize_question(e.question) for e in entries if e.question}
    for f in files:
        out.update(normalize_question(it.question) for it in load_items(f))
    return out
