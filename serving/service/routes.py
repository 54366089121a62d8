"""The service's routes: sufficiency, the gates, the chat gateway and the ops endpoints.

Each handler reads the :class:`~suffice.serving.service.state.ServiceState` from
``request.app.state.service`` (the ``State`` dependency), checks the per-item limits (413) and
puts the model work on the bounded queue.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Union

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse, Response

from suffice.serving.gates.context import ContextGate
from suffice.serving.gates.safety import SafetyGate, SafetyThresholds
from suffice.serving.jsonl import json_safe
from suffice.serving.service.chat import chat_completion
from suffice.serving.service.errors import ApiError
from suffice.serving.service.schemas import (
    DUPLICATE_IDS,
    ERRORS,
    ChatCompletionOut,
    ChatRequest,
    ContextGateRequest,
    ContextGateResponse,
    ErrorOut,
    RetrievalGateRequest,
    RetrievalGateResponse,
    SafetyRequest,
    SafetyResponse,
    SufficiencyBody,
    SufficiencyRequest,
    SufficiencyResponse,
    text_chars,
)
from suffice.serving.service.state import ServiceState


def service_state(request: Request) -> ServiceState:
    """The state ``create_app`` put on the app."""
    return request.app.state.service


State = Annotated[ServiceState, Depends(service_state)]
router = APIRouter()


@router.post("/v1/sufficiency", response_model=Union[SufficiencyResponse, list[SufficiencyResponse]], responses=ERRORS,
          tags=["sufficiency"], summary="Score whether the passages suffice to answer the question (one item or a list)")
async def sufficiency(body: Annotated[SufficiencyBody, Body()], state: State) -> Any:
    """One ``{question, passages}`` object -> one result; a JSON list of them (the batch form)
    -> a list of results in input order, scored in batches of the bundle's batch size."""
    t0 = time.perf_counter()
    if isinstance(body, SufficiencyRequest):
        it = body.item()
        state.check_item("", len(it.passages), len(it.question) + text_chars(it.passages))
        state.check_question(it.question, "question")
        r = await state.run_model(state.scorer.score, it.question, list(it.passages), param="question")
        state.observe([r])
        return state.to_response(r, (time.perf_counter() - t0) * 1e3)
    if len(body) > state.config.limits.max_batch:
        raise ApiError(413, "batch_too_large", f"the batch has {len(body)} items; the limit is {state.config.limits.max_batch} (limits.max_batch)")
    items = [req.item() for req in body]
    for i, it in enumerate(items):
        state.check_item(f"{i}.", len(it.passages), len(it.question) + text_chars(it.passages))
        state.check_question(it.question, f"{i}.question")
    if not items:
        return []
    results = await state.run_model(state.scorer.score_batch, [it.question for it in items],
                                    [list(it.passages) for it in items], param="question")
    state.observe(results)
    return [state.to_response(r, float(r.latency_ms)) for r in results]

@router.post("/v1/context-gate", response_model=ContextGateResponse, responses={**ERRORS, **DUPLICATE_IDS}, tags=["gates"],
          summary="Choose which artifacts enter the prompt under a token budget and a document cap")
async def context_gate(req: ContextGateRequest, state: State) -> dict[str, Any]:
    t0 = time.perf_counter()
    state.check_item("", len(req.artifacts), text_chars(req.artifacts) + len(req.question or ""), what="artifacts")
    state.check_unique_ids([a.id for a in req.artifacts], "artifacts")
    gate = ContextGate(state.scorer, state.config.context_gate)
    arts = [a.model_dump() for a in req.artifacts]
    sel = await state.run_model(gate.select, arts, req.question, req.budget_tokens, req.max_docs, param="artifacts")
    return {
        "admitted": [{"id": a.id, "kind": a.kind, "content": a.content, "authority": a.authority, "priority": a.priority}
                     for a in sel.admitted],
        "excluded": [{"id": e.artifact.id, "kind": e.artifact.kind, "reason": e.reason.value, "detail": e.detail}
                     for e in sel.excluded],
        "context": sel.context, "tokens_used": sel.tokens_used, "budget_tokens": sel.budget_tokens,
        "relevance": {k: float(v) for k, v in sel.relevance.items()},
        "latency_ms": (time.perf_counter() - t0) * 1e3,
    }

@router.post("/v1/safety-check", response_model=SafetyResponse, responses=ERRORS, tags=["gates"],
          summary="Decide whether to answer or say \"I don't know\", with every check's result")
