"""The OpenAI-compatible upstream LLM: one async httpx client, failures mapped to 502/504.

Timeout -> 504 ``upstream_timeout``; connection refused / reset / bad protocol -> 502
``upstream_unreachable``; a non-2xx answer -> 502 ``upstream_error`` (with the upstream's status);
a 2xx answer that is not a chat completion -> 502 ``upstream_bad_response``. Error messages name
the upstream by scheme://host:port/path only: never a key, never userinfo from the URL.

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

    def __init__(self, status: int, code: str, message: str, upstream_status: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.upstream_status = upstream_status


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
            raise UpstreamError(504, "upstream_timeout", f"the upstream LLM at {self._where} stopped sending the stream (read timeout)") from None
        except httpx.TransportError as e:
            raise UpstreamError(502, "upstream_unreachable", f"the upstream LLM stream from {self._where} broke ({type(e).__name__})") from None

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

    def _status_error(self, status: int, body: bytes) -> UpstreamError:
        msg = ""
        try:
            payload = json.loads(body)
            if isinstance(payload, dict):
                err = payload.get("error")
                msg = err.get("message", "") if isinstance(err, dict) else str(err or payload.get("detail") or "")
        except (json.JSONDecodeError, UnicodeDecodeError):
            msg = ""
        detail = f": {msg[:300]}" if msg else ""
        return UpstreamError(502, "upstream_error", f"the upstream LLM at {self.where} answered HTTP {status}{detail}", upstream_status=status)

    async def chat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming chat completion (the upstream's JSON object)."""
        try:
            r = await self._client.post(self.url, json=payload)
        except httpx.TimeoutException:
            raise UpstreamError(504, "upstream_timeout", f"the upstream LLM at {self.where} did not answer in time") from None
        except httpx.TransportError as e:
            raise UpstreamError(502, "upstream_unreachable", f"cannot reach the upstream LLM at {self.where} ({type(e).__name__})") from None
        if not 200 <= r.status_code < 300:
            raise self._status_error(r.status_code, r.content)
        try:
            data = r.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UpstreamError(502, "upstream_bad_response", f"the upstream LLM at {self.where} answered with invalid JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamError(502, "upstream_bad_response", f"the upstream LLM at {self.where} answered without a 'choices' list")
        return data

    async def open_stream(self, payload: dict[str, Any]) -> UpstreamStream:
        """Send a ``stream: true`` request and check the status before any byte goes to the client."""
        req = self._client.build_request("POST", self.url, json={**payload, "stream": True},
                                         headers={"Accept": "text/event-stream"})
        try:
            r = await self._client.send(req, stream=True)
        except httpx.TimeoutException:
            raise UpstreamError(504, "upstream_timeout", f"the upstream LLM at {self.where} did not answer in time") from None
        except httpx.TransportError as e:
            raise UpstreamError(502, "upstream_unreachable", f"cannot reach the upstream LLM at {self.where} ({type(e).__name__})") from None
        if not 200 <= r.status_code < 300:
            try:
                body = await r.aread()
            except httpx.HTTPError:
                body = b""
            finally:
                await r.aclose()
            raise self._status_error(r.status_code, body)
        return UpstreamStream(r, self.where)
