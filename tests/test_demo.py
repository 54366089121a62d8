"""`suffice demo` (what `make demo` runs) end to end on the 20-row fixture and the tiny BERT."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from suffice.training import demo

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "train20.jsonl"


def test_demo_without_export_registers_nothing_servable(tiny_bert, tmp_path, capfd, monkeypatch):
    """--no-export: the trained-model folder is registered as suffice-sufficiency-model, and the log says that
    nothing servable went under suffice-sufficiency (the export-and-register path is tests/test_registry_demo.py)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("ACCELERATE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    out = tmp_path / "model"
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("task: sufficiency\nnum_train_epochs: 1\nexport: false\n")
    rc = demo.main([
        "--skip-data", "--no-export", "--stage0", "off", "--config", str(cfg), f"--train_file={FIXTURE}", f"--base_model={tiny_bert}", f"--output_dir={out}", "--max_length=64",
        "--per_device_train_batch_size=4", "--lora.r=4", "--torch_threads=1", "--baselines=[tfidf_lr]",
    ])
    assert rc == 0
    meta = json.loads((out / "suffice_model.json").read_text())
    assert meta["mlflow"]["version"] == "1" and meta["mlflow"]["registered_model"] == "suffice-sufficiency-model"
    uri = os.environ["MLFLOW_TRACKING_URI"]  # this test's store (mlflow keeps a process-wide URI once set)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert client.search_model_versions("name='suffice-sufficiency'") == []
    captured = capfd.readouterr()
    assert "make mlflow-ui" in captured.out
    assert "nothing servable was registered under suffice-sufficiency (export: false)" in captured.err


def test_demo_rejects_stray_arguments(capsys):
    assert demo.main(["--skip-data", "oops"]) == 2
    assert "look like --key=value" in capsys.readouterr().err


@pytest.mark.slow  # the default suite runs the same two stages in tests/test_registry_demo.py (with export)
def test_demo_with_stage0_starts_the_demo_config_from_the_stage0_directory(tiny_bert, tmp_path, monkeypatch):
    """--stage0 on: configs/pretrain.yaml runs first into <output_dir>/stage0 (its --stage0.* overrides only),
    then the demo config starts from that directory; the user's --base_model is where stage 0 starts."""
    monkeypatch.setenv("ACCELERATE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    shared = Path(__file__).resolve().parent / "fixtures" / "shared"
    out = tmp_path / "model"
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("task: sufficiency\nnum_train_epochs: 1\nexport: false\n")
    tiny = ["--max_length=64", "--per_device_train_batch_size=4", "--lora.r=4", "--lora.alpha=8", "--torch_threads=1", "--baselines=[]"]
    rc = demo.main([
        "--skip-data", "--no-export", "--stage0", "on", "--mixed-precision", "no", "--config", str(cfg), f"--train_file={FIXTURE}",
        f"--base_model={tiny_bert}", f"--output_dir={out}", *tiny,
        f"--stage0.data.data_dir={shared}", "--stage0.data.name=pytest-demo-stage0", "--stage0.max_train_items=0",
        *("--stage0." + o[2:] for o in tiny),
    ])
    assert rc == 0
    stage0 = json.loads((out / "stage0" / "suffice_model.json").read_text())
    assert stage0["base_model"] == str(tiny_bert)
    assert json.loads((out / "suffice_model.json").read_text())["base_model"] == str(out / "stage0")


def test_demo_refuses_stage0_overrides_without_stage0(capsys):
    assert demo.main(["--skip-data", "--stage0", "off", "--stage0.max_train_items=9"]) == 2
    assert "--stage0 off" in capsys.readouterr().err


def test_an_indecisive_sufficiency_bundle_is_announced_loudly():
    """A model that puts no validation item at "sufficient" makes every gate caveat or decline: say so."""
    from types import SimpleNamespace

    from suffice.training.demo import indecisive_warning

    def manifest(coverage, task="sufficiency"):
        return SimpleNamespace(task=task, model_version="7", thresholds={"sufficient": 0.8, "partial": 0.5},
                               metrics={"validation_levels": {"coverage_at_sufficient": coverage}})

    text = indecisive_warning(manifest(0.0))
    assert "version 7 puts no validation item at P(sufficient) >= 0.8" in text and text.startswith("!!!")
    assert indecisive_warning(manifest(0.12)) is None
    assert indecisive_warning(manifest(0.0, task="retrieval_gate")) is None
    assert indecisive_warning(SimpleNamespace(task="sufficiency", model_version="1", thresholds={}, metrics={})) is None
