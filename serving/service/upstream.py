"""The OpenAI-compatible upstream LLM: one async httpx client, failures mapped to 429/502/503/504.

Timeout -> 504 ``upstream_timeout``; connection refused / reset / bad protocol -> 502
``upstream_unreachable``; the upstream's 429 / 503 -> the same status (``upstream_rate_limited`` /
``upstream_unavailable``) with its ``Retry-After``, so clients back off as the upstream asked; any
other non-2xx answer -> 502 ``upstream_error`` (with the upstream's status); a 2xx answer that is
not a chat completion -> 502 ``upstream_bad_response``. Client-facing messages say "the upstream
LLM" and never its URL; ``UpstreamError.where`` (scheme://host:port/path, no userinfo) is for the log.

>>> client = UpstreamClient("http://127.0.0.1:8000/v1", api_key=None)  # doctest: +SKIP
>>> completion = await client.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})  # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import httpx


class UpstreamError(Exception):
    """The upstream failed; ``status`` is what the gateway answers (502 or 504)."""

    def __init__(self, status: int, code: str, message: str, upstream_status: int | None = None,
                 retry_after: str | None = None, where: str = ""):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.upstream_status = upstream_status
        self.retry_after = retry_after
        self.where = where


# upstream statuses passed through to the client (with Retry-After) instead of becoming 502
PASSED_THROUGH = {429: "upstream_rate_limited", 503: "upstream_unavailable"}


def retry_after_of(value: str | None) -> str | None:
    """A Retry-After header worth passing on (delay-seconds or an HTTP date), else None.

    >>> retry_after_of(" 7 "), retry_after_of("Wed, 21 Oct 2026 07:28:00 GMT")[:3], retry_after_of("soon")
    ('7', 'Wed', None)
    """
    v = (value or "").strip()
    if v.isdigit():
        return v
    from email.utils import parsedate_to_datetime

    try:
        return v if v and parsedate_to_datetime(v) is not None else None
    except (TypeError, ValueError):
        return None


def public_url(url: str) -> str:
    """The URL without userinfo, query or fragment: safe to show in errors and logs.

    >>> public_url("https://user:secret@llm.example:8443/v1?key=abc")
    'https://llm.example:8443/v1'
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass
class SSEEvent:
    """One server-sent event: the joined ``data:`` lines, or a raw non-data block (comments)."""

    data: str | None
    raw: str

    @property
    def done(self) -> bool:
        return self.data is not None and self.data.strip() == "[DONE]"

    def json(self) -> Any:
        return json.loads(self.data) if self.data is not None else None


class UpstreamStream:
    """An opened streaming response (status already checked): iterate :meth:`events`, then close."""

    def __init__(self, response: httpx.Response, where: str):
        self._response = response
        self._where = where

    async def events(self) -> AsyncIterator[SSEEvent]:
        """SSE events as they arrive; raises :class:`UpstreamError` if the stream breaks."""
        data_lines: list[str] = []
        raw_lines: list[str] = []
        try:
            async for line in self._response.aiter_lines():
                if line == "":
                    if raw_lines:
                        yield SSEEvent("\n".join(data_lines) if data_lines else None, "\n".join(raw_lines))
                    data_lines, raw_lines = [], []
                    continue
                raw_lines.append(line)
                if line.startswith("data:"):
                    data_lines.append(line[5:].lstrip(" ") if line.startswith("data: ") else line[5:])
            if raw_lines:
                yield SSEEvent("\n".join(data_lines) if data_lines else None, "\n".join(raw_lines))
        except httpx.TimeoutException:
            raise UpstreamError(504, "upstream_timeout", "the upstream LLM stopped sending the stream (read timeout)", where=self._where) from None
        except httpx.TransportError as e:
            raise UpstreamError(502, "upstream_unreachable", f"the upstream LLM stream broke ({type(e).__name__})", where=self._where) from None

    async def aclose(self) -> None:
        await self._response.aclose()


class UpstreamClient:
    """POST ``{base_url}/chat/completions`` with a bearer key; map every failure to UpstreamError."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = 60.0, connect_timeout_s: float = 5.0,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.where = public_url(self.url)
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            headers=headers,
            transport=transport,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            follow_redirects=False,
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _status_error(self, status: int, body: bytes, headers: httpx.Headers | None = None) -> UpstreamError:
        msg = ""
        try:
            payload = json.loads(body)
            if isinstance(payload, dict):
                err = payload.get("error")
                msg = err.get("message", "") if isinstance(err, dict) else str(err or payload.get("detail") or "")
        except (json.JSONDecodeError, UnicodeDecodeError):
            msg = ""
        detail = f": {msg[:300]}" if msg else ""
        retry_after = retry_after_of((headers or {}).get("retry-after"))
        if status in PASSED_THROUGH:
            wait = f"; retry after {retry_after} s" if retry_after and retry_after.isdigit() else ""
            return UpstreamError(status, PASSED_THROUGH[status], f"the upstream LLM answered HTTP {status}{detail}{wait}",
                                 upstream_status=status, retry_after=retry_after, where=self.where)
        return UpstreamError(502, "upstream_error", f"the upstream LLM answered HTTP {status}{detail}", upstream_status=status,
                             where=self.where)

    async def chat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming chat completion (the upstream's JSON object)."""
        try:
            r = await self._client.post(self.url, json=payload)
        except httpx.TimeoutException:
            raise UpstreamError(504, "upstream_timeout", "the upstream LLM did not answer in time", where=self.where) from None
        except httpx.TransportError as e:
            raise UpstreamError(502, "upstream_unreachable", f"cannot reach the upstream LLM ({type(e).__name__})", where=self.where) from None
        if not 200 <= r.status_code < 300:
            raise self._status_error(r.status_code, r.content, r.headers)
        try:
            data = r.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UpstreamError(502, "upstream_bad_response", "the upstream LLM answered with invalid JSON", where=self.where) from None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamError(502, "upstream_bad_response", "the upstream LLM answered without a 'choices' list", where=self.where)
        return data

    async def open_stream(self, payload: dict[str, Any]) -> UpstreamStream:
        """Send a ``stream: true`` request and check the status before any byte goes to the client."""
        req = self._client.build_request("POST", self.url, json={**payload, "stream": True},
                                         headers={"Accept": "text/event-stream"})
        try:
            r = await self._client.send(req, stream=True)
        except httpx.TimeoutException:
            raise UpstreamError(504, "upstream_timeout", "the upstream LLM did not answer in time", where=self.where) from None
        except httpx.TransportError as e:
            raise UpstreamError(502, "upstream_unreachable", f"cannot reach the upstream LLM ({type(e).__name__})", where=self.where) from None
        if not 200 <= r.status_code < 300:
            try:
                body = await r.aread()
            except httpx.HTTPError:
                body = b""
            finally:
                await r.aclose()
            raise self._status_error(r.status_code, body, r.headers)
        return UpstreamStream(r, self.where)
