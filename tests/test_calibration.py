"""Calibration fitting: source-balanced weights, Platt scaling, the config rules, and old records still reading."""

from __future__ import annotations

import numpy as np
import pytest

from suffice.serving.calibration import Calibration, softmax
from suffice.training.evaluation.metrics import expected_calibration_error
from suffice.training.fit.calibration import (CalibrationSettings, fit_calibration, fit_platt, fit_temperature, source_weights)

TRAIN20 = "tests/fixtures/train20.jsonl"


def _binary_logits(rng, n: int, true_t: float, shift: float = 0.0):
    """Logits whose calibrated truth is softmax(z / true_t) (+ a shift of the margin): labels drawn from it."""
    m = rng.normal(0, 4, n)
    z = np.stack([np.zeros(n), m], axis=1)
    p = 1 / (1 + np.exp(-(m / true_t + shift)))
    return z, (rng.random(n) < p).astype(int)


def test_balanced_weights_keep_a_dominant_source_from_deciding_the_temperature():
    rng = np.random.default_rng(0)
    z_big, y_big = _binary_logits(rng, 4000, true_t=1.0)   # calibrated at T=1, and 40x bigger
    z_small, y_small = _binary_logits(rng, 100, true_t=4.0)  # over-confident: wants T~4
    z, y = np.concatenate([z_big, z_small]), np.concatenate([y_big, y_small])
    sources = ["wiki-synthetic"] * 4000 + ["squad2"] * 100

    pooled = fit_calibration(CalibrationSettings(pool="pooled"), z, y, sources, 1).temperature
    balanced = fit_calibration(CalibrationSettings(pool="source_balanced"), z, y, sources, 1).temperature
    assert pooled < 1.3 and balanced > pooled + 0.7, (pooled, balanced)
    ece = lambda t: expected_calibration_error(softmax(z_small, t)[:, 1], y_small)  # noqa: E731
    assert ece(balanced) < ece(pooled)
    w = source_weights(sources)
    assert w.mean() == pytest.approx(1.0) and w[:4000].sum() == pytest.approx(w[4000:].sum())


def test_one_source_balanced_equals_pooled():
    """The retrieval gate has one validation source: source_balanced must not change its calibration."""
    rng = np.random.default_rng(1)
    z, y = _binary_logits(rng, 500, true_t=2.0, shift=0.5)
    src = ["retrieval-gate"] * 500
    for method in ("temperature", "platt"):
        a = fit_calibration(CalibrationSettings(method=method, pool="pooled"), z, y, src, 1)
        b = fit_calibration(CalibrationSettings(method=method, pool="source_balanced"), z, y, src, 1)
        np.testing.assert_allclose(a.scores(z, 1), b.scores(z, 1), atol=1e-6)


def test_platt_recovers_a_known_slope_and_offset():
    rng = np.random.default_rng(2)
    margin = rng.normal(0, 3, 40000)
    y = (rng.random(len(margin)) < 1 / (1 + np.exp(-(0.6 * margin - 0.8)))).astype(int)
    logits = np.stack([margin / 2, -margin / 2], axis=1)  # positive class in column 1: z1 - z0 = -margin
    a, b = fit_platt(logits, 1 - y, positive_index=0)       # positive index 0 sees margin z0 - z1 = margin
    assert a == pytest.approx(0.6, abs=0.03) and b == pytest.approx(-0.8, abs=0.05)
    # integer weights are the same as repeated rows
    w = rng.integers(1, 4, len(margin)).astype(float)
    rep = np.repeat(np.arange(len(margin)), w.astype(int))
    np.testing.assert_allclose(fit_platt(logits, 1 - y, 0, w), fit_platt(logits[rep], (1 - y)[rep], 0), atol=1e-3)


def test_platt_with_no_offset_is_temperature_scaling():
    z = np.random.default_rng(3).normal(0, 3, (50, 2))
    np.testing.assert_allclose(Calibration("platt", a=1 / 2.5, b=0.0).probabilities(z, 1), Calibration(temperature=2.5).probabilities(z, 1),
                               atol=1e-12)
    assert Calibration("platt", a=0.5, b=1.0).probabilities(z, 0).sum(axis=1) == pytest.approx(np.ones(50))


def test_nothing_to_fit_is_identity():
    z = np.array([[0.0, 1.0], [0.0, 2.0]])
    assert fit_platt(z, np.array([1, 1])) == (1.0, 0.0) and fit_temperature(z, np.array([1, 1])) == 1.0
    assert fit_calibration(CalibrationSettings(temperature="none"), z, np.array([0, 1]), None, 1) == Calibration()


def test_three_level_with_platt_is_refused_naming_the_fix():
    from suffice.serving.config import ConfigError
    from suffice.training.fit.config import build_train_config

    with pytest.raises(ConfigError, match=r"calibration.method=platt.*three_level.*--calibration.method=temperature"):
        build_train_config(None, [f"--train_file={TRAIN20}", "--label_scheme=three_level", "--calibration.method=platt"])
    with pytest.raises(ConfigError, match=r"calibration.temperature=none"):
        build_train_config(None, [f"--train_file={TRAIN20}", "--calibration.temperature=none", "--calibration.method=platt"])
    with pytest.raises(ConfigError, match=r"pool"):
        build_train_config(None, [f"--train_file={TRAIN20}", "--calibration.pool=balanced"])
    cfg = build_train_config(None, [f"--train_file={TRAIN20}", "--calibration.method=platt", "--calibration.pool=source_balanced"])
    assert (cfg.calibration.method, cfg.calibration.pool) == ("platt", "source_balanced")


