"""A registered bundle is an MLflow pyfunc model: signature, pinned torch-free environment, loads
without torch (or an installed suffice), scores like suffice.serving, resolves through aliases."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pyfunc_support import HEAVY, MIXED_ROWS, as_scorer_input, mlflow_store, no_torch_site, shared_store, tiny_bundle

pytest.importorskip("optimum")
mlflow = pytest.importorskip("mlflow")
pd = pytest.importorskip("pandas")

URI = "models:/suffice-sufficiency@production"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_bert_dir):
    return tiny_bundle(tmp_path_factory, tiny_bert_dir)


@pytest.fixture
def registered(bundle, tmp_path_factory, monkeypatch):
    """The test runs against the session's store (bundle registered as version 1 @production)."""
    root, name, version = shared_store(tmp_path_factory, bundle)
    with mlflow_store(root, monkeypatch):
        yield name, version


def test_registered_version_is_a_pyfunc_model_with_a_torch_free_environment(registered, tmp_path):
    from mlflow.models import Model

    name, version = registered
    assert (name, version) == ("suffice-sufficiency", "1")
    local = tmp_path / "downloaded"
    mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=str(local))
    model = Model.load(str(local / "MLmodel"))
    conf = model.flavors["python_function"]
    assert conf["loader_module"] == "suffice.serving.pyfunc" and conf["data"] == "data/bundle" and conf["code"] == "code"
    assert (local / "data" / "bundle" / "suffice.json").is_file()
    assert (local / "code" / "suffice" / "serving" / "pyfunc.py").is_file()
    assert not (local / "code" / "suffice" / "serving" / "service").exists()
    sig = model.signature
    assert sig.inputs.input_names() == ["question", "passages", "context"]
    assert sig.inputs.required_input_names() == ["question"]
    assert sig.outputs.input_names() == ["score", "level", "latency_ms"]
    assert model.saved_input_example_info and (local / "input_example.json").is_file()
    assert json.loads((local / "data" / "bundle" / "suffice.json").read_text())["model_version"] == "1"

    reqs = (local / "requirements.txt").read_text().split()
    pinned = {r.split("==")[0].lower(): r for r in reqs}
    for pkg in ("onnxruntime", "tokenizers", "numpy", "pandas", "mlflow"):
        assert "==" in pinned[pkg], reqs
    environment = " ".join((local / f).read_text() for f in ("requirements.txt", "conda.yaml", "python_env.yaml"))
    for heavy in HEAVY:
        assert heavy not in environment.lower(), f"{heavy} is in the logged environment"


def test_pyfunc_predict_equals_the_direct_scorer(bundle, registered):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    model = mlflow.pyfunc.load_model(URI)
    frame = pd.DataFrame(MIXED_ROWS, index=[10, 11, 12, 13, 14, 15])
    out = model.predict(frame)
    assert list(out.columns) == ["score", "level", "latency_ms"] and list(out.index) == list(frame.index)
    assert out["score"].dtype == np.float64 and out["latency_ms"].dtype == np.float64
    questions, passages = as_scorer_input(MIXED_ROWS)
    want = SufficiencyScorer.load(bundle).score_batch(questions, passages)
    np.testing.assert_allclose(out["score"].to_numpy(), [r.score for r in want], atol=1e-6)
    assert out["level"].tolist() == [r.level for r in want]
    assert out.loc[14, "score"] == 0.0 and out.loc[14, "level"] == "insufficient"  # empty passages

    fp32 = mlflow.pyfunc.load_model(URI, model_config={"precision": "fp32"})
    want32 = SufficiencyScorer.load(bundle, ScorerConfig(precision="fp32"))
    np.testing.assert_allclose(fp32.predict(frame)["score"].to_numpy(), [r.score for r in want32.score_batch(questions, passages)], atol=1e-6)


