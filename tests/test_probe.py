"""The parity probe: written at export, validated on load, every variant checked against it, drift falls back."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

from serving_support import make_model_dir, rewrite_manifest, validation_items


def _probe(scores, **tol):
    from suffice.serving.probe import ParityProbe

    n = len(scores)
    ids = np.full((n, 6), 0, dtype=np.int64)
    ids[:, :4] = 101
    mask = (ids != 0).astype(np.int64)
    return ParityProbe(ids, np.zeros_like(ids), mask, np.asarray(scores, dtype=np.float64), **tol)


def test_probe_round_trips_without_pickles(tmp_path):
    from suffice.serving.probe import ParityProbe

    p = _probe([0.1, 0.9, 0.55], max_mean_score_shift=0.02)
    p.write(tmp_path / "probe.npz")
    back = ParityProbe.read(tmp_path / "probe.npz")
    assert back.max_mean_score_shift == 0.02 and back.confident_margin == 0.1
    np.testing.assert_array_equal(back.input_ids, p.input_ids)
    np.testing.assert_array_equal(back.scores, p.scores)
    with np.load(tmp_path / "probe.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


def test_probe_rejects_drift_and_clear_flips_but_not_flips_at_a_threshold():
    p = _probe([0.05, 0.95, 0.51, 0.3])
    ok = p.check([0.051, 0.949, 0.49, 0.3], thresholds=[0.8, 0.5])  # 0.51 -> 0.49 flips, but it is not confident
    assert ok.ok and ok.confident_items == 3 and ok.confident_flips == 0
    flip = p.check([0.05, 0.95, 0.51, 0.31 + 0.25], thresholds=[0.8, 0.5])
    assert not flip.ok and flip.confident_flips == 1 and "1 of 3 confident decisions flipped" in flip.describe()
    shift = p.check([0.08, 0.92, 0.54, 0.33], thresholds=[0.8, 0.5])
    assert not shift.ok and shift.confident_flips == 0 and shift.mean_abs_score_change == pytest.approx(0.03)


def test_a_shipped_variant_is_held_to_what_export_measured_not_to_a_small_fp32_sample(tmp_path):
    """The 2026-11-28 demo bundle: OpenVINO int8 moved scores by 0.0084 on export's 200 items but 0.0102 on the
    32 probe items, so a check against fp32 refused on every load the variant export had passed."""
    from suffice.serving.probe import ParityProbe

    fp32 = np.array([0.05, 0.95, 0.3, 0.7, 0.62])
    exported = fp32 + np.array([0.015, -0.015, 0.015, -0.015, 0.015])  # what export's int8 rule judged and passed
    p = _probe(fp32).with_variant_scores({"openvino-int8": exported})
    p.write(tmp_path / "probe.npz")
    back = ParityProbe.read(tmp_path / "probe.npz")
    np.testing.assert_array_equal(back.variant_scores["openvino-int8"], exported)

    here = exported + 0.002  # this CPU reproduces the exported variant
    ok = back.check(here, thresholds=[0.8, 0.5], variant="openvino-int8")
    assert ok.ok and ok.reference == "openvino-int8" and ok.mean_abs_score_change == pytest.approx(0.002)
    assert "from export's openvino-int8 scores" in ok.describe()
    # the same scores judged against fp32 (a variant export never measured, e.g. OpenVINO bf16) drift too far
    assert not back.check(here, thresholds=[0.8, 0.5], variant="openvino-bf16").ok
    assert back.check(here, thresholds=[0.8, 0.5], variant="openvino-bf16").reference == "fp32"
    # a CPU whose kernels move the exported variant is still caught: drift, or a flip of an fp32-confident item
    assert not back.check(exported + 0.03, thresholds=[0.8, 0.5], variant="openvino-int8").ok
    flipped = exported.copy()
    flipped[2] = 0.52  # 0.3 is confident in fp32 (>= 0.1 from 0.5 and 0.8): its decision must not change
    bad = back.check(flipped, thresholds=[0.8, 0.5], variant="openvino-int8")
    assert not bad.ok and bad.confident_flips == 1


def test_probe_refuses_variant_scores_of_the_wrong_shape():
    from suffice.serving.probe import ProbeError

    with pytest.raises(ProbeError, match="variant 'openvino-int8'"):
        _probe([0.1, 0.9]).with_variant_scores({"openvino-int8": [0.1]})


def test_damaged_probe_file_names_the_file(tmp_path):
    from suffice.serving.probe import ParityProbe, ProbeError

    (tmp_path / "probe.npz").write_bytes(b"not a zip")
    with pytest.raises(ProbeError, match="probe.npz.*re-export"):
        ParityProbe.read(tmp_path / "probe.npz")


@pytest.fixture(scope="module")
def bundle(tiny_bert_dir, tmp_path_factory):
    pytest.importorskip("optimum")
    from suffice.training.export import export_bundle

    root = tmp_path_factory.mktemp("probe")
    model_dir = make_model_dir(tiny_bert_dir, root / "model")
    return export_bundle(model_dir, root / "bundle", validation_items(40), probe_items=24)


@pytest.fixture
def copy(bundle, tmp_path):
    return shutil.copytree(bundle, tmp_path / "bundle")


def test_export_writes_a_checksummed_probe_with_the_fp32_scores(bundle):
    from suffice.serving.bundle import read_manifest, read_probe
    from suffice.serving.calibration import softmax
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    m = read_manifest(bundle)
    assert m.probe_file == "probe.npz" and "probe.npz" in m.files
    probe = read_probe(bundle, m)
    assert probe.input_ids.shape[0] == 24 and probe.input_ids.shape[1] <= m.max_length and probe.input_ids.dtype == np.int64
    fp32 = OnnxClassifier(bundle, RuntimeConfig(precision="fp32", backend="onnxruntime"))
    got = softmax(fp32.run({k: getattr(probe, k) for k in ("input_ids", "token_type_ids", "attention_mask")}), m.temperature)[:, 1]
    np.testing.assert_allclose(got, probe.scores, atol=1e-5)
    assert fp32.probe_check.ok and fp32.probe_check.items == 24


def test_export_records_the_shipped_int8_variant_and_serving_reproduces_it(bundle):
    from suffice.serving.bundle import read_manifest, read_probe
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    m = read_manifest(bundle)
    probe = read_probe(bundle, m)
    assert m.int8_model_file and "onnxruntime-int8" in probe.variant_scores
    assert set(probe.variant_scores) <= {"onnxruntime-int8", "openvino-int8", "openvino-int8-bf16"}
    int8 = OnnxClassifier(bundle, RuntimeConfig(precision="int8", backend="onnxruntime"))
    assert int8.probe_check.ok and int8.probe_check.reference == "onnxruntime-int8"
    assert int8.probe_check.mean_abs_score_change < 1e-6  # same CPU, same engine: export's scores exactly
    fp32 = OnnxClassifier(bundle, RuntimeConfig(precision="fp32", backend="onnxruntime"))
    assert fp32.probe_check.reference == "fp32"


def test_every_loaded_variant_is_checked_and_reported(bundle):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    s = SufficiencyScorer.load(bundle, ScorerConfig(backend="onnxruntime"))
    d = s.describe()
    assert s.variant == "onnxruntime-int8" and d["probe"]["ok"] and d["probe"]["items"] == 24
    assert "onnxruntime-int8" in repr(s) and d["cpu"]["isa_class"]


def test_a_drifting_variant_is_not_used_and_the_numbers_are_logged(bundle, caplog):
    from suffice.serving.backends import open_engine
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    class Drifting:  # int8 kernels that move every logit: what full-range int8 weights do on a CPU without VNNI
        def __init__(self, engine):
            self.engine, self.input_names, self.num_outputs = engine, engine.input_names, engine.num_outputs

        def run(self, feeds):
            return self.engine.run(feeds) + np.array([0.0, 0.8], np.float32)

    def factory(root, variant, intra, inter):
        engine = open_engine(root, variant, intra, inter)
        return Drifting(engine) if variant.precision == "int8" else engine

    with caplog.at_level(logging.WARNING, logger="suffice.runtime"):
        clf = OnnxClassifier(bundle, RuntimeConfig(backend="onnxruntime"), engine_factory=factory)
    assert clf.variant == "onnxruntime-fp32"
    assert [r["variant"] for r in clf.rejected] == ["onnxruntime-int8"] and "mean |score change|" in clf.rejected[0]["reason"]
    assert "onnxruntime-int8 drifts" in caplog.text and "allowed 0.01" in caplog.text


def test_no_usable_variant_is_an_error_with_the_numbers(bundle):
    from suffice.serving.backends import open_engine
    from suffice.serving.bundle import BundleError
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    class Broken:
        def __init__(self, engine):
            self.input_names, self.num_outputs, self.engine = engine.input_names, engine.num_outputs, engine

        def run(self, feeds):
            return -self.engine.run(feeds)

    with pytest.raises(BundleError, match="no model variant.*onnxruntime-int8: parity probe.*onnxruntime-fp32: parity probe"):
        OnnxClassifier(bundle, RuntimeConfig(backend="onnxruntime"), engine_factory=lambda *a: Broken(open_engine(*a)))


def test_bundle_without_probe_still_loads(copy):
    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving.bundle import MANIFEST_NAME

    data = json.loads((copy / MANIFEST_NAME).read_text())
    del data["probe_file"]
    del data["files"]["probe.npz"]
    rewrite_manifest(copy, data)
    (copy / "probe.npz").unlink()
    s = SufficiencyScorer.load(copy, ScorerConfig(backend="onnxruntime"))
    assert s.describe()["probe"] is None and s.score("Where is Paris?", ["Paris is in France."]).level


def test_tampered_or_missing_probe_is_refused(copy):
    from suffice.serving import ChecksumError, ScorerConfig, SufficiencyScorer
    from suffice.serving.bundle import BundleNotFoundError, ManifestError

    (copy / "probe.npz").write_bytes(b"garbage")
    with pytest.raises(ChecksumError, match="probe.npz"):
        SufficiencyScorer.load(copy)
    with pytest.raises(ManifestError, match="probe.npz.*re-export"):
        SufficiencyScorer.load(copy, ScorerConfig(verify_checksums=False))
    (copy / "probe.npz").unlink()
    with pytest.raises(BundleNotFoundError, match="probe.npz"):
        SufficiencyScorer.load(copy)
