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


def test_time_budget_fits_the_plan_and_a_resumed_run_keeps_it(tiny_bert, tmp_path, monkeypatch):
    """``max_train_minutes``: after the probe steps the loop plans what fits (here: a budget already spent,
    so one more step), ends the learning-rate schedule there, stores the plan in the checkpoints, and a run
    killed after the plan resumes to the same step count and the same weights."""
    import torch
    from safetensors.torch import load_file

    monkeypatch.setattr(train_mod, "BUDGET_PROBE_STEPS", 2)
    budget = ("--max_train_minutes=1e-6", "--tracking.enabled=false")
    ref = run(cfg_for(tiny_bert, tmp_path / "ref", *budget))  # 3 steps per epoch, 2 epochs planned: 6 steps
    assert [h["epoch"] for h in ref["history"]] == [1]  # the plan (3 steps) ends with epoch 1
    last = sorted((tmp_path / "ref" / "checkpoints").glob("step-*"))[-1]
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and state["planned_steps"] == 3
    sched = torch.load(last / "scheduler.bin", weights_only=False)
    assert sched["_last_lr"][0] == pytest.approx(0.0, abs=1e-12)  # the linear schedule ended at the plan's last step

    full = run(cfg_for(tiny_bert, tmp_path / "nobudget", "--tracking.enabled=false"))
    assert [h["epoch"] for h in full["history"]] == [1, 2]  # no budget: the whole plan

    real_save = train_mod.Checkpoints.save

    def save_then_die(self, accelerator, state):
        path = real_save(self, accelerator, state)
        if state.global_step == 2 and state.planned_steps is not None:
            raise RuntimeError("simulated kill")
        return path

    monkeypatch.setattr(train_mod.Checkpoints, "save", save_then_die)
    out = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="simulated kill"):
        run(cfg_for(tiny_bert, out, *budget))
    monkeypatch.setattr(train_mod.Checkpoints, "save", real_save)
    monkeypatch.setattr(train_mod, "budget_steps", lambda *a, **k: pytest.fail("a resumed run must keep its plan"))
    resumed = run(cfg_for(tiny_bert, out, *budget, "--resume"))
    assert [h["epoch"] for h in resumed["history"]] == [1]
    a, b = load_file(tmp_path / "ref" / "model.safetensors"), load_file(out / "model.safetensors")
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, f"resumed weights differ from the uninterrupted budgeted run by {worst}"


def test_max_train_minutes_must_be_a_budget(tiny_bert, tmp_path):
    with pytest.raises(ConfigError, match="max_train_minutes=-1.0 must be a finite number"):
        cfg_for(tiny_bert, tmp_path, "--max_train_minutes=-1")


def test_a_run_killed_in_its_first_epoch_resumes_exactly(tiny_bert, tmp_path, monkeypatch):
    """Killed after step 1 of 3 in epoch 1 (before any validation pass): the resumed run draws the same dropout
    masks for the remaining steps (each batch seeds its own, :func:`~suffice.training.fit.loop.batch_seed`)."""
    from safetensors.torch import load_file

    ref = run(cfg_for(tiny_bert, tmp_path / "ref", "--tracking.enabled=false"))
    real_save = train_mod.Checkpoints.save

    def save_then_die(self, accelerator, state):
        path = real_save(self, accelerator, state)
        if state.global_step == 1:
            raise RuntimeError("simulated kill")
        return path

    monkeypatch.setattr(train_mod.Checkpoints, "save", save_then_die)
    out = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="simulated kill"):
        run(cfg_for(tiny_bert, out, "--tracking.enabled=false"))
    monkeypatch.setattr(train_mod.Checkpoints, "save", real_save)
    resumed = run(cfg_for(tiny_bert, out, "--tracking.enabled=false", "--resume"))
    assert [h["epoch"] for h in resumed["history"]] == [h["epoch"] for h in ref["history"]] == [1, 2]
    a, b = load_file(tmp_path / "ref" / "model.safetensors"), load_file(out / "model.safetensors")
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, f"resumed weights differ from the uninterrupted run by {worst}"


def test_time_budget_stops_at_the_deadline_when_the_steps_slow_down(tiny_bert, tmp_path, monkeypatch):
    """The plan fitted (every step fits), then the machine gets busy: training stops once the budget is spent."""
    import time as real_time

    class Clock:  # the loop's clock; jumps 10 minutes after step 3 (as a busy machine would stretch the steps)
        offset = 0.0

        @staticmethod
        def perf_counter():
            return real_time.perf_counter() + Clock.offset

    monkeypatch.setattr(train_mod, "time", Clock)
    monkeypatch.setattr(train_mod, "BUDGET_PROBE_STEPS", 2)
    real_save = train_mod.Checkpoints.save

    def save(self, accelerator, state):
        if state.global_step == 3:
            Clock.offset += 600.0
        return real_save(self, accelerator, state)

    monkeypatch.setattr(train_mod.Checkpoints, "save", save)
    out = tmp_path / "busy"
    summary = run(cfg_for(tiny_bert, out, "--max_train_minutes=5", "--tracking.enabled=false"))
    last = sorted((out / "checkpoints").glob("step-*"))[-1]
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["planned_steps"] == 4  # checked at step 4 (every 2 steps), of 6 planned
    assert [h["epoch"] for h in summary["history"]] == [1, 2]
