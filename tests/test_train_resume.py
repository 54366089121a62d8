"""A killed run resumes from its last checkpoint with --resume and ends where an uninterrupted run ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suffice.training.fit import loop as train_mod
from suffice.serving.config import ConfigError
from suffice.training.fit.run import run
from suffice.training.fit.config import build_train_config

REPO = Path(__file__).resolve().parent.parent
FIXTURE = str(REPO / "tests" / "fixtures" / "train20.jsonl")


def cfg_for(base: Path, out: Path, *extra: str):
    return build_train_config(None, [
        f"--train_file={FIXTURE}", f"--base_model={base}", f"--output_dir={out}", "--max_length=64",
        "--per_device_train_batch_size=4", "--num_train_epochs=2", "--lora.r=4", "--torch_threads=1",
        "--checkpoint_every_steps=1", "--checkpoints_total_limit=3", "--baselines=[]", "--learning_rate=1e-3", *extra,
    ])


def test_killed_run_resumes_to_the_same_model(tiny_bert, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file

    from suffice.training.paths import default_tracking_uri

    ref = run(cfg_for(tiny_bert, tmp_path / "ref", "--tracking.enabled=false"))
    assert ref["history"][-1]["epoch"] == 2

    real_save = train_mod.Checkpoints.save

    def save_then_die(self, accelerator, state):
        path = real_save(self, accelerator, state)
        if state.global_step == 4:  # mid-way through epoch 2 (3 steps per epoch)
            raise RuntimeError("simulated kill")
        return path

    monkeypatch.setattr(train_mod.Checkpoints, "save", save_then_die)
    out = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="simulated kill"):
        run(cfg_for(tiny_bert, out))
    assert not (out / "suffice_model.json").exists()
    state = json.loads((out / "checkpoints" / "step-0000004" / "trainer_state.json").read_text())
    assert state["epoch"] == 1 and state["batch_in_epoch"] == 1 and state["best_epoch"] == 1
    monkeypatch.setattr(train_mod.Checkpoints, "save", real_save)

    resumed = run(cfg_for(tiny_bert, out, "--resume"))
    assert [h["epoch"] for h in resumed["history"]] == [1, 2]
    a, b = load_file(tmp_path / "ref" / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(a) == set(b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, f"resumed weights differ from the uninterrupted run by {worst}"

    client = MlflowClient(tracking_uri=default_tracking_uri())
    runs = client.search_runs([client.get_experiment_by_name("suffice").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == resumed["mlflow_run_id"] and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_loss")]
    assert steps == [1, 2]


def test_resume_without_a_checkpoint_names_the_fix(tiny_bert, tmp_path):
    with pytest.raises(ConfigError, match="holds no complete checkpoint"):
        run(cfg_for(tiny_bert, tmp_path / "empty", "--resume", "--tracking.enabled=false"))
