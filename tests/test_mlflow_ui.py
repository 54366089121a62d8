"""The MLflow UI in a real browser: two registered versions, three pages, each checked for the headline numbers.

Slow (two tiny trainings, exports and an `mlflow ui`): `make test-slow`. Needs Debian's chromium and
chromium-driver and selenium (`pip install 'suffice[screenshots]'`); skips with the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not (Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists()),
                    reason="needs /usr/bin/chromium and /usr/bin/chromedriver: apt-get install -y chromium chromium-driver")
def test_runs_table_versions_page_and_comparison_show_the_headline_metrics(tmp_path):
    pytest.importorskip("selenium", reason="needs selenium: pip install 'suffice[screenshots]'")
    pytest.importorskip("optimum")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SUFFICE_"))}
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "mlflow_compare_screenshot.py"), "--workdir", str(tmp_path / "work"),
                        "--out-dir", str(tmp_path / "png")], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    # the script raises when a page misses what it must show (run names, headline columns, both versions, the GenAI overview)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    for name in ("runs", "versions", "compare"):
        png = tmp_path / "png" / f"mlflow-{name}.png"
        assert png.stat().st_size > 10_000, png
