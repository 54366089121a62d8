"""The SafetyGate: whether an answer should be given at all, or "I don't know", and why.

It decides from the retrieval scores, the scorer's sufficiency verdict, topicality, citations
and grounding. It accepts any ``scorer`` with ``score(question, passages)`` and
``score_batch(questions, passages_list)`` (a :class:`~suffice.serving.scorer.SufficiencyScorer`),
or none: then relevance and coverage are lexical only.

>>> SafetyGate().check("What is the capital of Peru?", []).rejection_reason.value
'insufficient_context'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping, Sequence

from suffice.serving.bundle import INSUFFICIENT
from suffice.serving.gates.context import document_relevance
from suffice.serving.lexical import content_terms, keyword_coverage, stem, tokenize_words
from suffice.serving.packing import split_sentences


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
            ok = not (th.reject_insufficient and level == INSUFFICIENT)
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
