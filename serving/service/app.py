"""The HTTP service: sufficiency scoring, the RAG gates and a sufficiency-aware chat gateway.

``create_app(config, scorer=...)`` builds the FastAPI app around an already loaded scorer (any
object with the :class:`~suffice.serving.scorer.SufficiencyScorer` interface), so tests and
embedders choose how the model is loaded; ``suffice serve`` loads it from a bundle.

>>> from suffice.serving import SufficiencyScorer, ScorerConfig  # doctest: +SKIP
>>> from suffice.serving.service.config import load_service_config  # doctest: +SKIP
>>> cfg = load_service_config("configs/service.yaml")  # doctest: +SKIP
>>> app = create_app(cfg, scorer=SufficiencyScorer.load("bundle", ScorerConfig(thresholds={"sufficient": 0.8, "partial": 0.5})))  # doctest: +SKIP
>>> import uvicorn; uvicorn.run(app, port=8080)  # doctest: +SKIP

Request flow: a pure ASGI middleware authenticates (``/v1`` routes, bearer keys compared in
constant time), enforces the content type (415) and the body size (413) before anything is
parsed, and counts every request; FastAPI/pydantic validate the schema (422 naming the field);
each route checks the per-item limits (413) and puts the model work on a bounded queue (503 with
Retry-After when it is full). No client input reaches a 500: model errors caused by the input
(a question longer than the window) are 422s, and anything else is logged and answered as a
generic 500 without internals.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.message
import hashlib
import hmac
import json
import logging
import math
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, AsyncIterator, Callable, Literal, Mapping, Sequence, Union

from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from suffice.serving.gates import ContextGate, ContextGateConfig, SafetyGate, SafetyThresholds
from suffice.serving.service.config import ServiceConfig, read_api_keys, read_secret_env
from suffice.serving.service.metrics import ServiceMetrics
from suffice.serving.service.retrievers import Retriever, load_retriever
from suffice.serving.service.upstream import UpstreamClient, UpstreamError

log = logging.getLogger("suffice.service")

POST_ROUTES = ("/v1/sufficiency", "/v1/context-gate", "/v1/safety-check",
               "/v1/retrieval-gate", "/v1/chat/completions")
KNOWN_ROUTES = frozenset(POST_ROUTES + ("/healthz", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json"))
METHODS = frozenset(("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"))
LEVELS = ("sufficient", "partial", "insufficient")


# ------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------
class ApiError(Exception):
    """An error answered to the client: OpenAI-style ``{"error": {message, type, code, param}}``."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 headers: Mapping[str, str] | None = None, extra: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "request_too_large", 415: "invalid_request_error",
               422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 502: "upstream_error",
               503: "overloaded_error", 504: "upstream_error"}


def error_body(status: int, code: str, message: str, param: str | None = None, **extra: Any) -> dict[str, Any]:
    err = {"message": message, "type": ERROR_TYPES.get(status, "error"), "code": code, "param": param}
    return {"error": err, **extra}


class Redactor:
    """Replaces known secrets (API keys, the upstream key) in any text bound for a log or a client."""

    def __init__(self, secrets: Sequence[str] = ()):
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, "[REDACTED]")
        return text


class RedactingFilter(logging.Filter):
    """A logging filter that scrubs secrets from every record it sees (attach it to handlers)."""

    def __init__(self, redact: Redactor):
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        if self.redact.secrets:
            msg = self.redact(record.getMessage())
            record.msg, record.args = msg, None
            if record.exc_text:
                record.exc_text = self.redact(record.exc_text)
        return True


# ------------------------------------------------------------------------------------------
# request / response models
# ------------------------------------------------------------------------------------------
def _valid_unicode(v: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains an unpaired UTF-16 surrogate (\\ud800-\\udfff escape): send valid Unicode text") from None
    return v


def _not_blank(v: str) -> str:
    if not v.strip():
        raise ValueError("must contain non-whitespace text")
    return v


Text = Annotated[str, AfterValidator(_valid_unicode)]
NonBlank = Annotated[str, AfterValidator(_valid_unicode), AfterValidator(_not_blank)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PassageIn(Strict):
    title: Text = ""
    text: Text


class SufficiencyRequest(Strict):
    """One question and the passages retrieved for it (strings or ``{title, text}`` objects)."""

    question: NonBlank = Field(description="The user's question (never truncated).")
    passages: list[Union[Text, PassageIn]] = Field(default_factory=list, description="Retrieved passages.")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"question": "Where is the Eiffel Tower?", "passages": [{"title": "Paris", "text": "The Eiffel Tower is in Paris."}]}]})


