"""``mlflow models serve -m models:/suffice-sufficiency@production`` answers /invocations on loopback
with the numbers of suffice.serving, in a process where torch cannot be imported."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from pyfunc_support import MIXED_ROWS, as_scorer_input, mlflow_store, no_torch_site, shared_store, tiny_bundle

pytest.importorskip("optimum")
pytest.importorskip("mlflow")

URI = "models:/suffice-sufficiency@production"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, dict | str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if body is not None else text)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.slow
def test_mlflow_models_serve_answers_with_the_scorer_numbers(tiny_bert_dir, tmp_path_factory, tmp_path, monkeypatch):
    from suffice.serving import SufficiencyScorer

    bundle = tiny_bundle(tmp_path_factory, tiny_bert_dir)
    root, _, _ = shared_store(tmp_path_factory, bundle)
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    with mlflow_store(root, monkeypatch):
        env = no_torch_site(tmp_path / "site")
        # as in an activated environment: mlflow starts the server with the `uvicorn` on PATH
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", URI, "--env-manager", "local",
                                 "-h", "127.0.0.1", "-p", str(port)], env=env, cwd=tmp_path, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow models serve exited with {proc.returncode}:\n{(tmp_path / 'serve.log').read_text()[-3000:]}")
            try:
                if _request(f"http://127.0.0.1:{port}/ping", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow models serve did not answer /ping in 240 s:\n{(tmp_path / 'serve.log').read_text()[-3000:]}")
            time.sleep(0.5)

        status, body = _request(f"http://127.0.0.1:{port}/invocations", {"dataframe_records": MIXED_ROWS})
        assert status == 200, body
        got = body["predictions"]
        questions, passages = as_scorer_input(MIXED_ROWS)
        want = SufficiencyScorer.load(bundle).score_batch(questions, passages)
        np.testing.assert_allclose([g["score"] for g in got], [r.score for r in want], atol=1e-6)
        assert [g["level"] for g in got] == [r.level for r in want]
        assert all(g["latency_ms"] >= 0 for g in got)

        status, body = _request(f"http://127.0.0.1:{port}/invocations", {"dataframe_records": [{"question": "", "context": "c"}]})
        assert status >= 400 and "question must be a non-empty string" in str(body)
    finally:
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            try:
                os.killpg(proc.pid, sig)  # the server and the uvicorn workers it started
                proc.wait(timeout=wait_s)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()
