"""The lean OpenVINO engine: int8 embedding tables kept int8, inputs padded to length buckets, the int8 IR's
bf16 hint used only where export's int8 rule passed it. Skipped without OpenVINO (an optional extra)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from serving_support import ITEMS, make_model_dir, rewrite_manifest, validation_items

ov = pytest.importorskip("openvino", reason="OpenVINO is optional: pip install 'suffice[openvino]'")

VNNI_BF16 = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}


def cpu(flags):
    from suffice.serving.cpu import CpuInfo

    return CpuInfo.from_flags("test CPU", flags, cores=2)


def embedding_model(rows: int = 50, dim: int = 8, scale_shape=None):
    """ids -> Gather(Convert(int8 table) * scale): the shape NNCF gives an int8 embedding table."""
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)
    table = rng.integers(-127, 128, size=(rows, dim), dtype=np.int8)
    scale = rng.uniform(0.001, 0.01, size=scale_shape or (rows, 1)).astype(np.float32)
    ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    deq = ops.multiply(ops.convert(ops.constant(table), ov.Type.f32), ops.constant(scale))
    out = ops.gather(deq, ids, ops.constant(np.int64(0)))
    return ov.Model([out], [ids], "emb"), table.astype(np.float32) * scale


@pytest.mark.parametrize("scale_shape", [(50, 1), (1, 1)])
def test_int8_tables_are_gathered_before_dequantising(scale_shape):
    from suffice.serving.backends import keep_int8_tables

    model, dense = embedding_model(scale_shape=scale_shape)
    assert keep_int8_tables(model) == 1
    gathers = [op for op in model.get_ordered_ops() if op.get_type_name() == "Gather"]
    assert any(g.input_value(0).get_element_type() == ov.Type.i8 for g in gathers)
    ids = np.array([[3, 0, 49, 3]], np.int64)
    got = ov.Core().compile_model(model, "CPU")({"input_ids": ids})[0]
    np.testing.assert_array_equal(got, dense[ids])  # the same int8 value times the same scale
    assert keep_int8_tables(model) == 0  # nothing left to rewrite; graphs without such a table are untouched


def test_per_column_scales_are_left_alone():
    from suffice.serving.backends import keep_int8_tables

    model, _ = embedding_model(scale_shape=(1, 8))
    assert keep_int8_tables(model) == 0


@pytest.fixture(scope="module")
def bundle(tiny_bert_dir, tmp_path_factory):
    pytest.importorskip("optimum")
    from suffice.training.export import export_bundle

    root = tmp_path_factory.mktemp("ov-engine")
    return export_bundle(make_model_dir(tiny_bert_dir, root / "m"), root / "b", validation_items(30))


def test_inputs_are_padded_to_length_buckets_without_changing_logits(bundle):
    from suffice.serving.backends import OPENVINO_LENGTH_BUCKET, OpenVinoEngine
    from suffice.serving.probe import ParityProbe

    probe = ParityProbe.read(bundle / "probe.npz")
    plain = OpenVinoEngine(bundle / "model.onnx", "fp32", length_bucket=0)
    padded = OpenVinoEngine(bundle / "model.onnx", "fp32")
    seen = []
    infer = padded.compiled.create_infer_request()
    padded._local.request = type("Spy", (), {"infer": lambda self, f: seen.append(f["input_ids"].shape) or infer.infer(f),
                                              "get_output_tensor": lambda self, i: infer.get_output_tensor(i)})()
    for _, feeds in probe.batches(batch_size=3):
        np.testing.assert_allclose(padded.run(feeds), plain.run(feeds), atol=1e-5)
    assert seen and all(L % OPENVINO_LENGTH_BUCKET == 0 for _, L in seen)
    assert {L for _, L in seen} != {int(w) for w in probe.lengths}  # the probe's widths were padded, not fed as they are


def _with_bf16_verdict(bundle, tmp_path, passed):
    b = tmp_path / f"b-{passed}"
    shutil.copytree(bundle, b)
    m = json.loads((b / "suffice.json").read_text())
    m["parity"]["openvino_int8"]["bf16_hint"] = {"passed": passed} if passed is not None else None
    if passed is None:
        del m["parity"]["openvino_int8"]["bf16_hint"]
    rewrite_manifest(b, m)
    return b


@pytest.mark.parametrize("passed", [True, False, None])
def test_int8_bf16_hint_is_tried_only_where_export_passed_it(bundle, tmp_path, passed):
    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving.bundle import read_manifest

    if not read_manifest(bundle).openvino_int8_model_file:
        pytest.skip("this bundle has no OpenVINO int8 model (nncf is not installed)")
    b = _with_bf16_verdict(bundle, tmp_path, passed)
    s = SufficiencyScorer.load(b, ScorerConfig(cpu=cpu(VNNI_BF16), precision="int8", backend="openvino"))
    d = s.describe()
    tried = [r["variant"] for r in d["rejected_variants"]] + [s.variant]
    want = ["openvino-int8-bf16", "openvino-int8"] if passed else ["openvino-int8"]
    assert tried == want[: len(tried)] and d["probe"]["ok"]
    if s.variant == "openvino-int8-bf16":
        assert s.precision == "int8" and s.backend == "openvino" and s._model.variant_info.hint == "bf16"
    assert s.score(*ITEMS[0][:2]).level


def test_export_records_the_bf16_hint_verdict(bundle):
    from suffice.serving.bundle import read_manifest
    from suffice.serving.cpu import detect

    ov_parity = read_manifest(bundle).parity.openvino_int8.to_dict()
    if not ov_parity.get("passed"):
        pytest.skip(f"no OpenVINO int8 model in this bundle: {ov_parity.get('refused')}")
    hint = ov_parity["bf16_hint"]
    if detect().bf16:
        assert hint["items"] == 30 and ("refused" in hint) != hint["passed"]
        assert "mean_abs_score_change" in hint if hint["passed"] else hint["refused"].endswith("not used by serving")
    else:
        assert hint["passed"] is False and "has no bf16 units" in hint["refused"]


def test_trim_heap_is_harmless():
    from suffice.serving.backends import trim_heap

    assert trim_heap() is None
