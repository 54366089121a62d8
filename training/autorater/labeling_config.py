"""LabelingConfig: everything ``suffice label`` needs, from ``configs/labeling.yaml`` plus overrides.

>>> cfg = LabelingConfig(rater="lexical")
>>> cfg.resolved_rater_id()
'lexical-coverage'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from suffice.serving.config import ConfigError
from suffice.training.paths import REPO_ROOT, prepared_dir

RATERS = ("openai-compatible", "cached", "lexical")
SCHEMES = ("binary", "three_level")
DEFAULT_CONFIG = REPO_ROOT / "configs" / "labeling.yaml"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class LabelingConfig:
    """How to label (question, context) items: which rater, how to reach it, what it costs, where labels go.

    rater: ``openai-compatible`` (any chat-completions server: OpenAI, Gemini's OpenAI endpoint,
        vLLM, llama.cpp), ``cached`` (the shipped teacher labels, rater ``llm-autorater-v1``) or
        ``lexical`` (keyword coverage of the question by the context: a baseline, and for tests).
    rater_id: the name labels are stored under; null = ``llm:<model>`` / ``llm-autorater-v1`` /
        ``lexical-coverage``. Two runs share labels exactly when rater_id and prompt version match.
    scheme: ``binary`` (sufficient or not) or ``three_level`` (sufficient / partial / insufficient;
        the binary label is ``level == sufficient``).
    base_url: the server's OpenAI-compatible root, ending before ``/chat/completions``
        (``https://api.openai.com/v1``, ``http://localhost:8000/v1`` for vLLM).
    model: the model name sent in every request (required for ``openai-compatible``).
    api_key_env: the NAME of the environment variable holding the API key. The key itself is
        never read from a file, logged, stored or sent to MLflow. Empty = send no key (local servers).
    concurrency: requests in flight at once.
    timeout_s: seconds for one HTTP request (connect + reply) before it counts as a timeout and is retried.
    max_retries: re-sends of one request after 429 / 5xx / timeout / dropped connection before the item
        is given up for this run (it is not stored, so the next run tries it again).
    backoff_base_s / backoff_max_s: exponential backoff ``base * 2**attempt`` with full jitter, capped;
        a Retry-After header overrides it (capped by ``max_retry_after_s``).
    max_tokens: reply budget per request (null = leave it to the server).
    extra_body: extra JSON fields for every request, for provider options (``{"seed": 7}``).
    price_per_1k_input / price_per_1k_output: US$ per 1,000 prompt / completion tokens, for the estimate.
    store: the SQLite label store; null = ``data/labels.sqlite`` (``$SUFFICE_PREPARED_DIR/labels.sqlite``).
    cached_path: the shipped labels for ``cached``; null = ``<shared data>/autorater-labels.jsonl``.
    lexical_sufficient / lexical_partial: coverage score thresholds for the lexical rater's levels
        (label 1 iff score >= lexical_sufficient).
    mlflow: log the run (accounting, label distribution) to the MLflow experiment ``experiment``.
    progress: show a progress bar (rate, ETA, cost so far) on stderr.
    """

    rater: Literal["openai-compatible", "cached", "lexical"] = "cached"
    rater_id: str | None = None
    scheme: Literal["binary", "three_level"] = "binary"
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    max_retry_after_s: float = 300.0
    max_tokens: int | None = 1024
    extra_body: dict[str, Any] = field(default_factory=dict)
    price_per_1k_input: float = 0.0
    price_per_1k_output: float = 0.0
    store: str | None = None
    cached_path: str | None = None
    lexical_sufficient: float = 0.8
    lexical_partial: float = 0.5
    mlflow: bool = True
    experiment: str = "labeling"
    progress: bool = True

    def __post_init__(self) -> None:
        if self.rater not in RATERS:
            raise ConfigError(f"rater={self.rater!r} is unknown: choose one of {list(RATERS)}")
        if self.scheme not in SCHEMES:
            raise ConfigError(f"scheme={self.scheme!r} is unknown: choose one of {list(SCHEMES)}")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency={self.concurrency} must be >= 1 (requests in flight at once), e.g. --concurrency=8")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ConfigError(f"timeout_s={self.timeout_s} must be a positive number of seconds, e.g. --timeout_s=60")
        if self.max_retries < 0:
            raise ConfigError(f"max_retries={self.max_retries} must be >= 0 (0 = never re-send)")
        for name in ("backoff_base_s", "backoff_max_s", "max_retry_after_s", "price_per_1k_input", "price_per_1k_output"):
            v = getattr(self, name)
            if v < 0 or not math.isfinite(v):
                raise ConfigError(f"{name}={v} must be a finite number >= 0")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"max_tokens={self.max_tokens} must be >= 1, or null to leave it to the server")
        if not 0.0 <= self.lexical_partial <= self.lexical_sufficient <= 1.0:
            raise ConfigError(
                f"lexical thresholds must satisfy 0 <= lexical_partial <= lexical_sufficient <= 1, got "
                f"lexical_partial={self.lexical_partial}, lexical_sufficient={self.lexical_sufficient}")
        if self.api_key_env and not _ENV_NAME.match(self.api_key_env):
            # A pasted key here would end up in logs and MLflow params: refuse it, without echoing it.
            raise ConfigError(
                "api_key_env must be the NAME of an environment variable (like OPENAI_API_KEY), not the key itself: "
                "export the key in that variable and give its name")
        if self.rater == "openai-compatible":
            if not self.model:
                raise ConfigError("rater openai-compatible needs a model name: set model in configs/labeling.yaml or --model=NAME")
            if not self.base_url.startswith(("http://", "https://")):
                raise ConfigError(f"base_url={self.base_url!r} must start with http:// or https:// (e.g. http://localhost:8000/v1)")
        if self.rater_id is not None and (not self.rater_id.strip() or "@" in self.rater_id):
            raise ConfigError(f"rater_id={self.rater_id!r} must be a non-empty name without '@' (e.g. llm:gpt-4o-mini)")
        for name in ("extra_body",):
            reserved = {"model", "messages", "temperature"} & set(getattr(self, name))
            if reserved:
                raise ConfigError(f"extra_body may not set {sorted(reserved)}: they are fixed by the rater (temperature is always 0)")

    def resolved_rater_id(self) -> str:
        """The name labels are stored under (see ``rater_id``)."""
        if self.rater_id:
            return self.rater_id
        return {"openai-compatible": f"llm:{self.model}", "cached": "llm-autorater-v1", "lexical": "lexical-coverage"}[self.rater]

    def store_path(self) -> Path:
        """The label store file (``store``, else ``data/labels.sqlite`` under the prepared-data directory)."""
        return Path(self.store) if self.store else prepared_dir() / "labels.sqlite"

    def cached_labels_path(self) -> Path:
        if self.cached_path:
            return Path(self.cached_path)
        from suffice.training.paths import data_dir

        return data_dir() / "autorater-labels.jsonl"
