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

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

from suffice.training.schema import LEVELS, SPLITS, DataFormatError, Item, Passage, level_to_label

FORMATS = ("squad2", "hotpotqa", "musique", "qed", "canonical")
GATE_LABELS = ("RETRIEVE", "SKIP")
ROLES = ("system", "user", "assistant")
_JSONL_SUFFIXES = (".jsonl", ".jsonlines", ".ndjson")


# ---------------------------------------------------------------- reports and errors


@dataclass
class LoadReport:
    """What one load did: records read, items kept, records dropped by reason, empty contexts."""

    path: str
    format: str
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    empty_passages: int = 0
    first_errors: list[str] = field(default_factory=list)  # a few messages, to show what was dropped

    def drop(self, reason: str, error: Exception | None = None) -> None:
        self.dropped[reason] += 1
        if error is not None and len(self.first_errors) < 5:
            self.first_errors.append(str(error))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "read": self.read, "kept": self.kept,
                "dropped": dict(sorted(self.dropped.items())), "empty_passages": self.empty_passages,
                "first_errors": list(self.first_errors)}


class LoadedItems(list):
    """A ``list[Item]`` that also carries the :class:`LoadReport` of the load that made it."""

    def __init__(self, items: Sequence[Item] = (), report: LoadReport | None = None):
        super().__init__(items)
        self.report = report


def _error(reason: str, message: str, path: Any, line: int | None, field_: str | None) -> DataFormatError:
    err = DataFormatError(message, path=str(path), line=line, field=field_)
    err.reason = f"{reason}: {field_}" if field_ else reason  # the drop-counter key under on_error="skip"
    return err


class _Record:
    """One raw record plus where it came from, with typed getters that raise located errors."""

    def __init__(self, obj: Any, path: Path, line: int | None, where: str = ""):
        self.obj, self.path, self.line, self.where = obj, path, line, where
        if not isinstance(obj, dict):
            raise _error("wrong type", f"expected a JSON object, got {type(obj).__name__}: {_short(obj)}",
                         path, line, where or None)

    def fail(self, reason: str, key: str, message: str) -> DataFormatError:
        return _error(reason, message, self.path, self.line, f"{self.where}.{key}" if self.where else key)

    def get(self, key: str, types: type | tuple[type, ...], *, required: bool = True, default: Any = None) -> Any:
        if key not in self.obj or self.obj[key] is None:
            if required:
                raise self.fail("missing field", key, f"required field '{key}' is missing (record keys: {sorted(self.obj)})")
            return default
        value = self.obj[key]
        if not isinstance(value, types) or isinstance(value, bool) and bool not in _as_tuple(types):
            names = "/".join(t.__name__ for t in _as_tuple(types))
            raise self.fail("wrong type", key, f"'{key}' must be {names}, got {type(value).__name__}: {_short(value)}")
        return value

    def text(self, key: str, *, required: bool = True, default: str = "") -> str:
        value = self.get(key, (str, int), required=required, default=default)
        value = str(value).strip()
        if required and not value:
            raise self.fail("missing field", key, f"'{key}' is empty: every record needs a non-empty {key}")
        return value


def _as_tuple(t: Any) -> tuple:
    return t if isinstance(t, tuple) else (t,)


