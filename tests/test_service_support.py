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
