"""schemathesis against the live service (slow: ~2 min on 2 cores): every check, zero failures.

Runs the ``st`` command line (schemathesis >= 4) against a real uvicorn server with the chat
gateway in front of the local fake upstream, the way the issue-20 review ran it. Skipped when
schemathesis is not installed (``pip install schemathesis``).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytest.importorskip("fastapi")

from llm_server import FakeLLMServer, Reply
from test_service_support import ServiceServer, load_scorer, service_bundles

from suffice.serving.service import create_app, load_service_config


@pytest.mark.slow
def test_schemathesis_finds_nothing(tmp_path_factory, tiny_bert_dir, tmp_path):
    st = shutil.which("st")
    if st is None:
        pytest.skip("schemathesis is not installed (pip install schemathesis)")
    bundles = service_bundles(tmp_path_factory, tiny_bert_dir)
    with FakeLLMServer(default=lambda body: Reply.text("ok")) as llm:
        cfg = load_service_config(None, [f"--upstream.base_url={llm.base_url}", "--context_gate.model_weight=0.0"])
        app = create_app(cfg, load_scorer(bundles["sufficiency"]), api_keys=[], upstream_api_key=None)
        with ServiceServer(app) as s:
            proc = subprocess.run([st, "run", f"{s.url}/openapi.json", "--checks", "all", "-n", "100", "-w", "1", "--no-color"],
                                  cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout and "failure" not in proc.stdout.split("SUMMARY")[-1]
