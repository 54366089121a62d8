"""RAG gates built on the scorer: what goes into the prompt, and when to say "I don't know".

``ContextGate`` chooses which artifacts (system prompt, task, messages, documents) enter the
context under a token budget and a document cap, dropping off-topic documents; every exclusion
carries a reason. ``SafetyGate`` decides whether an answer should be given at all from the
retrieval scores, the scorer's sufficiency verdict, topicality, citations and grounding.

Both accept any ``scorer`` with ``score_batch(questions, passages_list) -> [result.score, ...]``
(a :class:`~suffice.serving.scorer.SufficiencyScorer`), or none: then relevance is lexical only.

>>> gate = ContextGate(scorer)  # doctest: +SKIP
>>> sel = gate.select(artifacts, budget_tokens=120, doc_cap=3)  # doctest: +SKIP
>>> [a.id for a in sel.admitted], [(e.artifact.id, e.reason.value) for e in sel.excluded]  # doctest: +SKIP
(['sys', 'task', 'q', 'paris-1', 'paris-2'], [('promo', 'out_of_scope')])
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping, Sequence

from suffice.serving.lexical import content_terms, keyword_coverage, stem, tokenize_words
from suffice.serving.packing import split_sentences

KIND_ORDER = {"system": 0, "task": 1, "message": 2, "document": 3}
_APPROX_TOKEN = re.compile(r"\w+|[^\w\s]")


def approx_token_count(text: str) -> int:
    """Words and punctuation marks: a tokenizer-free stand-in for a token count.

    >>> approx_token_count("Paris is the capital of France.")
    7
    """
    return len(_APPROX_TOKEN.findall(text))


def document_relevance(query: str, documents: Sequence[str], scorer: Any = None, model_weight: float = 0.5) -> list[float]:
    """Per-document relevance in [0, 1]: a blend of the scorer's score for (query, [doc]) and the
    share of the query's terms the document mentions (lexical only when there is no scorer).

    A single on-topic document rarely answers a question alone, so the model's sufficiency score
    would call it irrelevant; the lexical half keeps it, while an off-topic text scores low on both.

    >>> [round(x, 2) for x in document_relevance("capital of France?", ["Paris is the capital of France.", "Buy shoes."])]
    [1.0, 0.0]
    """
    if not documents:
        return []
    lexical = [keyword_coverage(query, [d]).score if d.strip() else 0.0 for d in documents]
    if scorer is None or model_weight == 0.0:
        return lexical
    results = scorer.score_batch([query] * len(documents), [[d] for d in documents])
    return [model_weight * float(r.score) + (1.0 - model_weight) * lex for r, lex in zip(results, lexical)]


# ------------------------------------------------------------------------------------------
# ContextGate
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Artifact:
    """One candidate piece of context.

    kind: ``system``, ``task``, ``message`` or ``document``.
    authority: higher is more trusted (admitted first). priority: higher first within a kind.
    """

    id: str
    kind: str
    content: str
    authority: float = 0.0
    priority: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KIND_ORDER:
            raise ValueError(f"artifact {self.id!r} has kind {self.kind!r}: choose one of {list(KIND_ORDER)}")
        if not isinstance(self.content, str):
            raise ValueError(f"artifact {self.id!r} content must be a string, got {type(self.content).__name__}")

    @classmethod
    def from_any(cls, a: "Artifact | Mapping[str, Any]") -> "Artifact":
        if isinstance(a, Artifact):
            return a
        if not isinstance(a, Mapping):
            raise ValueError(f"an artifact must be an Artifact or a mapping with id, kind, content; got {type(a).__name__}")
        unknown = sorted(set(a) - {"id", "kind", "content", "authority", "priority"})
        if unknown:
            raise ValueError(f"artifact {a.get('id')!r} has unknown key(s) {unknown}: use id, kind, content, authority, priority")
        missing = [k for k in ("id", "kind", "content") if k not in a]
        if missing:
            raise ValueError(f"artifact {dict(a)!r} is missing {missing}")
        return cls(id=str(a["id"]), kind=str(a["kind"]), content=a["content"] or "",
                   authority=float(a.get("authority", 0.0)), priority=float(a.get("priority", 0.0)))


class ExclusionReason(str, Enum):
    OUT_OF_SCOPE = "out_of_scope"
    BUDGET = "budget"
    DOC_CAP = "doc_cap"
    EMPTY = "empty"


@dataclass(frozen=True)
class Exclusion:
    artifact: Artifact
    reason: ExclusionReason
    detail: str


@dataclass(frozen=True)
class ContextSelection:
    """What the ContextGate admitted, what it left out (with reasons) and the assembled context."""

    admitted: list[Artifact]
    excluded: list[Exclusion]
    context: str
    tokens_used: int
    budget_tokens: int
    relevance: dict[str, float] = field(default_factory=dict)

    def reasons(self) -> dict[str, str]:
        """``{artifact id: reason}`` for the excluded artifacts."""
        return {e.artifact.id: e.reason.value for e in self.excluded}


@dataclass(frozen=True)
class ContextGateConfig:
    """ContextGate settings.

    budget_tokens: most tokens the assembled context may hold (block headers included).
    doc_cap: most documents admitted.
    relevance_threshold: documents below this relevance to the query are ``out_of_scope``.
    model_weight: weight of the scorer in the relevance blend (0 = lexical only).
    """

    budget_tokens: int = 1024
    doc_cap: int = 5
    relevance_threshold: float = 0.3
    model_weight: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.budget_tokens, int) or self.budget_tokens < 1:
            raise ValueError(f"budget_tokens={self.budget_tokens!r} must be a positive integer")
        if not isinstance(self.doc_cap, int) or self.doc_cap < 0:
            raise ValueError(f"doc_cap={self.doc_cap!r} must be an integer >= 0")
        if not 0.0 <= self.relevance_threshold <= 1.0:
            raise ValueError(f"relevance_threshold={self.relevance_threshold!r} must be in [0, 1]")
        if not 0.0 <= self.model_weight <= 1.0:
            raise ValueError(f"model_weight={self.model_weight!r} must be in [0, 1]")


def _block(a: Artifact) -> str:
    return f"[{a.kind}:{a.id}]\n{a.content.strip()}"


class ContextGate:
    """Admit artifacts into a prompt by authority, kind, priority and relevance, within a budget.

    Order: authority (high first), then kind (system, task, message, document), then priority
    (high first), then relevance (high first). Empty artifacts are ``empty``; documents below the
    relevance threshold are ``out_of_scope``; admission stops at the first artifact that does not
    fit (it and everything after it are ``budget``) or, for documents, at the cap (``doc_cap``).

    >>> gate = ContextGate(None, ContextGateConfig(budget_tokens=120, doc_cap=3))
    >>> sel = gate.select([{"id": "q", "kind": "message", "content": "What is the capital of France?"},
    ...                    {"id": "d1", "kind": "document", "content": "Paris is the capital of France."},
    ...                    {"id": "ad", "kind": "document", "content": "Buy our shoes today!"}])
    >>> [a.id for a in sel.admitted], sel.reasons()
    (['q', 'd1'], {'ad': 'out_of_scope'})
    """

    def __init__(self, scorer: Any = None, config: ContextGateConfig | None = None,
                 token_counter: Callable[[str], int] | None = None):
        self.scorer = scorer
        self.config = config or ContextGateConfig()
        if token_counter is None:
            token_counter = getattr(scorer, "count_tokens", None) or approx_token_count
        self.count_tokens = token_counter

    def select(self, artifacts: Sequence[Artifact | Mapping[str, Any]], query: str | None = None,
               budget_tokens: int | None = None, doc_cap: int | None = None) -> ContextSelection:
        """Choose the artifacts for one prompt. ``query`` defaults to the last ``message`` artifact."""
        arts = [Artifact.from_any(a) for a in artifacts]
        ids = [a.id for a in arts]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"artifact ids must be unique, repeated: {dup}")
        budget = self.config.budget_tokens if budget_tokens is None else budget_tokens
        cap = self.config.doc_cap if doc_cap is None else doc_cap
        if not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budget_tokens={budget!r} must be a positive integer")
        if query is None:
            msgs = [a.content for a in arts if a.kind == "message" and a.content.strip()]
            query = msgs[-1] if msgs else ""

        excluded: list[Exclusion] = []
        live = []
        for a in arts:
            if not a.content.strip():
                excluded.append(Exclusion(a, ExclusionReason.EMPTY, "the artifact has no content"))
            else:
                live.append(a)
        docs = [a for a in live if a.kind == "document"]
        relevance = {a.id: 1.0 for a in live if a.kind != "document"}
        if docs:
            if query.strip():
                scores = document_relevance(query, [d.content for d in docs], self.scorer, self.config.model_weight)
            else:
                scores = [1.0] * len(docs)  # no query to judge topicality against: keep documents in play
            relevance.update({d.id: s for d, s in zip(docs, scores)})
        candidates = []
        for a in live:
            if a.kind == "document" and relevance[a.id] < self.config.relevance_threshold:
                excluded.append(Exclusion(a, ExclusionReason.OUT_OF_SCOPE,
                                          f"relevance {relevance[a.id]:.2f} < threshold {self.config.relevance_threshold:g}"))
            else:
                candidates.append(a)
        candidates.sort(key=lambda a: (-a.authority, KIND_ORDER[a.kind], -a.priority, -relevance[a.id]))

        admitted: list[Artifact] = []
        used = n_docs = 0
        overflow = False
        for a in candidates:
            cost = self.count_tokens(_block(a))
            if overflow:
                excluded.append(Exclusion(a, ExclusionReason.BUDGET, "admission stopped at an earlier artifact that did not fit"))
                continue
            if a.kind == "document" and n_docs >= cap:
                excluded.append(Exclusion(a, ExclusionReason.DOC_CAP, f"{cap} document(s) already admitted"))
                continue
            if used + cost > budget:
                overflow = True
                excluded.append(Exclusion(a, ExclusionReason.BUDGET, f"needs {cost} tokens, {budget - used} of {budget} left"))
                continue
            admitted.append(a)
            used += cost
            n_docs += a.kind == "document"
        context = "\n\n".join(_block(a) for a in admitted)
        return ContextSelection(admitted=admitted, excluded=excluded, context=context, tokens_used=used,
                                budget_tokens=budget, relevance=relevance)


# ------------------------------------------------------------------------------------------
# SafetyGate
# ------------------------------------------------------------------------------------------
class RejectionReason(str, Enum):
    LOW_CONFIDENCE = "low_confidence"
    INSUFFICIENT_CONTEXT = "insufficient_context"
    OFF_TOPIC = "off_topic"
    MISSING_CITATIONS = "missing_citations"
    INVALID_CITATIONS = "invalid_citations"
    LOW_GROUNDING = "low_grounding"
    MULTIPLE_ISSUES = "multiple_issues"


CHECK_REASONS = {
    "retrieval_confidence": RejectionReason.LOW_CONFIDENCE,
    "context_sufficiency": RejectionReason.INSUFFICIENT_CONTEXT,
    "relevance": RejectionReason.OFF_TOPIC,
    "citation_coverage": RejectionReason.MISSING_CITATIONS,
    "citation_validity": RejectionReason.INVALID_CITATIONS,
    "grounding": RejectionReason.LOW_GROUNDING,
}


@dataclass(frozen=True)
class SafetyThresholds:
    """Every threshold of the SafetyGate ("I don't know") in one place.

    min_retrieval_confidence: the mean retriever score of the chunks must reach this (chunks
        without scores skip the check).
    min_context_chars: fewer characters of chunk text in total is insufficient context.
    reject_insufficient: reject when the scorer's level is ``insufficient``.
    min_relevance: the best chunk's relevance to the query must reach this, else off-topic.
    model_weight: weight of the scorer in the chunk relevance blend (0 = lexical only).
    min_citation_coverage: share of answer sentences that must cite a chunk as ``[n]`` (1-based).
    min_grounding: share of answer sentences whose content the cited chunks support.
    support_overlap: a sentence is supported when this share of its content terms appears in
        the chunks it cites.
    """

    min_retrieval_confidence: float = 0.6
    min_context_chars: int = 100
    reject_insufficient: bool = True
    min_relevance: float = 0.3
    model_weight: float = 0.5
    min_citation_coverage: float = 0.8
    min_grounding: float = 0.7
    support_overlap: float = 0.5

    def __post_init__(self) -> None:
        for name in ("min_retrieval_confidence", "min_relevance", "model_weight", "min_citation_coverage",
                     "min_grounding", "support_overlap"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}={v!r} must be a number in [0, 1]")
        if not isinstance(self.min_context_chars, int) or self.min_context_chars < 0:
            raise ValueError(f"min_context_chars={self.min_context_chars!r} must be an integer >= 0")


@dataclass(frozen=True)
class RetrievedChunk:
    text: str
    score: float | None = None
    title: str = ""

    @classmethod
    def from_any(cls, c: Any, i: int) -> "RetrievedChunk":
        if isinstance(c, RetrievedChunk):
            return c
        if isinstance(c, str):
            return cls(text=c)
        if isinstance(c, Mapping):
            unknown = sorted(set(c) - {"text", "score", "title", "id"})
            if unknown:
                raise ValueError(f"chunk {i} has unknown key(s) {unknown}: use text, score, title, id")
            if "text" not in c:
                raise ValueError(f"chunk {i} has no 'text': give {{'text': ..., 'score': ...}}")
            score = c.get("score")
            return cls(text=str(c["text"] or ""), score=None if score is None else float(score), title=str(c.get("title") or ""))
        raise ValueError(f"chunk {i} is a {type(c).__name__}: give a string, a RetrievedChunk or a {{text, score}} mapping")


@dataclass(frozen=True)
class SafetyResult:
    """The SafetyGate's verdict. ``confidence`` is the mean of the scores of the checks that ran."""

    should_reject: bool
    rejection_reason: RejectionReason | None
    confidence: float
    passed_checks: list[str]
    failed_checks: list[str]
    explanation: str
    diagnostics: dict[str, Any]


