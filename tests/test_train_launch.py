"""One real ``accelerate launch -m suffice.training.train`` run on the 20-row fixture."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "train20.jsonl"


def test_fixture_is_twenty_canonical_rows_in_three_splits():
    from suffice.training.data.loaders import load_items

    items = list(load_items(FIXTURE))
    assert len(items) == 20
    splits = {s: [it for it in items if it.split == s] for s in ("train", "validation", "test")}
    assert [len(v) for v in splits.values()] == [12, 4, 4]
    for rows in splits.values():
        assert {it.label for it in rows} == {0, 1}  # both classes everywhere: metrics are defined


def test_accelerate_launch_smoke(tiny_bert, tmp_path):
    launcher = Path(sys.executable).with_name("accelerate")
    if not launcher.is_file():
        launcher = shutil.which("accelerate")
    if not launcher:
        pytest.skip("the accelerate launcher is not installed next to this python")
    out = tmp_path / "model"
    env = dict(os.environ, ACCELERATE_CONFIG_FILE=str(tmp_path / "no-accelerate-config.yaml"), PYTHONWARNINGS="ignore")
    cmd = [str(launcher), "launch", "--num_processes=1", "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no",
           "-m", "suffice.training.train", f"--train_file={FIXTURE}", f"--base_model={tiny_bert}", f"--output_dir={out}",
           "--max_length=64", "--per_device_train_batch_size=4", "--num_train_epochs=1", "--lora.r=4", "--torch_threads=1",
           "--baselines=[tfidf_lr]"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "effective batch 4" in proc.stdout and "(registered as models:/suffice-sufficiency-model/1)" in proc.stdout
    meta = json.loads((out / "suffice_model.json").read_text())
    assert meta["mlflow"]["version"] == "1" and (out / "model.safetensors").is_file()