async def safety_check(req: SafetyRequest, state: State) -> dict[str, Any]:
    t0 = time.perf_counter()
    state.check_item("", len(req.chunks), len(req.question) + len(req.answer or "") + text_chars(req.chunks), what="chunks")
    state.check_question(req.question, "question")
    overrides = req.thresholds.model_dump(exclude_none=True) if req.thresholds else {}
    try:
        th = SafetyThresholds(**overrides)
    except ValueError as e:
        raise ApiError(422, "invalid_thresholds", str(e), param="thresholds") from None
    chunks = [c if isinstance(c, str) else {k: v for k, v in c.model_dump().items() if v is not None} for c in req.chunks]
    res = await state.run_model(SafetyGate(state.scorer, th).check, req.question, chunks, req.answer, param="question")
    return {
        "should_reject": res.should_reject,
        "rejection_reason": res.rejection_reason.value if res.rejection_reason else None,
        "confidence": float(res.confidence), "passed_checks": res.passed_checks, "failed_checks": res.failed_checks,
        "explanation": res.explanation, "diagnostics": json_safe(res.diagnostics),
        "latency_ms": (time.perf_counter() - t0) * 1e3,
    }

@router.post("/v1/retrieval-gate", response_model=RetrievalGateResponse, responses={**ERRORS, 404: {"model": ErrorOut}},
          tags=["gates"], summary="Should this chat turn trigger retrieval? RETRIEVE or SKIP (fails open)")
async def retrieval_gate_route(req: RetrievalGateRequest, state: State) -> dict[str, Any]:
    if state.retrieval_gate is None:
        raise ApiError(404, "not_configured", "no retrieval-gate model is loaded: start the service with "
                       "retrieval_gate.bundle set (or --retrieval-gate-bundle DIR)")
    state.check_messages(len(req.messages))
    state.check_item("", 0, sum(len(m.content) for m in req.messages))
    d = await state.run_model(state.retrieval_gate.decide, [m.model_dump() for m in req.messages], param="messages")
    state.metrics.gate.labels(decision=d.decision).inc()
    return {"decision": d.decision, "score": None if d.score is None else float(d.score),
            "latency_ms": float(d.latency_ms), "reason": d.reason}

@router.post("/v1/chat/completions", responses={200: {"model": ChatCompletionOut, "content": {"text/event-stream": {}}},
                                              404: {"model": ErrorOut}, 429: {"model": ErrorOut}, 502: {"model": ErrorOut},
                                              503: {"model": ErrorOut}, 504: {"model": ErrorOut}, **ERRORS, **DUPLICATE_IDS},
          tags=["chat"], summary="OpenAI-compatible chat gateway: context gate -> sufficiency -> upstream LLM")
async def chat_completions(req: ChatRequest, state: State) -> Response:
    return await chat_completion(state, req)

@router.get("/v1/models", tags=["chat"], summary="The models the chat gateway serves (OpenAI list format)")
async def list_models(state: State) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(state)]}

@router.get("/v1/models/{model_id}", tags=["chat"], summary="One served model (OpenAI format)", responses={404: {"model": ErrorOut}})
async def get_model(model_id: str, state: State) -> dict[str, Any]:
    card = model_card(state)
    if model_id != card["id"]:
        raise ApiError(404, "model_not_found", f"model {model_id!r} is not served here: GET /v1/models lists {card['id']!r}",
                       param="model_id")
    return card

def model_card(state: ServiceState) -> dict[str, Any]:
    """The upstream model the gateway forwards to when a request names none (upstream.model)."""
    return {"id": state.config.upstream.model, "object": "model", "created": int(state.started_at), "owned_by": "suffice"}

@router.get("/healthz", tags=["ops"], summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}

@router.get("/readyz", tags=["ops"], summary="Readiness: the model is loaded and warmed up",
         responses={503: {"description": "not ready (starting, warm-up failed, shutting down)"}})
async def readyz(state: State) -> JSONResponse:
    body = {"status": "ready" if state.ready else "not_ready", "model_version": state.model_version,
            "retrieval_gate": state.retrieval_gate is not None, "queue_depth": state.queue.depth,
            # which model variant runs (e.g. onnxruntime-int8, openvino-bf16): the runtime picks it per CPU
            "variant": state.scorer.variant,
            "retrieval_gate_variant": state.retrieval_gate.variant if state.retrieval_gate is not None else None}
    if not state.ready:
        body["reason"] = state.not_ready_reason
    return JSONResponse(body, status_code=200 if state.ready else 503)

@router.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=Response)
async def metrics_route(state: State) -> Response:
    data, ctype = state.metrics.render()
    return Response(data, media_type=ctype)

