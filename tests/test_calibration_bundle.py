"""A Platt-calibrated model end to end: export, parity probe, served scores = training-side scores; the bench on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from serving_support import ITEMS, make_model_dir, validation_items

pytest.importorskip("optimum")

REPO = Path(__file__).resolve().parent.parent
PLATT = {"method": "platt", "temperature": 1.0, "platt": {"a": 0.7, "b": -0.4}, "pool": "source_balanced"}


def _torch_logits(model_dir: Path, pairs) -> np.ndarray:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    from suffice.serving.packing import ContextPacker

    meta = json.loads((model_dir / "suffice_model.json").read_text())
    packer = ContextPacker(Tokenizer.from_file(str(model_dir / "tokenizer.json")), meta["max_length"], meta["long_context_strategy"])
    feeds, _ = packer.pack_batch([q for q, _ in pairs], [p for _, p in pairs])
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.inference_mode():
        return model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy().astype(np.float64)


@pytest.fixture(scope="module")
def platt_model(tiny_bert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("platt")
    model_dir = make_model_dir(tiny_bert_dir, root / "model", lora=False, head_scale=5.0)
    meta = json.loads((model_dir / "suffice_model.json").read_text())
    (model_dir / "suffice_model.json").write_text(json.dumps({**meta, "calibration": PLATT}))
    return model_dir


def test_platt_bundle_serves_the_training_side_calibrated_scores(platt_model, tmp_path):
    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving.bundle import read_manifest
    from suffice.training.export import export_bundle

    bundle = export_bundle(platt_model, tmp_path / "bundle", validation_items(40), quantize=False, openvino_int8=False)
    m = read_manifest(bundle)
    assert m.calibration == {"method": "platt", "platt": {"a": 0.7, "b": -0.4}} and m.temperature == 1.0
    pairs = [(q, p) for q, p, _ in ITEMS]
    z = _torch_logits(platt_model, pairs)
    want = 1 / (1 + np.exp(-(0.7 * (z[:, 1] - z[:, 0]) - 0.4)))  # written out: not the code under test
    from suffice.training.fit.meta import ModelMeta

    np.testing.assert_allclose(ModelMeta.read(platt_model).calibrator.scores(z, 1), want, atol=1e-12)  # training side
    scorer = SufficiencyScorer.load(bundle, ScorerConfig(precision="fp32"))  # loading checks the Platt-scored probe
    got = scorer.score_batch([q for q, _ in pairs], [p for _, p in pairs])
    np.testing.assert_allclose([r.score for r in got], want, atol=1e-5)
    assert any("platt a=0.7 b=-0.4" in f.detail for r in got for f in r.confidence_factors)
    # the export's parity probe holds the Platt scores, and the served model was checked against them at load
    from suffice.serving.bundle import read_probe
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    clf = OnnxClassifier(bundle, RuntimeConfig(precision="fp32"))
    probe = read_probe(bundle)
    pz = clf.run({k: getattr(probe, k) for k in ("input_ids", "token_type_ids", "attention_mask")}).astype(np.float64)
    np.testing.assert_allclose(probe.scores, 1 / (1 + np.exp(-(0.7 * (pz[:, 1] - pz[:, 0]) - 0.4))), atol=1e-5)
    assert clf.probe_check is not None and clf.probe_check.ok


def test_temperature_bundle_manifest_has_no_calibration_key(tiny_bert_dir, tmp_path):
    from suffice.serving.bundle import MANIFEST_NAME
    from suffice.training.export import export_bundle

    model_dir = make_model_dir(tiny_bert_dir, tmp_path / "model", lora=False)
    bundle = export_bundle(model_dir, tmp_path / "bundle", validation_items(12), quantize=False, openvino_int8=False)
    written = json.loads((bundle / MANIFEST_NAME).read_text())
    assert "calibration" not in written and written["temperature"] == 1.5  # what every older suffice reads


def test_bench_calibration_runs_on_a_tiny_model(platt_model, tmp_path):
    (platt_model / "train_config.yaml").write_text(f"train_file: {REPO / 'tests/fixtures/train20.jsonl'}\nmax_length: 128\n")
    out = tmp_path / "results"
    # a process of its own: scoring sets up accelerate's process-wide state, which a later training test must set itself
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_calibration.py"), "--model-dir", str(platt_model), "--out", str(out),
                        "--logits-cache", str(tmp_path / "cache")], capture_output=True, text=True, timeout=300, cwd=REPO, env=dict(os.environ))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    r = json.loads((out / f"calibration-{platt_model.name}.json").read_text())
    assert set(r["comparison"]["variants"]) == {"pooled-temperature", "balanced-temperature", "pooled-platt", "balanced-platt",
                                                "real-temperature", "real-platt"}
    assert r["comparison"]["selected"] in r["comparison"]["variants"] and r["n_validation"] == 4 and r["n_test"] == 4
    assert (tmp_path / "cache" / platt_model.name / "test.npz").is_file()
    assert "Selected on validation" in (out / "calibration.md").read_text()


def test_training_with_balanced_platt_ships_it_to_the_bundle(tiny_bert, tmp_path):
    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving.bundle import read_manifest
    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.run import run

    out = tmp_path / "trained"
    cfg = build_train_config(None, [f"--train_file={REPO / 'tests/fixtures/train20.jsonl'}", f"--base_model={tiny_bert}",
                                    f"--output_dir={out}", "--max_length=64", "--per_device_train_batch_size=4", "--num_train_epochs=1",
                                    "--lora.r=4", "--lora.alpha=8", "--torch_threads=1", "--export", "--tracking.enabled=false",
                                    "--baselines=[]", "--calibration.method=platt", "--calibration.pool=source_balanced"])
    run(cfg)
    meta = json.loads((out / "suffice_model.json").read_text())
    assert meta["calibration"]["method"] == "platt" and meta["calibration"]["pool"] == "source_balanced"
    a, b = meta["calibration"]["platt"]["a"], meta["calibration"]["platt"]["b"]
    m = read_manifest(out / "bundle")
    assert m.calibration == {"method": "platt", "platt": {"a": a, "b": b}}
    pairs = [(q, p) for q, p, _ in ITEMS]
    z = _torch_logits(out, pairs)
    got = SufficiencyScorer.load(out / "bundle", ScorerConfig(precision="fp32")).score_batch([q for q, _ in pairs], [p for _, p in pairs])
    np.testing.assert_allclose([r.score for r in got], 1 / (1 + np.exp(-(a * (z[:, 1] - z[:, 0]) + b))), atol=1e-4)