def _sufficiency_form(v: Any) -> str:
    return "item-list" if isinstance(v, list) else "one-item"


# One object or a list of them (the batch form); the discriminator keeps errors to the form sent.
SufficiencyBody = Annotated[
    Union[Annotated[SufficiencyRequest, Tag("one-item")], Annotated[list[SufficiencyRequest], Tag("item-list")]],
    Discriminator(_sufficiency_form),
]
UNION_TAGS = frozenset(("one-item", "item-list"))


class Factor(BaseModel):
    name: str
    effect: str
    detail: str


class SufficiencyResponse(BaseModel):
    score: float = Field(description="Calibrated probability that the passages suffice to answer (0..1).")
    level: Literal["sufficient", "partial", "insufficient"]
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


class ContextGateRequest(Strict):
    artifacts: list[ArtifactIn]
    query: Text | None = Field(None, description="Defaults to the last message artifact.")
    budget_tokens: int | None = Field(None, ge=1, le=1_000_000, description="Defaults to context_gate.budget_tokens.")
    max_docs: int | None = Field(None, ge=0, le=64, description="Defaults to context_gate.max_docs.")

    @model_validator(mode="after")
    def _unique_ids(self) -> "ContextGateRequest":
        ids = [a.id for a in self.artifacts]
        dup = sorted({i for i in ids if ids.count(i) > 1}) if len(ids) != len(set(ids)) else []
        if dup:
            raise ValueError(f"artifacts: ids must be unique, repeated: {dup}")
        return self


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
    id: Union[Text, int, None] = None


class SafetyThresholdsIn(Strict):
    """Per-request overrides of the SafetyGate thresholds (omitted keys keep their defaults)."""

    min_retrieval_confidence: float | None = Field(None, ge=0, le=1)
    min_context_chars: int | None = Field(None, ge=0, le=10_000_000)
    reject_insufficient: bool | None = None
    min_relevance: float | None = Field(None, ge=0, le=1)
    model_weight: float | None = Field(None, ge=0, le=1)
    min_citation_coverage: float | None = Field(None, ge=0, le=1)
    min_grounding: float | None = Field(None, ge=0, le=1)
    support_overlap: float | None = Field(None, ge=0, le=1)


class SafetyRequest(Strict):
    query: NonBlank
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
    id: Union[Text, int, None] = None
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
    stream: bool = False
    documents: list[Union[Text, DocumentIn]] | None = None


class SufficiencyMeta(BaseModel):
    score: float | None
    level: Literal["sufficient", "partial", "insufficient"] | None
    factors: list[Factor]
    missing_aspects: list[str] = Field(default_factory=list)
    action: Literal["forwarded", "forwarded_with_caveat", "declined", "unscored"]
    documents: dict[str, Any] = Field(default_factory=dict, description="admitted ids and excluded {id, reason}")


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


ERRORS = {413: {"model": ErrorOut, "description": "Body, passages or characters over the limit"},
          415: {"model": ErrorOut, "description": "Content-Type is not application/json"},
          422: {"model": ErrorOut, "description": "Invalid JSON or schema; names the field"},
          503: {"model": ErrorOut, "description": "Model queue full; retry after Retry-After seconds"}}


# ------------------------------------------------------------------------------------------
# backpressure
# ------------------------------------------------------------------------------------------
class QueueFullError(Exception):
    pass


class ModelQueue:
    """A bounded queue of model work in front of a thread pool.

    At most ``capacity`` jobs wait or run; one more is refused at once (QueueFullError -> 503)
    instead of waiting behind an unbounded backlog. A slot is released when the job itself ends,
    not when its client goes away, so abandoned jobs still count against the bound.
    """

    def __init__(self, workers: int, capacity: int, metrics: ServiceMetrics | None = None):
        self.capacity = capacity
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="suffice-model")
        self._pending = 0
        self._lock = threading.Lock()
        self._metrics = metrics

    @property
    def depth(self) -> int:
        return self._pending

    def _release(self, _f: Any = None) -> None:
        with self._lock:
            self._pending -= 1
            depth = self._pending
        if self._metrics:
            self._metrics.queue_depth.set(depth)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            if self._pending >= self.capacity:
                if self._metrics:
                    self._metrics.queue_rejections.inc()
                raise QueueFullError()
            self._pending += 1
            depth = self._pending
        if self._metrics:
            self._metrics.queue_depth.set(depth)
        try:
            cf = self._executor.submit(fn, *args)
        except RuntimeError:  # executor shut down
            self._release()
            raise QueueFullError() from None
        cf.add_done_callback(self._release)
        return await asyncio.wrap_future(cf)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)


