"""Raters: anything that turns an :class:`~suffice.training.data.schema.Item` into a sufficiency label.

One small interface (:class:`Rater`: ``id``, ``prompt_version``, ``async rate(item) -> Rating``,
``aclose()``) and three implementations:

``OpenAICompatibleRater``  any chat-completions server (OpenAI, Gemini's OpenAI endpoint, vLLM,
                           llama.cpp). Temperature 0, bounded by the runner's concurrency; retries
                           429 / 5xx / timeouts / dropped connections with exponential backoff and
                           jitter, honouring Retry-After; re-asks once when the reply has no verdict.
``CachedRater``            the shipped teacher labels (``autorater-labels.jsonl``, rater ``llm-autorater-v1``).
``LexicalRater``           keyword coverage of the question by the context (a RAG-gateway heuristic; baseline).

The API key is read from the environment variable the config names, kept only in the HTTP
client's headers, and scrubbed from any server text the rater stores or reports.

>>> import asyncio
>>> from suffice.training.data.schema import Item, Passage
>>> rater = LexicalRater()
>>> item = Item(id="demo:1", question="Where is Lima?", passages=[Passage("Lima", "Lima is in Peru.")])
>>> asyncio.run(rater.rate(item)).label
1
"""

from __future__ import annotations

import abc
import asyncio
import email.utils
import logging
import math
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timezone
from typing import Any

from suffice.training.autorater.labeling_config import LabelingConfig
from suffice.training.autorater.parsing import VerdictParseError, parse_verdict
from suffice.training.autorater.prompts import SufficiencyPrompt, get_prompt
from suffice.training.data.schema import Item

log = logging.getLogger("suffice.autorater")

CACHED_VERSION = "shipped"
FATAL_STATUSES = (401, 403, 404)  # the same answer would come for every item: stop the run


class RaterConfigError(ValueError):
    """The rater cannot start (missing API key variable, unreadable label file...)."""


class RaterFatalError(RuntimeError):
    """The server refuses every request (bad key, unknown model or URL): labelling stops."""


@dataclass
class Rating:
    """What one rater said about one item, and what it cost.

    status: ``ok`` (label set), ``unparsed`` (no verdict after one reminder; ``raw`` kept) or
    ``failed`` (no usable reply: retries exhausted, or the cache has no label; not stored).
    failures: failed attempts by kind (``http_429``, ``http_500``, ``timeout``, ``connection``,
    ``bad_response``, ``unparsed_reply``...), counted even when a retry then succeeded.
    """

    status: str
    label: int | None = None
    level: str | None = None
    rationale: str | None = None
    raw: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    requests: int = 0
    retries: int = 0
    failures: Counter = field(default_factory=Counter)
    error: str | None = None
    usage_estimated: int = 0  # replies without a usage block (tokens estimated from characters)


class Rater(abc.ABC):
    """The interface every rater implements."""

    id: str
    prompt_version: str
    kind: str
    scheme: str | None = None

    @abc.abstractmethod
    async def rate(self, item: Item) -> Rating:
        """Label one item; never raises for a per-item problem (that is a ``failed`` Rating)."""

    async def aclose(self) -> None:
        """Release connections (no-op for local raters)."""

    def describe(self) -> dict[str, Any]:
        """What the store's ``raters`` table records (never headers or keys)."""
        return {"kind": self.kind, "scheme": self.scheme}


# ---------------------------------------------------------------- OpenAI-compatible HTTP


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None if absent/unreadable.

    >>> parse_retry_after("3")
    3.0
    >>> parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480.0 - 10)
    10.0
    >>> parse_retry_after("soon") is None
    True
    """
    if value is None or not value.strip():
        return None
    try:
        seconds = float(value.strip())
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: uniform in [d/2, d] for d = min(max_s, base_s * 2**attempt).

    >>> 0.5 <= backoff_delay(0, 1.0, 60.0) <= 1.0
    True
    >>> backoff_delay(10, 1.0, 8.0) <= 8.0
    True
    """
    d = min(max_s, base_s * (2 ** attempt))
    return d / 2 + (rng or random).uniform(0, d / 2)


