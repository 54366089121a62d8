"""The service's request and response models (pydantic): what each route accepts and answers.

FastAPI validates every body against these before a route runs (422 naming the field); the
per-item limits (413) are checked by the routes. ``Strict`` models refuse unknown fields; the
chat models allow them (they are forwarded to the upstream untouched).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, Sequence, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Strict as StrictMode, StrictBool, Tag,
                      model_validator)

from suffice.serving.bundle import LEVELS
from suffice.serving.items import SufficiencyItem, passages_form_error
from suffice.serving.service.config import MAX_DOCS_LIMIT


def valid_unicode(v: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains an unpaired UTF-16 surrogate (\\ud800-\\udfff escape): send valid Unicode text") from None
    return v


def not_blank(v: str) -> str:
    if not v.strip():
        raise ValueError("must contain non-whitespace text")
    return v


Text = Annotated[str, AfterValidator(valid_unicode)]
# the schema states "non-blank" (minLength 1, a non-space character); the validator gives the friendly message
NonBlank = Annotated[str, AfterValidator(valid_unicode), AfterValidator(not_blank),
                     Field(json_schema_extra={"minLength": 1, "pattern": r"\S"})]
# numbers are numbers: booleans and numeric strings are refused (JSON integers are fine as floats)
Finite = Annotated[float, Field(allow_inf_nan=False), StrictMode()]
Fraction = Annotated[float, Field(ge=0, le=1), StrictMode()]


def integer_number(v: Any) -> Any:
    if isinstance(v, (bool, str)):
        raise ValueError(f"must be an integer number, not {type(v).__name__} {v!r}")
    return v


# a JSON integer (61 or 61.0, as JSON Schema's "integer" allows); booleans and numeric strings are refused
Int = Annotated[int, BeforeValidator(integer_number)]


def int_in(lo: int, hi: int) -> Any:
    """An ``Int`` in [lo, hi] (the bounds go on the integer itself, so the JSON schema states them)."""
    return Annotated[int, Field(ge=lo, le=hi), BeforeValidator(integer_number)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PassageIn(Strict):
    title: Text = ""
    text: Text


def passages_list(v: Any) -> Any:
    """``passages`` is a list: a bare string or one object gets the error every room gives (:mod:`suffice.serving.items`)."""
    if isinstance(v, (str, dict)):
        raise ValueError(passages_form_error(v))
    return v


class SufficiencyRequest(Strict):
    """One question and the passages retrieved for it (strings or ``{title, text}`` objects), or one
    ``context`` string: the item of :class:`suffice.serving.items.SufficiencyItem`, as in pyfunc and ``suffice score``."""

    question: NonBlank = Field(description="The user's question (never truncated).")
    passages: Annotated[list[Union[Text, PassageIn]], BeforeValidator(passages_list)] = Field(
        default_factory=list, description="Retrieved passages. Missing or empty: `context` is the context.")
    context: Text | None = Field(None, description="The context as one string, used when `passages` is missing or empty.")

    def item(self) -> SufficiencyItem:
        """The item the scorer takes (the same rules as pyfunc and ``suffice score``)."""
        passages = [p if isinstance(p, str) else {"title": p.title, "text": p.text} for p in self.passages]
        return SufficiencyItem.from_fields(self.question, passages, self.context)

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"question": "Where is the Eiffel Tower?", "passages": [{"title": "Paris", "text": "The Eiffel Tower is in Paris."}]}]})


def sufficiency_form(v: Any) -> str:
    return "item-list" if isinstance(v, list) else "one-item"


# One object or a list of them (the batch form); the discriminator keeps errors to the form sent.
SufficiencyBody = Annotated[
    Union[Annotated[SufficiencyRequest, Tag("one-item")], Annotated[list[SufficiencyRequest], Tag("item-list")]],
    Discriminator(sufficiency_form),
]
UNION_TAGS = frozenset(("one-item", "item-list"))


class Factor(BaseModel):
    name: str
    effect: str
    detail: str


class SufficiencyResponse(BaseModel):
    score: float = Field(description="Calibrated probability that the passages suffice to answer (0..1).")
    level: Literal[LEVELS]
    missing_aspects: list[str]
    confidence_factors: list[Factor]
    latency_ms: float = Field(description="Service time for this item: queue wait plus model (batch: model time per item).")
    model_version: str


class ArtifactIn(Strict):
    id: NonBlank
    kind: Literal["system", "task", "message", "document"]
    content: Text
    authority: Finite = 0.0
    priority: Finite = 0.0


def no_query_key(v: Any) -> Any:
    """``query`` was the safety and context-gate routes' old name for the question: say so instead of
    "extra inputs are not permitted"."""
    if isinstance(v, dict) and "query" in v:
        raise ValueError("'query' is now 'question' (the name every route uses): rename the field")
    return v


class ContextGateRequest(Strict):
    artifacts: list[ArtifactIn] = Field(description="Artifact ids must be unique (repeated ids: 409 duplicate_ids).")
    question: Text | None = Field(None, description="Defaults to the last message artifact.")

    @model_validator(mode="before")
    @classmethod
    def _query_is_question(cls, data: Any) -> Any:
        return no_query_key(data)

    budget_tokens: int_in(1, 1_000_000) | None = Field(None, description="Defaults to context_gate.budget_tokens.")
    max_docs: int_in(0, MAX_DOCS_LIMIT) | None = Field(None, description="Defaults to context_gate.max_docs.")


class ArtifactOut(BaseModel):
    id: str
    kind: str
    content: str
    authority: float
    priority: float


class ExclusionOut(BaseModel):
    id: str
    kind: str
    reason: Literal["out_of_scope", "budget", "doc_cap", "empty"]
    detail: str


class ContextGateResponse(BaseModel):
    admitted: list[ArtifactOut]
    excluded: list[ExclusionOut]
    context: str
    tokens_used: int
    budget_tokens: int
    relevance: dict[str, float]
    latency_ms: float


class ChunkIn(Strict):
    text: Text
    score: Finite | None = None
    title: Text = ""
    id: Union[Text, Int, None] = None


class SafetyThresholdsIn(Strict):
    """Per-request overrides of the SafetyGate thresholds (omitted keys keep their defaults)."""

    min_retrieval_confidence: Fraction | None = None
    min_context_chars: int_in(0, 10_000_000) | None = None
    reject_insufficient: StrictBool | None = None
    min_relevance: Fraction | None = None
    model_weight: Fraction | None = None
    min_citation_coverage: Fraction | None = None
    min_grounding: Fraction | None = None
    support_overlap: Fraction | None = None




class SafetyRequest(Strict):
    question: NonBlank = Field(description="The user's question (never truncated).")

    @model_validator(mode="before")
    @classmethod
    def _query_is_question(cls, data: Any) -> Any:
        return no_query_key(data)
    chunks: list[Union[Text, ChunkIn]] = Field(default_factory=list)
    answer: Text | None = Field(None, description="The drafted answer; citations [n] refer to chunks[n-1].")
    thresholds: SafetyThresholdsIn | None = None


class SafetyResponse(BaseModel):
    should_reject: bool
    rejection_reason: str | None
    confidence: float
    passed_checks: list[str]
    failed_checks: list[str]
    explanation: str
    diagnostics: dict[str, Any]
    latency_ms: float


class GateMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: NonBlank
    content: Text


class RetrievalGateRequest(Strict):
    messages: list[GateMessage] = Field(min_length=1)


class RetrievalGateResponse(BaseModel):
    decision: Literal["RETRIEVE", "SKIP"]
    score: float | None = Field(description="P(SKIP); null when the model did not run (first turn, error).")
    latency_ms: float
    reason: str


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: Text | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: NonBlank
    content: Union[Text, list[ContentPart], None] = None


class DocumentIn(Strict):
    id: Union[Text, Int, None] = None
    title: Text = ""
    text: Text
    score: Finite | None = None


class ChatRequest(BaseModel):
    """A standard OpenAI chat request; unknown fields are forwarded to the upstream untouched.

    ``documents`` (extension): the retrieved documents; when absent, the configured retriever
    (if any) is asked with the last user message.
    """

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: StrictBool = False
    documents: list[Union[Text, DocumentIn]] | None = Field(None, description=(
        "Extension: the retrieved documents (strings or {id, title, text, score}) the answer must rest on; with the "
        "openai client pass extra_body={'documents': [...]}. Absent: the configured retriever is asked; without one "
        "the turn is forwarded unscored (sufficient_context.without_documents). [] = nothing was found: scored, declined."))


class SufficiencyMeta(BaseModel):
    """The gateway's verdict on a chat request (also in the X-Suffice-Level / -Action / -Score / -Caveat headers).

    Frozen: a step that adds to it (the caveat, a shortened question) makes a copy, so a cached
    verdict never changes under a later request.
    """

    model_config = ConfigDict(frozen=True)

    score: float | None
    level: Literal[(*LEVELS, "unscored")] | None
    factors: list[Factor]
    missing_aspects: list[str] = Field(default_factory=list)
    action: Literal["forwarded", "forwarded_with_caveat", "declined", "unscored"]
    documents: dict[str, Any] = Field(default_factory=dict, description="source, admitted ids and excluded {id, reason}")
    caveat: str | None = Field(None, description="Set when a caveat applies; with response_format or tools it is not in the content.")
    reason: str | None = Field(None, description="Why the request was forwarded unscored (no documents, retrieval gate SKIP, ...).")
    question_scored: str | None = Field(None, description="The part of a long turn that was scored (absent when the whole turn was).")

    def to_json(self) -> dict[str, Any]:
        """The ``sufficiency`` block as answers carry it: the fields this verdict set (``score: null`` kept)."""
        return self.model_dump(mode="json", exclude_unset=True)


class ChatCompletionOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    object: str
    created: int
    model: str
    choices: list[dict[str, Any]]
    sufficiency: SufficiencyMeta


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str
    param: str | None = None


class ErrorOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    error: ErrorDetail


DUPLICATE_IDS = {409: {"model": ErrorOut, "description": "Repeated ids (JSON Schema cannot state unique-by-id); names them"}}
ERRORS = {413: {"model": ErrorOut, "description": "Body, passages or characters over the limit"},
          415: {"model": ErrorOut, "description": "Content-Type is not application/json"},
          422: {"model": ErrorOut, "description": "Invalid JSON or schema; names the field"},
          503: {"model": ErrorOut, "description": "Model queue full; retry after Retry-After seconds"}}



# the request models by class name: pydantic puts them in error locations of union members
MODEL_NAMES = frozenset(c.__name__ for c in (PassageIn, SufficiencyRequest, ArtifactIn, ContextGateRequest, ChunkIn,
                                             SafetyThresholdsIn, SafetyRequest, GateMessage, RetrievalGateRequest,
                                             ContentPart, ChatMessage, DocumentIn, ChatRequest))


def text_chars(items: Sequence[Any]) -> int:
    """Characters of text in passages, documents, artifacts or chunks (strings or models)."""
    n = 0
    for p in items:
        if isinstance(p, str):
            n += len(p)
        elif isinstance(p, Mapping):
            n += len(str(p.get("title") or "")) + len(str(p.get("text") or ""))
        else:
            n += len(getattr(p, "title", "") or "") + len(getattr(p, "text", "") or getattr(p, "content", "") or "")
    return n


def message_text(m: ChatMessage) -> str:
    """The text of a chat message (its string content, or its text parts joined by newlines)."""
    if isinstance(m.content, str):
        return m.content
    if isinstance(m.content, list):
        return "\n".join(p.text for p in m.content if p.type == "text" and p.text)
    return ""