# ------------------------------------------------------------------------------------------
# the ASGI front door: auth, content type, body size, request metrics
# ------------------------------------------------------------------------------------------
def _key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class FrontDoor:
    """Pure ASGI middleware (no per-request task, streaming untouched).

    Order: auth (401) -> content type (415) -> body size (413) -> the app. The body is read once
    here, bounded, and replayed to the app. Bodies announced or found larger than the limit are
    drained (up to 16x the limit) so the client can read the 413 instead of a reset connection.
    """

    def __init__(self, app: Any, state: "ServiceState"):
        self.app = app
        self.state = state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path = scope.get("path", "")
        route = path if path in KNOWN_ROUTES else "other"
        method = scope.get("method", "GET")
        method_label = method if method in METHODS else "OTHER"
        status_box = [500]

        async def send_counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            await send(message)

        try:
            await self._handle(scope, receive, send_counted, path, method)
        finally:
            self.state.metrics.observe_request(route, method_label, status_box[0], time.perf_counter() - t0)

    async def _reply(self, send: Callable, status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        body = json.dumps(error_body(status, code, message)).encode()
        hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})

    async def _handle(self, scope: dict, receive: Callable, send: Callable, path: str, method: str) -> None:
        st = self.state
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if st.key_digests and path.startswith("/v1/"):
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            ok = False
            if scheme.lower() == "bearer" and token.strip():
                d = _key_digest(token.strip())
                for k in st.key_digests:  # no early exit: the time does not depend on which key matched
                    ok |= hmac.compare_digest(d, k)
            if not ok:
                await self._reply(send, 401, "invalid_api_key",
                                  "missing or invalid API key: send 'Authorization: Bearer <key>'",
                                  {"WWW-Authenticate": "Bearer"})
                return
        if method != "POST" or path not in POST_ROUTES:
            await self.app(scope, receive, send)
            return
        ctype = headers.get("content-type", "")
        msg = email.message.Message()
        msg["content-type"] = ctype
        subtype = msg.get_content_subtype() if msg.get_content_maintype() == "application" else ""
        if not ctype or not (subtype == "json" or subtype.endswith("+json")):
            await self._reply(send, 415, "unsupported_media_type",
                              f"Content-Type {ctype or '(none)'!r} is not supported: send the body as 'application/json'")
            return
        limit = st.config.limits.max_body_bytes
        too_big = f"the request body exceeds the limit of {limit} bytes (limits.max_body_bytes): send fewer or shorter passages"
        declared = headers.get("content-length")
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                n = -1
            if n < 0:
                await self._reply(send, 400, "invalid_content_length", f"Content-Length {declared!r} is not a non-negative integer")
                return
            if n > limit:
                if n <= 16 * limit:
                    await self._drain(receive)
                await self._reply(send, 413, "body_too_large", too_big, {"Connection": "close"})
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                if message.get("more_body", False):
                    await self._drain(receive, size)
                await self._reply(send, 413, "body_too_large", too_big, {"Connection": "close"})
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if not body.strip():
            await self._reply(send, 422, "invalid_json", "the body is empty: send a JSON document (see /docs for the schema)")
            return
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            await self._reply(send, 422, "invalid_json", f"the body is not UTF-8 encoded JSON (bad byte at position {e.start})")
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive: Callable, already: int = 0) -> None:
        cap = 16 * self.state.config.limits.max_body_bytes
        size = already
        while size <= cap:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


# ------------------------------------------------------------------------------------------
# the service
# ------------------------------------------------------------------------------------------
def model_version_of(scorer: Any) -> str:
    """A stable version string for responses: the manifest's model_version, else its file hash."""
    m = getattr(scorer, "manifest", None)
    if m is None:
        return "unknown"
    if getattr(m, "model_version", None):
        name = getattr(m, "registered_model", None)
        return f"{name}:{m.model_version}" if name else str(m.model_version)
    files = getattr(m, "files", {}) or {}
    sha = files.get(getattr(m, "model_file", "model.onnx"))
    return f"sha256:{sha[:12]}" if sha else "unknown"


@dataclass
class ServiceState:
    config: ServiceConfig
    scorer: Any
    metrics: ServiceMetrics
    queue: ModelQueue
    redact: Redactor
    retrieval_gate: Any = None
    retriever: Retriever | None = None
    key_digests: list[bytes] = field(default_factory=list)
    upstream_key: str | None = None
    upstream: UpstreamClient | None = None
    ready: bool = False
    not_ready_reason: str = "starting: the model is not warmed up yet"
    model_version: str = "unknown"


