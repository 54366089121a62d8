"""A scriptable fake OpenAI-compatible chat-completions server for tests (real HTTP, no network).

It is a FastAPI app served by uvicorn in a background thread on 127.0.0.1 with a port the OS
picks, so tests exercise the real client stack (sockets, HTTP parsing, timeouts, dropped
connections). Every request is answered by a :class:`Reply`, chosen in this order:

1. a rule added with :meth:`FakeLLMServer.on` whose ``contains`` string occurs in the request's
   messages (each rule replays its replies in order, then falls through once exhausted, unless
   ``repeat=True`` keeps its last reply);
2. a reply queued with :meth:`FakeLLMServer.enqueue` (first in, first out, for the next requests);
3. ``default(request_json) -> Reply`` (by default a well-formed ``{"Sufficient Context": 1}`` verdict).

Replies: ``Reply.verdict(1)``, ``Reply.questions([...])`` (a reply to suffice synth's question-writing
prompt), ``Reply.text("anything")``, ``Reply.error(429, retry_after=1)``, ``Reply.error(500)``,
``Reply.drop()`` (the connection is closed with no response), and any of them delayed with ``delay_s=``
(``Reply.verdict(1, delay_s=2)`` is a slow reply).
Requests with ``"stream": true`` get Server-Sent Events chunks as the OpenAI API sends them.

Counters: ``n_requests``, ``max_in_flight``, ``requests`` (bodies and headers, for assertions).

>>> with FakeLLMServer() as server:  # doctest: +SKIP
...     server.enqueue(Reply.error(429, retry_after=1))
...     httpx.post(server.base_url + "/chat/completions", json={"model": "m", "messages": []}).status_code
429
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


@dataclass
class Reply:
    """One scripted answer to one request."""

    kind: str = "text"  # text | error | drop
    content: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # error body (JSON-serialisable) for kind == "error"
    delay_s: float = 0.0
    usage: tuple[int, int] | None = None  # (prompt_tokens, completion_tokens); None = estimated
    include_usage: bool = True  # False: no usage block, as some local servers reply

    @classmethod
    def text(cls, content: str, *, delay_s: float = 0.0, usage: tuple[int, int] | None = None,
             include_usage: bool = True) -> "Reply":
        return cls(kind="text", content=content, delay_s=delay_s, usage=usage, include_usage=include_usage)

    @classmethod
    def verdict(cls, label: int, *, level: str | None = None, explanation: str = "Every step is answered by the context.",
                delay_s: float = 0.0, fenced: bool = False) -> "Reply":
        """A well-formed chain-of-thought reply ending in the JSON verdict the autorater prompt asks for."""
        verdict: dict[str, Any] = {"Sufficient Context": int(label)}
        if level is not None:
            verdict["Level"] = level
        block = json.dumps(verdict)
        if fenced:
            block = f"```json\n{block}\n```"
        content = f"Step-by-step:\nQ1: What is asked? A1: see the context.\nExplanation: {explanation}\n{block}"
        return cls(kind="text", content=content, delay_s=delay_s)

    @classmethod
    def questions(cls, questions: list[dict[str, Any]], *, preamble: str = "Here are the questions.", fenced: bool = True,
                  delay_s: float = 0.0) -> "Reply":
        """A well-formed reply to a question-writing prompt (``suffice synth``): ``{"questions": [...]}`` as JSON."""
        block = json.dumps({"questions": questions}, indent=1)
        if fenced:
            block = f"```json\n{block}\n```"
        return cls(kind="text", content=f"{preamble}\n{block}", delay_s=delay_s)

    @classmethod
    def error(cls, status: int, *, retry_after: float | str | None = None, body: Any = None, delay_s: float = 0.0) -> "Reply":
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        return cls(kind="error", status=status, headers=headers, delay_s=delay_s,
                   body=body if body is not None else {"error": {"message": f"scripted {status}", "code": status}})

    @classmethod
    def drop(cls, *, delay_s: float = 0.0) -> "Reply":
        """Close the TCP connection without sending any response (a crashed proxy)."""
        return cls(kind="drop", delay_s=delay_s)


@dataclass
class _Rule:
    contains: str
    replies: deque
    repeat: bool


def approx_tokens(text: str) -> int:
    """Token count as a server would report it, roughly (4 characters a token)."""
    return max(1, len(text) // 4)


def messages_text(body: dict[str, Any]) -> str:
    """All message contents of a chat-completions request, joined (what rules match against)."""
    parts = []
    for m in body.get("messages") or []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):  # content parts
            parts += [p.get("text", "") for p in c if isinstance(p, dict)]
    return "\n".join(parts)


class FakeLLMServer:
    """A local OpenAI-compatible server with scripted replies; use as a context manager.

    ``base_url`` is ``http://127.0.0.1:<port>/v1``. Thread-safe counters let tests assert how
    many requests arrived and how many were in flight at once.
    """

    def __init__(self, default: Callable[[dict[str, Any]], Reply] | None = None, model: str = "fake-llm"):
        self.default = default or (lambda body: Reply.verdict(1))
        self.model = model
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque()
        self._rules: list[_Rule] = []
        self.requests: list[dict[str, Any]] = []  # {"body", "headers", "reply_kind"}
        self.n_requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.app = self._build_app()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    # ---------------------------------------------------------------- scripting

    def enqueue(self, *replies: Reply) -> None:
        """Answer the next requests (any item) with these replies, in order."""
        with self._lock:
            self._queue.extend(replies)

    def on(self, contains: str, *replies: Reply, repeat: bool = False) -> None:
        """Answer requests whose messages contain ``contains`` with ``replies`` in order."""
        if not replies:
            raise ValueError("on(): give at least one Reply")
        with self._lock:
            self._rules.append(_Rule(contains, deque(replies), repeat))

    def reset_counters(self) -> None:
        with self._lock:
            self.requests.clear()
            self.n_requests = 0
            self.max_in_flight = self.in_flight

    def _choose(self, body: dict[str, Any]) -> Reply:
        text = messages_text(body)
        with self._lock:
            for rule in self._rules:
                if rule.contains in text and rule.replies:
                    if rule.repeat and len(rule.replies) == 1:
                        return rule.replies[0]
                    return rule.replies.popleft()
            if self._queue:
                return self._queue.popleft()
        return self.default(body)

    # ---------------------------------------------------------------- the app

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="fake OpenAI-compatible server")

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "tests"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            with self._lock:
                self.n_requests += 1
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                try:
                    body = await request.json()
                except (json.JSONDecodeError, UnicodeDecodeError):
                    return JSONResponse({"error": {"message": "request body is not JSON"}}, status_code=400)
                reply = self._choose(body)
                with self._lock:
                    self.requests.append({"body": body, "headers": dict(request.headers), "reply_kind": reply.kind})
                if reply.delay_s:
                    await asyncio.sleep(reply.delay_s)
                if reply.kind == "drop":
                    return _DropConnection()
                if reply.kind == "error":
                    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
                return self._completion(body, reply)
            finally:
                with self._lock:
                    self.in_flight -= 1

        return app

    def _completion(self, body: dict[str, Any], reply: Reply) -> Response:
        prompt_tokens, completion_tokens = reply.usage or (approx_tokens(messages_text(body)), approx_tokens(reply.content))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        cid = f"chatcmpl-fake-{self.n_requests}"
        created = int(time.time())
        model = body.get("model") or self.model
        if not body.get("stream"):
            payload: dict[str, Any] = {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}],
            }
            if reply.include_usage:
                payload["usage"] = usage
            return JSONResponse(payload, headers=reply.headers)
        include_usage = reply.include_usage and bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None, usage_: dict | None = None, choices: bool = True) -> str:
            obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []}
            if usage_ is not None:
                obj["usage"] = usage_
            return f"data: {json.dumps(obj)}\n\n"

        async def events():
            yield chunk({"role": "assistant", "content": ""})
            step = 8
            for i in range(0, len(reply.content), step):
                yield chunk({"content": reply.content[i : i + step]})
            yield chunk({}, finish="stop")
            if include_usage:
                yield chunk({}, usage_=usage, choices=False)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=reply.headers)

    # ---------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("FakeLLMServer is not started: use it as a context manager or call start()")
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 10.0) -> "FakeLLMServer":
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                lifespan="off", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="fake-llm-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("fake LLM server did not start (see the uvicorn log above)")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> "FakeLLMServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _QuietDrops(logging.Filter):
    """uvicorn logs an error for every deliberate drop; keep the test output readable."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "returned without starting response" not in record.getMessage()


logging.getLogger("uvicorn.error").addFilter(_QuietDrops())


class _DropConnection(Response):
    """Closes the client's TCP connection without writing a byte of response."""

    def __init__(self) -> None:
        super().__init__()

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - ASGI signature
        transport = _transport_of(receive)
        if transport is None:
            raise RuntimeError("cannot reach the connection's transport to drop it (uvicorn internals changed?)")
        transport.close()


def _transport_of(receive: Any) -> Any:
    """uvicorn's per-request cycle holds the asyncio transport; starlette may wrap ``receive``."""
    seen = 0
    while receive is not None and seen < 10:
        owner = getattr(receive, "__self__", None)
        transport = getattr(owner, "transport", None)
        if transport is not None:
            return transport
        receive = getattr(receive, "__wrapped__", None) or getattr(owner, "receive", None) or getattr(owner, "_receive", None)
        seen += 1
    return None
