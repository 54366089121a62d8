"""The sufficiency-aware chat gateway behind ``/v1/chat/completions``.

A standard OpenAI chat request goes through, in order: the request checks (limits), the
question to score (the last user turn, none = forwarded unscored; or its question part when the turn is
longer than the scoring budget: a chat turn is never refused for its length), the retrieval gate
when one is loaded and the request has no ``documents`` (SKIP = chit-chat, forwarded unscored),
the documents (the request's ``documents``, else the configured retriever; neither = forwarded
unscored unless ``sufficient_context.without_documents: decline``), the context gate and the
scorer (the verdict and the ``action``; an identical request within ``cache_ttl_s`` reuses its
verdict), then either a decline written here or the upstream LLM call with the admitted context
in a system message, a caveat on ``partial`` context, and the ``sufficiency`` block added to the
answer (streamed or not). :mod:`~suffice.serving.service.chat_forms` decides how the caveat and
the decline look (plain text, or JSON-safe with ``response_format`` / ``tools``).
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
from suffice.serving.service.chat_forms import declined, sse, verdict_headers, wants_structured
from suffice.serving.service.config import ServiceConfig
from suffice.serving.service.errors import ApiError, error_body
from suffice.serving.service.schemas import ChatRequest, Factor, SufficiencyMeta, message_text, text_chars
from suffice.serving.service.state import ServiceState, factors_of
from suffice.serving.service.upstream import UpstreamError, UpstreamStream
from suffice.serving.service.verdicts import fit_question, verdict_key

log = logging.getLogger("suffice.service")
NO_UPSTREAM = "no upstream LLM is configured: set upstream.base_url in the service config"
UNSCORED = "unscored"
UPSTREAM_FAILED = "upstream_failed"  # chat_gateway_outcomes: the verdict said forward, the upstream call failed


def check_chat_request(state: ServiceState, req: ChatRequest) -> str:
    """The limits of a chat request (413/422); returns the question (the last user message with text, else '')."""
    state.check_messages(len(req.messages))
    users = [i for i, m in enumerate(req.messages) if m.role == "user" and message_text(m).strip()]
    docs_in = req.documents
    n_chars = sum(len(message_text(m)) for m in req.messages) + (text_chars(docs_in) if docs_in else 0)
    state.check_item("", len(docs_in or []), n_chars, what="documents")
    return message_text(req.messages[users[-1]]) if users else ""


def scoring_question(state: ServiceState, turn: str) -> tuple[str, dict[str, Any] | None]:
    """The turn, or (when it does not fit the window) its question part within half the window; and a factor saying so."""
    packer = state.scorer.packer
    if packer.question_fits(turn):  # the packer's rule, what /v1/sufficiency accepts
        return turn, None
    window = packer.max_length
    count = packer.question_tokens
    # a shortened turn takes at most half the window: the rest is for the documents
    question, _ = fit_question(turn, count, max(8, window // 2))
    detail = (f"the last user turn ({count(turn)} tokens) does not fit the {window}-token window: scored with its "
              f"question part ({count(question)} tokens): {question[:200]!r}")
    return question, {"name": "question_shortened", "effect": "neutral", "detail": detail}


async def gather_documents(state: ServiceState, req: ChatRequest, question: str) -> tuple[list[dict[str, Any]], str]:
    """The request's documents (ids unique), else the retriever's for ``question``; and where they came from."""
    documents: list[dict[str, Any]] = []
    if req.documents is not None:
        for i, d in enumerate(req.documents):
            if isinstance(d, str):
                documents.append({"id": f"doc-{i + 1}", "title": "", "text": d})
            else:
                documents.append({"id": str(d.id) if d.id is not None else f"doc-{i + 1}", "title": d.title, "text": d.text})
        state.check_unique_ids([d["id"] for d in documents], "documents")
        return documents, "request"
    if state.retriever is not None:
        found = await state.run_model(state.retriever.retrieve, question, state.config.retriever.top_k, param="messages")
        return [{"id": d.id, "title": d.title, "text": d.text} for d in found], "retriever"
    return documents, "none"


async def gate_skips(state: ServiceState, req: ChatRequest) -> str | None:
    """The retrieval gate's reason when it SKIPs this turn (no documents needed), else None."""
    if state.retrieval_gate is None or req.documents is not None:
        return None
    messages = [{"role": m.role, "content": message_text(m)} for m in req.messages if m.role in ("user", "assistant")]
    d = await state.run_model(state.retrieval_gate.decide, messages, param="messages")
    state.metrics.gate.labels(decision=d.decision).inc()
    return f"the retrieval gate decided this turn needs no documents (SKIP: {d.reason})" if d.decision == "SKIP" else None