def test_pyfunc_input_errors_name_the_problem(registered):
    model = mlflow.pyfunc.load_model(URI)
    with pytest.raises(Exception, match="question"):
        model.predict(pd.DataFrame({"passages": [["text"]]}))
    with pytest.raises(Exception, match="row 1: question must be a non-empty string"):
        model.predict(pd.DataFrame({"question": ["Q?", "  "], "context": ["a", "b"]}))
    with pytest.raises(Exception, match="passages must be a list"):
        model.predict(pd.DataFrame({"question": ["Q?"], "passages": [42]}))
    from suffice.serving.pyfunc import scorer_config_from

    with pytest.raises(ValueError, match="unknown model_config key"):  # MLflow itself drops unknown keys with a warning
        scorer_config_from({"precison": "fp32"})
    with pytest.raises(ValueError, match="precision='fp16': choose one of auto, int8, fp32, bf16"):
        scorer_config_from({"precision": "fp16"})
    with pytest.raises(ValueError, match="backend='tensorrt': choose one of auto, onnxruntime, openvino"):
        scorer_config_from({"backend": "tensorrt"})
    assert scorer_config_from({"backend": "onnxruntime", "precision": "fp32"}).backend == "onnxruntime"


def test_registered_version_loads_where_there_is_no_torch_and_no_installed_suffice(bundle, registered, tmp_path):
    """A fresh environment: torch & co. unimportable, suffice not installed; the model's own code scores."""
    from suffice.serving import SufficiencyScorer

    env = no_torch_site(tmp_path / "site", hide_installed_suffice=True)
    code = textwrap.dedent(f"""
        import json, sys
        try:
            import torch
            raise SystemExit("torch was importable")
        except ImportError:
            pass
        try:
            import suffice.serving
            raise SystemExit("the installed suffice was importable")
        except ImportError:
            pass
        import mlflow, pandas as pd
        model = mlflow.pyfunc.load_model({URI!r})
        out = model.predict(pd.DataFrame({MIXED_ROWS!r}))
        import suffice.serving
        print(json.dumps({{"scores": out["score"].tolist(), "levels": out["level"].tolist(),
                          "serving_from": suffice.serving.__file__,
                          "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
    """)
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["heavy"] == []
    assert "/code/suffice/serving/" in got["serving_from"], got["serving_from"]
    questions, passages = as_scorer_input(MIXED_ROWS)
    want = SufficiencyScorer.load(bundle).score_batch(questions, passages)
    np.testing.assert_allclose(got["scores"], [r.score for r in want], atol=1e-6)
    assert got["levels"] == [r.level for r in want]


