"""Loaders for the QA formats users bring, each mapping into suffice's one :class:`Item` schema.

Formats (``load_items(path, format="auto")`` detects them from the extension and the first record):

``squad2``     SQuAD 2.0 JSON (``{"version", "data": [{title, paragraphs: [{context, qas}]}]}``);
               one item per question, group ``<source>:<title>:<paragraph index>``.
``hotpotqa``   HotPotQA JSON list or JSONL, distractor/fullwiki ``context: [[title, [sentences]]]``
               (also the Hugging Face layout ``context: {title: [...], sentences: [[...]]}``).
``musique``    MuSiQue JSON list or JSONL with ``paragraphs[{idx, title, paragraph_text, is_supporting}]``.
``qed``        QED JSON Lines (``example_id, title_text, question_text, paragraph_text, annotation``).
``canonical``  suffice JSONL as in ``items.jsonl`` (may also carry ``label``/``level``).

Canonical ids are ``<source>:<original id>``; the raw loaders rebuild ``items.jsonl`` exactly
(questions and passages stripped, gold annotations as in the shared README). Raw formats carry
no split: :func:`hash_split` assigns one deterministically from a key (the same rule built the
shared splits: ``sha256(id) % 100`` against the test / validation percentages).

Bad input raises :class:`DataFormatError` naming the file, the line (JSON Lines and top-level JSON
arrays; a field path such as ``data[3].paragraphs[0].qas[2]`` for SQuAD's nested JSON) and the
field. With ``on_error="skip"`` bad records are dropped instead, and every drop is counted by
reason in the returned list's ``.report`` (a :class:`LoadReport`); nothing disappears silently.
An item with an empty passage list is valid (its context is insufficient by definition) and is
counted in ``report.empty_passages``.

>>> items = load_items("tests/fixtures/squad2.json")  # doctest: +SKIP
>>> items.report.kept, items[0].source  # doctest: +SKIP
(4, 'squad2')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Literal

from suffice.serving.bundle import sha256_file
from suffice.training.data.formats import (FORMATS, PARSERS, detect_format, parse_label, source_for,
                                           squad_records)
from suffice.training.data.records import (JSONL_SUFFIXES, LoadedItems, LoadReport, Record, iter_records,
                                           iter_strict_records, located_error)
from suffice.training.data.schema import DataFormatError, Item, Passage
from suffice.training.data.splits import hash_split
from suffice.training.data.threads import GATE_LABELS, ROLES, RetrievalThread, load_retrieval_threads

__all__ = [
    "FORMATS", "GATE_LABELS", "ROLES", "DataFormatError", "LoadReport", "LoadedItems", "RetrievalThread", "detect_format",
    "gold_answers", "gold_label", "item_answers", "gold_level", "hash_split", "load_items", "load_passages", "load_retrieval_threads",
    "parse_label", "read_autorater_labels", "sha256_file", "supporting_positions",
]


def load_items(path: str | Path, format: str = "auto", *, source: str | None = None,
               on_error: Literal["raise", "skip"] = "raise", progress: bool = False) -> LoadedItems:
    """Load one file in any supported format into canonical :class:`Item` objects.

    ``source`` overrides the source name (defaults: squad2, qed, musique, hotpotqa-fullwiki /
    hotpotqa-distractor from the file name, or the canonical record's own ``source``).
    ``on_error="skip"`` drops bad records and counts them in ``.report.dropped`` instead of raising.
    Duplicate ids are always an error (they would silently shadow each other downstream).

    >>> items = load_items("../shared/data/sources/qed-dev.jsonl")  # doctest: +SKIP
    >>> len(items), items.report.dropped  # doctest: +SKIP
    (1355, Counter())
    """
    p = Path(path)
    if format == "auto":
        format = detect_format(p)
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}: choose one of {list(FORMATS)} or 'auto'")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error={on_error!r}: choose 'raise' or 'skip'")
    if not p.is_file():
        raise FileNotFoundError(f"input file {p} does not exist")
    report = LoadReport(path=str(p), format=format)
    src = source if format == "canonical" else source_for(p, format, source)
    if format == "squad2":
        records: Iterator[tuple[int | None, Any]] = squad_records(p, src)
    else:
        records = iter_records(p)
    if progress:
        from tqdm.auto import tqdm

        records = tqdm(records, desc=f"load {p.name}", unit=" rec", leave=False)
    items: list[Item] = []
    seen: dict[str, int | None] = {}
    for line, obj in records:
        report.read += 1
        try:
            if isinstance(obj, Exception):
                raise obj
            item = obj if isinstance(obj, Item) else PARSERS[format](Record(obj, p, line), src)
            if item.id in seen:
                first = f"line {seen[item.id]}" if seen[item.id] else "an earlier record"
                raise located_error("duplicate id", f"duplicate id {item.id!r} (first seen at {first}): ids must be unique", p, line, "id")
        except DataFormatError as e:
            if on_error == "raise":
                raise
            report.drop(getattr(e, "reason", "invalid record"), e)
            continue
        seen[item.id] = line
        report.kept += 1
        report.empty_passages += not item.passages
        items.append(item)
    return LoadedItems(items, report)


# ---------------------------------------------------------------- gold labels


def gold_label(item: Item) -> int | None:
    """The label the source dataset's own annotations imply (None when they imply none).

    SQuAD 2.0: ``answerable``; QED: ``explanation_type != "none"``; HotPotQA: every supporting
    title is among the passages; MuSiQue: every supporting paragraph is present (and the item is
    answerable). Constructed variants carry ``supporting_missing`` or ``answerable: false``.

    >>> gold_label(Item(id="x", question="q?", passages=[], gold={"answerable": False}))
    0
    """
    g = item.gold or {}
    if g.get("supporting_missing"):
        return 0
    if "explanation_type" in g:
        return int(g["explanation_type"] != "none")
    if "supporting_titles" in g:
        present = {p.title for p in item.passages}
        return int(bool(g["supporting_titles"]) and all(t in present for t in g["supporting_titles"]))
    if "supporting_idx" in g:
        if g.get("answerable") is False:
            return 0
        return int(bool(g["supporting_idx"]) and all(0 <= i < len(item.passages) for i in g["supporting_idx"]))
    if "answerable" in g:
        return int(bool(g["answerable"]))
    return None


def supporting_positions(item: Item) -> list[int] | None:
    """Positions of the supporting passages of a multi-hop item (None when the item has no such notion)."""
    g = item.gold or {}
    if "supporting_titles" in g:
        wanted = set(g["supporting_titles"])
        return [k for k, p in enumerate(item.passages) if p.title in wanted]
    if "supporting_idx" in g:
        return [i for i in g["supporting_idx"] if 0 <= i < len(item.passages)]
    return None


def gold_level(item: Item) -> str | None:
    """Three-level reading of the gold label: sufficient, partial (some supporting passage present) or insufficient."""
    label = gold_label(item)
    if label is None:
        return None
    if label == 1:
        return "sufficient"
    return "partial" if supporting_positions(item) else "insufficient"


def gold_answers(item: Item) -> list[str]:
    """Answer strings from the gold annotations (SQuAD plausible answers included)."""
    g = item.gold or {}
    return [a for a in list(g.get("answers") or []) + list(g.get("plausible_answers") or []) if isinstance(a, str) and a.strip()]


def item_answers(item: Item) -> list[str]:
    """The strings that answer ``item``: its gold ``answers`` (not SQuAD's plausible answers of an
    unanswerable question), else the one ``answer`` a teacher-written question carries. The one
    owner of "which answers does a row have": prepared data stores them in its ``answers`` column.

    >>> item_answers(Item(id="s:1", question="q", passages=[], gold={"answers": ["Paris"], "plausible_answers": ["Rome"]}))
    ['Paris']
    """
    g = item.gold or {}
    if "answers" in g:
        return [str(a) for a in g.get("answers") or []]
    answer = item.meta.get("answer")
    return [str(answer)] if answer else []


# ---------------------------------------------------------------- autorater labels


def read_autorater_labels(path: str | Path) -> dict[str, dict[str, Any]]:
    """``{id: {label, level, rationale, rater}}`` from an autorater JSONL, validated line by line.

    >>> labels = read_autorater_labels("../shared/data/autorater-labels.jsonl")  # doctest: +SKIP
    >>> labels["squad2:68cf05f67fd29c6f129fe2fb9"]["label"]  # doctest: +SKIP
    1
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"autorater labels file {p} does not exist: run `suffice label` or point data_dir at the shared data")
    out: dict[str, dict[str, Any]] = {}
    lines: dict[str, int] = {}
    for rec in iter_strict_records(p):
        rid = rec.text("id")
        label, level = parse_label(rec)
        if label is None:
            raise rec.fail("missing field", "label", "an autorater record needs 'label' (0 or 1) or 'level'")
        if rid in out:
            raise rec.fail("duplicate id", "id", f"duplicate id {rid!r} (first at line {lines[rid]}): one label per item")
        out[rid] = {"label": label, "level": level, "rationale": rec.text("rationale", required=False),
                    "rater": rec.text("rater", required=False) or "unknown"}
        lines[rid] = rec.line
    return out


# ---------------------------------------------------------------- passage corpora


def load_passages(path: str | Path) -> list[Passage]:
    """A passage corpus: plain text (one passage per non-empty line) or JSON Lines / a JSON list of
    strings or ``{title, text}`` objects.

    >>> load_passages("tests/fixtures/passages.txt")[0].title  # doctest: +SKIP
    ''
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"passage file {p} does not exist")
    out: list[Passage] = []
    if p.suffix.lower() in JSONL_SUFFIXES + (".json",):
        for line, obj in iter_records(p):
            if isinstance(obj, DataFormatError):
                raise obj
            if isinstance(obj, str):
                text, title = obj.strip(), ""
            else:
                rec = Record(obj, p, line)
                text, title = rec.text("text"), rec.text("title", required=False)
            if text:
                out.append(Passage(title, text))
    else:
        with p.open(encoding="utf-8") as f:
            out = [Passage("", s.strip()) for s in f if s.strip()]
    return out
