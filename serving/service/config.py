"""The service's configuration: one documented dataclass per concern, read from YAML and checked.

``configs/service.yaml`` is the documented default. Every key is a field below; unknown keys,
values of the wrong type and broken cross-field rules are :class:`ServiceConfigError` s that
name the dotted key (``sufficient_context.thresholds.partial``), the value and the fix. Secrets
never live in the file: the upstream key and the bearer API keys are read from environment
variables whose *names* the file gives.

>>> cfg = load_service_config(None, ["--sufficient_context.decline_insufficient=true"])
>>> cfg.sufficient_context.decline_insufficient, cfg.limits.max_passages
(True, 64)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from suffice.serving.backends import BACKENDS, PRECISIONS
from suffice.serving.bundle import PARTIAL, SUFFICIENT
from suffice.serving.config import ConfigError, config_from_dict, deep_merge, load_yaml, parse_overrides
from suffice.serving.gates.context import ContextGateConfig

# the most documents one request may admit (the HTTP schema's ``max_docs`` bound too)
MAX_DOCS_LIMIT = 64


class ServiceConfigError(ConfigError):
    """A service config key or value is wrong; the message names the key, the value and the fix."""


@dataclass(frozen=True)
class ServerConfig:
    """Where and how uvicorn listens.

    host / port: the listening address (port 0 = any free port, printed at start).
    drain_timeout_s: on SIGTERM, stop accepting and give in-flight requests this long to finish.
    log_level: ``debug``, ``info``, ``warning`` or ``error``.
    access_log: one uvicorn access-log line per request.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    drain_timeout_s: float = 30.0
    log_level: str = "info"
    access_log: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ServiceConfigError(f"port={self.port!r} must be in [0, 65535] (0 picks a free port)")
        if self.drain_timeout_s < 0:
            raise ServiceConfigError(f"drain_timeout_s={self.drain_timeout_s!r} must be >= 0")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ServiceConfigError(f"log_level={self.log_level!r}: choose debug, info, warning or error")