def test_service_resolves_a_registry_alias_once_at_start_up(registered, tmp_path, monkeypatch, capfd):
    pytest.importorskip("fastapi")
    from suffice.serving.bundle import BundleError
    from suffice.serving.model_uri import RegistryURIError, resolve_bundle_uri
    from suffice.serving.service import build_service, load_service_config

    name, version = registered
    monkeypatch.setenv("SUFFICE_BUNDLE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    capfd.readouterr()
    path = resolve_bundle_uri(URI)
    assert "Downloading artifacts" not in capfd.readouterr().err  # no per-file progress bars at a service start
    assert (path / "suffice.json").is_file() and path.is_relative_to(tmp_path / "cache" / name / version)
    app, scorer, _ = build_service(URI, load_service_config(None, []))
    assert scorer.manifest.model_version == version
    with pytest.raises(RegistryURIError, match="suffice promote"):
        resolve_bundle_uri("models:/suffice-sufficiency@staging")
    with pytest.raises(RegistryURIError, match="models:/NAME/VERSION"):
        resolve_bundle_uri("models:/suffice-sufficiency/")
    with pytest.raises(BundleError, match="does not exist"):
        resolve_bundle_uri(tmp_path / "nope")


def test_failed_registration_takes_the_version_back(bundle, registered, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from suffice.training.export import registry

    def broken(*args, **kwargs):
        raise OSError("disk full")

    uri = registry.default_tracking_uri()
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    before = sorted(v.version for v in client.search_model_versions("name='suffice-sufficiency'"))
    monkeypatch.setattr(registry, "save_pyfunc_model", broken)
    local = tmp_path / "b"
    shutil.copytree(bundle, local)
    with pytest.raises(registry.RegistryError, match="disk full"):
        registry.register_bundle(local)
    assert sorted(v.version for v in client.search_model_versions("name='suffice-sufficiency'")) == before


def test_pyfunc_and_model_uri_modules_import_nothing_heavy():
    code = textwrap.dedent(f"""
        import json, sys
        import suffice.serving.pyfunc, suffice.serving.model_uri
        print(json.dumps(sorted(m for m in {HEAVY + ("mlflow", "pandas")!r} if m in sys.modules)))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_rows_from_frame_accepts_arrow_and_pandas_shapes():
    from suffice.serving.pyfunc import rows_from_frame

    frame = pd.DataFrame({
        "question": ["A?", "B?", "C?", "D?"],
        "passages": [np.array([{"title": "T", "text": "x", "extra": None}], dtype=object), np.array(["y", "z"]), None, pd.NA],
        "context": [None, None, "ctx", float("nan")],
    })
    questions, passages = rows_from_frame(frame)
    assert questions == ["A?", "B?", "C?", "D?"]
    assert passages == [[{"title": "T", "text": "x", "extra": ""}], ["y", "z"], ["ctx"], []]


@pytest.mark.slow
def test_registered_version_loads_in_a_fresh_virtualenv_from_its_own_requirements(bundle, registered, tmp_path):
    """The real thing: a new venv with only the model's requirements.txt (no torch, no suffice) loads and scores it."""
    from suffice.serving import SufficiencyScorer

    model_dir = tmp_path / "model"
    mlflow.artifacts.download_artifacts(artifact_uri=URI, dst_path=str(model_dir))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "-r", str(model_dir / "requirements.txt")],
                         capture_output=True, text=True, timeout=1200)
    if pip.returncode != 0:
        pytest.skip(f"cannot install the model's requirements here (no package index?): {pip.stderr[-800:]}")
    code = textwrap.dedent(f"""
        import importlib.util, json, sys
        assert importlib.util.find_spec("torch") is None and importlib.util.find_spec("suffice") is None
        import mlflow, pandas as pd
        out = mlflow.pyfunc.load_model({str(model_dir)!r}).predict(pd.DataFrame({MIXED_ROWS!r}))
        print(json.dumps({{"scores": out["score"].tolist(), "levels": out["level"].tolist()}}))
    """)
    p = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    questions, passages = as_scorer_input(MIXED_ROWS)
    want = SufficiencyScorer.load(bundle).score_batch(questions, passages)
    np.testing.assert_allclose(got["scores"], [r.score for r in want], atol=1e-6)
    assert got["levels"] == [r.level for r in want]


def test_retrieval_gate_bundles_register_as_plain_folders(bundle, registered, tmp_path):
    from dataclasses import replace

    from suffice.serving.bundle import read_manifest, write_manifest
    from suffice.training.export import registry

    gate = tmp_path / "gate"
    shutil.copytree(bundle, gate)
    m = read_manifest(gate)
    write_manifest(gate, replace(m, task="retrieval_gate", id2label={0: "RETRIEVE", 1: "SKIP"}, positive_label="SKIP",
                                 thresholds={"skip": 0.5}, long_context_strategy="recent"))
    with pytest.raises(registry.RegistryError, match="sufficiency bundles only"):
        registry.save_pyfunc_model(gate, tmp_path / "never")
    name, version = registry.register_bundle(gate)
    assert name == "suffice-retrieval-gate"
    path = registry.resolve_bundle(f"models:/{name}/{version}")
    assert read_manifest(path).task == "retrieval_gate" and not (path / "MLmodel").exists()
