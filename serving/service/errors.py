"""Errors answered to clients, and the redaction of secrets from everything bound for a log or a client.

Every error body is OpenAI-style ``{"error": {message, type, code, param}}``. The handlers
registered by :func:`add_error_handlers` turn validation errors into 422s naming the field, a
full model queue into 503 with Retry-After, and anything unexpected into a generic 500 whose
details only go to the (redacted) service log.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any, Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from suffice.serving.service.queue import QueueFullError
from suffice.serving.service.schemas import MODEL_NAMES, UNION_TAGS

log = logging.getLogger("suffice.service")


class ApiError(Exception):
    """An error answered to the client: OpenAI-style ``{"error": {message, type, code, param}}``."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 headers: Mapping[str, str] | None = None, extra: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 409: "invalid_request_error", 413: "request_too_large", 415: "invalid_request_error",
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
# exception handlers (the service state is ``request.app.state.service``)
# ------------------------------------------------------------------------------------------
async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    redact = request.app.state.service.redact
    return JSONResponse(error_body(exc.status, exc.code, redact(exc.message), exc.param, **exc.extra),
                        status_code=exc.status, headers=exc.headers)


# pydantic's names for the members of a union ("str", "function-after[valid_unicode(), str]", "PassageIn"):
# internals a client should not see in a field path
_INTERNAL_LOC = frozenset(("str", "int", "float", "bool", "none", "list", "dict", "is-instance", "lax-or-strict"))


def public_loc(loc: Sequence[Any], model_names: frozenset[str] = frozenset()) -> str:
    """A validation error's location as the client's field path (``body.passages.0.text``).

    >>> public_loc(("body", "passages", 0, "function-after[valid_unicode(), str]"))
    'body.passages.0'
    """
    parts = []
    for x in loc:
        if isinstance(x, str) and (x in UNION_TAGS or x in _INTERNAL_LOC or x in model_names or "[" in x or "(" in x):
            continue
        parts.append(str(x))
    return ".".join(parts)


def public_message(msg: str) -> str:
    """pydantic's message without its class prefixes ("Value error, ..." -> "...")."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    fields: list[dict[str, str]] = []
    for e in exc.errors():
        f = {"field": public_loc(e.get("loc", ()), MODEL_NAMES), "message": public_message(str(e.get("msg", ""))),
             "type": str(e.get("type", ""))}
        if not any(g["field"] == f["field"] and g["message"] == f["message"] for g in fields):
            fields.append(f)
    if any(f["type"] == "json_invalid" for f in fields):
        msg = "the body is not valid JSON: " + "; ".join(f"{f['field']}: {f['message']}" for f in fields)
        code = "invalid_json"
    else:
        msg = "invalid request: " + "; ".join(f"{f['field']}: {f['message']}" for f in fields[:10])
        code = "invalid_request"
    msg = request.app.state.service.redact(msg[:4000])
    return JSONResponse(error_body(422, code, msg, fields[0]["field"] if fields else None, fields=fields[:50]), status_code=422)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        return JSONResponse(error_body(422, "invalid_json", "the body is not valid JSON (it could not be parsed)", "body"), status_code=422)
    codes = {404: "not_found", 405: "method_not_allowed"}
    return JSONResponse(error_body(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail)),
                        status_code=exc.status_code, headers=getattr(exc, "headers", None))


MAX_JSON_DEPTH = 64  # no field of this API nests more than a few levels
NESTED_TOO_DEEPLY = (f"the JSON body nests arrays/objects more than {MAX_JSON_DEPTH} levels deep: no field of this API "
                     "nests more than a few levels, so flatten it")
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``body`` nests arrays/objects deeper than ``limit`` (strings skipped; cheap for ordinary bodies).

    >>> too_deep(b'{"a": [[1]], "s": "[[[[[[["}', limit=3), too_deep(b"[" * 5 + b"]" * 5, limit=3)
    (False, True)
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    depth = 0
    for b in _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS):
        depth += 1 if b in (0x5B, 0x7B) else -1
        if depth > limit:
            return True
    return False


async def queue_full(request: Request, exc: QueueFullError) -> JSONResponse:
    limits = request.app.state.service.config.limits
    ra = limits.retry_after_s
    return JSONResponse(error_body(503, "overloaded", f"the model queue is full ({limits.queue_size} requests waiting or "
                                   f"running, limits.queue_size): retry after {ra} s"),
                        status_code=503, headers={"Retry-After": str(ra)})


async def unexpected(request: Request, exc: Exception) -> JSONResponse:
    rid = uuid.uuid4().hex[:12]
    redact = request.app.state.service.redact
    log.error("internal error %s on %s: %s", rid, request.url.path, redact(f"{type(exc).__name__}: {exc}"))
    return JSONResponse(error_body(500, "internal_error", f"internal error (id {rid}); the details are in the service log"),
                        status_code=500)


def add_error_handlers(app: FastAPI) -> None:
    """Register the handlers above on ``app`` (whose ``state.service`` holds the redactor and config)."""
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(QueueFullError, queue_full)
    app.add_exception_handler(Exception, unexpected)
