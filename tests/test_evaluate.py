"""``suffice evaluate`` on a model directory, a models:/ URI and an exported bundle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from suffice.training.evaluation.evaluate import evaluate, main
from suffice.training.fit.run import run
from suffice.training.fit.config import build_train_config

REPO = Path(__file__).resolve().parent.parent
FIXTURE = str(REPO / "tests" / "fixtures" / "train20.jsonl")


@pytest.fixture(scope="module")
def model(tiny_bert_dir, tmp_path_factory):
    """A tiny LoRA model trained once, registered in its own MLflow store."""
    root = tmp_path_factory.mktemp("eval-model")
    (root / "mlruns").mkdir()
    env = {"SUFFICE_MLRUNS_DIR": str(root / "mlruns"), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        run(build_train_config(None, [
            f"--train_file={FIXTURE}", f"--base_model={tiny_bert_dir}", f"--output_dir={root / 'model'}", "--max_length=64",
            "--per_device_train_batch_size=4", "--num_train_epochs=1", "--lora.r=4", "--torch_threads=1", "--learning_rate=1e-3",
            # fp32 as evaluate scores: with bf16 autocast (auto on AVX512-BF16 / AMX CPUs) training's own test
            # pass differs from evaluate's fp32 one in the 6th decimal, which is not what these tests check
            "--mixed_precision=no"]))
    return root / "model", env


def test_model_dir_report_matches_training_and_has_baselines(model, tmp_path):
    path, _ = model
    report = evaluate(str(path), "test", out_dir=tmp_path / "ev", log_mlflow=False)
    overall = report["model"]["overall"]
    assert overall["n"] == 4 and set(report["model"]) == {"squad2", "qed", "hotpotqa-fullwiki", "overall"}
    trained = json.loads((path / "suffice_model.json").read_text())["metrics"]["test"]
    for key in ("accuracy", "macro_f1", "ece", "nll"):
        assert overall[key] == pytest.approx(trained[key], abs=1e-6), key
    assert sorted(report["baselines"]) == ["answer_in_context", "keyword_coverage", "tfidf_lr"]
    # the fixture's answers sit in the sufficient contexts only: the (gold-reading) rule is perfect here
    assert report["baselines"]["answer_in_context"]["overall"]["accuracy"] == 1.0
    for name in ("test_confusion_matrix.png", "test_reliability.png", "test_precision_recall.png", "test_selective_accuracy.png",
                 "test_metrics.json", "test_table.txt"):
        assert (tmp_path / "ev" / name).is_file(), name
    saved = json.loads((tmp_path / "ev" / "test_metrics.json").read_text())
    assert "margins" in saved and "overall" in saved["model"]


def test_models_uri_resolves_and_the_evaluation_is_logged(model, tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    path, env = model
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["--model", "models:/suffice-sufficiency-model/1", "--split", "validation", "--baselines", "tfidf_lr",
                 "--out", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr().out
    assert "model / overall" in out and "tfidf_lr / overall" in out and "keyword_coverage" not in out
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("suffice-evaluate")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    m = runs[0].data.metrics
    assert "validation_macro_f1" in m and "validation_baseline_tfidf_lr_auroc" in m and "validation_squad2_accuracy" in m
    assert runs[0].data.tags["evaluated_run_id"] == json.loads((path / "suffice_model.json").read_text())["mlflow"]["run_id"]


def test_exported_bundle_scores_like_the_torch_model(model, tmp_path):
    export = pytest.importorskip("suffice.training.export")
    path, _ = model
    bundle = export.export_bundle(path, tmp_path / "bundle", quantize=False)
    a = evaluate(str(path), "test", baselines=[], out_dir=tmp_path / "a", log_mlflow=False)
    b = evaluate(str(bundle), "test", baselines=[], precision="fp32", out_dir=tmp_path / "b", log_mlflow=False,
                 config=str(path / "train_config.yaml"))
    pa, pb = a["_arrays"]["probs"], b["_arrays"]["probs"]
    assert np.abs(pa - pb).max() < 1e-4
    assert b["model_info"]["kind"] == "bundle"


def test_cli_errors_exit_2(capsys, tmp_path):
    assert main(["--model", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["--model", str(tmp_path), "stray"]) == 2
    assert "unrecognised argument" in capsys.readouterr().err
