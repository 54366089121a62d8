"""The HTTP service: sufficiency scoring, the RAG gates and a sufficiency-aware chat gateway.

``create_app(config, scorer=...)`` builds the FastAPI app around an already loaded scorer (any
object with the :class:`~suffice.serving.scorer.SufficiencyScorer` interface), so tests and
embedders choose how the model is loaded; ``suffice serve`` loads it from a bundle.

>>> from suffice.serving import SufficiencyScorer, ScorerConfig  # doctest: +SKIP
>>> from suffice.serving.service.config import load_service_config  # doctest: +SKIP
>>> cfg = load_service_config("configs/service.yaml")  # doctest: +SKIP
>>> app = create_app(cfg, scorer=SufficiencyScorer.load("bundle", ScorerConfig(precision="int8")))  # doctest: +SKIP
>>> import uvicorn; uvicorn.run(app, port=8080)  # doctest: +SKIP

Request flow: a pure ASGI middleware authenticates (``/v1`` routes, bearer keys compared in
constant time), enforces the content type (415) and the body size (413) before anything is
parsed, and counts every request; FastAPI/pydantic validate the schema (422 naming the field);
each route checks the per-item limits (413) and puts the model work on a bounded queue (503 with
Retry-After when it is full). No client input reaches a 500: model errors caused by the input
(a question longer than the window) are 422s, and anything else is logged and answered as a
generic 500 without internals.

The pieces, one module each: ``schemas`` (request/response models), ``errors`` (error bodies,
handlers, redaction), ``middleware`` (the front door), ``queue`` (the bounded model queue),
``state`` (the service state and the checks routes share), ``routes`` (the handlers), ``chat``
(the chat gateway), ``chat_forms`` (how its verdict reaches the client), ``verdicts`` (question
fitting and the verdict cache) and ``docs`` (``/docs`` from local files). This module wires them
together and warns at start-up when the bundle's validation coverage is low.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping, Sequence

from fastapi import FastAPI

from suffice.serving.bundle import SUFFICIENT, VALIDATION_LEVELS
from suffice.serving.gates.retrieval import RetrievalGate
from suffice.serving.scorer import SufficiencyScorer
from suffice.serving.service.config import ServiceConfig, read_api_keys, read_secret_env
from suffice.serving.service.docs import add_docs
from suffice.serving.service.errors import ApiError, RedactingFilter, Redactor, add_error_handlers, error_body
from suffice.serving.service.metrics import ServiceMetrics
from suffice.serving.service.middleware import FrontDoor, key_digest
from suffice.serving.service.queue import ModelQueue, QueueFullError
from suffice.serving.service.retrievers import Retriever, load_retriever
from suffice.serving.service.routes import router
from suffice.serving.service.state import ServiceState, model_version_of
from suffice.serving.service.upstream import UpstreamClient
from suffice.serving.service.verdicts import VerdictCache

# the names this module offered before the service was split into modules (for one release)
__all__ = ["ApiError", "ModelQueue", "QueueFullError", "RedactingFilter", "Redactor", "ServiceState", "create_app",
           "error_body", "model_version_of"]

log = logging.getLogger("suffice.service")


def create_app(config: ServiceConfig, scorer: SufficiencyScorer, *, retrieval_gate: RetrievalGate | None = None,
               retriever: Retriever | None = None,
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
    state = ServiceState(
        config=config, scorer=scorer, metrics=metrics,
        queue=ModelQueue(config.runtime.workers, config.limits.queue_size, metrics),
        redact=Redactor([*api_keys, *([upstream_api_key] if upstream_api_key else [])]),
        retrieval_gate=retrieval_gate, retriever=retriever,
        key_digests=[key_digest(k) for k in api_keys], upstream_key=upstream_api_key,
        model_version=model_version_of(scorer),
        verdicts=VerdictCache(config.sufficient_context.cache_ttl_s, config.sufficient_context.cache_size),
    )
    app = FastAPI(
        title="suffice",
        version="1",
        summary="Is the retrieved context enough to answer this question? Sufficiency scoring, RAG gates and a sufficiency-aware chat gateway.",
        lifespan=lifespan_of(state, upstream_transport),
        docs_url=None, redoc_url=None,  # /docs from local files (docs.py); ReDoc needs a CDN
        redirect_slashes=False,  # no 307 to an absolute http:// URL for a trailing slash: a plain 404
    )
    add_docs(app, "suffice")
    app.state.service = state
    warning = coverage_warning(scorer, config.sufficient_context.coverage_floor)
    if warning:
        log.warning("%s", warning)
    add_error_handlers(app)
    app.include_router(router)
    app.add_middleware(FrontDoor, state=state)
    return app


def recorded_coverage(metrics: Any) -> tuple[float, Any, Any] | None:
    """(share, threshold, n items) of validation items at or above the ``sufficient`` threshold, as the
    bundle manifest's ``metrics[VALIDATION_LEVELS]`` records it (written at training's finalize);
    None when not recorded (older bundles).

    >>> recorded_coverage({"validation_levels": {"coverage_at_sufficient": 0.004, "sufficient_threshold": 0.8, "items": 256}})
    (0.004, 0.8, 256)
    >>> recorded_coverage({}) is None
    True
    """
    levels = metrics.get(VALIDATION_LEVELS) if isinstance(metrics, Mapping) else None
    if not isinstance(levels, Mapping):
        return None
    share = levels.get("coverage_at_sufficient")
    if not isinstance(share, (int, float)) or isinstance(share, bool) or share != share:
        return None
    return float(share), levels.get("sufficient_threshold"), levels.get("items")


def coverage_warning(scorer: SufficiencyScorer, floor: float) -> str | None:
    """The start-up warning when the bundle's validation coverage at ``sufficient`` is below ``floor`` (None = fine or unknown)."""
    found = recorded_coverage(scorer.manifest.metrics)
    if found is None or found[0] >= floor:
        return None
    share, threshold, n = found
    at = f" (threshold {threshold:g})" if isinstance(threshold, (int, float)) else ""
    items = f" of {n} validation items" if isinstance(n, int) else " of the validation items"
    in_use = scorer.thresholds.get(SUFFICIENT)
    now = f"; this service uses sufficient>={in_use:g}" if isinstance(in_use, (int, float)) else ""
    return (f"the bundle reaches 'sufficient'{at} on only {share:.1%}{items}, below "
            f"sufficient_context.coverage_floor={floor:g}{now}: most chat answers will be caveated or declined. "
            "Lower sufficient_context.thresholds.sufficient, or export a bundle whose validation coverage is higher")


def lifespan_of(state: ServiceState, upstream_transport: Any = None):
    """Start-up (upstream client, warm-up -> ready) and shutdown (drain the queue) of one service."""
    config = state.config
    log_filter = RedactingFilter(state.redact)
    log.addFilter(log_filter)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if config.upstream.base_url:
            state.upstream = UpstreamClient(config.upstream.base_url, state.upstream_key, config.upstream.timeout_s,
                                            config.upstream.connect_timeout_s, transport=upstream_transport)
        try:
            await state.queue.run(state.warm_up)
            state.ready, state.not_ready_reason = True, ""
        except Exception as e:  # readiness reports it; liveness stays up so the operator can see why
            state.not_ready_reason = state.redact(f"warm-up failed: {type(e).__name__}: {e}")
            log.error("not ready: %s", state.not_ready_reason)
        try:
            yield
        finally:
            state.ready, state.not_ready_reason = False, "shutting down"
            if state.upstream is not None:
                await state.upstream.aclose()
            await asyncio.to_thread(state.queue.shutdown)
            log.removeFilter(log_filter)

    return lifespan
