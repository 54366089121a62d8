"""Shared pieces of the service tests: a real uvicorn server on 127.0.0.1, tiny exported bundles.

Not a test module of its own (it holds no tests); the ``test_service_*`` files import from it.
Bundles are exported once per pytest session into the session's base temp folder and reused by
every service test file (an export takes ~2 s on 2 cores).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from serving_support import make_model_dir, validation_items

LONG_PASSAGE = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
                "It is named after the engineer Gustave Eiffel, whose company designed and built the tower. ") * 3


def service_bundles(tmp_path_factory: Any, tiny_bert_dir: Path) -> dict[str, Path]:
    """{"sufficiency": bundle, "retrieval_gate": bundle}, exported once per session (fp32 only, fast)."""
    from suffice.training.export import export_bundle

    root = tmp_path_factory.getbasetemp() / "service-bundles"
    out = {"sufficiency": root / "sufficiency", "retrieval_gate": root / "retrieval-gate"}
    if not (out["sufficiency"] / "suffice.json").is_file():
        md = make_model_dir(tiny_bert_dir, root / "model-sufficiency", lora=False, max_length=128)
        export_bundle(md, out["sufficiency"], validation_items(10), quantize=False, overwrite=True)
    if not (out["retrieval_gate"] / "suffice.json").is_file():
        md = make_model_dir(tiny_bert_dir, root / "model-gate", task="retrieval_gate", lora=False, max_length=64)
        export_bundle(md, out["retrieval_gate"], quantize=False, overwrite=True)
    return out


def load_scorer(bundle: Path, sufficient: float = 0.8, partial: float = 0.5, workers_threads: int = 1):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    return SufficiencyScorer.load(bundle, ScorerConfig(intra_op_threads=workers_threads,
                                                       thresholds={"sufficient": sufficient, "partial": partial}))


class ServiceServer:
    """Serve an ASGI app with a real uvicorn on 127.0.0.1:<free port> in a background thread."""

    def __init__(self, app: Any, drain_timeout_s: float = 10.0):
        self.app = app
        self.drain_timeout_s = drain_timeout_s
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServiceServer":
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                lifespan="on", timeout_graceful_shutdown=self.drain_timeout_s)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="suffice-service", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the service did not start (see the log above)")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit (like SIGTERM: stop accepting, drain in-flight requests) and wait."""
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=30)
        self.server = self.thread = None

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 30.0), **kw)

    def __enter__(self) -> "ServiceServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# The tiny random model scores every (question, passages) pair at ~0.62, so a chat branch is chosen
# with thresholds: (sufficient, partial).
BRANCHES = {"sufficient": (0.6, 0.5), "partial": (0.8, 0.5), "insufficient": (0.9, 0.8)}
CAVEAT = "Note: this answer is based on limited available information."


class GatewayFactory:
    """``make(branch, *overrides, **create_app_kwargs)`` -> a started chat gateway in front of ``upstream_url``.

    One owner for the gateway set-up of the chat tests: service config overrides (upstream, thresholds
    that pick ``branch``, the context gate's model weight off), ``create_app`` and a real uvicorn.
    ``close()`` stops every server it started (the fixture's teardown).
    """

    def __init__(self, bundle: Path, upstream_url: str, *base_overrides: str, upstream_api_key: str | None = None,
                 drain_timeout_s: float = 10.0):
        self.bundle, self.upstream_url, self.base_overrides = bundle, upstream_url, base_overrides
        self.upstream_api_key, self.drain_timeout_s = upstream_api_key, drain_timeout_s
        self.started: list[ServiceServer] = []

    def __call__(self, branch: str = "partial", *overrides: str, base_url: str | None = None, **app_kwargs: Any) -> ServiceServer:
        from suffice.serving.service import create_app, load_service_config

        suff, part = BRANCHES[branch]
        cfg = load_service_config(None, [f"--upstream.base_url={base_url or self.upstream_url}", *self.base_overrides,
                                         "--context_gate.model_weight=0.0",
                                         f"--sufficient_context.thresholds.sufficient={suff}",
                                         f"--sufficient_context.thresholds.partial={part}", *overrides])
        app = create_app(cfg, load_scorer(self.bundle, suff, part), api_keys=[], upstream_api_key=self.upstream_api_key,
                         **app_kwargs)
        server = ServiceServer(app, drain_timeout_s=self.drain_timeout_s).start()
        self.started.append(server)
        return server

    def close(self) -> None:
        for server in self.started:
            server.stop()
        self.started.clear()


def free_port() -> int:
    """A port nothing listens on (bound, then released): connections to it are refused."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0.0 when none)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                total += float(s.value)
    return total
