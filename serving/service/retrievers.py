"""Retrievers for the chat gateway: a built-in BM25 over a local JSONL corpus, others by entry point.

A retriever is any object with ``retrieve(query, k) -> list[RetrievedDocument]``. The service
builds one from ``retriever: {name, options}``: ``bm25`` is built in; any other name is looked
up in the ``suffice.retrievers`` entry-point group (a package declares
``[project.entry-points."suffice.retrievers"] mine = "pkg.module:factory"``), or given directly
as ``module:attr``. The factory is called with ``options`` as keyword arguments.

>>> r = BM25Retriever.from_documents([{"id": "a", "text": "Paris is the capital of France."},
...                                   {"id": "b", "text": "Berlin is in Germany."}])
>>> [d.id for d in r.retrieve("capital of France", k=1)]
['a']
"""

from __future__ import annotations

import importlib
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from suffice.serving.jsonl import JSONLError, iter_json_lines
from suffice.serving.lexical import STOPWORDS, stem, tokenize_words

ENTRY_POINT_GROUP = "suffice.retrievers"


class RetrieverError(ValueError):
    """A retriever cannot be built: bad corpus line, unknown name, wrong options."""


@dataclass(frozen=True)
class RetrievedDocument:
    id: str
    text: str
    title: str = ""
    score: float = 0.0


@runtime_checkable
class Retriever(Protocol):
    def retrieve(self, query: str, k: int) -> list[RetrievedDocument]: ...


def bm25_terms(text: str) -> list[str]:
    """Lower-cased, stop-word-free, stemmed words (the same stemmer as the lexical coverage).

    >>> bm25_terms("The cities of France")
    ['city', 'franc']
    """
    out = []
    for w in tokenize_words(text):
        lw = w.lower()
        if lw and lw not in STOPWORDS:
            out.append(stem(lw))
    return out


class BM25Retriever:
    """Okapi BM25 over an in-memory corpus (k1, b as in Robertson et al.; idf floored at 0).

    The corpus is a JSONL file: one ``{"id", "title", "text"}`` object (or a bare JSON string)
    per line; ``id`` defaults to the line number, blank lines are skipped.

    >>> BM25Retriever("corpus.jsonl").retrieve("Who wrote Hamlet?", k=3)  # doctest: +SKIP
    [RetrievedDocument(id='hamlet', text='Hamlet is a tragedy by Shakespeare.', title='Hamlet', score=3.1)]
    """

    def __init__(self, corpus: str | os.PathLike, k1: float = 1.5, b: float = 0.75):
        self.path = Path(corpus)
        self._index(read_corpus(self.path), k1, b)

    @classmethod
    def from_documents(cls, docs: Iterable[Mapping[str, Any] | str], k1: float = 1.5, b: float = 0.75) -> "BM25Retriever":
        self = cls.__new__(cls)
        self.path = None
        self._index([_parse_doc(d, i + 1, "documents") for i, d in enumerate(docs)], k1, b)
        return self

    def _index(self, docs: list[RetrievedDocument], k1: float, b: float) -> None:
        if not isinstance(k1, (int, float)) or k1 < 0 or not isinstance(b, (int, float)) or not 0 <= b <= 1:
            raise RetrieverError(f"bm25 needs k1 >= 0 and b in [0, 1], got k1={k1!r}, b={b!r}")
        self.k1, self.b = float(k1), float(b)
        self.docs = docs
        self._postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._lengths: list[int] = []
        for i, d in enumerate(docs):
            terms = bm25_terms(f"{d.title} {d.text}")
            self._lengths.append(len(terms))
            for t, tf in Counter(terms).items():
                self._postings[t].append((i, tf))
        n = len(docs)
        self._avgdl = (sum(self._lengths) / n) if n else 0.0
        self._idf = {t: max(0.0, math.log((n - len(p) + 0.5) / (len(p) + 0.5) + 1.0)) for t, p in self._postings.items()}

    def __len__(self) -> int:
        return len(self.docs)

    def retrieve(self, query: str, k: int = 5) -> list[RetrievedDocument]:
        """The ``k`` best documents for ``query`` (documents sharing no term are never returned)."""
        if k < 1 or not self.docs:
            return []
        scores: dict[int, float] = defaultdict(float)
        for t in sorted(set(bm25_terms(query))):  # sorted: float sums independent of the hash seed
            idf = self._idf.get(t)
            if not idf:
                continue
            for i, tf in self._postings[t]:
                norm = self.k1 * (1.0 - self.b + self.b * self._lengths[i] / (self._avgdl or 1.0))
                scores[i] += idf * tf * (self.k1 + 1.0) / (tf + norm)
        best = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        out = []
        for i, s in best:
            d = self.docs[i]
            out.append(RetrievedDocument(id=d.id, text=d.text, title=d.title, score=round(s, 6)))
        return out


