"""The sufficiency-aware chat gateway behind ``/v1/chat/completions``.

A standard OpenAI chat request goes through, in order: the request checks (limits, a user
message with text), the documents (the request's ``documents``, else the configured retriever),
the context gate and the scorer (the verdict and the ``action``), then either a decline written
here or the upstream LLM call with the admitted context in a system message, a caveat appended
on ``partial`` context, and the ``sufficiency`` block added to the answer (streamed or not).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any, AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse

from suffice.serving.bundle import INSUFFICIENT, SUFFICIENT
from suffice.serving.gates.context import ContextGate
from suffice.serving.service.config import ServiceConfig
from suffice.serving.service.errors import ApiError, error_body
from suffice.serving.service.schemas import ChatRequest, message_text, text_chars
from suffice.serving.service.state import ServiceState, factors_of
from suffice.serving.service.upstream import UpstreamError, UpstreamStream

log = logging.getLogger("suffice.service")
NO_UPSTREAM = "no upstream LLM is configured: set upstream.base_url in the service config"


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def decline_text(meta: dict[str, Any]) -> str:
    """The assistant's answer when the context is insufficient: what is missing and what to try."""
    missing = meta.get("missing_aspects") or []
    text = "I can't answer this reliably from the information available to me."
    if missing:
        text += " What is missing: " + "; ".join(missing) + "."
    return text + " Try rephrasing the question, adding detail, or providing documents that cover it."


def check_chat_request(state: ServiceState, req: ChatRequest) -> str:
    """The limits of a chat request (413/422); returns the question (the last user message with text)."""
    state.check_messages(len(req.messages))
    users = [i for i, m in enumerate(req.messages) if m.role == "user" and message_text(m).strip()]
    if not users:
        raise ApiError(422, "invalid_request", "messages: the request needs at least one user message with text", param="messages")
    docs_in = req.documents
    n_chars = sum(len(message_text(m)) for m in req.messages) + (text_chars(docs_in) if docs_in else 0)
    state.check_item("", len(docs_in or []), n_chars, what="documents")
    return message_text(req.messages[users[-1]])


async def gather_documents(state: ServiceState, req: ChatRequest, question: str) -> tuple[list[dict[str, Any]], str]:
    """The request's documents (ids unique), else the retriever's for ``question``; and where they came from."""
    documents: list[dict[str, Any]] = []
    if req.documents is not None:
        for i, d in enumerate(req.documents):
            if isinstance(d, str):
                documents.append({"id": f"doc-{i + 1}", "title": "", "text": d})
            else:
                documents.append({"id": str(d.id) if d.id is not None else f"doc-{i + 1}", "title": d.title, "text": d.text})
        ids = [d["id"] for d in documents]
        if len(set(ids)) != len(ids):
            raise ApiError(422, "invalid_request", "documents: ids must be unique", param="documents")
        return documents, "request"
    if state.retriever is not None:
        found = await state.run_model(state.retriever.retrieve, question, state.config.retriever.top_k, param="messages")
        return [{"id": d.id, "title": d.title, "text": d.text} for d in found], "retriever"
    return documents, "request"


async def judge_sufficiency(state: ServiceState, question: str, documents: list[dict[str, Any]],
                            source: str) -> tuple[dict[str, Any], str]:
    """Gate the documents and score the admitted ones: the ``sufficiency`` block and the admitted context."""
    sc = state.config.sufficient_context
    state.check_question(question, "messages (last user message)")
    gate = ContextGate(state.scorer, state.config.context_gate)
    artifacts = [{"id": d["id"], "kind": "document", "content": (f"{d['title']}. {d['text']}" if d["title"] else d["text"])}
                 for d in documents]

    def gate_and_score() -> tuple[Any, Any]:
        sel = gate.select(artifacts, query=question) if artifacts else None
        admitted = [a.id for a in sel.admitted] if sel else []
        by_id = {d["id"]: d for d in documents}
        passages = [{"title": by_id[i]["title"], "text": by_id[i]["text"]} for i in admitted]
        return sel, state.scorer.score(question, passages)

    sel, result = await state.run_model(gate_and_score, param="messages")
    state.observe([result])
    factors = factors_of(result)
    level = result.level
    n_admitted = len(sel.admitted) if sel else 0
    if n_admitted < sc.min_contexts and level != INSUFFICIENT:
        level = INSUFFICIENT
        factors.append({"name": "min_contexts", "effect": "lowers",
                        "detail": f"{n_admitted} document(s) admitted, fewer than sufficient_context.min_contexts={sc.min_contexts}"})
    missing = list(result.missing_aspects)
    if level == INSUFFICIENT and not missing:
        missing = [f"at least {sc.min_contexts} relevant document(s) about the question"]
    if level == SUFFICIENT:
        action = "forwarded"
    elif level == INSUFFICIENT and sc.decline_insufficient:
        action = "declined"
    else:
        action = "forwarded_with_caveat"
    meta = {"score": float(result.score), "level": level, "factors": factors, "missing_aspects": missing, "action": action,
            "documents": {"source": source, "admitted": [a.id for a in sel.admitted] if sel else [],
                          "excluded": [{"id": e.artifact.id, "reason": e.reason.value} for e in sel.excluded] if sel else []}}
    return meta, sel.context if sel else ""


