"""How the chat gateway's verdict reaches the client: headers, the caveat, and the decline in the requested form.

Plain chat: the caveat is appended to the answer and a decline is the assistant's text. With
``response_format`` (``json_object`` / ``json_schema``) or ``tools`` set, the content must stay
what the client asked for, so the caveat goes only into the ``sufficiency`` block and the
``X-Suffice-Caveat`` header, and a decline is an OpenAI refusal (``message.refusal`` set,
``content`` null; streamed as ``delta.refusal``), which the OpenAI SDK's ``.parse()`` surfaces.
Every chat answer carries ``X-Suffice-Level`` and ``X-Suffice-Action`` (and ``X-Suffice-Score``).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator, Mapping
from urllib.parse import quote

from fastapi.responses import JSONResponse, Response, StreamingResponse

from suffice.serving.service.schemas import SufficiencyMeta


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def wants_structured(extra: Mapping[str, Any]) -> bool:
    """True when the request asks for JSON output or may answer with tool calls (content must not be touched)."""
    rf = extra.get("response_format")
    if isinstance(rf, Mapping) and rf.get("type") in ("json_object", "json_schema"):
        return True
    return bool(extra.get("tools") or extra.get("functions"))


def header_value(text: str) -> str:
    """``text`` as a header value: ASCII kept, anything else percent-encoded (RFC 3986)."""
    flat = " ".join(text.split())
    return flat if flat.isascii() else quote(flat, safe=" !#$&'()*+,/:;=?@[]~")


def verdict_headers(meta: SufficiencyMeta) -> dict[str, str]:
    """The verdict as response headers (the caveat header only when a caveat applies)."""
    headers = {"X-Suffice-Level": str(meta.level or "unscored"), "X-Suffice-Action": str(meta.action)}
    if meta.score is not None:
        headers["X-Suffice-Score"] = f"{float(meta.score):.4f}"
    if meta.caveat:
        headers["X-Suffice-Caveat"] = header_value(meta.caveat)
    return headers


def decline_text(meta: SufficiencyMeta) -> str:
    """The assistant's answer when the context is insufficient: what is missing and what to try."""
    missing = meta.missing_aspects
    text = "I can't answer this reliably from the information available to me."
    if missing:
        text += " What is missing: " + "; ".join(missing) + "."
    return text + " Try rephrasing the question, adding detail, or providing documents that cover it."


def declined(model: str, meta: SufficiencyMeta, *, stream: bool, structured: bool) -> Response:
    """The decline as a chat completion (or its stream), written here without calling the LLM."""
    text = decline_text(meta)
    ident = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model}
    headers = verdict_headers(meta)
    if not stream:
        message = {"role": "assistant", "content": None, "refusal": text} if structured else {"role": "assistant", "content": text}
        return JSONResponse({**ident, "object": "chat.completion",
                             "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "sufficiency": meta.to_json()},
                            headers=headers)
    return StreamingResponse(declined_chunks(ident, text, meta, structured), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", **headers})


async def declined_chunks(ident: dict[str, Any], text: str, meta: SufficiencyMeta, structured: bool) -> AsyncIterator[bytes]:
    """The decline streamed as OpenAI chunks: role, text (or refusal), stop, the verdict, [DONE]."""
    base = {**ident, "object": "chat.completion.chunk"}
    field = "refusal" if structured else "content"
    first = {"role": "assistant", "content": None, "refusal": ""} if structured else {"role": "assistant", "content": ""}
    yield sse({**base, "choices": [{"index": 0, "delta": first, "finish_reason": None}]})
    yield sse({**base, "choices": [{"index": 0, "delta": {field: text}, "finish_reason": None}]})
    yield sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    yield sse({**base, "choices": [], "sufficiency": meta.to_json()})
    yield b"data: [DONE]\n\n"
