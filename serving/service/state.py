"""The service state: the loaded models, the config, the queue and metrics, and the checks every route shares.

One :class:`ServiceState` lives on ``app.state.service``; routes, the chat gateway, the error
handlers and the front door read it from there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from suffice.serving.gates.retrieval import RetrievalGate
from suffice.serving.packing import MIN_CONTEXT_TOKENS, question_room
from suffice.serving.scorer import SufficiencyScorer
from suffice.serving.service.config import ServiceConfig
from suffice.serving.service.errors import ApiError, Redactor
from suffice.serving.service.metrics import ServiceMetrics
from suffice.serving.service.queue import ModelQueue
from suffice.serving.service.retrievers import Retriever
from suffice.serving.service.upstream import UpstreamClient
from suffice.serving.service.verdicts import VerdictCache


def model_version_of(scorer: SufficiencyScorer) -> str:
    """A stable version string for responses: the manifest's model_version, else its file hash."""
    m = scorer.manifest
    if m.model_version:
        return f"{m.registered_model}:{m.model_version}" if m.registered_model else str(m.model_version)
    sha = m.files.get(m.model_file)
    return f"sha256:{sha[:12]}" if sha else "unknown"


def factors_of(result: Any) -> list[dict[str, str]]:
    """A result's confidence factors as ``{name, effect, detail}`` dicts."""
    out = []
    for f in getattr(result, "confidence_factors", []) or []:
        if isinstance(f, Mapping):
            out.append({"name": str(f.get("name", "")), "effect": str(f.get("effect", "")), "detail": str(f.get("detail", ""))})
        else:
            out.append({"name": f.name, "effect": f.effect, "detail": f.detail})
    return out


@dataclass
class ServiceState:
    config: ServiceConfig
    scorer: SufficiencyScorer
    metrics: ServiceMetrics
    queue: ModelQueue
    redact: Redactor
    retrieval_gate: RetrievalGate | None = None
    retriever: Retriever | None = None
    key_digests: list[bytes] = field(default_factory=list)
    upstream_key: str | None = None
    upstream: UpstreamClient | None = None
    ready: bool = False
    not_ready_reason: str = "starting: the model is not warmed up yet"
    model_version: str = "unknown"
    verdicts: VerdictCache | None = None  # recent chat verdicts by request digest (None = no cache)
    started_at: float = field(default_factory=time.time)

    def check_item(self, where: str, n_passages: int, n_chars: int, what: str = "passages") -> None:
        """413 when one item carries more passages or characters than ``limits`` allow."""
        limits = self.config.limits
        if n_passages > limits.max_passages:
            raise ApiError(413, "too_many_passages",
                           f"{where}{what} has {n_passages} entries; the limit is {limits.max_passages} (limits.max_passages)",
                           param=f"{where}{what}")
        if n_chars > limits.max_chars:
            raise ApiError(413, "too_many_characters",
                           f"{where.rstrip('.') or 'the request'} carries {n_chars} characters of text; the limit is "
                           f"{limits.max_chars} (limits.max_chars)", param=where.rstrip(".") or None)

    def check_unique_ids(self, ids: Sequence[Any], param: str) -> None:
        """409 when ids repeat (a rule JSON Schema cannot state, so not a 422 for schema-valid input)."""
        if len(set(ids)) != len(ids):
            dup = sorted({str(i) for i in ids if ids.count(i) > 1})
            raise ApiError(409, "duplicate_ids", f"{param}: ids must be unique, repeated: {dup}", param=param)

    def check_messages(self, n_messages: int) -> None:
        """413 when a chat or retrieval-gate request carries more messages than ``limits.max_messages``."""
        limit = self.config.limits.max_messages
        if n_messages > limit:
            raise ApiError(413, "too_many_messages", f"messages has {n_messages} entries; the limit is {limit} "
                           "(limits.max_messages)", param="messages")

    def check_question(self, q: str, param: str) -> None:
        """Questions are never truncated: refuse one longer than the window (the packer's rule) before queueing it."""
        packer = self.scorer.packer
        n = packer.question_tokens(q)
        if n > question_room(packer.max_length):
            raise ApiError(422, "question_too_long",
                           f"{param} is {n} tokens; the model's window is {packer.max_length} tokens and questions are never "
                           f"truncated: shorten it to at most {question_room(packer.max_length) - MIN_CONTEXT_TOKENS} tokens",
                           param=param)

    def observe(self, results: Sequence[Any]) -> None:
        """Count sufficiency results in the metrics."""
        for r in results:
            self.metrics.observe_sufficiency(float(r.score), r.level, float(r.latency_ms) / 1e3)

    def to_response(self, r: Any, latency_ms: float) -> dict[str, Any]:
        """One sufficiency result as the ``SufficiencyResponse`` body."""
        return {"score": float(r.score), "level": r.level, "missing_aspects": list(r.missing_aspects),
                "confidence_factors": factors_of(r), "latency_ms": latency_ms, "model_version": self.model_version}

    async def run_model(self, fn: Callable[..., Any], *args: Any, param: str | None = None) -> Any:
        """Run model work on the bounded queue; input the model cannot take is a 422 naming ``param``."""
        try:
            return await self.queue.run(fn, *args)
        except (ValueError, TypeError) as e:  # input the model cannot take (e.g. a question over the window)
            raise ApiError(422, "unprocessable_input", self.redact(str(e)), param=param) from None

    def warm_up(self) -> None:
        """Run every loaded model once (readiness waits for this)."""
        self.scorer.score("Is the service warmed up?", ["The service loads its model and runs one example before it is ready."])
        if self.retrieval_gate is not None:
            self.retrieval_gate.decide([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi."},
                                        {"role": "user", "content": "Thanks, can you repeat that?"}])