def _parse_doc(obj: Any, line: int, where: str) -> RetrievedDocument:
    if isinstance(obj, str):
        return RetrievedDocument(id=str(line), text=obj)
    if not isinstance(obj, Mapping):
        raise RetrieverError(f"{where}:{line}: a corpus line must be a JSON object or string, got {type(obj).__name__}")
    unknown = sorted(set(obj) - {"id", "title", "text", "metadata"})
    if unknown:
        raise RetrieverError(f"{where}:{line}: unknown field(s) {unknown}; a document has id, title, text (and optional metadata)")
    text = obj.get("text")
    if not isinstance(text, str):
        raise RetrieverError(f"{where}:{line}: 'text' must be a string, got {text!r}")
    title = obj.get("title") or ""
    if not isinstance(title, str):
        raise RetrieverError(f"{where}:{line}: 'title' must be a string, got {title!r}")
    doc_id = obj.get("id", line)
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise RetrieverError(f"{where}:{line}: 'id' must be a string or an integer, got {doc_id!r}")
    return RetrievedDocument(id=str(doc_id), text=text, title=title)


def read_corpus(path: Path) -> list[RetrievedDocument]:
    """Documents of a JSONL corpus; errors name the file and the line."""
    if not path.is_file():
        raise RetrieverError(f"corpus {path} does not exist: set retriever.options.corpus to a JSONL file of {{id, title, text}} lines")
    docs: list[RetrievedDocument] = []
    seen: set[str] = set()
    try:
        for n, obj in iter_json_lines(path):
            d = _parse_doc(obj, n, str(path))
            if d.id in seen:
                raise RetrieverError(f"{path}:{n}: duplicate id {d.id!r}: document ids must be unique")
            seen.add(d.id)
            docs.append(d)
    except JSONLError as e:
        raise RetrieverError(f"{path}:{e.line_no}: not valid JSON ({e.reason})") from None
    return docs


def available_retrievers() -> list[str]:
    """``bm25`` plus the names registered in the ``suffice.retrievers`` entry-point group."""
    return sorted({"bm25", *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def _resolve_factory(name: str) -> Any:
    if name == "bm25":
        return BM25Retriever
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            obj: Any = importlib.import_module(module)
        except ImportError as e:
            raise RetrieverError(f"retriever.name={name!r}: cannot import {module!r} ({e})") from e
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise RetrieverError(f"retriever.name={name!r}: {module!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        return obj
    raise RetrieverError(
        f"unknown retriever.name={name!r}: choose one of {available_retrievers()}, 'none', "
        f"an entry point of the {ENTRY_POINT_GROUP!r} group, or 'module:attr'"
    )


def load_retriever(name: str, options: Mapping[str, Any] | None = None) -> Retriever | None:
    """Build the configured retriever (None for ``none``).

    >>> load_retriever("none") is None
    True
    """
    if name in ("none", "", None):
        return None
    factory = _resolve_factory(name)
    try:
        retriever = factory(**dict(options or {}))
    except TypeError as e:
        raise RetrieverError(f"retriever {name!r} rejected retriever.options {dict(options or {})!r}: {e}") from e
    if not callable(getattr(retriever, "retrieve", None)):
        raise RetrieverError(f"retriever {name!r} built a {type(retriever).__name__} without a retrieve(query, k) method")
    return retriever


def as_passages(docs: Sequence[RetrievedDocument]) -> list[dict[str, Any]]:
    return [{"id": d.id, "title": d.title, "text": d.text, "score": d.score} for d in docs]