_CITATION = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")


class SafetyGate:
    """Decide whether to answer or say "I don't know", with the reason.

    >>> gate = SafetyGate()
    >>> r = gate.check("What is the capital of Peru?", [])
    >>> r.should_reject, r.rejection_reason.value
    (True, 'insufficient_context')
    """

    def __init__(self, scorer: Any = None, thresholds: SafetyThresholds | None = None):
        self.scorer = scorer
        self.thresholds = thresholds or SafetyThresholds()

    def check(self, query: str, chunks: Sequence[Any], answer: str | None = None) -> SafetyResult:
        """Run every check; reject when any fails. Citations ``[n]`` refer to ``chunks[n-1]``."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"query must be a non-empty string, got {query!r}")
        th = self.thresholds
        cs = [RetrievedChunk.from_any(c, i) for i, c in enumerate(chunks or [])]
        texts = [f"{c.title}. {c.text}" if c.title else c.text for c in cs]
        passed: list[str] = []
        failed: list[str] = []
        scores: list[float] = []
        diag: dict[str, Any] = {"n_chunks": len(cs)}
        notes: dict[str, str] = {}

        def record(name: str, ok: bool, score: float, note: str) -> None:
            (passed if ok else failed).append(name)
            scores.append(max(0.0, min(1.0, score)))
            notes[name] = note

        # 1. retrieval confidence
        rs = [c.score for c in cs if c.score is not None]
        if rs:
            mean = sum(rs) / len(rs)
            diag["retrieval_mean"] = mean
            record("retrieval_confidence", mean >= th.min_retrieval_confidence, mean,
                   f"mean retrieval score {mean:.2f} (needs >= {th.min_retrieval_confidence:g})")
        else:
            diag["retrieval_mean"] = None

        # 2. sufficiency of the context
        chars = sum(len(c.text.strip()) for c in cs)
        diag["context_chars"] = chars
        suff = None
        if cs and chars >= th.min_context_chars and self.scorer is not None:
            r = self.scorer.score(query, [{"title": c.title, "text": c.text} for c in cs])
            suff = float(r.score)
            diag["sufficiency_score"], diag["sufficiency_level"] = suff, r.level
            diag["missing_aspects"] = list(getattr(r, "missing_aspects", []))
        if not cs:
            record("context_sufficiency", False, 0.0, "no chunks were retrieved")
        elif chars < th.min_context_chars:
            record("context_sufficiency", False, chars / max(1, th.min_context_chars),
                   f"only {chars} characters of context (needs >= {th.min_context_chars})")
        elif suff is not None:
            level = diag["sufficiency_level"]
            ok = not (th.reject_insufficient and level == "insufficient")
            record("context_sufficiency", ok, suff, f"the scorer rates the context {level} ({suff:.2f})")
        else:
            cov = keyword_coverage(query, texts).score
            record("context_sufficiency", True, cov, f"{chars} characters of context; no scorer, lexical coverage {cov:.2f}")

        # 3. topicality
        if cs:
            rel = document_relevance(query, texts, self.scorer, th.model_weight)
            best = max(rel)
            diag["chunk_relevance"] = rel
            record("relevance", best >= th.min_relevance, best, f"best chunk relevance {best:.2f} (needs >= {th.min_relevance:g})")

        # 4-5. citations and grounding, only when there is an answer to check
        if answer is not None and answer.strip():
            self._check_answer(answer, cs, texts, record, diag)

        confidence = sum(scores) / len(scores) if scores else 0.0
        if not failed:
            reason = None
            explanation = f"answer: all {len(passed)} checks passed (" + "; ".join(notes[n] for n in passed) + ")"
        else:
            reason = CHECK_REASONS[failed[0]] if len(failed) == 1 else RejectionReason.MULTIPLE_ISSUES
            explanation = "I don't know: " + "; ".join(f"{CHECK_REASONS[n].value}: {notes[n]}" for n in failed)
        diag["checks"] = notes
        return SafetyResult(should_reject=bool(failed), rejection_reason=reason, confidence=confidence,
                            passed_checks=passed, failed_checks=failed, explanation=explanation, diagnostics=diag)

    def _check_answer(self, answer, cs, texts, record, diag) -> None:
        th = self.thresholds
        sentences = split_sentences(answer)
        n = len(sentences)
        cited = invalid = supported = 0
        bad_refs: list[int] = []
        per_sentence = []
        for s in sentences:
            refs = [int(x) for m in _CITATION.findall(s) for x in m.split(",")]
            valid = [r for r in refs if 1 <= r <= len(cs)]
            bad = [r for r in refs if not 1 <= r <= len(cs)]
            bad_refs += bad
            cited += bool(refs)
            invalid += bool(bad)
            terms = set(content_terms(_CITATION.sub(" ", s)))
            if valid:
                stems = {stem(w) for r in valid for w in tokenize_words(texts[r - 1])}
                overlap = len(terms & stems) / len(terms) if terms else 1.0
            else:
                overlap = 0.0
            ok = bool(valid) and overlap >= th.support_overlap
            supported += ok
            per_sentence.append({"sentence": s, "citations": refs, "support": round(overlap, 3), "supported": ok})
        coverage = cited / n if n else 0.0
        grounding = supported / n if n else 0.0
        diag.update(answer_sentences=n, citation_coverage=coverage, invalid_citations=sorted(set(bad_refs)),
                    grounding=grounding, sentences=per_sentence)
        record("citation_coverage", coverage >= th.min_citation_coverage, coverage,
               f"{cited} of {n} answer sentences cite a chunk (needs >= {th.min_citation_coverage:.0%})")
        record("citation_validity", not bad_refs, 1.0 - invalid / max(1, n),
               "every citation names a retrieved chunk" if not bad_refs
               else f"citation(s) {sorted(set(bad_refs))} name no chunk (there are {len(cs)})")
        record("grounding", grounding >= th.min_grounding, grounding,
               f"{supported} of {n} answer sentences are supported by the chunks they cite (needs >= {th.min_grounding:.0%})")