def _short(value: Any, n: int = 80) -> str:
    s = json.dumps(value, ensure_ascii=False, default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


# ---------------------------------------------------------------- reading files


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield n, json.loads(raw)
            except json.JSONDecodeError as e:
                err = _error("malformed JSON", f"malformed JSON ({e.msg} at column {e.colno}): {raw.strip()[:80]!r}", path, n, None)
                yield n, err


def _iter_json_array(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array with the line each starts on (json.load would lose it)."""
    dec, pos, line = json.JSONDecoder(), 0, 1

    def skip_ws(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def line_at(i: int) -> int:
        nonlocal pos, line
        line += text.count("\n", pos, i)
        pos = i
        return line

    i = skip_ws(0)
    if i >= len(text) or text[i] != "[":
        raise _error("malformed JSON", "expected a JSON array of records", path, line_at(i), None)
    i = skip_ws(i + 1)
    if i < len(text) and text[i] == "]":
        return
    while True:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise _error("malformed JSON", f"malformed JSON ({e.msg} at column {e.colno})", path, e.lineno, None) from None
        yield line_at(i), obj
        i = skip_ws(end)
        if i < len(text) and text[i] == ",":
            i = skip_ws(i + 1)
        elif i < len(text) and text[i] == "]":
            return
        else:
            raise _error("malformed JSON", "expected ',' or ']' after an array element", path, line_at(min(i, len(text))), None)


def _iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, record-or-error) for JSONL files and top-level JSON arrays."""
    if path.suffix.lower() in _JSONL_SUFFIXES:
        yield from _iter_jsonl(path)
    else:
        yield from _iter_json_array(path, path.read_text(encoding="utf-8"))


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise _error("malformed JSON", f"malformed JSON ({e.msg} at column {e.colno})", path, e.lineno, None) from None


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (recorded in manifests so a run knows exactly what it read)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_split(key: str, fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> str:
    """Deterministic split from a key: ``sha256(key) % 100`` against (train, validation, test) percentages.

    The shared items.jsonl used this rule on the item id (qed: 70/15/15, hotpotqa-fullwiki: 60/20/20).

    >>> hash_split("qed:-3290814144789249484", (0.7, 0.15, 0.15))
    'test'
    """
    train, val, test = _check_fractions(fractions)
    bucket = int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % 100
    if bucket < round(test * 100):
        return "test"
    if bucket < round((test + val) * 100):
        return "validation"
    return "train"


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"split fractions {list(fractions)} must be three non-negative numbers (train, validation, test) summing to 1, e.g. [0.8, 0.1, 0.1]")
    return float(fractions[0]), float(fractions[1]), float(fractions[2])


# ---------------------------------------------------------------- format detection


def _sniff(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return None
    if "question_text" in obj and "paragraph_text" in obj:
        return "qed"
    if "paragraphs" in obj and "question" in obj:
        return "musique"
    if "context" in obj and "question" in obj and ("_id" in obj or "supporting_facts" in obj):
        return "hotpotqa"
    if "passages" in obj and "question" in obj:
        return "canonical"
    if "data" in obj and isinstance(obj.get("data"), list):
        return "squad2"
    return None


_SNIFF_HELP = ("qed (question_text + paragraph_text), musique (question + paragraphs), hotpotqa (_id + question + "
               "context), canonical (id + question + passages), squad2 ({version, data: [...]})")


def detect_format(path: str | Path) -> str:
    """The format of a file from its first record (see the module docstring).

    >>> detect_format("tests/fixtures/qed.jsonl")  # doctest: +SKIP
    'qed'
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"input file {p} does not exist: give the path of a SQuAD/HotPotQA/MuSiQue/QED/canonical file")
    if p.suffix.lower() in _JSONL_SUFFIXES:
        for line, obj in _iter_jsonl(p):
            if isinstance(obj, DataFormatError):
                raise obj
            fmt = _sniff(obj)
            if fmt is None or fmt == "squad2":
                raise _error("unknown format", f"cannot tell the format from this record (keys {sorted(obj) if isinstance(obj, dict) else type(obj).__name__}); "
                             f"expected one of: {_SNIFF_HELP}, or pass format=", p, line, None)
            return fmt
        raise _error("empty file", "the file holds no records", p, None, None)
    head = p.read_text(encoding="utf-8", errors="replace").lstrip()[:1]
    if head == "[":
        for line, obj in _iter_records(p):
            fmt = _sniff(obj)
            if fmt is None or fmt == "squad2":
                raise _error("unknown format", f"cannot tell the format from the first array element; expected one of: {_SNIFF_HELP}", p, line, None)
            return fmt
        raise _error("empty file", "the JSON array is empty", p, 1, None)
    if head == "{":
        obj = _load_json(p)
        if _sniff(obj) == "squad2":
            return "squad2"
        raise _error("unknown format", f"a single JSON object with keys {sorted(obj)[:10]} is not a known format; expected {_SNIFF_HELP}", p, 1, None)
    raise _error("unknown format", "the file is neither JSON nor JSON Lines", p, 1, None)


# ---------------------------------------------------------------- per-format parsers


def _source_for(path: Path, default: str, source: str | None) -> str:
    if source:
        return source
    if default == "hotpotqa":
        name = path.name.lower()
        return "hotpotqa-distractor" if "distractor" in name else "hotpotqa-fullwiki" if "fullwiki" in name else "hotpotqa"
    return default


def _dedup_sorted(values: Sequence[str]) -> list[str]:
    return sorted({v for v in values if isinstance(v, str)})


def _parse_hotpotqa(rec: _Record, source: str) -> Item:
    rid = rec.text("_id" if "_id" in rec.obj else "id")
    question = rec.text("question")
    ctx = rec.get("context", (list, dict))
    passages: list[Passage] = []
    if isinstance(ctx, dict):  # Hugging Face layout: {title: [...], sentences: [[...]]}
        titles, sents = ctx.get("title"), ctx.get("sentences")
        if not isinstance(titles, list) or not isinstance(sents, list) or len(titles) != len(sents):
            raise rec.fail("wrong type", "context", "dict context needs equal-length lists 'title' and 'sentences'")
        pairs = list(zip(titles, sents))
    else:
        pairs = ctx
    for k, pair in enumerate(pairs):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)
                and isinstance(pair[1], list) and all(isinstance(s, str) for s in pair[1])):
            raise rec.fail("wrong type", f"context[{k}]", f"each context entry must be [title, [sentences]], got {_short(pair)}")
        passages.append(Passage(pair[0], "".join(pair[1]).strip()))
    gold: dict[str, Any] = {}
    if rec.obj.get("answer") is not None:
        gold["answers"] = [str(rec.obj["answer"])]
    for key in ("type", "level"):
        if key in rec.obj:
            gold[key] = rec.obj[key]
    sf = rec.obj.get("supporting_facts")
    if isinstance(sf, dict):  # HF layout: {title: [...], sent_id: [...]}
        sf = [[t, i] for t, i in zip(sf.get("title", []), sf.get("sent_id", []))]
    if sf is not None:
        if not isinstance(sf, list) or not all(isinstance(x, (list, tuple)) and len(x) == 2 for x in sf):
            raise rec.fail("wrong type", "supporting_facts", f"must be a list of [title, sentence index], got {_short(sf)}")
        present = {p.title for p in passages}
        titles = _dedup_sorted([x[0] for x in sf])
        gold.update(supporting_titles=titles, supporting_present=sum(t in present for t in titles),
                    supporting_facts=[list(x) for x in sf])
    return Item(id=f"{source}:{rid}", question=question, passages=passages, source=source, group=f"{source}:{rid}", gold=gold)


def _parse_musique(rec: _Record, source: str) -> Item:
    rid = rec.text("id")
    question = rec.text("question")
    paragraphs = rec.get("paragraphs", list)
    passages, supporting = [], []
    for k, p in enumerate(paragraphs):
        prec = _Record(p, rec.path, rec.line, f"paragraphs[{k}]")
        passages.append(Passage(prec.text("title", required=False), prec.text("paragraph_text")))
        if prec.get("is_supporting", bool, required=False, default=False):
            # positions, not the file's idx: they stay valid however the list is re-indexed
            supporting.append(k)
    answers = ([str(rec.obj["answer"])] if rec.obj.get("answer") is not None else []) + [
        str(a) for a in rec.get("answer_aliases", list, required=False, default=[])]
    decomposition = rec.get("question_decomposition", list, required=False)
    hops = len(decomposition) if decomposition is not None else int(rid[0]) if rid[:1].isdigit() else len(supporting)
    gold: dict[str, Any] = {"answers": answers, "supporting_idx": supporting, "hops": hops}
    if rec.obj.get("answerable") is False:
        gold["answerable"] = False
    return Item(id=f"{source}:{rid}", question=question, passages=passages, source=source, group=f"{source}:{rid}", gold=gold)


def _parse_qed(rec: _Record, source: str) -> Item:
    rid = rec.text("example_id")
    ann = rec.get("annotation", dict)
    etype = ann.get("explanation_type")
    if not isinstance(etype, str):
        raise rec.fail("missing field", "annotation.explanation_type", "QED annotation needs 'explanation_type' (single_sentence, multi_sentence or none)")
    nq = rec.get("original_nq_answers", list, required=False, default=[])
    answers = _dedup_sorted([a.get("string") for grp in nq if isinstance(grp, list) for a in grp if isinstance(a, dict)])
    gold = {"explanation_type": etype, "answerable": etype != "none", "answers": answers,
            "selected_sentence": ann.get("selected_sentence")}
    passages = [Passage(rec.text("title_text", required=False), rec.text("paragraph_text"))]
    return Item(id=f"{source}:{rid}", question=rec.text("question_text"), passages=passages, source=source,
                group=f"{source}:{rid}", gold=gold)


_CANONICAL_FIELDS = {"id", "question", "passages", "label", "level", "label_source", "split", "source", "group",
                     "gold", "variant", "parent_id", "meta"}


def _parse_passages(rec: _Record, key: str = "passages") -> list[Passage]:
    raw = rec.get(key, list)
    out = []
    for k, p in enumerate(raw):
        if isinstance(p, str):
            out.append(Passage("", p.strip()))
            continue
        if not isinstance(p, dict):
            raise rec.fail("wrong type", f"{key}[{k}]", f"a passage must be a {{title, text}} object or a string, got {type(p).__name__}: {_short(p)}")
        title, text = p.get("title", ""), p.get("text")
        if not isinstance(text, str):
            raise rec.fail("wrong type" if text is not None else "missing field", f"{key}[{k}].text",
                           f"a passage needs a string 'text', got {_short(text)}")
        if title is not None and not isinstance(title, str):
            raise rec.fail("wrong type", f"{key}[{k}].title", f"'title' must be a string, got {_short(title)}")
        out.append(Passage(title or "", text.strip()))
    return out


def parse_label(rec: _Record) -> tuple[int | None, str | None]:
    """Validated (label, level) of a record: label 0/1, level one of LEVELS, and the two consistent."""
    label, level = rec.obj.get("label"), rec.obj.get("level")
    if label is not None and (isinstance(label, bool) or label not in (0, 1)):
        raise rec.fail("unknown label", "label", f"unknown label value {_short(label)}: use 1 (sufficient), 0 (not sufficient) or null")
    if level is not None and level not in LEVELS:
        raise rec.fail("unknown level", "level", f"unknown level value {_short(level)}: use one of {list(LEVELS)} or null")
    if label is not None and level is not None and level_to_label(level) != label:
        raise rec.fail("unknown label", "level", f"level '{level}' contradicts label {label}: 'sufficient' goes with 1, 'partial'/'insufficient' with 0")
    if label is None and level is not None:
        label = level_to_label(level)
    return label, level


def _parse_canonical(rec: _Record, source: str | None) -> Item:
    rid = rec.text("id")
    label, level = parse_label(rec)
    split = rec.get("split", str, required=False)
    if split is not None and split not in SPLITS:
        raise rec.fail("unknown split", "split", f"unknown split {split!r}: use one of {list(SPLITS)} or leave it out")
    src = rec.get("source", str, required=False) or source or (rid.split(":", 1)[0] if ":" in rid else None)
    meta = {k: v for k, v in rec.obj.items() if k not in _CANONICAL_FIELDS}
    meta.update(rec.get("meta", dict, required=False, default={}))
    return Item(id=rid, question=rec.text("question"), passages=_parse_passages(rec), label=label, level=level,
                label_source=rec.get("label_source", str, required=False) or ("rater" if label is not None else None),
                split=split, source=src, group=rec.get("group", str, required=False) or rid,
                gold=rec.get("gold", dict, required=False, default={}),
                variant=rec.get("variant", str, required=False), parent_id=rec.get("parent_id", str, required=False), meta=meta)


def _squad_records(path: Path, source: str) -> Iterator[tuple[int | None, Any]]:
    """SQuAD's nested JSON flattened to one (None, Item-or-error) per question; errors carry a field path."""
    doc = _load_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise _error("wrong type", "SQuAD JSON needs a top-level object with a 'data' list of articles", path, 1, "data")
    for a, article in enumerate(doc["data"]):
        try:
            art = _Record(article, path, None, f"data[{a}]")
            title = art.text("title", required=False)
            paragraphs = art.get("paragraphs", list)
        except DataFormatError as e:
            yield None, e
            continue
        for pi, para in enumerate(paragraphs):
            try:
                prec = _Record(para, path, None, f"data[{a}].paragraphs[{pi}]")
                context, qas = prec.text("context"), prec.get("qas", list)
            except DataFormatError as e:
                yield None, e
                continue
            for qi, qa in enumerate(qas):
                try:
                    q = _Record(qa, path, None, f"data[{a}].paragraphs[{pi}].qas[{qi}]")
                    qid, question = q.text("id"), q.text("question")
                    answers = q.get("answers", list, required=False, default=[])
                    plausible = q.get("plausible_answers", list, required=False, default=[])
                    gold = {"answerable": not q.get("is_impossible", bool, required=False, default=False),
                            "answers": _dedup_sorted([x.get("text") for x in answers if isinstance(x, dict)]),
                            "plausible_answers": _dedup_sorted([x.get("text") for x in plausible if isinstance(x, dict)])}
                    yield None, Item(id=f"{source}:{qid}", question=question, passages=[Passage(title.replace("_", " "), context)],
                                     source=source, group=f"{source}:{title}:{pi}", gold=gold, meta={"article": title})
                except DataFormatError as e:
                    yield None, e


_PARSERS: dict[str, Callable[[_Record, Any], Item]] = {
    "hotpotqa": _parse_hotpotqa, "musique": _parse_musique, "qed": _parse_qed, "canonical": _parse_canonical,
}


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
    src = source if format == "canonical" else _source_for(p, format, source)
    if format == "squad2":
        records: Iterator[tuple[int | None, Any]] = _squad_records(p, src)
    else:
        records = _iter_records(p)
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
            item = obj if isinstance(obj, Item) else _PARSERS[format](_Record(obj, p, line), src)
            if item.id in seen:
                first = f"line {seen[item.id]}" if seen[item.id] else "an earlier record"
                raise _error("duplicate id", f"duplicate id {item.id!r} (first seen at {first}): ids must be unique", p, line, "id")
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
    for line, obj in _iter_jsonl(p):
        if isinstance(obj, DataFormatError):
            raise obj
        rec = _Record(obj, p, line)
        rid = rec.text("id")
        label, level = parse_label(rec)
        if label is None:
            raise rec.fail("missing field", "label", "an autorater record needs 'label' (0 or 1) or 'level'")
        if rid in out:
            raise rec.fail("duplicate id", "id", f"duplicate id {rid!r} (first at line {lines[rid]}): one label per item")
        out[rid] = {"label": label, "level": level, "rationale": rec.text("rationale", required=False),
                    "rater": rec.text("rater", required=False) or "unknown"}
        lines[rid] = line
    return out


# ---------------------------------------------------------------- retrieval-gate threads


@dataclass
class RetrievalThread:
    """One chat thread whose last user message is labelled RETRIEVE (needs new content) or SKIP."""

    id: str
    messages: list[dict[str, str]]
    label: str
    category: str | None
    split: str

    @property
    def label_id(self) -> int:
        """0 = RETRIEVE, 1 = SKIP (the retrieval-gate model's id2label)."""
        return GATE_LABELS.index(self.label)


def load_retrieval_threads(path: str | Path, fractions: Sequence[float] = (0.8, 0.1, 0.1),
                           split_by: Literal["id", "conversation"] = "id") -> list[RetrievalThread]:
    """Validated retrieval-gate threads with a deterministic split from a hash.

    ``split_by="id"`` hashes each thread id; ``"conversation"`` hashes the first message, so
    follow-ups of one conversation (which share their opening turns) always land in one split.

    >>> threads = load_retrieval_threads("../shared/data/retrieval-gate/train.jsonl")  # doctest: +SKIP
    >>> threads[0].label, threads[0].messages[-1]["role"]  # doctest: +SKIP
    ('SKIP', 'user')
    """
    _check_fractions(fractions)
    if split_by not in ("id", "conversation"):
        raise ValueError(f"split_by={split_by!r}: choose 'id' or 'conversation'")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"retrieval-gate file {p} does not exist")
    out: list[RetrievalThread] = []
    seen: dict[str, int] = {}
    for line, obj in _iter_jsonl(p):
        if isinstance(obj, DataFormatError):
            raise obj
        rec = _Record(obj, p, line)
        rid = rec.text("id")
        if rid in seen:
            raise rec.fail("duplicate id", "id", f"duplicate id {rid!r} (first at line {seen[rid]})")
        messages = rec.get("messages", list)
        if not messages:
            raise rec.fail("missing field", "messages", "a thread needs at least one message")
        for k, m in enumerate(messages):
            mrec = _Record(m, p, line, f"messages[{k}]")
            role = mrec.get("role", str)
            if role not in ROLES:
                raise mrec.fail("unknown role", "role", f"unknown role {role!r}: use one of {list(ROLES)}")
            mrec.get("content", str)
        if messages[-1]["role"] != "user":
            raise rec.fail("bad thread", f"messages[{len(messages) - 1}].role", "the last message must be the user's new turn (role 'user')")
        label = rec.get("label", str)
        if label not in GATE_LABELS:
            raise rec.fail("unknown label", "label", f"unknown label {label!r}: use one of {list(GATE_LABELS)}")
        key = rid if split_by == "id" else messages[0]["content"]
        seen[rid] = line
        out.append(RetrievalThread(id=rid, messages=[{"role": m["role"], "content": m["content"]} for m in messages],
                                   label=label, category=rec.get("category", str, required=False),
                                   split=hash_split(key, fractions)))
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
    if p.suffix.lower() in _JSONL_SUFFIXES + (".json",):
        for line, obj in _iter_records(p):
            if isinstance(obj, DataFormatError):
                raise obj
            if isinstance(obj, str):
                text, title = obj.strip(), ""
            else:
                rec = _Record(obj, p, line)
                text, title = rec.text("text"), rec.text("title", required=False)
            if text:
                out.append(Passage(title, text))
    else:
        with p.open(encoding="utf-8") as f:
            out = [Passage("", s.strip()) for s in f if s.strip()]
    return out
