"""`suffice serve` as a real process: starts on a bundle, no torch loaded, auth from env, clean SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from test_service_support import service_bundles

REPO = Path(__file__).resolve().parent.parent
API_KEY = "svc-key-for-cli-test-7781"
UPSTREAM_KEY = "sk-upstream-cli-test-9924"


def _serve(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "suffice.training.cli", "serve", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_serve_process_end_to_end(tmp_path_factory, tiny_bert_dir, tmp_path):
    bundles = service_bundles(tmp_path_factory, tiny_bert_dir)
    env = {**os.environ, "SUFFICE_API_KEYS": API_KEY, "SUFFICE_UPSTREAM_API_KEY": UPSTREAM_KEY}
    proc = _serve(["--bundle", str(bundles["sufficiency"]), "--config", str(REPO / "configs" / "service.yaml"), "--port", "0",
                   "--retrieval-gate-bundle", str(bundles["retrieval_gate"]), "--auth.api_keys_env=SUFFICE_API_KEYS",
                   "--server.log_level=debug"], env, tmp_path)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        assert port, "".join(lines)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/readyz").json()["status"] == "ready"
        body = {"question": "Where is the Eiffel Tower?", "passages": ["The Eiffel Tower is in Paris."]}
        assert httpx.post(base + "/v1/sufficiency", json=body).status_code == 401
        r = httpx.post(base + "/v1/sufficiency", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 200 and r.json()["level"] in ("sufficient", "partial", "insufficient")
        maps = Path(f"/proc/{proc.pid}/maps")
        if maps.exists():
            assert "libtorch" not in maps.read_text(), "the service process loaded torch"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        lines.append(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(lines)
    assert proc.returncode == 0, log  # a drained SIGTERM is a clean stop (uvicorn alone would exit 143)
    assert "Finished server process" in log, log
    assert "2 model worker(s)" in log and "auth on" in log and "Application shutdown complete" in log
    assert API_KEY not in log and UPSTREAM_KEY not in log


@pytest.mark.parametrize("extra, message", [
    (["--sufficient_context.thresholds.partial=0.95", "--sufficient_context.thresholds.sufficient=0.9"], "sufficient_context.thresholds"),
    (["--limits.queue_size=many"], "limits.queue_size"),
    (["--auth.api_keys_env=SUFFICE_TEST_UNSET_KEYS"], "auth.api_keys_env"),
    (["positional"], "unrecognised argument"),
])
def test_serve_rejects_bad_config_naming_the_key(tmp_path, extra, message):
    env = {k: v for k, v in os.environ.items() if k != "SUFFICE_TEST_UNSET_KEYS"}
    p = subprocess.run([sys.executable, "-m", "suffice.training.cli", "serve", "--bundle", str(tmp_path), *extra],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_serve_refuses_a_bad_tokenizer_with_exit_2_when_checksums_are_off(tmp_path_factory, tiny_bert_dir, tmp_path):
    import shutil

    bundle = tmp_path / "bundle"
    shutil.copytree(service_bundles(tmp_path_factory, tiny_bert_dir)["sufficiency"], bundle)
    (bundle / "tokenizer.json").write_text("{not a tokenizer")
    p = subprocess.run([sys.executable, "-m", "suffice.training.cli", "serve", "--bundle", str(bundle), "--runtime.verify_checksums=false"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "cannot read its tokenizer" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_serve_rejects_a_folder_that_is_not_a_bundle(tmp_path):
    p = subprocess.run([sys.executable, "-m", "suffice.training.cli", "serve", "--bundle", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "suffice.json" in p.stderr, p.stderr
