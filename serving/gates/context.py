"""The ContextGate: which artifacts (system prompt, task, messages, documents) enter the prompt.

It chooses under a token budget and a document cap, dropping off-topic documents; every
exclusion carries a reason. It accepts any ``scorer`` with ``score_batch(questions, passages_list) -> [result.score, ...]``
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

from suffice.serving.lexical import keyword_coverage

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