def _chars(passages: Sequence[Any]) -> int:
    n = 0
    for p in passages:
        if isinstance(p, str):
            n += len(p)
        else:
            n += len(getattr(p, "title", "") or "") + len(getattr(p, "text", "") or getattr(p, "content", "") or "")
    return n


def _check_item(limits: Any, where: str, n_passages: int, n_chars: int, what: str = "passages") -> None:
    if n_passages > limits.max_passages:
        raise ApiError(413, "too_many_passages",
                       f"{where}{what} has {n_passages} entries; the limit is {limits.max_passages} (limits.max_passages)",
                       param=f"{where}{what}")
    if n_chars > limits.max_chars:
        raise ApiError(413, "too_many_characters",
                       f"{where.rstrip('.') or 'the request'} carries {n_chars} characters of text; the limit is "
                       f"{limits.max_chars} (limits.max_chars)", param=where.rstrip(".") or None)


def _passages_for_scorer(passages: Sequence[Any]) -> list[Any]:
    return [p if isinstance(p, str) else {"title": p.title, "text": p.text} for p in passages]


def _factors(result: Any) -> list[dict[str, str]]:
    out = []
    for f in getattr(result, "confidence_factors", []) or []:
        if isinstance(f, Mapping):
            out.append({"name": str(f.get("name", "")), "effect": str(f.get("effect", "")), "detail": str(f.get("detail", ""))})
        else:
            out.append({"name": f.name, "effect": f.effect, "detail": f.detail})
    return out


def _message_text(m: ChatMessage) -> str:
    if isinstance(m.content, str):
        return m.content
    if isinstance(m.content, list):
        return "\n".join(p.text for p in m.content if p.type == "text" and p.text)
    return ""