def unscored(config: ServiceConfig, documents: list[dict[str, Any]], source: str) -> tuple[dict[str, Any], str]:
    """Sufficient-context off (a plain proxy): the first ``max_docs`` documents, unscored."""
    kept = documents[: config.context_gate.doc_cap]
    context = "\n\n".join(f"[document:{d['id']}]\n{d['title'] + '. ' if d['title'] else ''}{d['text']}" for d in kept)
    meta = {"score": None, "level": None, "factors": [], "missing_aspects": [], "action": "unscored",
            "documents": {"source": source, "admitted": [d["id"] for d in kept], "excluded": []}}
    return meta, context


def upstream_payload(config: ServiceConfig, req: ChatRequest, model: str, context: str) -> dict[str, Any]:
    """The request as the upstream gets it: unknown fields kept, the admitted context as a system message."""
    payload = dict(req.model_extra or {})
    payload["model"] = model
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    if context:
        messages.insert(0, {"role": "system", "content": f"{config.upstream.system_prompt}\n\nContext:\n{context}"})
    payload["messages"] = messages
    return payload


def upstream_error(state: ServiceState, e: UpstreamError, meta: dict[str, Any]) -> ApiError:
    """Count and log an upstream failure; the client's error carries the verdict too."""
    state.metrics.upstream_errors.labels(kind=e.code).inc()
    log.warning("upstream failure %s (%s): %s; sufficiency score=%s level=%s action=%s", e.code, e.status,
                state.redact(e.message), meta["score"], meta["level"], meta["action"])
    return ApiError(e.status, e.code, state.redact(e.message),
                    extra={"sufficiency": meta, **({"upstream_status": e.upstream_status} if e.upstream_status else {})})


async def chat_completion(state: ServiceState, req: ChatRequest) -> Response:
    """Answer one chat request (the body of ``/v1/chat/completions``)."""
    config = state.config
    sc = config.sufficient_context
    if state.upstream is None and not (sc.enabled and sc.decline_insufficient):
        raise ApiError(404, "not_configured", NO_UPSTREAM)
    question = check_chat_request(state, req)
    documents, source = await gather_documents(state, req, question)
    t_model = time.perf_counter()
    if sc.enabled:
        meta, context = await judge_sufficiency(state, question, documents, source)
    else:
        meta, context = unscored(config, documents, source)
    scoring_ms = (time.perf_counter() - t_model) * 1e3
    state.metrics.chat_outcomes.labels(outcome=meta["action"]).inc()
    model = req.model or config.upstream.model
    log.info("chat sufficiency score=%s level=%s action=%s docs=%d scoring_ms=%.1f stream=%s",
             meta["score"], meta["level"], meta["action"], len(meta["documents"]["admitted"]), scoring_ms, req.stream)

    if meta["action"] == "declined":
        return declined(req, model, meta)
    if state.upstream is None:
        raise ApiError(404, "not_configured", NO_UPSTREAM, extra={"sufficiency": meta})
    payload = upstream_payload(config, req, model, context)
    caveat = sc.caveat if meta["action"] == "forwarded_with_caveat" else None
    if not req.stream:
        return await forward(state, payload, meta, caveat)
    try:
        stream = await state.upstream.open_stream(payload)
    except UpstreamError as e:
        raise upstream_error(state, e, meta) from None
    return StreamingResponse(relay(state, stream, meta, caveat, model), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def forward(state: ServiceState, payload: dict[str, Any], meta: dict[str, Any], caveat: str | None) -> Response:
    """One non-streaming upstream call; the caveat appended to every answer, the verdict added."""
    payload.pop("stream", None)
    try:
        completion = await state.upstream.chat(payload)
    except UpstreamError as e:
        raise upstream_error(state, e, meta) from None
    if caveat:
        for choice in completion.get("choices", []):
            msg = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                msg["content"] = msg["content"].rstrip() + "\n\n" + caveat
    completion["sufficiency"] = meta
    return JSONResponse(completion)


async def relay(state: ServiceState, stream: UpstreamStream, meta: dict[str, Any], caveat: str | None,
                model: str) -> AsyncIterator[bytes]:
    """The upstream's events passed on, the caveat before the first finishing chunk, then the verdict and [DONE]."""
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
                    yield sse({**ident, "choices": [{"index": idx, "delta": {"content": "\n\n" + pending_caveat}, "finish_reason": None}]})
                    pending_caveat = None
            yield f"data: {ev.data}\n\n".encode()
        if pending_caveat:
            yield sse({**ident, "choices": [{"index": 0, "delta": {"content": "\n\n" + pending_caveat}, "finish_reason": None}]})
        yield sse({**ident, "choices": [], "sufficiency": meta})
    except UpstreamError as e:
        err = upstream_error(state, e, meta)
        yield sse({**error_body(err.status, err.code, err.message), "sufficiency": meta})
    finally:
        await stream.aclose()
    yield b"data: [DONE]\n\n"


def declined(req: ChatRequest, model: str, meta: dict[str, Any]) -> Response:
    """The decline as a chat completion (or its stream), written here without calling the LLM."""
    text = decline_text(meta)
    ident = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model}
    if not req.stream:
        return JSONResponse({**ident, "object": "chat.completion",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "sufficiency": meta})
    return StreamingResponse(declined_chunks(ident, text, meta), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def declined_chunks(ident: dict[str, Any], text: str, meta: dict[str, Any]) -> AsyncIterator[bytes]:
    """The decline streamed as OpenAI chunks: role, text, stop, the verdict, [DONE]."""
    base = {**ident, "object": "chat.completion.chunk"}
    yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    yield sse({**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
    yield sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    yield sse({**base, "choices": [], "sufficiency": meta})
    yield b"data: [DONE]\n\n"
