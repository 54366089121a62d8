"""What the chat gateway scores and remembers: the question part of a long turn, and a short-lived verdict cache.

A chat turn is free text and is never refused for its length: :func:`fit_question` keeps the part
that fits the scoring budget (its last question sentences, else its tail). :class:`VerdictCache`
keeps recent verdicts by a digest of (question, documents, bundle version), so a client retrying
the same request (after an upstream 429, say) is not scored again.

>>> fit_question("Some background. More background. Where is it?", lambda t: len(t.split()), 3)
('Where is it?', True)
>>> cache = VerdictCache(ttl_s=30, max_size=2)
>>> cache.put("k", {"level": "partial"}); cache.get("k")
{'level': 'partial'}
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Sequence

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def _longest_tail(units: Sequence[str], joiner: str, fits: Callable[[str], bool]) -> str:
    """The longest suffix of ``units`` (joined) that fits; '' when not even the last unit does."""
    lo, hi = 0, len(units)  # lo fits (empty), find the largest k with fits(units[-k:])
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(joiner.join(units[-mid:])):
            lo = mid
        else:
            hi = mid - 1
    return joiner.join(units[-lo:]) if lo else ""


def fit_question(text: str, count_tokens: Callable[[str], int], budget: int) -> tuple[str, bool]:
    """The part of a chat turn to score within ``budget`` tokens, and whether it was shortened.

    The whole turn when it fits; else the last sentences that end in a question mark (as many as
    fit, newest kept); else the last sentences of the turn; else the tail words (or characters)
    of its last sentence.
    """
    text = text.strip()
    if count_tokens(text) <= budget:
        return text, False

    def fits(t: str) -> bool:
        return count_tokens(t) <= budget

    sentences = [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]
    asks = [s for s in sentences if s.endswith("?")]
    for pool in (asks, sentences):
        picked = _longest_tail(pool, " ", fits)
        if picked:
            return picked, True
    last = sentences[-1] if sentences else text
    picked = _longest_tail(last.split(), " ", fits) or _longest_tail(list(last), "", fits)
    return picked, True


def verdict_key(question: str, documents: Sequence[dict[str, Any]], source: str, version: str) -> str:
    """A digest of everything a verdict depends on within one service (its config is fixed)."""
    blob = json.dumps([question, [[d["id"], d["title"], d["text"]] for d in documents], source, version],
                      ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


class VerdictCache:
    """A bounded, thread-safe TTL cache (least recently used out first); values are copied in and out."""

    def __init__(self, ttl_s: float, max_size: int, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.max_size, self.clock = float(ttl_s), int(max_size), clock
        self._items: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0 and self.max_size > 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> Any:
        """The value stored under ``key`` within the TTL, else None."""
        if not self.enabled:
            return None
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            if self.clock() - hit[0] > self.ttl_s:
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return copy.deepcopy(hit[1])

    def put(self, key: str, value: Any) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._items[key] = (self.clock(), copy.deepcopy(value))
            self._items.move_to_end(key)
            while len(self._items) > self.max_size:
                self._items.popitem(last=False)