def create_app(config: ServiceConfig, scorer: Any, *, retrieval_gate: Any = None, retriever: Retriever | None = None,
               api_keys: Sequence[str] | None = None, upstream_api_key: str | None = None,
               upstream_transport: Any = None) -> FastAPI:
    """Build the service around a loaded scorer.

    ``retrieval_gate``: a loaded RetrievalGate (None = ``/v1/retrieval-gate`` answers 404).
    ``retriever``: overrides the configured one. ``api_keys`` / ``upstream_api_key``: override
    the environment variables named in the config (tests pass them directly).

    >>> app = create_app(ServiceConfig(), scorer=SufficiencyScorer.load("bundle"))  # doctest: +SKIP
    """
    if api_keys is None:
        api_keys = read_api_keys(config.auth)
    if upstream_api_key is None:
        upstream_api_key = read_secret_env(config.upstream.api_key_env)
    if retriever is None:
        retriever = load_retriever(config.retriever.name, config.retriever.options)
    metrics = ServiceMetrics()
    redact = Redactor([*api_keys, *([upstream_api_key] if upstream_api_key else [])])
    state = ServiceState(
        config=config, scorer=scorer, metrics=metrics,
        queue=ModelQueue(config.runtime.workers, config.limits.queue_size, metrics),
        redact=redact, retrieval_gate=retrieval_gate, retriever=retriever,
        key_digests=[_key_digest(k) for k in api_keys], upstream_key=upstream_api_key,
        model_version=model_version_of(scorer),
    )
    log_filter = RedactingFilter(redact)
    log.addFilter(log_filter)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if config.upstream.base_url:
            state.upstream = UpstreamClient(config.upstream.base_url, state.upstream_key, config.upstream.timeout_s,
                                            config.upstream.connect_timeout_s, transport=upstream_transport)
        try:
            await state.queue.run(_warm_up, state)
            state.ready, state.not_ready_reason = True, ""
        except Exception as e:  # readiness reports it; liveness stays up so the operator can see why
            state.not_ready_reason = redact(f"warm-up failed: {type(e).__name__}: {e}")
            log.error("not ready: %s", state.not_ready_reason)
        try:
            yield
        finally:
            state.ready, state.not_ready_reason = False, "shutting down"
            if state.upstream is not None:
                await state.upstream.aclose()
            await asyncio.to_thread(state.queue.shutdown)
            log.removeFilter(log_filter)

    app = FastAPI(
        title="suffice",
        version="1",
        summary="Is the retrieved context enough to answer this question? Sufficiency scoring, RAG gates and a sufficiency-aware chat gateway.",
        lifespan=lifespan,
    )
    app.state.service = state

    # -- error rendering ----------------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.code, redact(exc.message), exc.param, **exc.extra),
                            status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()) if x not in UNION_TAGS)
            fields.append({"field": loc, "message": str(e.get("msg", "")), "type": str(e.get("type", ""))})
        if any(f["type"] == "json_invalid" for f in fields):
            msg = "the body is not valid JSON: " + "; ".join(f"{f['field']}: {f['message']}" for f in fields)
            code = "invalid_json"
        else:
            msg = "invalid request: " + "; ".join(f"{f['field']}: {f['message']}" for f in fields[:10])
            code = "invalid_request"
        msg = redact(msg[:4000])
        return JSONResponse(error_body(422, code, msg, fields[0]["field"] if fields else None, fields=fields[:50]), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            return JSONResponse(error_body(422, "invalid_json", "the body is not valid JSON (it could not be parsed)", "body"), status_code=422)
        codes = {404: "not_found", 405: "method_not_allowed"}
        return JSONResponse(error_body(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(QueueFullError)
    async def _queue_full(request: Request, exc: QueueFullError) -> JSONResponse:
        ra = config.limits.retry_after_s
        return JSONResponse(error_body(503, "overloaded", f"the model queue is full ({config.limits.queue_size} requests waiting or "
                                       f"running, limits.queue_size): retry after {ra} s"),
                            status_code=503, headers={"Retry-After": str(ra)})

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        rid = uuid.uuid4().hex[:12]
        log.error("internal error %s on %s: %s", rid, request.url.path, redact(f"{type(exc).__name__}: {exc}"))
        return JSONResponse(error_body(500, "internal_error", f"internal error (id {rid}); the details are in the service log"),
                            status_code=500)

    # -- helpers -------------------------------------------------------------------------------
    def check_question(q: str, param: str) -> None:
        """Questions are never truncated: refuse one longer than the window before queueing it."""
        count = getattr(scorer, "count_tokens", None)
        manifest = getattr(scorer, "manifest", None)
        if count is None or manifest is None:
            return
        window = int(manifest.max_length)
        if len(q) > window * 2 or count(q) + 3 > window:  # a token is at least half a character, usually far more
            n = count(q)
            if n + 3 > window:
                raise ApiError(422, "question_too_long",
                               f"{param} is {n} tokens; the model's window is {window} tokens and questions are never "
                               f"truncated: shorten it to at most {window - 3 - 32} tokens", param=param)

    def observe(results: Sequence[Any]) -> None:
        for r in results:
            metrics.observe_sufficiency(float(r.score), r.level, float(r.latency_ms) / 1e3)

    def to_response(r: Any, latency_ms: float) -> dict[str, Any]:
        return {"score": float(r.score), "level": r.level, "missing_aspects": list(r.missing_aspects),
                "confidence_factors": _factors(r), "latency_ms": latency_ms, "model_version": state.model_version}

    async def run_model(fn: Callable[..., Any], *args: Any, param: str | None = None) -> Any:
        try:
            return await state.queue.run(fn, *args)
        except (ValueError, TypeError) as e:  # input the model cannot take (e.g. a question over the window)
            raise ApiError(422, "unprocessable_input", redact(str(e)), param=param) from None

    # -- routes --------------------------------------------------------------------------------
    @app.post("/v1/sufficiency", response_model=Union[SufficiencyResponse, list[SufficiencyResponse]], responses=ERRORS,
              tags=["sufficiency"], summary="Score whether the passages suffice to answer the question (one item or a list)")
    async def sufficiency(body: Annotated[SufficiencyBody, Body()]) -> Any:
        """One ``{question, passages}`` object -> one result; a JSON list of them (the batch form)
        -> a list of results in input order, scored in batches of the bundle's batch size."""
        t0 = time.perf_counter()
        if isinstance(body, SufficiencyRequest):
            _check_item(config.limits, "", len(body.passages), len(body.question) + _chars(body.passages))
            check_question(body.question, "question")
            r = await run_model(scorer.score, body.question, _passages_for_scorer(body.passages), param="question")
            observe([r])
            return to_response(r, (time.perf_counter() - t0) * 1e3)
        items = body
        if len(items) > config.limits.max_batch:
            raise ApiError(413, "batch_too_large", f"the batch has {len(items)} items; the limit is {config.limits.max_batch} (limits.max_batch)")
        for i, it in enumerate(items):
            _check_item(config.limits, f"{i}.", len(it.passages), len(it.question) + _chars(it.passages))
            check_question(it.question, f"{i}.question")
        if not items:
            return []
        results = await run_model(scorer.score_batch, [it.question for it in items],
                                  [_passages_for_scorer(it.passages) for it in items], param="question")
        observe(results)
        return [to_response(r, float(r.latency_ms)) for r in results]

    @app.post("/v1/context-gate", response_model=ContextGateResponse, responses=ERRORS, tags=["gates"],
              summary="Choose which artifacts enter the prompt under a token budget and a document cap")
    async def context_gate(req: ContextGateRequest) -> dict[str, Any]:
        t0 = time.perf_counter()
        _check_item(config.limits, "", len(req.artifacts), _chars(req.artifacts) + len(req.query or ""), what="artifacts")
        gate = ContextGate(scorer, config.context_gate)
        arts = [a.model_dump() for a in req.artifacts]
        sel = await run_model(gate.select, arts, req.query, req.budget_tokens, req.max_docs, param="artifacts")
        return {
            "admitted": [{"id": a.id, "kind": a.kind, "content": a.content, "authority": a.authority, "priority": a.priority}
                         for a in sel.admitted],
            "excluded": [{"id": e.artifact.id, "kind": e.artifact.kind, "reason": e.reason.value, "detail": e.detail}
                         for e in sel.excluded],
            "context": sel.context, "tokens_used": sel.tokens_used, "budget_tokens": sel.budget_tokens,
            "relevance": {k: float(v) for k, v in sel.relevance.items()},
            "latency_ms": (time.perf_counter() - t0) * 1e3,
        }

    @app.post("/v1/safety-check", response_model=SafetyResponse, responses=ERRORS, tags=["gates"],
              summary="Decide whether to answer or say \"I don't know\", with every check's result")
    async def safety_check(req: SafetyRequest) -> dict[str, Any]:
        t0 = time.perf_counter()
        _check_item(config.limits, "", len(req.chunks), len(req.query) + len(req.answer or "") + _chars(req.chunks), what="chunks")
        check_question(req.query, "query")
        overrides = req.thresholds.model_dump(exclude_none=True) if req.thresholds else {}
        try:
            th = SafetyThresholds(**overrides)
        except ValueError as e:
            raise ApiError(422, "invalid_thresholds", str(e), param="thresholds") from None
        chunks = [c if isinstance(c, str) else {k: v for k, v in c.model_dump().items() if v is not None} for c in req.chunks]
        res = await run_model(SafetyGate(scorer, th).check, req.query, chunks, req.answer, param="query")
        return {
            "should_reject": res.should_reject,
            "rejection_reason": res.rejection_reason.value if res.rejection_reason else None,
            "confidence": float(res.confidence), "passed_checks": res.passed_checks, "failed_checks": res.failed_checks,
            "explanation": res.explanation, "diagnostics": _jsonable(res.diagnostics),
            "latency_ms": (time.perf_counter() - t0) * 1e3,
        }

    @app.post("/v1/retrieval-gate", response_model=RetrievalGateResponse, responses={**ERRORS, 404: {"model": ErrorOut}},
              tags=["gates"], summary="Should this chat turn trigger retrieval? RETRIEVE or SKIP (fails open)")
    async def retrieval_gate_route(req: RetrievalGateRequest) -> dict[str, Any]:
        if state.retrieval_gate is None:
            raise ApiError(404, "not_configured", "no retrieval-gate model is loaded: start the service with "
                           "retrieval_gate.bundle set (or --retrieval-gate-bundle DIR)")
        if len(req.messages) > config.limits.max_messages:
            raise ApiError(413, "too_many_messages", f"messages has {len(req.messages)} entries; the limit is "
                           f"{config.limits.max_messages} (limits.max_messages)", param="messages")
        _check_item(config.limits, "", 0, sum(len(m.content) for m in req.messages))
        d = await run_model(state.retrieval_gate.decide, [m.model_dump() for m in req.messages], param="messages")
        metrics.gate.labels(decision=d.decision).inc()
        return {"decision": d.decision, "score": None if d.score is None else float(d.score),
                "latency_ms": float(d.latency_ms), "reason": d.reason}

    @app.post("/v1/chat/completions", responses={200: {"model": ChatCompletionOut, "content": {"text/event-stream": {}}},
                                                  404: {"model": ErrorOut}, 502: {"model": ErrorOut}, 504: {"model": ErrorOut}, **ERRORS},
              tags=["chat"], summary="OpenAI-compatible chat gateway: context gate -> sufficiency -> upstream LLM")
    async def chat_completions(req: ChatRequest) -> Response:
        return await _chat(state, req, check_question, run_model, observe)

    @app.get("/healthz", tags=["ops"], summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], summary="Readiness: the model is loaded and warmed up",
             responses={503: {"description": "not ready (starting, warm-up failed, shutting down)"}})
    async def readyz() -> JSONResponse:
        body = {"status": "ready" if state.ready else "not_ready", "model_version": state.model_version,
                "retrieval_gate": state.retrieval_gate is not None, "queue_depth": state.queue.depth}
        if not state.ready:
            body["reason"] = state.not_ready_reason
        return JSONResponse(body, status_code=200 if state.ready else 503)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=Response)
    async def metrics_route() -> Response:
        data, ctype = metrics.render()
        return Response(data, media_type=ctype)

    app.add_middleware(FrontDoor, state=state)
    return app


def _warm_up(state: ServiceState) -> None:
    state.scorer.score("Is the service warmed up?", ["The service loads its model and runs one example before it is ready."])
    if state.retrieval_gate is not None:
        state.retrieval_gate.decide([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi."},
                                     {"role": "user", "content": "Thanks, can you repeat that?"}])


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "value") and isinstance(getattr(x, "value"), str):
        return x.value
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)


