"""``suffice serve``: the HTTP service on the serving library (FastAPI + uvicorn, no torch).

    suffice serve --bundle bundles/sufficiency-v3 [--config configs/service.yaml] [--port 8080]
                  [--retrieval-gate-bundle DIR] [--section.key=value ...]

Needs the ``[serve]`` extra (fastapi, uvicorn, pydantic, httpx, prometheus-client). Importing
``suffice.serving`` never imports this subpackage.

>>> from suffice.serving.service import create_app, load_service_config  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from suffice.serving.bundle import DEFAULT_THRESHOLDS, PARTIAL, SUFFICIENT, read_manifest
from suffice.serving.config import not_overrides
from suffice.serving.service.app import create_app
from suffice.serving.service.errors import RedactingFilter, Redactor
from suffice.serving.service.config import (
    ServiceConfig,
    ServiceConfigError,
    load_service_config,
    read_api_keys,
    read_secret_env,
)

__all__ = ["ServiceConfig", "ServiceConfigError", "create_app", "load_service_config", "main"]

DEFAULT_CONFIG = Path("configs/service.yaml")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="suffice serve",
        description="Serve a sufficiency bundle over HTTP: /v1/sufficiency, /v1/context-gate, /v1/safety-check, "
        "/v1/retrieval-gate, /v1/chat/completions, /healthz, /readyz, /metrics. Any config key can be "
        "overridden as --section.key=value (e.g. --sufficient_context.decline_insufficient=false).",
    )
    p.add_argument("--bundle", required=True, help="the exported bundle folder (suffice export --out), or a registry URI "
                   "models:/NAME/VERSION or models:/NAME@ALIAS (needs mlflow; resolved once at start-up)")
    p.add_argument("--config", default=None, help=f"service YAML (default: {DEFAULT_CONFIG} when it exists, else built-in defaults)")
    p.add_argument("--host", default=None, help="listen address (overrides server.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (overrides server.port; 0 = any free port)")
    p.add_argument("--retrieval-gate-bundle", default=None, help="a retrieval_gate bundle folder or models:/ URI (overrides retrieval_gate.bundle)")
    return p


def build_service(bundle: str, config: ServiceConfig):
    """Load the bundle(s) the config asks for and return the app (what ``main`` serves).

    ``bundle`` (and ``retrieval_gate.bundle``) may be a folder or a registry URI such as
    ``models:/suffice-sufficiency@production``: the URI is resolved here, once, to a local copy.

    >>> app = build_service("bundles/sufficiency-v3", load_service_config("configs/service.yaml"))  # doctest: +SKIP
    """
    from suffice.serving import RetrievalGate, RetrievalGateConfig, ScorerConfig, SufficiencyScorer
    from suffice.serving.model_uri import resolve_bundle_uri

    rt = config.runtime
    th = config.sufficient_context.thresholds
    overrides = {k: v for k, v in ((SUFFICIENT, th.sufficient), (PARTIAL, th.partial)) if v is not None}  # unset: the bundle's
    path = resolve_bundle_uri(bundle)
    if overrides:
        check_threshold_overrides(read_manifest(path).thresholds, overrides)
    scorer = SufficiencyScorer.load(path, ScorerConfig(
        precision=rt.precision, backend=rt.backend, intra_op_threads=rt.intra_op_threads, verify_checksums=rt.verify_checksums,
        thresholds=overrides or None,
    ))
    gate = None
    if config.retrieval_gate.bundle:
        gate = RetrievalGate.load(resolve_bundle_uri(config.retrieval_gate.bundle), RetrievalGateConfig(
            skip_threshold=config.retrieval_gate.skip_threshold, ood_guard=config.retrieval_gate.ood_guard, search_guard=config.retrieval_gate.search_guard, precision=rt.precision, backend=rt.backend,
            intra_op_threads=rt.intra_op_threads, verify_checksums=rt.verify_checksums))
    return create_app(config, scorer, retrieval_gate=gate), scorer, gate


def check_threshold_overrides(bundle_thresholds, overrides) -> None:
    """Refuse config overrides that cross the bundle's other threshold, naming the config key.

    >>> check_threshold_overrides({"sufficient": 0.8, "partial": 0.5}, {"partial": 0.9})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    suffice.serving.service.config.ServiceConfigError: sufficient_context.thresholds: partial=0.9 > sufficient=0.8 (the bundle's ...
    """
    merged = {**DEFAULT_THRESHOLDS["sufficiency"], **dict(bundle_thresholds), **overrides}
    if merged[PARTIAL] > merged[SUFFICIENT]:
        bundle_text = ", ".join(f"{k}={dict(bundle_thresholds).get(k, DEFAULT_THRESHOLDS['sufficiency'][k]):g}" for k in (SUFFICIENT, PARTIAL))
        raise ServiceConfigError(
            f"sufficient_context.thresholds: partial={merged[PARTIAL]:g} > sufficient={merged[SUFFICIENT]:g} (the bundle's {bundle_text} "
            f"with this config's {', '.join(f'{k}={v:g}' for k, v in overrides.items())}): partial must be the lower one; set both")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``suffice serve``; returns the exit code."""
    args, rest = _parser().parse_known_args(argv)
    bad = not_overrides(rest)
    if bad:
        print(f"suffice serve: unrecognised argument(s) {bad}: config overrides look like --section.key=value", file=sys.stderr)
        return 2
    overrides = list(rest)
    if args.host is not None:
        overrides.append(f"--server.host={args.host}")
    if args.port is not None:
        overrides.append(f"--server.port={args.port}")
    if args.retrieval_gate_bundle is not None:
        overrides.append(f"--retrieval_gate.bundle={args.retrieval_gate_bundle}")
    config_path = args.config if args.config is not None else (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)

    from suffice.serving.bundle import BundleError
    from suffice.serving.service.retrievers import RetrieverError

    try:
        config = load_service_config(config_path, overrides)
        secrets = read_api_keys(config.auth) + [s for s in [read_secret_env(config.upstream.api_key_env)] if s]
    except ServiceConfigError as e:
        print(f"suffice serve: {e}", file=sys.stderr)
        return 2
    level = getattr(logging, config.server.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    redacting = RedactingFilter(Redactor(secrets))
    for handler in logging.getLogger().handlers:
        handler.addFilter(redacting)
    try:
        app, scorer, gate = build_service(args.bundle, config)
    except (BundleError, ServiceConfigError, RetrieverError, ValueError) as e:
        print(f"suffice serve: {e}", file=sys.stderr)
        return 2

    import uvicorn

    rt, lim = config.runtime, config.limits
    m = scorer.manifest
    print(f"suffice serve: bundle {args.bundle} ({m.task}, {scorer.variant}, window {m.max_length} tokens, "
          f"strategy {m.long_context_strategy}); thresholds sufficient>={scorer.thresholds[SUFFICIENT]:g} "
          f"partial>={scorer.thresholds[PARTIAL]:g}", file=sys.stderr)
    print(f"suffice serve: {rt.workers} model worker(s) x {rt.intra_op_threads or 'auto'} onnxruntime thread(s); "
          f"queue {lim.queue_size}; body <= {lim.max_body_bytes} B, <= {lim.max_passages} passages, <= {lim.max_chars} chars; "
          f"retrieval gate {'on' if gate else 'off'}; upstream {'on' if config.upstream.base_url else 'off'}; "
          f"retriever {config.retriever.name}; auth {'on' if config.auth.api_keys_env else 'off'}", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(
        app, host=config.server.host, port=config.server.port, log_level=config.server.log_level,
        access_log=config.server.access_log, timeout_graceful_shutdown=config.server.drain_timeout_s,
        lifespan="on", log_config=None,
    ))
    # uvicorn drains on SIGTERM, restores the handler it found and raises the signal again: with
    # Python's default handler that kills the process (exit 143) after a clean drain. This handler
    # lets the drained service return 0, as process managers expect of a clean stop.
    signal.signal(signal.SIGTERM, _drained)
    server.run()
    return 0 if server.started else 1


def _drained(signum, frame) -> None:
    """SIGTERM after uvicorn's graceful shutdown: nothing left to do, ``main`` returns 0."""