class GiveUp(Exception):
    """A request failed for good (retries exhausted or not retryable); ``kind`` names the failure."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class OpenAICompatibleRater(Rater):
    """An LLM behind the OpenAI chat-completions API, judging with the 1-shot step-by-step prompt.

    >>> rater = OpenAICompatibleRater(LabelingConfig(rater="openai-compatible", model="m", api_key_env=""))  # doctest: +SKIP
    >>> asyncio.run(rater.rate(item)).label  # doctest: +SKIP
    """

    kind = "openai-compatible"

    def __init__(self, cfg: LabelingConfig, *, prompt: SufficiencyPrompt | None = None, seed: int | None = None):
        import httpx  # the only HTTP client; imported here so `suffice --help` stays instant

        self._httpx = httpx
        self.cfg = cfg
        self.prompt = prompt or get_prompt(cfg.scheme)
        self.scheme = self.prompt.scheme
        self.id = cfg.resolved_rater_id()
        self.prompt_version = self.prompt.version
        key = None
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise RaterConfigError(
                    f"environment variable {cfg.api_key_env} is not set: export your API key in it, name another "
                    f"variable with --api_key_env=NAME, or use --api_key_env= for a local server that needs no key")
        self._secret = key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.AsyncClient(
            base_url=cfg.base_url.rstrip("/") + "/", headers=headers, timeout=httpx.Timeout(cfg.timeout_s),
            limits=httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency),
            follow_redirects=False)
        self._rng = random.Random(seed)
        self._resume_at = 0.0  # monotonic time before which nobody sends (a 429's Retry-After pauses all workers)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "scheme": self.scheme, "model": self.cfg.model, "base_url": self.cfg.base_url,
                "prompt_text": self.prompt.full_text()}

    def redact(self, text: str | None) -> str | None:
        """Remove the API key from server text (a misconfigured proxy may echo the Authorization header)."""
        if text is None or not self._secret:
            return text
        return text.replace(self._secret, "***")

    async def aclose(self) -> None:
        await self._client.aclose()

    def _body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.cfg.model, "messages": messages, "temperature": 0}
        if self.cfg.max_tokens is not None:
            body["max_tokens"] = self.cfg.max_tokens
        body.update(self.cfg.extra_body)
        return body

    async def complete(self, messages: list[dict[str, str]], rating: Rating, item_id: str) -> str:
        """POST one chat completion, retrying transient failures; returns the reply text."""
        httpx = self._httpx
        body = self._body(messages)
        attempt = 0
        while True:
            pause = self._resume_at - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            rating.requests += 1
            retry_after = None
            try:
                resp = await asyncio.wait_for(self._client.post("chat/completions", json=body), self.cfg.timeout_s)
            except (asyncio.TimeoutError, httpx.TimeoutException):
                kind, detail = "timeout", f"no reply within {self.cfg.timeout_s:g} s"
            except httpx.TransportError as e:
                kind, detail = "connection", f"{type(e).__name__}: {self.redact(str(e)) or 'connection failed'}"
            else:
                code = resp.status_code
                if code == 200:
                    try:
                        data = resp.json()
                        content = data["choices"][0]["message"].get("content")
                        if content is not None and not isinstance(content, str):
                            raise TypeError(f"message content is {type(content).__name__}")
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                        kind, detail = "bad_response", f"HTTP 200 without a chat completion ({type(e).__name__}: {e})"
                    else:
                        self._count_usage(data.get("usage"), messages, content or "", rating)
                        return content or ""
                else:
                    snippet = self.redact(resp.text[:300])
                    if code in FATAL_STATUSES:
                        hint = {401: f"check the API key in ${self.cfg.api_key_env or '(none set: api_key_env is empty)'}",
                                403: "the key is not allowed to use this model",
                                404: f"check base_url ({self.cfg.base_url}) and model ({self.cfg.model!r})"}[code]
                        raise RaterFatalError(f"HTTP {code} from {self.cfg.base_url}/chat/completions: {snippet!r}; {hint}")
                    kind, detail = f"http_{code}", f"HTTP {code}: {snippet!r}"
                    if code == 429 or code >= 500 or code == 408:
                        retry_after = parse_retry_after(resp.headers.get("retry-after"))
                    else:  # 400, 413, 422...: this item's request is wrong; re-sending will not help
                        rating.failures[kind] += 1
                        raise GiveUp(kind, detail)
            rating.failures[kind] += 1
            if attempt >= self.cfg.max_retries:
                raise GiveUp(kind, f"{detail} (gave up after {attempt + 1} attempts)")
            if retry_after is not None:
                delay = min(retry_after, self.cfg.max_retry_after_s)
                if kind == "http_429":
                    self._resume_at = max(self._resume_at, time.monotonic() + delay)
            else:
                delay = backoff_delay(attempt, self.cfg.backoff_base_s, self.cfg.backoff_max_s, self._rng)
            log.debug("item %s: %s; retry %d/%d in %.2f s", item_id, kind, attempt + 1, self.cfg.max_retries, delay)
            rating.retries += 1
            attempt += 1
            await asyncio.sleep(delay)

    @staticmethod
    def _count_usage(usage: Any, messages: list[dict[str, str]], content: str, rating: Rating) -> None:
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            rating.tokens_in += usage["prompt_tokens"]
            rating.tokens_out += int(usage.get("completion_tokens") or 0)
            return
        # No usage block (some local servers): estimate at 4 characters a token and say so in the accounting.
        rating.usage_estimated += 1
        rating.tokens_in += sum(len(m["content"]) for m in messages) // 4
        rating.tokens_out += len(content) // 4

    async def rate(self, item: Item) -> Rating:
        rating = Rating(status="failed")
        started = time.monotonic()
        messages = self.prompt.messages(item.question, item.passages)
        try:
            first = await self.complete(messages, rating, item.id)
            try:
                v = parse_verdict(first, self.scheme)
                raw = first
            except VerdictParseError as e:
                rating.failures["unparsed_reply"] += 1
                log.debug("item %s: reply without a verdict (%s); re-asking once", item.id, e.reason)
                again = messages + [{"role": "assistant", "content": first}, {"role": "user", "content": self.prompt.reminder()}]
                second = await self.complete(again, rating, item.id)
                raw = f"{first}\n\n--- reply after the reminder ---\n{second}"
                try:
                    v = parse_verdict(second, self.scheme)
                except VerdictParseError as e2:
                    rating.status, rating.raw, rating.rationale = "unparsed", self.redact(raw), f"unparsed: {e2.reason}"
                    rating.latency_s = time.monotonic() - started
                    return rating
        except GiveUp as e:
            rating.error, rating.latency_s = self.redact(str(e)), time.monotonic() - started
            rating.failures["gave_up"] += 1
            log.warning("item %s: no usable reply (%s)", item.id, rating.error)
            return rating
        rating.status, rating.label, rating.level = "ok", v.label, v.level
        rating.rationale, rating.raw = self.redact(v.rationale), self.redact(raw)
        rating.latency_s = time.monotonic() - started
        return rating


# ---------------------------------------------------------------- cached teacher


class CachedRater(Rater):
    """The shipped teacher labels as a rater: looks each item up by id (no requests, no cost).

    >>> rater = CachedRater(LabelingConfig(rater="cached"))  # doctest: +SKIP
    >>> rater.id, rater.prompt_version  # doctest: +SKIP
    ('llm-autorater-v1', 'shipped')
    """

    kind = "cached"

    def __init__(self, cfg: LabelingConfig):
        from suffice.training.data.loaders import read_autorater_labels

        path = cfg.cached_labels_path()
        try:
            self.labels = read_autorater_labels(path)
        except FileNotFoundError as e:
            raise RaterConfigError(f"{e} (set cached_path to the teacher's JSONL)") from e
        named = sorted({r["rater"] for r in self.labels.values()} - {"unknown"})  # "unknown": the file gave no rater
        if cfg.rater_id:
            self.id = cfg.rater_id
        elif len(named) > 1:
            raise RaterConfigError(f"{path} holds labels of several raters {named}: choose one with --rater_id=NAME")
        else:
            self.id = named[0] if named else "llm-autorater-v1"
        self.path = path
        self.prompt_version = CACHED_VERSION
        self.scheme = "three_level"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "scheme": self.scheme, "prompt_text": f"labels imported from {self.path}"}

    async def rate(self, item: Item) -> Rating:
        rec = self.labels.get(item.id)
        if rec is None:
            return Rating(status="failed", error=f"{item.id} has no label in {self.path}", failures=Counter(not_in_cache=1))
        return Rating(status="ok", label=int(rec["label"]), level=rec.get("level"), rationale=rec.get("rationale") or None)


# ---------------------------------------------------------------- lexical baseline


class LexicalRater(Rater):
    """Keyword coverage of the question by the context: label 1 iff coverage >= ``lexical_sufficient``.

    Levels: sufficient (>= lexical_sufficient), partial (>= lexical_partial), else insufficient.
    It only checks that the question's words appear, so it cannot see a missing hop or an
    unanswerable question written over the right paragraph: a baseline, not a teacher.
    """

    kind = "lexical"
    scheme = "three_level"

    def __init__(self, cfg: LabelingConfig | None = None):
        cfg = cfg or LabelingConfig(rater="lexical")
        self.sufficient, self.partial = cfg.lexical_sufficient, cfg.lexical_partial
        self.id = cfg.rater_id or "lexical-coverage"
        self.prompt_version = f"coverage-{self.sufficient:g}-{self.partial:g}"

    async def rate(self, item: Item) -> Rating:
        from suffice.serving.lexical import keyword_coverage

        started = time.monotonic()
        cov = keyword_coverage(item.question, [p.to_dict() if hasattr(p, "to_dict") else p for p in item.passages])
        level = "sufficient" if cov.score >= self.sufficient else "partial" if cov.score >= self.partial else "insufficient"
        why = f"coverage {cov.score:.2f} of {cov.n_terms} question terms"
        if cov.missing:
            why += "; missing: " + ", ".join(cov.missing[:8])
        return Rating(status="ok", label=int(level == "sufficient"), level=level, rationale=why,
                      latency_s=time.monotonic() - started)


def build_rater(cfg: LabelingConfig) -> Rater:
    """The rater ``cfg.rater`` names, configured.

    >>> build_rater(LabelingConfig(rater="lexical")).id
    'lexical-coverage'
    """
    if cfg.rater == "openai-compatible":
        return OpenAICompatibleRater(cfg)
    if cfg.rater == "cached":
        return CachedRater(cfg)
    return LexicalRater(cfg)
