"""The ASGI front door: auth, content type, body size and request metrics, before anything is parsed.

``/v1`` routes need a bearer key when keys are configured (compared in constant time); POST
bodies must be JSON (415), within ``limits.max_body_bytes`` (413) and arrive within
``limits.body_timeout_s`` (408); every request is counted (a client that leaves before any
response as status 499, not as a server error).
"""

from __future__ import annotations

import asyncio
import email.message
import hashlib
import hmac
import json
import time
from typing import Any, Callable, Mapping

from suffice.serving.service.errors import NESTED_TOO_DEEPLY, error_body, too_deep
from suffice.serving.service.state import ServiceState

POST_ROUTES = ("/v1/sufficiency", "/v1/context-gate", "/v1/safety-check",
               "/v1/retrieval-gate", "/v1/chat/completions")
KNOWN_ROUTES = frozenset(POST_ROUTES + ("/v1/models", "/healthz", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json"))
HEAD_AS_GET = frozenset(("/healthz", "/readyz"))  # probes that use HEAD
METHODS = frozenset(("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"))
CLIENT_CLOSED = 499  # the metrics status of a request whose client disconnected before any response


def is_json(content_type: str) -> bool:
    """``application/json`` or ``application/*+json`` (parameters such as charset allowed)."""
    msg = email.message.Message()
    msg["content-type"] = content_type
    subtype = msg.get_content_subtype() if msg.get_content_maintype() == "application" else ""
    return bool(content_type) and (subtype == "json" or subtype.endswith("+json"))


def key_digest(key: str) -> bytes:
    """The sha256 of an API key: what the service keeps and compares instead of the key."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class FrontDoor:
    """Pure ASGI middleware (no per-request task, streaming untouched).

    Order: auth (401) -> content type (415) -> body size (413) and time (408) -> the app. The body
    is read once here, bounded in size and time, and replayed to the app. Bodies announced or found larger than the limit are
    drained (up to 16x the limit) so the client can read the 413 instead of a reset connection.
    """

    def __init__(self, app: Any, state: ServiceState):
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
        status_box: list[int | None] = [None]

        async def send_counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            await send(message)

        if method == "HEAD" and path in HEAD_AS_GET:
            scope = {**scope, "method": "GET"}  # the server still sends no body: it saw a HEAD request
        failed = True
        try:
            await self._handle(scope, receive, send_counted, path, scope["method"])
            failed = False
        finally:
            # no response started: an exception is a 500; a clean return means the client left first
            # (mid-body): counted as 499 (nginx's "client closed request"), not as a server error
            status = status_box[0] if status_box[0] is not None else (500 if failed else CLIENT_CLOSED)
            self.state.metrics.observe_request(route, method_label, status, time.perf_counter() - t0)

    async def _reply(self, send: Callable, status: int, code: str, message: str, headers: Mapping[str, str] | None = None,
                     param: str | None = None) -> None:
        body = json.dumps(error_body(status, code, message, param)).encode()
        hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})

    async def _handle(self, scope: dict, receive: Callable, send: Callable, path: str, method: str) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.state.key_digests and path.startswith("/v1/") and not self._authorised(headers):
            await self._reply(send, 401, "invalid_api_key",
                              "missing or invalid API key: send 'Authorization: Bearer <key>'",
                              {"WWW-Authenticate": "Bearer"})
            return
        if method != "POST" or path not in POST_ROUTES:
            await self.app(scope, receive, send)
            return
        ctype = headers.get("content-type", "")
        if not is_json(ctype):
            await self._reply(send, 415, "unsupported_media_type",
                              f"Content-Type {ctype or '(none)'!r} is not supported: send the body as 'application/json'")
            return
        body = await self._read_body(receive, send, headers.get("content-length"))
        if body is None:
            return
        if not body.strip():
            await self._reply(send, 422, "invalid_json", "the body is empty: send a JSON document (see /docs for the schema)")
            return
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            await self._reply(send, 422, "invalid_json", f"the body is not UTF-8 encoded JSON (bad byte at position {e.start})")
            return
        if too_deep(body):
            await self._reply(send, 422, "nested_too_deeply", NESTED_TOO_DEEPLY, param="body")
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _authorised(self, headers: Mapping[str, str]) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        ok = False
        if scheme.lower() == "bearer" and token.strip():
            d = key_digest(token.strip())
            for k in self.state.key_digests:  # no early exit: the time does not depend on which key matched
                ok |= hmac.compare_digest(d, k)
        return ok

    async def _read_body(self, receive: Callable, send: Callable, declared: str | None) -> bytes | None:
        """The whole body within ``limits.max_body_bytes`` and ``limits.body_timeout_s``; None when the reply
        (400/408/413) was sent or the client left."""
        timeout = self.state.config.limits.body_timeout_s
        deadline = time.monotonic() + timeout

        async def receive_in_time() -> dict:
            return await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))

        try:
            return await self._read_body_until(receive_in_time, send, declared)
        except asyncio.TimeoutError:
            await self._reply(send, 408, "request_timeout",
                              f"the request body did not arrive within {timeout:g} s (limits.body_timeout_s): send it at once",
                              {"Connection": "close"})
            return None

    async def _read_body_until(self, receive: Callable, send: Callable, declared: str | None) -> bytes | None:
        limit = self.state.config.limits.max_body_bytes
        too_big = f"the request body exceeds the limit of {limit} bytes (limits.max_body_bytes): send fewer or shorter passages"
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                n = -1
            if n < 0:
                await self._reply(send, 400, "invalid_content_length", f"Content-Length {declared!r} is not a non-negative integer")
                return None
            if n > limit:
                if n <= 16 * limit:
                    await self._drain(receive)
                await self._reply(send, 413, "body_too_large", too_big, {"Connection": "close"})
                return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                if message.get("more_body", False):
                    await self._drain(receive, size)
                await self._reply(send, 413, "body_too_large", too_big, {"Connection": "close"})
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _drain(self, receive: Callable, already: int = 0) -> None:
        cap = 16 * self.state.config.limits.max_body_bytes
        size = already
        while size <= cap:
            try:
                message = await receive()
            except asyncio.TimeoutError:  # the body timeout ends the drain too: the 413 still goes out
                return
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

