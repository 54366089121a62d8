"""`make demo` → serve → score → promote → pyfunc, as the README says, on the tiny model.

One module-scoped `suffice demo` run (tiny random BERT, stage 0 on the shared fixture, then the 20-row
fixture, export on) trains both stages, exports and registers stage 0 as `suffice-sufficiency` version
1 and the demo model as version 2, and points `candidate` at version 2; the tests then walk the
commands the demo prints and the README's registry section.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from pyfunc_support import MIXED_ROWS, mlflow_store

pytest.importorskip("optimum")
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "train20.jsonl"
CANDIDATE = "models:/suffice-sufficiency@candidate"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory, tiny_bert_dir):
    """(mlflow store folder, demo stdout, model dir) after one `suffice demo` with export."""
    from suffice.training import demo

    root = tmp_path_factory.mktemp("demo-registry")
    cfg = root / "tiny.yaml"
    cfg.write_text("task: sufficiency\nnum_train_epochs: 1\n")
    out_dir = root / "model"
    shared = Path(__file__).resolve().parent / "fixtures" / "shared"
    tiny = ["--max_length=64", "--per_device_train_batch_size=4", "--lora.r=4", "--lora.alpha=8", "--torch_threads=1", "--baselines=[]"]
    with pytest.MonkeyPatch.context() as mp, mlflow_store(root / "mlruns"):
        for k, v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                     "SUFFICE_PREPARED_DIR": str(root / "prepared"), "ACCELERATE_CONFIG_FILE": str(root / "none.yaml")}.items():
            mp.setenv(k, v)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = demo.main(["--skip-data", "--stage0", "on", "--mixed-precision", "no", "--config", str(cfg), f"--train_file={FIXTURE}",
                            f"--base_model={tiny_bert_dir}", f"--output_dir={out_dir}", *tiny, "--evaluate_test=false",
                            f"--stage0.data.data_dir={shared}", "--stage0.data.name=pytest-registry-stage0", "--stage0.max_train_items=0",
                            *("--stage0." + o[2:] for o in tiny)])
    assert rc == 0, buf.getvalue()[-3000:]
    return root / "mlruns", buf.getvalue(), out_dir


@pytest.fixture
def store(demo_store, monkeypatch):
    root, printed, out_dir = demo_store
    with mlflow_store(root, monkeypatch):
        yield root, printed, out_dir


def test_demo_registers_stage0_and_the_candidate_as_two_versions(store, tmp_path, capsys, tiny_bert_dir):
    from mlflow.tracking import MlflowClient

    from suffice.serving import SufficiencyScorer
    from suffice.serving.batch import main as score_main
    from suffice.serving.model_uri import resolve_bundle_uri

    _, printed, out_dir = store
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    versions = {str(v.version): v for v in client.search_model_versions("name='suffice-sufficiency'")}
    assert sorted(versions) == ["1", "2"]  # stage 0 and the demo model, each once (no extra one from `export --register`)
    assert str(client.get_model_version_by_alias("suffice-sufficiency", "candidate").version) == "2"
    assert sorted(str(v.version) for v in client.search_model_versions("name='suffice-sufficiency-model'")) == ["1", "2"]
    meta = json.loads((out_dir / "suffice_model.json").read_text())
    assert meta["mlflow"]["registered_model"] == "suffice-sufficiency-model" and meta["mlflow"]["bundle"] == "models:/suffice-sufficiency/2"
    stage0 = json.loads((out_dir / "stage0" / "suffice_model.json").read_text())
    assert stage0["mlflow"]["bundle"] == "models:/suffice-sufficiency/1"
    # stage 0 starts where --base_model says, the demo config from the stage-0 directory
    assert stage0["base_model"] == str(tiny_bert_dir)
    assert meta["base_model"] == str(out_dir / "stage0")
    # what the registry page shows at a glance: the headline numbers open each version's description
    for v in versions.values():
        assert v.description.startswith("val source-mean F1 "), v.description
        assert v.tags["headline/val_source_mean_macro_f1"]

    bundle = resolve_bundle_uri(CANDIDATE)  # serving's resolver
    mlmodel = (bundle.parent.parent / "MLmodel").read_text()  # data/bundle inside the pyfunc model folder
    assert "python_function" in mlmodel and "signature:" in mlmodel and "saved_input_example_info" in mlmodel
    manifest = json.loads((bundle / "suffice.json").read_text())
    assert manifest["registered_model"] == "suffice-sufficiency" and manifest["model_version"] == "2"
    r = SufficiencyScorer.load(bundle).score("When did Chopin leave Warsaw?", ["Chopin left Warsaw in 1830."])
    assert 0.0 <= r.score <= 1.0 and r.level in ("sufficient", "partial", "insufficient")

    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps(row) + "\n" for row in MIXED_ROWS))
    capsys.readouterr()
    assert score_main(["--input", str(src), "--output", str(tmp_path / "scored.jsonl"), "--model", CANDIDATE, "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == len(MIXED_ROWS)

    for line in ("suffice serve --bundle models:/suffice-sufficiency@candidate",
                 "suffice score --input items.jsonl --output scored.jsonl --model models:/suffice-sufficiency@candidate",
                 "mlflow.pyfunc.load_model('models:/suffice-sufficiency@candidate')",
                 "suffice promote --name suffice-sufficiency --version 2 --alias production"):
        assert line in printed, line


def test_demo_prints_the_ui_links_that_compare_its_two_versions(store):
    """The runs table opens in model-training mode with the headline columns (the experiment's shared view),
    and the comparison link names both versions with their runs."""
    import json as _json
    import urllib.parse

    from mlflow.tracking import MlflowClient

    from suffice.training.tracking import HEADLINE_VIEW

    _, printed, _ = store
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name("suffice")
    runs_line = next(ln for ln in printed.splitlines() if ln.strip().startswith("runs:"))
    assert f"#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={HEADLINE_VIEW}" in runs_line
    view = _json.loads(exp.tags[f"mlflow.sharedViewState.{HEADLINE_VIEW}"])
    assert "metrics.`headline/val_squad2_macro_f1`" in view["selectedColumns"]
    line = next(ln for ln in printed.splitlines() if "side by side" in ln)
    query = urllib.parse.parse_qs(line.split("#/compare-model-versions?", 1)[1])
    runs = _json.loads(query["runs"][0])
    assert _json.loads(query["name"][0]) == "suffice-sufficiency" and sorted(runs) == ["1", "2"]
    assert runs == {v: client.get_model_version("suffice-sufficiency", v).run_id for v in ("1", "2")}


def test_the_printed_pyfunc_command_runs_in_a_fresh_shell(store, tmp_path):
    """Pasted as printed into a shell with no MLFLOW_TRACKING_URI, in another folder: plain MLflow finds the store."""
    import subprocess
    import sys

    _, printed, _ = store
    line = next(ln.strip() for ln in printed.splitlines() if "mlflow.pyfunc.load_model" in ln)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SUFFICE_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` is this environment's
    shell = tmp_path / "fresh-shell"
    shell.mkdir()
    p = subprocess.run(["bash", "-c", line], cwd=shell, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert any(level in p.stdout for level in ("sufficient", "partial", "insufficient")), p.stdout
    assert not (shell / "mlflow.db").exists() and not (shell / "mlruns").exists()  # no stray store where it ran


def test_the_readme_commands_run_after_the_demo(store, tmp_path, capsys):
    """serve (the app `suffice serve` builds), score, promote to production, pyfunc load_model + predict."""
    import mlflow
    import pandas as pd
    from fastapi.testclient import TestClient

    from suffice.serving.batch import main as score_main
    from suffice.serving.service import build_service, load_service_config
    from suffice.training.cli import main as suffice

    app, _, _ = build_service("models:/suffice-sufficiency/2", load_service_config(None))
    with TestClient(app) as c:
        r = c.post("/v1/sufficiency", json={"question": "When did Chopin leave Warsaw?", "passages": ["Chopin left Warsaw in 1830."]})
    assert r.status_code == 200, r.text
    assert r.json()["level"] in ("sufficient", "partial", "insufficient")

    assert suffice(["promote", "--name", "suffice-sufficiency", "--version", "2", "--alias", "production"]) == 0
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps(row) + "\n" for row in MIXED_ROWS))
    assert score_main(["--input", str(src), "--output", str(tmp_path / "scored.parquet"), "--model",
                       "models:/suffice-sufficiency@production", "--no-progress"]) == 0

    model = mlflow.pyfunc.load_model("models:/suffice-sufficiency@production")
    out = model.predict(pd.DataFrame([
        {"question": "Where is the Eiffel Tower?", "passages": [{"title": "Paris", "text": "The Eiffel Tower is in Paris."}]},
        {"question": "When did Chopin leave Warsaw?", "passages": ["Chopin left Warsaw in 1830."]},
        {"question": "Who founded Lima?", "context": "Lima is the capital of Peru."},
    ]))
    assert list(out.columns) == ["score", "level", "latency_ms"] and len(out) == 3