def test_finalize_writes_the_method_its_parameters_and_the_pool():
    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.finalize import calibration_and_thresholds
    from suffice.training.fit.meta import ModelMeta

    cfg = build_train_config(None, [f"--train_file={TRAIN20}", "--calibration.method=platt", "--calibration.pool=source_balanced"])
    z, y = _binary_logits(np.random.default_rng(4), 300, true_t=2.0, shift=-0.5)
    cal, thresholds, record = calibration_and_thresholds(cfg, z, y, ["squad2"] * 200 + ["qed"] * 100)
    assert record["method"] == "platt" and record["pool"] == "source_balanced" and set(record["platt"]) == {"a", "b"}
    assert thresholds == {"sufficient": 0.8, "partial": 0.5} and "validation_levels" in record
    meta = ModelMeta(task="sufficiency", label_scheme="binary", id2label={"0": "insufficient", "1": "sufficient"},
                     positive_label="sufficient", max_length=128, long_context_strategy="select", calibration=record)
    np.testing.assert_allclose(meta.calibrator.scores(z, 1), cal.scores(z, 1))


def test_old_temperature_only_records_still_load():
    from suffice.serving.bundle import BundleManifest
    from suffice.training.fit.meta import ModelMeta, ModelMetaError

    base = dict(task="sufficiency", label_scheme="binary", id2label={"0": "insufficient", "1": "sufficient"},
                positive_label="sufficient", max_length=128, long_context_strategy="select")
    for record in ({"temperature": 1.3}, {"method": "temperature", "temperature": 1.3, "validation_levels": {"items": 3}}):
        meta = ModelMeta.from_dict({**base, "calibration": record})
        assert meta.calibrator == Calibration(temperature=1.3) and meta.temperature == 1.3
    with pytest.raises(ModelMetaError, match="no platt"):
        ModelMeta.from_dict({**base, "calibration": {"method": "platt", "temperature": 1.0}})

    old = {"task": "sufficiency", "id2label": {"0": "insufficient", "1": "sufficient"}, "positive_label": "sufficient",
           "max_length": 128, "long_context_strategy": "select", "temperature": 1.7, "thresholds": {}, "base_model": "x",
           "files": {"model.onnx": "0", "tokenizer.json": "0"}}
    m = BundleManifest.from_dict(old)
    assert m.calibrator == Calibration(temperature=1.7) and "calibration" not in m.to_dict()  # written back unchanged
    platt = BundleManifest.from_dict({**old, "temperature": 1.0, "calibration": {"method": "platt", "platt": {"a": 0.5, "b": 0.2}}})
    assert platt.calibrator == Calibration("platt", a=0.5, b=0.2) and BundleManifest.from_dict(platt.to_dict()) == platt


def test_platt_manifest_for_three_labels_is_refused():
    from suffice.serving.bundle import BundleManifest, ManifestError

    three = {"task": "sufficiency", "id2label": {"0": "insufficient", "1": "partial", "2": "sufficient"}, "positive_label": "sufficient",
             "max_length": 128, "long_context_strategy": "select", "temperature": 1.0, "thresholds": {}, "base_model": "x",
             "files": {"model.onnx": "0", "tokenizer.json": "0"}, "calibration": {"method": "platt", "platt": {"a": 1, "b": 0}}}
    with pytest.raises(ManifestError, match="binary model"):
        BundleManifest.from_dict(three)


def test_bench_compares_variants_on_validation_only():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from bench_calibration import TODAY, compare_variants

    rng = np.random.default_rng(5)
    z_big, y_big = _binary_logits(rng, 3000, true_t=1.0)
    z_small, y_small = _binary_logits(rng, 300, true_t=4.0, shift=-1.0)
    val = {"logits": np.concatenate([z_big, z_small]), "labels": np.concatenate([y_big, y_small]),
           "sources": ["wiki-synthetic"] * 3000 + ["squad2"] * 300}
    r = compare_variants(val, None)
    # the synthetic source is left out of the selection; squad2's over-confidence is fixed only by a fit that
    # weighs it (balanced) or fits on it alone (real)
    assert r["selected"] != TODAY and r["selected"].startswith(("balanced", "real"))
    assert r["variants"]["real-platt"]["validation"]["squad2"]["ece"] < r["variants"]["balanced-platt"]["validation"]["squad2"]["ece"]
    assert all("test" not in v for v in r["variants"].values())


def test_real_pool_fits_on_the_real_sources_only():
    from suffice.training.fit.calibration import CalibrationSettings, fit_calibration, pool_weights

    rng = np.random.default_rng(11)
    z_syn, y_syn = _binary_logits(rng, 3000, true_t=1.0)
    z_real, y_real = _binary_logits(rng, 400, true_t=3.0)
    logits, labels = np.concatenate([z_syn, z_real]), np.concatenate([y_syn, y_real])
    sources = ["wiki-synthetic"] * 3000 + ["squad2"] * 200 + ["qed"] * 200
    real = fit_calibration(CalibrationSettings(pool="real"), logits, labels, sources, 1)
    alone = fit_calibration(CalibrationSettings(), z_real, y_real, None, 1)
    pooled = fit_calibration(CalibrationSettings(), logits, labels, sources, 1)
    assert real.temperature == pytest.approx(alone.temperature, rel=1e-6) and abs(pooled.temperature - 1.0) < abs(real.temperature - 1.0)
    assert pool_weights("real", ["wiki-synthetic"] * 3) is None  # no real items: every item alike
    with pytest.raises(Exception, match="pool"):
        CalibrationSettings(pool="synthetic")
