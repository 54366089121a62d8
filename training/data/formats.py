"""One parser per QA file format, each mapping a raw record into the canonical :class:`Item`, and the
format detection that picks one (see :mod:`suffice.training.data.loaders` for the formats).

>>> detect_format("tests/fixtures/qed.jsonl")  # doctest: +SKIP
'qed'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from suffice.training.data.records import (JSONL_SUFFIXES, Record, iter_record_lines, iter_records, load_json_document,
                                           located_error, short_repr)
from suffice.serving.bundle import LEVELS
from suffice.training.data.schema import SPLITS, DataFormatError, Item, Passage, level_to_label

FORMATS = ("squad2", "hotpotqa", "musique", "qed", "canonical")


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
    if p.suffix.lower() in JSONL_SUFFIXES:
        for line, obj in iter_record_lines(p):
            if isinstance(obj, DataFormatError):
                raise obj
            fmt = _sniff(obj)
            if fmt is None or fmt == "squad2":
                raise located_error("unknown format", f"cannot tell the format from this record (keys {sorted(obj) if isinstance(obj, dict) else type(obj).__name__}); "
                             f"expected one of: {_SNIFF_HELP}, or pass format=", p, line, None)
            return fmt
        raise located_error("empty file", "the file holds no records", p, None, None)
    head = p.read_text(encoding="utf-8", errors="replace").lstrip()[:1]
    if head == "[":
        for line, obj in iter_records(p):
            fmt = _sniff(obj)
            if fmt is None or fmt == "squad2":
                raise located_error("unknown format", f"cannot tell the format from the first array element; expected one of: {_SNIFF_HELP}", p, line, None)
            return fmt
        raise located_error("empty file", "the JSON array is empty", p, 1, None)
    if head == "{":
        obj = load_json_document(p)
        if _sniff(obj) == "squad2":
            return "squad2"
        raise located_error("unknown format", f"a single JSON object with keys {sorted(obj)[:10]} is not a known format; expected {_SNIFF_HELP}", p, 1, None)
    raise located_error("unknown format", "the file is neither JSON nor JSON Lines", p, 1, None)


# ---------------------------------------------------------------- per-format parsers


def source_for(path: Path, default: str, source: str | None) -> str:
    """The source name of a file: ``source`` if given, else the format's (hotpotqa: -distractor/-fullwiki from the file name)."""
    if source:
        return source
    if default == "hotpotqa":
        name = path.name.lower()
        return "hotpotqa-distractor" if "distractor" in name else "hotpotqa-fullwiki" if "fullwiki" in name else "hotpotqa"
    return default


def _dedup_sorted(values: Sequence[str]) -> list[str]:
    return sorted({v for v in values if isinstance(v, str)})


def _parse_hotpotqa(rec: Record, source: str) -> Item:
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
            raise rec.fail("wrong type", f"context[{k}]", f"each context entry must be [title, [sentences]], got {short_repr(pair)}")
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
            raise rec.fail("wrong type", "supporting_facts", f"must be a list of [title, sentence index], got {short_repr(sf)}")
        present = {p.title for p in passages}
        titles = _dedup_sorted([x[0] for x in sf])
        gold.update(supporting_titles=titles, supporting_present=sum(t in present for t in titles),
                    supporting_facts=[list(x) for x in sf])
    return Item(id=f"{source}:{rid}", question=question, passages=passages, source=source, group=f"{source}:{rid}", gold=gold)


def _parse_musique(rec: Record, source: str) -> Item:
    rid = rec.text("id")
    question = rec.text("question")
    paragraphs = rec.get("paragraphs", list)
    passages, supporting = [], []
    for k, p in enumerate(paragraphs):
        prec = Record(p, rec.path, rec.line, f"paragraphs[{k}]")
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


def _parse_qed(rec: Record, source: str) -> Item:
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


def _parse_passages(rec: Record, key: str = "passages") -> list[Passage]:
    raw = rec.get(key, list)
    out = []
    for k, p in enumerate(raw):
        if isinstance(p, str):
            out.append(Passage("", p.strip()))
            continue
        if not isinstance(p, dict):
            raise rec.fail("wrong type", f"{key}[{k}]", f"a passage must be a {{title, text}} object or a string, got {type(p).__name__}: {short_repr(p)}")
        title, text = p.get("title", ""), p.get("text")
        if not isinstance(text, str):
            raise rec.fail("wrong type" if text is not None else "missing field", f"{key}[{k}].text",
                           f"a passage needs a string 'text', got {short_repr(text)}")
        if title is not None and not isinstance(title, str):
            raise rec.fail("wrong type", f"{key}[{k}].title", f"'title' must be a string, got {short_repr(title)}")
        out.append(Passage(title or "", text.strip()))
    return out


def parse_label(rec: Record) -> tuple[int | None, str | None]:
    """Validated (label, level) of a record: label 0/1, level one of LEVELS, and the two consistent."""
    label, level = rec.obj.get("label"), rec.obj.get("level")
    if label is not None and (isinstance(label, bool) or label not in (0, 1)):
        raise rec.fail("unknown label", "label", f"unknown label value {short_repr(label)}: use 1 (sufficient), 0 (not sufficient) or null")
    if level is not None and level not in LEVELS:
        raise rec.fail("unknown level", "level", f"unknown level value {short_repr(level)}: use one of {list(LEVELS)} or null")
    if label is not None and level is not None and level_to_label(level) != label:
        raise rec.fail("unknown label", "level", f"level '{level}' contradicts label {label}: 'sufficient' goes with 1, 'partial'/'insufficient' with 0")
    if label is None and level is not None:
        label = level_to_label(level)
    return label, level


def _parse_canonical(rec: Record, source: str | None) -> Item:
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


def squad_records(path: Path, source: str) -> Iterator[tuple[int | None, Any]]:
    """SQuAD's nested JSON flattened to one (None, Item-or-error) per question; errors carry a field path."""
    doc = load_json_document(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise located_error("wrong type", "SQuAD JSON needs a top-level object with a 'data' list of articles", path, 1, "data")
    for a, article in enumerate(doc["data"]):
        try:
            art = Record(article, path, None, f"data[{a}]")
            title = art.text("title", required=False)
            paragraphs = art.get("paragraphs", list)
        except DataFormatError as e:
            yield None, e
            continue
        for pi, para in enumerate(paragraphs):
            try:
                prec = Record(para, path, None, f"data[{a}].paragraphs[{pi}]")
                context, qas = prec.text("context"), prec.get("qas", list)
            except DataFormatError as e:
                yield None, e
                continue
            for qi, qa in enumerate(qas):
                try:
                    q = Record(qa, path, None, f"data[{a}].paragraphs[{pi}].qas[{qi}]")
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


PARSERS: dict[str, Callable[[Record, Any], Item]] = {
    "hotpotqa": _parse_hotpotqa, "musique": _parse_musique, "qed": _parse_qed, "canonical": _parse_canonical,
}