@dataclass(frozen=True)
class RuntimeSection:
    """How the model runs (the "threads" of the service).

    workers: model worker threads (concurrent ONNX calls); onnxruntime releases the GIL.
    intra_op_threads: onnxruntime threads per call (0 = one per core). workers x intra_op_threads
        should not exceed the cores: 2 workers x 1 thread suits a 2-core box.
    backend: ``auto`` (the fastest variant the bundle holds that this CPU supports, checked against the
        bundle's parity probe), ``onnxruntime`` or ``openvino`` (the extra ``suffice[openvino]``).
    precision: ``auto``, ``int8``, ``fp32`` or ``bf16`` (OpenVINO on CPUs with AMX or AVX-512 BF16).
    verify_checksums: refuse a bundle whose files do not match its manifest (hashing every file; the file names and
        the manifest's own field digests are checked either way).
    """

    workers: int = 2
    intra_op_threads: int = 1
    precision: str = "auto"
    verify_checksums: bool = True
    backend: str = "auto"

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= 256:
            raise ServiceConfigError(f"workers={self.workers!r} must be in [1, 256]")
        if not 0 <= self.intra_op_threads <= 256:
            raise ServiceConfigError(f"intra_op_threads={self.intra_op_threads!r} must be in [0, 256] (0 = onnxruntime default)")
        if self.precision not in PRECISIONS:
            raise ServiceConfigError(f"precision={self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.backend not in BACKENDS:
            raise ServiceConfigError(f"backend={self.backend!r}: choose one of {', '.join(BACKENDS)}")


@dataclass(frozen=True)
class Thresholds:
    """Score thresholds: ``sufficient`` when score >= sufficient, ``partial`` when >= partial.

    None (the default) keeps the bundle's own threshold (its ``suffice.json``, fitted with the model);
    a number overrides it for this service. The bundle's and these are checked together at load.
    """

    sufficient: float | None = None
    partial: float | None = None

    def __post_init__(self) -> None:
        for name in (SUFFICIENT, PARTIAL):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ServiceConfigError(f"{name}={v!r} must be in [0, 1] (or null: the bundle's)")
        if self.partial is not None and self.sufficient is not None and self.partial > self.sufficient:
            raise ServiceConfigError(
                f"partial={self.partial!r} > sufficient={self.sufficient!r}: partial must be the lower threshold"
            )


@dataclass(frozen=True)
class SufficientContextConfig:
    """What the chat gateway does with the sufficiency verdict.

    enabled: run the context gate and the scorer on every chat request (false = plain proxy).
    min_contexts: fewer admitted documents than this is ``insufficient`` whatever the score.
    thresholds: the levels' thresholds; null (the default) = the bundle's own, a number overrides it.
    decline_insufficient: ``insufficient`` -> answer with what is missing instead of calling the
        LLM; false -> call the LLM and append the caveat.
    caveat: appended to answers given on ``partial`` (or forwarded ``insufficient``) context; with
        ``response_format`` or ``tools`` set it goes in the ``sufficiency`` block and the
        ``X-Suffice-Caveat`` header instead, so the content stays valid JSON / tool calls.
    without_documents: a turn with no ``documents`` field and no retriever (or one the retrieval
        gate SKIPs): ``forward`` = call the LLM unscored (``level: unscored``, with the reason);
        ``decline`` = score it with no context, i.e. decline it. ``documents: []`` is always scored.
    cache_ttl_s / cache_size: an identical request (question, documents, bundle) within
        ``cache_ttl_s`` seconds reuses its verdict instead of re-scoring (client retries); at most
        ``cache_size`` verdicts are kept. 0 disables the cache.
    coverage_floor: at start-up, warn when the bundle's recorded validation coverage at the
        ``sufficient`` threshold is below this share (nearly everything would be caveated or declined).
    """

    enabled: bool = True
    min_contexts: int = 1
    thresholds: Thresholds = field(default_factory=Thresholds)
    decline_insufficient: bool = True
    caveat: str = "Note: this answer is based on limited available information."
    without_documents: str = "forward"
    cache_ttl_s: float = 30.0
    cache_size: int = 1024
    coverage_floor: float = 0.2

    def __post_init__(self) -> None:
        if not 0 <= self.min_contexts <= 64:
            raise ServiceConfigError(f"min_contexts={self.min_contexts!r} must be in [0, 64]")
        if not self.caveat.strip():
            raise ServiceConfigError("caveat must not be empty: it is what tells the user the answer is uncertain")
        if self.without_documents not in ("forward", "decline"):
            raise ServiceConfigError(f"without_documents={self.without_documents!r}: choose forward or decline")
        if self.cache_ttl_s < 0 or not 0 <= self.cache_size <= 1_000_000:
            raise ServiceConfigError(f"cache_ttl_s={self.cache_ttl_s!r} must be >= 0 and cache_size={self.cache_size!r} "
                                     "in [0, 1000000] (0 disables the verdict cache)")
        if not 0.0 <= self.coverage_floor <= 1.0:
            raise ServiceConfigError(f"coverage_floor={self.coverage_floor!r} must be in [0, 1] (0 = never warn)")


@dataclass(frozen=True)
class UpstreamConfig:
    """The OpenAI-compatible LLM the chat gateway forwards to.

    base_url: e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended); null
        disables ``/v1/chat/completions`` (it answers 404 not_configured).
    model: model name sent when the request names none.
    api_key_env: name of the environment variable holding the upstream key (sent as a bearer
        token; never logged). An unset variable means no Authorization header.
    timeout_s: total seconds for a non-streaming call, and the longest gap between two chunks of
        a stream. connect_timeout_s: seconds to open the connection.
    system_prompt: instruction placed before the admitted context in the system message.
    """

    base_url: str | None = None
    model: str = "gpt-4o-mini"
    api_key_env: str | None = "SUFFICE_UPSTREAM_API_KEY"
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    system_prompt: str = "Answer the user's question using only the context below. If the context does not contain the answer, say so."

    def __post_init__(self) -> None:
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ServiceConfigError(f"base_url={self.base_url!r} must start with http:// or https://")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ServiceConfigError(
                f"timeout_s={self.timeout_s!r} and connect_timeout_s={self.connect_timeout_s!r} must be > 0"
            )


@dataclass(frozen=True)
class RetrieverSection:
    """Where the chat gateway gets documents when a request brings none.

    name: ``none``, ``bm25`` (built in: BM25 over a local JSONL corpus) or the name of an entry
        point in the ``suffice.retrievers`` group (or ``module:attr``).
    options: keyword arguments of the retriever's factory (bm25: ``corpus``, ``k1``, ``b``).
    top_k: documents retrieved per question (before the context gate).
    """

    name: str = "none"
    options: dict = field(default_factory=dict)
    top_k: int = 8

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= 64:
            raise ServiceConfigError(f"top_k={self.top_k!r} must be in [1, 64]")


@dataclass(frozen=True)
class RetrievalGateSection:
    """The optional retrieval-gate bundle behind ``/v1/retrieval-gate`` (null = route answers 404).

    skip_threshold: None = the bundle's ``thresholds.skip``. ood_guard: RETRIEVE without asking the model
    for a new message in another script or language, or far longer than the gate's training follow-ups
    (:func:`suffice.serving.gates.retrieval.out_of_distribution`). search_guard: RETRIEVE without asking
    the model for a message that asks for a search or for more than the conversation showed
    (:func:`suffice.serving.gates.retrieval.search_request`).
    """

    bundle: str | None = None
    skip_threshold: float | None = None
    ood_guard: bool = True
    search_guard: bool = True


@dataclass(frozen=True)
class LimitsConfig:
    """What one request may carry, and how much work may wait for the model.

    max_body_bytes: larger bodies get 413. max_passages: passages (documents, artifacts, chunks)
    per item. max_chars: characters of text per item (question + passages). max_batch: items in a
    batch request. max_messages: messages in a chat request. queue_size: requests waiting for or
    running on the model; beyond it, 503 with Retry-After: retry_after_s. body_timeout_s: the whole
    request body must arrive within this many seconds, else 408 (a stalled upload holds no slot).
    """

    max_body_bytes: int = 1 << 20
    max_passages: int = 64
    max_chars: int = 100_000
    max_batch: int = 64
    max_messages: int = 256
    queue_size: int = 128
    retry_after_s: int = 1
    body_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_passages", "max_chars", "max_batch", "max_messages", "queue_size", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ServiceConfigError(f"{name}={getattr(self, name)!r} must be >= 1")
        if not 0 < self.body_timeout_s <= 3600:
            raise ServiceConfigError(f"body_timeout_s={self.body_timeout_s!r} must be in (0, 3600] seconds")


@dataclass(frozen=True)
class AuthConfig:
    """Optional bearer API keys for the ``/v1`` routes (health and metrics stay open).

    api_keys_env: name of the environment variable holding comma-separated keys; null = no auth.
    Keys are compared in constant time and never logged.
    """

    api_keys_env: str | None = None


@dataclass(frozen=True)
class ServiceConfig:
    """Everything ``suffice serve`` reads (configs/service.yaml documents each key)."""

    server: ServerConfig = field(default_factory=ServerConfig)
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    sufficient_context: SufficientContextConfig = field(default_factory=SufficientContextConfig)
    context_gate: ContextGateConfig = field(default_factory=ContextGateConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    retriever: RetrieverSection = field(default_factory=RetrieverSection)
    retrieval_gate: RetrievalGateSection = field(default_factory=RetrievalGateSection)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)

    def __post_init__(self) -> None:
        if self.context_gate.doc_cap > MAX_DOCS_LIMIT:
            raise ServiceConfigError(f"context_gate: max_docs={self.context_gate.doc_cap!r} must be in [0, {MAX_DOCS_LIMIT}]")


# ------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------
def _yaml_keys_to_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The one place where a service YAML key differs from its field: ``context_gate.max_docs``
    (the name the HTTP API uses too) is :class:`ContextGateConfig`'s ``doc_cap``."""
    cg = data.get("context_gate")
    if isinstance(cg, Mapping) and "max_docs" in cg:
        cg = dict(cg)
        if "doc_cap" in cg:
            raise ServiceConfigError("context_gate: give max_docs or doc_cap, not both (they are one setting; max_docs is the documented key)")
        cg["doc_cap"] = cg.pop("max_docs")
        data = {**data, "context_gate": cg}
    return data


def load_service_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> ServiceConfig:
    """Defaults, then the YAML file, then ``--dotted.key=value`` overrides.

    The engine is :mod:`suffice.serving.config`, the one ``suffice train`` uses: override values
    are typed by the field they set, and ``-`` in a key means ``_``.

    >>> load_service_config(None, ["--limits.queue-size=8"]).limits.queue_size
    8
    >>> try:
    ...     load_service_config(None, ["--limits.queue=8"])
    ... except ServiceConfigError as e:
    ...     print(str(e)[:46])
    config: unknown config key(s) ['limits.queue']
    """
    where = "config" if path is None else str(path)
    try:
        data = _yaml_keys_to_fields(load_yaml(path, example="configs/service.yaml")) if path is not None else {}
        data = deep_merge(data, _yaml_keys_to_fields(parse_overrides(overrides)))
        return config_from_dict(ServiceConfig, data)
    except ConfigError as e:
        raise ServiceConfigError(f"{where}: {e}") from None


def read_secret_env(name: str | None) -> str | None:
    """The value of an environment variable named in the config, or None when unnamed/unset."""
    if not name:
        return None
    value = os.environ.get(name, "").strip()
    return value or None


def read_api_keys(config: AuthConfig) -> list[str]:
    """Bearer keys from ``auth.api_keys_env`` (comma-separated); empty list = auth off.

    Raises when the variable is named but empty: a service that should be protected must not
    start open.
    """
    if not config.api_keys_env:
        return []
    raw = read_secret_env(config.api_keys_env)
    keys = [k.strip() for k in (raw or "").split(",") if k.strip()]
    if not keys:
        raise ServiceConfigError(
            f"auth.api_keys_env names ${config.api_keys_env}, but it is unset or empty: export it with "
            "comma-separated keys, or set auth.api_keys_env: null to run without API keys"
        )
    return keys