def nothing_admitted(excluded: list[dict[str, str]]) -> str:
    """What is missing when the context gate admitted none of the documents given (from its ``excluded`` list)."""
    by_reason: dict[str, list[str]] = {}
    for e in excluded:
        by_reason.setdefault(e["reason"], []).append(e["id"])
    n = len(excluded)
    if set(by_reason) == {"out_of_scope"}:
        return (f"documents about the question: none of the {n} document(s) given matched it (the context gate "
                f"dropped {', '.join(by_reason['out_of_scope'][:10])} as out of scope)")
    if set(by_reason) == {"empty"}:
        return f"document text: the {n} document(s) given are empty"
    parts = "; ".join(f"{r}: {', '.join(ids[:10])}" for r, ids in by_reason.items())
    return f"usable documents: the context gate admitted none of the {n} document(s) given ({parts})"


async def judge_sufficiency(state: ServiceState, question: str, documents: list[dict[str, Any]],
                            source: str) -> tuple[SufficiencyMeta, str]:
    """Gate the documents and score the admitted ones: the ``sufficiency`` block and the admitted context.

    An identical (question, documents, bundle) within ``cache_ttl_s`` reuses the stored verdict.
    """
    key = verdict_key(question, documents, source, state.model_version)
    hit = state.verdicts.get(key) if state.verdicts is not None else None
    if hit is not None:
        state.metrics.verdict_cache.labels(result="hit").inc()
        return hit
    sc = state.config.sufficient_context
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
    excluded = [{"id": e.artifact.id, "reason": e.reason.value} for e in sel.excluded] if sel else []
    missing = list(result.missing_aspects)
    if sel is not None and not sel.admitted and excluded:
        missing = [nothing_admitted(excluded)]
        # documents were given: the scorer saw none because the context gate admitted none
        factors = [f for f in factors if f["name"] != "empty_context"]
        factors.insert(0, {"name": "context_gate", "effect": "lowers",
                           "detail": f"the context gate admitted none of the {len(excluded)} document(s) given, so the model was not run"})
    if level == INSUFFICIENT and not missing:
        missing = [f"at least {sc.min_contexts} relevant document(s) about the question"]
    if level == SUFFICIENT:
        action = "forwarded"
    elif level == INSUFFICIENT and sc.decline_insufficient:
        action = "declined"
    else:
        action = "forwarded_with_caveat"
    meta = SufficiencyMeta(score=float(result.score), level=level, factors=factors, missing_aspects=missing, action=action,
                           documents={"source": source, "admitted": [a.id for a in sel.admitted] if sel else [], "excluded": excluded})
    out = (meta, sel.context if sel else "")
    if state.verdicts is not None:
        state.metrics.verdict_cache.labels(result="miss").inc()
        state.verdicts.put(key, out)
    return out


def unscored(config: ServiceConfig, documents: list[dict[str, Any]], source: str, reason: str) -> tuple[SufficiencyMeta, str]:
    """Forwarded without a verdict: the first ``max_docs`` documents, ``level: unscored`` and the reason."""
    kept = documents[: config.context_gate.doc_cap]
    context = "\n\n".join(f"[document:{d['id']}]\n{d['title'] + '. ' if d['title'] else ''}{d['text']}" for d in kept)
    meta = SufficiencyMeta(score=None, level=UNSCORED, factors=[], missing_aspects=[], action=UNSCORED, reason=reason,
                           documents={"source": source, "admitted": [d["id"] for d in kept], "excluded": []})
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


def upstream_error(state: ServiceState, e: UpstreamError, meta: SufficiencyMeta) -> ApiError:
    """Count and log an upstream failure; the client's error carries the verdict too (429/503: the upstream's Retry-After)."""
    state.metrics.upstream_errors.labels(kind=e.code).inc()
    state.metrics.chat_outcomes.labels(outcome=UPSTREAM_FAILED).inc()  # not the action it was meant to be
    log.warning("upstream failure %s (%s) from %s: %s; sufficiency score=%s level=%s action=%s", e.code, e.status, e.where,
                state.redact(e.message), meta.score, meta.level, meta.action)
    headers = {"Retry-After": e.retry_after} if e.retry_after else {}
    return ApiError(e.status, e.code, state.redact(e.message), headers={**headers, **verdict_headers(meta)},
                    extra={"sufficiency": meta.to_json(), **({"upstream_status": e.upstream_status} if e.upstream_status else {})})