# ------------------------------------------------------------------------------------------
# the chat gateway
# ------------------------------------------------------------------------------------------
def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _decline_text(meta: dict[str, Any]) -> str:
    missing = meta.get("missing_aspects") or []
    text = "I can't answer this reliably from the information available to me."
    if missing:
        text += " What is missing: " + "; ".join(missing) + "."
    return text + " Try rephrasing the question, adding detail, or providing documents that cover it."


async def _chat(state: ServiceState, req: ChatRequest, check_question: Callable, run_model: Callable, observe: Callable) -> Response:
    config = state.config
    sc = config.sufficient_context
    limits = config.limits
    if state.upstream is None and not (sc.enabled and sc.decline_insufficient):
        raise ApiError(404, "not_configured", "no upstream LLM is configured: set upstream.base_url in the service config")
    if len(req.messages) > limits.max_messages:
        raise ApiError(413, "too_many_messages", f"messages has {len(req.messages)} entries; the limit is {limits.max_messages} "
                       "(limits.max_messages)", param="messages")
    users = [i for i, m in enumerate(req.messages) if m.role == "user" and _message_text(m).strip()]
    if not users:
        raise ApiError(422, "invalid_request", "messages: the request needs at least one user message with text", param="messages")
    question = _message_text(req.messages[users[-1]])
    docs_in = req.documents
    n_chars = sum(len(_message_text(m)) for m in req.messages) + (_chars(docs_in) if docs_in else 0)
    _check_item(limits, "", len(docs_in or []), n_chars, what="documents")

    documents: list[dict[str, Any]] = []
    source = "request"
    if docs_in is not None:
        for i, d in enumerate(docs_in):
            if isinstance(d, str):
                documents.append({"id": f"doc-{i + 1}", "title": "", "text": d})
            else:
                documents.append({"id": str(d.id) if d.id is not None else f"doc-{i + 1}", "title": d.title, "text": d.text})
        ids = [d["id"] for d in documents]
        if len(set(ids)) != len(ids):
            raise ApiError(422, "invalid_request", "documents: ids must be unique", param="documents")
    elif state.retriever is not None:
        source = "retriever"
        found = await run_model(state.retriever.retrieve, question, config.retriever.top_k, param="messages")
        documents = [{"id": d.id, "title": d.title, "text": d.text} for d in found]

    t_model = time.perf_counter()
    meta: dict[str, Any]
    if sc.enabled:
        check_question(question, "messages (last user message)")
        gate = ContextGate(state.scorer, config.context_gate)
        artifacts = [{"id": d["id"], "kind": "document", "content": (f"{d['title']}. {d['text']}" if d["title"] else d["text"])}
                     for d in documents]

        def gate_and_score() -> tuple[Any, Any]:
            sel = gate.select(artifacts, query=question) if artifacts else None
            admitted = [a.id for a in sel.admitted] if sel else []
            by_id = {d["id"]: d for d in documents}
            passages = [{"title": by_id[i]["title"], "text": by_id[i]["text"]} for i in admitted]
            return sel, state.scorer.score(question, passages)

        sel, result = await run_model(gate_and_score, param="messages")
        observe([result])
        factors = _factors(result)
        level = result.level
        n_admitted = len(sel.admitted) if sel else 0
        if n_admitted < sc.min_contexts and level != "insufficient":
            level = "insufficient"
            factors.append({"name": "min_contexts", "effect": "lowers",
                            "detail": f"{n_admitted} document(s) admitted, fewer than sufficient_context.min_contexts={sc.min_contexts}"})
        missing = list(result.missing_aspects)
        if level == "insufficient" and not missing:
            missing = [f"at least {sc.min_contexts} relevant document(s) about the question"]
        context = sel.context if sel else ""
        if level == "sufficient":
            action = "forwarded"
        elif level == "insufficient" and sc.decline_insufficient:
            action = "declined"
        else:
            action = "forwarded_with_caveat"
        meta = {"score": float(result.score), "level": level, "factors": factors, "missing_aspects": missing, "action": action,
                "documents": {"source": source, "admitted": [a.id for a in sel.admitted] if sel else [],
                              "excluded": [{"id": e.artifact.id, "reason": e.reason.value} for e in sel.excluded] if sel else []}}
    else:
        kept = documents[: config.context_gate.doc_cap]
        context = "\n\n".join(f"[document:{d['id']}]\n{d['title'] + '. ' if d['title'] else ''}{d['text']}" for d in kept)
        meta = {"score": None, "level": None, "factors": [], "missing_aspects": [], "action": "unscored",
                "documents": {"source": source, "admitted": [d["id"] for d in kept], "excluded": []}}
    scoring_ms = (time.perf_counter() - t_model) * 1e3
    state.metrics.chat_outcomes.labels(outcome=meta["action"]).inc()
    model = req.model or config.upstream.model
    log.info("chat sufficiency score=%s level=%s action=%s docs=%d scoring_ms=%.1f stream=%s",
             meta["score"], meta["level"], meta["action"], len(meta["documents"]["admitted"]), scoring_ms, req.stream)

    if meta["action"] == "declined":
        return _declined(req, model, meta)
    if state.upstream is None:
        raise ApiError(404, "not_configured", "no upstream LLM is configured: set upstream.base_url in the service config",
                       extra={"sufficiency": meta})

    payload = dict(req.model_extra or {})
    payload["model"] = model
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    if context:
        messages.insert(0, {"role": "system", "content": f"{config.upstream.system_prompt}\n\nContext:\n{context}"})
    payload["messages"] = messages
    caveat = sc.caveat if meta["action"] == "forwarded_with_caveat" else None

    def upstream_failed(e: UpstreamError) -> ApiError:
        state.metrics.upstream_errors.labels(kind=e.code).inc()
        log.warning("upstream failure %s (%s): %s; sufficiency score=%s level=%s action=%s", e.code, e.status,
                    state.redact(e.message), meta["score"], meta["level"], meta["action"])
        return ApiError(e.status, e.code, state.redact(e.message),
                        extra={"sufficiency": meta, **({"upstream_status": e.upstream_status} if e.upstream_status else {})})

    if not req.stream:
        payload.pop("stream", None)
        try:
            completion = await state.upstream.chat(payload)
        except UpstreamError as e:
            raise upstream_failed(e) from None
        if caveat:
            for choice in completion.get("choices", []):
                msg = choice.get("message") if isinstance(choice, dict) else None
                if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                    msg["content"] = msg["content"].rstrip() + "\n\n" + caveat
        completion["sufficiency"] = meta
        return JSONResponse(completion)

    try:
        stream = await state.upstream.open_stream(payload)
    except UpstreamError as e:
        raise upstream_failed(e) from None

    async def relay() -> AsyncIterator[bytes]:
        ident = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        pending_caveat = caveat
        try:
            async for ev in stream.events():
                if ev.data is None:
                    yield (ev.raw + "\n\n").encode()
                    continue
                if ev.done:
                    break
                try:
                    chunk = json.loads(ev.data)
                except json.JSONDecodeError:
                    yield f"data: {ev.data}\n\n".encode()
                    continue
                if isinstance(chunk, dict):
                    for k in ("id", "created", "model"):
                        if k in chunk:
                            ident[k] = chunk[k]
                    finishing = [c for c in chunk.get("choices") or [] if isinstance(c, dict) and c.get("finish_reason")]
                    if pending_caveat and finishing:
                        idx = finishing[0].get("index", 0)
                        yield _sse({**ident, "choices": [{"index": idx, "delta": {"content": "\n\n" + pending_caveat}, "finish_reason": None}]})
                        pending_caveat = None
                yield f"data: {ev.data}\n\n".encode()
            if pending_caveat:
                yield _sse({**ident, "choices": [{"index": 0, "delta": {"content": "\n\n" + pending_caveat}, "finish_reason": None}]})
            yield _sse({**ident, "choices": [], "sufficiency": meta})
        except UpstreamError as e:
            err = upstream_failed(e)
            yield _sse({**error_body(err.status, err.code, err.message), "sufficiency": meta})
        finally:
            await stream.aclose()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(relay(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _declined(req: ChatRequest, model: str, meta: dict[str, Any]) -> Response:
    text = _decline_text(meta)
    ident = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model}
    if not req.stream:
        return JSONResponse({**ident, "object": "chat.completion",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "sufficiency": meta})

    async def chunks() -> AsyncIterator[bytes]:
        base = {**ident, "object": "chat.completion.chunk"}
        yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        yield _sse({**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
        yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        yield _sse({**base, "choices": [], "sufficiency": meta})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