async def decide(state: ServiceState, req: ChatRequest, turn: str) -> tuple[SufficiencyMeta, str]:
    """The verdict and the context to send: unscored (sufficiency off, gate SKIP, no documents) or judged."""
    config = state.config
    sc = config.sufficient_context
    if not sc.enabled:
        documents, source = await gather_documents(state, req, turn)
        return unscored(config, documents, source, "sufficient_context.enabled is false: the gateway is a plain proxy")
    if not turn.strip():
        documents, source = await gather_documents(state, req, turn) if req.documents is not None else ([], "none")
        return unscored(config, documents, source, "the request has no user message with text: nothing to score, "
                        "forwarded without a verdict")
    question, shortened = scoring_question(state, turn)
    skip = await gate_skips(state, req)
    if skip:
        return unscored(config, [], "none", skip)
    documents, source = await gather_documents(state, req, question)
    if source == "none" and sc.without_documents == "forward":
        return unscored(config, [], source, "the request has no `documents` and no retriever is configured: forwarded "
                        "without a verdict (send `documents`, configure a retriever, or set "
                        "sufficient_context.without_documents: decline)")
    meta, context = await judge_sufficiency(state, question, documents, source)
    if shortened:
        meta = meta.model_copy(update={"factors": [*meta.factors, Factor(**shortened)], "question_scored": question})
    return meta, context


async def chat_completion(state: ServiceState, req: ChatRequest) -> Response:
    """Answer one chat request (the body of ``/v1/chat/completions``)."""
    config = state.config
    sc = config.sufficient_context
    if state.upstream is None and not (sc.enabled and sc.decline_insufficient):
        raise ApiError(404, "not_configured", NO_UPSTREAM)
    turn = check_chat_request(state, req)
    t_model = time.perf_counter()
    meta, context = await decide(state, req, turn)
    scoring_ms = (time.perf_counter() - t_model) * 1e3
    model = req.model or config.upstream.model
    structured = wants_structured(req.model_extra or {})
    log.info("chat sufficiency score=%s level=%s action=%s docs=%d scoring_ms=%.1f stream=%s structured=%s",
             meta.score, meta.level, meta.action, len(meta.documents["admitted"]), scoring_ms, req.stream, structured)

    if meta.action == "declined":
        state.metrics.chat_outcomes.labels(outcome=meta.action).inc()
        return declined(model, meta, stream=req.stream, structured=structured)
    if state.upstream is None:
        raise ApiError(404, "not_configured", NO_UPSTREAM, extra={"sufficiency": meta.to_json()})
    payload = upstream_payload(config, req, model, context)
    if meta.action == "forwarded_with_caveat":
        meta = meta.model_copy(update={"caveat": sc.caveat})
    caveat = None if structured else meta.caveat  # structured output: the caveat stays out of the content
    if not req.stream:
        return await forward(state, payload, meta, caveat)
    try:
        stream = await state.upstream.open_stream(payload)
    except UpstreamError as e:
        raise upstream_error(state, e, meta) from None
    return StreamingResponse(relay(state, stream, meta, caveat, model), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", **verdict_headers(meta)})


async def forward(state: ServiceState, payload: dict[str, Any], meta: SufficiencyMeta, caveat: str | None) -> Response:
    """One non-streaming upstream call; the caveat (if any) appended to every text answer, the verdict added."""
    payload.pop("stream", None)
    try:
        completion = await state.upstream.chat(payload)
    except UpstreamError as e:
        raise upstream_error(state, e, meta) from None
    if caveat:
        for choice in completion.get("choices", []):
            msg = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(msg, dict) and isinstance(msg.get("content"), str) and not msg.get("tool_calls"):
                msg["content"] = msg["content"].rstrip() + "\n\n" + caveat
    completion["sufficiency"] = meta.to_json()
    state.metrics.chat_outcomes.labels(outcome=meta.action).inc()
    return JSONResponse(completion, headers=verdict_headers(meta))


async def relay(state: ServiceState, stream: UpstreamStream, meta: SufficiencyMeta, caveat: str | None,
                model: str) -> AsyncIterator[bytes]:
    """The upstream's events passed on, the caveat before the first finishing chunk, then the verdict and [DONE].

    With ``stream_options.include_usage`` the upstream's usage chunk (no choices) stays the last
    chunk before [DONE], as OpenAI clients expect: the verdict goes out just before it.
    """
    ident = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    pending_caveat = caveat
    verdict_sent = False

    def verdict() -> list[bytes]:
        nonlocal pending_caveat, verdict_sent
        out = []
        if pending_caveat:
            out.append(sse({**ident, "choices": [{"index": 0, "delta": {"content": "\n\n" + pending_caveat}, "finish_reason": None}]}))
            pending_caveat = None
        out.append(sse({**ident, "choices": [], "sufficiency": meta.to_json()}))
        verdict_sent = True
        return out

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
                if chunk.get("usage") is not None and not chunk.get("choices") and not verdict_sent:
                    for part in verdict():
                        yield part
            yield f"data: {ev.data}\n\n".encode()
        if not verdict_sent:
            for part in verdict():
                yield part
        state.metrics.chat_outcomes.labels(outcome=meta.action).inc()
    except UpstreamError as e:
        err = upstream_error(state, e, meta)
        yield sse({**error_body(err.status, err.code, err.message), "sufficiency": meta.to_json()})
    finally:
        await stream.aclose()
    yield b"data: [DONE]\n\n"
