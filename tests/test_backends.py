"""Runtime selection: which variant runs on which CPU (fed CpuInfo), OpenVINO optional, batches sorted by length."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from serving_support import ITEMS, make_model_dir, validation_items

AMX = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
VNNI_BF16 = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}  # Zen 4 / this project's AMD EPYC
VNNI = {"avx2", "avx512f", "avx512_vnni"}
AVX2 = {"avx2", "fma"}


def cpu(flags):
    from suffice.serving.cpu import CpuInfo

    return CpuInfo.from_flags("test CPU", flags, cores=2)


@pytest.mark.parametrize("flags, openvino, want", [
    (AMX, True, ["openvino-bf16", "onnxruntime-int8", "openvino-fp32", "onnxruntime-fp32"]),
    (AMX, False, ["onnxruntime-int8", "onnxruntime-fp32"]),
    (VNNI_BF16, True, ["onnxruntime-int8", "openvino-bf16", "openvino-fp32", "onnxruntime-fp32"]),
    (VNNI_BF16, False, ["onnxruntime-int8", "onnxruntime-fp32"]),
    (VNNI, True, ["onnxruntime-int8", "openvino-fp32", "onnxruntime-fp32"]),
    (AVX2, True, ["onnxruntime-int8", "onnxruntime-fp32", "openvino-fp32"]),
    (AVX2, False, ["onnxruntime-int8", "onnxruntime-fp32"]),
    (set(), True, ["onnxruntime-int8", "onnxruntime-fp32", "openvino-fp32"]),
])
def test_auto_ranks_the_variants_by_isa_class(flags, openvino, want):
    from suffice.serving.backends import rank_variants

    assert [v.name for v in rank_variants("model.onnx", "model.int8.onnx", cpu(flags), openvino=openvino)] == want


@pytest.mark.parametrize("flags, want", [
    (AMX, ["openvino-int8-bf16", "openvino-int8", "openvino-bf16", "onnxruntime-int8", "openvino-fp32", "onnxruntime-fp32"]),
    (VNNI_BF16, ["openvino-int8-bf16", "openvino-int8", "onnxruntime-int8", "openvino-bf16", "openvino-fp32", "onnxruntime-fp32"]),
    (VNNI, ["openvino-int8", "onnxruntime-int8", "openvino-fp32", "onnxruntime-fp32"]),
    (AVX2, ["onnxruntime-int8", "onnxruntime-fp32", "openvino-fp32", "openvino-int8"]),
])
def test_openvino_int8_ranks_by_isa_class(flags, want):
    from suffice.serving.backends import rank_variants

    ranked = rank_variants("model.onnx", "model.int8.onnx", cpu(flags), openvino=True, openvino_int8_model_file="model.int8.xml")
    assert [v.name for v in ranked] == want
    assert next(v.model_file for v in ranked if v.name == "openvino-int8") == "model.int8.xml"
    # without OpenVINO installed, or asked for ONNX Runtime, the bundle's OpenVINO int8 is not a candidate
    assert "openvino-int8" not in [v.name for v in rank_variants("model.onnx", "model.int8.onnx", cpu(flags), openvino=False,
                                                                   openvino_int8_model_file="model.int8.xml")]
    only = rank_variants("model.onnx", None, cpu(flags), openvino=True, precision="int8", openvino_int8_model_file="model.int8.xml")
    assert [v.name for v in only] == [v for v in want if v.startswith("openvino-int8")]
    # export's int8 rule refused (or never checked) the bf16 hint: that variant is not a candidate
    refused = rank_variants("model.onnx", "model.int8.onnx", cpu(flags), openvino=True, openvino_int8_model_file="model.int8.xml",
                            openvino_int8_bf16=False)
    assert [v.name for v in refused] == [v for v in want if v != "openvino-int8-bf16"]
    hinted = [v for v in ranked if v.hint]
    assert [(v.backend, v.precision, v.model_file, v.hint) for v in hinted] == (
        [("openvino", "int8", "model.int8.xml", "bf16")] if cpu(flags).bf16 else [])


def test_filters_and_bundles_without_int8():
    from suffice.serving.backends import rank_variants

    names = lambda **kw: [v.name for v in rank_variants("model.onnx", kw.pop("int8", "model.int8.onnx"), kw.pop("c", cpu(AMX)), openvino=True, **kw)]
    assert names(int8=None) == ["openvino-bf16", "openvino-fp32", "onnxruntime-fp32"]
    assert names(backend="onnxruntime") == ["onnxruntime-int8", "onnxruntime-fp32"]
    assert names(backend="openvino") == ["openvino-bf16", "openvino-fp32"]
    assert names(precision="fp32") == ["openvino-fp32", "onnxruntime-fp32"]
    assert names(precision="int8") == ["onnxruntime-int8"]
    with pytest.raises(ValueError, match="no bf16 units"):
        names(precision="bf16", c=cpu(AVX2))
    with pytest.raises(ValueError, match="no int8 model"):
        names(precision="int8", int8=None)


def test_openvino_asked_for_but_absent_names_the_extra():
    from suffice.serving.backends import BackendUnavailableError, rank_variants

    with pytest.raises(BackendUnavailableError, match=r"pip install 'suffice\[openvino\]'"):
        rank_variants("model.onnx", None, cpu(AMX), backend="openvino", openvino=False)


def test_bad_backend_or_precision_is_refused_by_the_config():
    from suffice.serving import ScorerConfig
    from suffice.serving.gates.retrieval import RetrievalGateConfig

    with pytest.raises(ValueError, match="backend='tensorrt'"):
        ScorerConfig(backend="tensorrt")
    with pytest.raises(ValueError, match="precision='fp16'"):
        RetrievalGateConfig(precision="fp16")
    with pytest.raises(ValueError, match="max_batch_tokens"):
        ScorerConfig(max_batch_tokens=0)


@pytest.fixture(scope="module")
def bundles(tiny_bert_dir, tmp_path_factory):
    pytest.importorskip("optimum")
    from suffice.training.export import export_bundle

    root = tmp_path_factory.mktemp("backends")
    suff = export_bundle(make_model_dir(tiny_bert_dir, root / "m1"), root / "suff", validation_items(30))
    gate = export_bundle(make_model_dir(tiny_bert_dir, root / "m2", task="retrieval_gate"), root / "gate", validation_items(30))
    return suff, gate


def test_amx_without_openvino_falls_back_to_int8_with_a_message(bundles, monkeypatch, caplog):
    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving import runtime

    monkeypatch.setattr(runtime, "openvino_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="suffice.runtime"):
        s = SufficiencyScorer.load(bundles[0], ScorerConfig(cpu=cpu(AMX)))
    assert s.variant == "onnxruntime-int8" and s.backend == "onnxruntime" and s.precision == "int8"
    assert "pip install 'suffice[openvino]'" in caplog.text and "pip install 'suffice[openvino]'" in s.describe()["notes"][0]
    assert "variant='onnxruntime-int8'" in repr(s) and "cpu='AMX'" in repr(s)


@pytest.mark.parametrize("flags", [VNNI, AVX2])
def test_vnni_and_avx2_pick_int8(bundles, flags):
    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving.backends import openvino_available
    from suffice.serving.bundle import read_manifest

    ov_int8 = openvino_available() and read_manifest(bundles[0]).openvino_int8_model_file
    want = "openvino-int8" if ov_int8 and flags is VNNI else "onnxruntime-int8"
    assert SufficiencyScorer.load(bundles[0], ScorerConfig(cpu=cpu(flags))).variant == want
    assert SufficiencyScorer.load(bundles[0], ScorerConfig(cpu=cpu(flags), backend="onnxruntime")).variant == "onnxruntime-int8"


def test_retrieval_gate_uses_the_same_selection(bundles, monkeypatch):
    from suffice.serving import runtime
    from suffice.serving.gates.retrieval import RetrievalGate, RetrievalGateConfig

    monkeypatch.setattr(runtime, "openvino_available", lambda: False)
    gate = RetrievalGate.load(bundles[1], RetrievalGateConfig(cpu=cpu(AMX)))
    assert gate.variant == "onnxruntime-int8" and "onnxruntime-int8" in repr(gate)
    assert RetrievalGate.load(bundles[1], RetrievalGateConfig(precision="fp32", backend="onnxruntime")).variant == "onnxruntime-fp32"


def test_batch_scoring_sorts_by_length_and_keeps_order(bundles):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    qs, ps = [q for q, _, _ in ITEMS], [p for _, p, _ in ITEMS]
    fp32 = SufficiencyScorer.load(bundles[0], ScorerConfig(precision="fp32", backend="onnxruntime", max_batch_tokens=200))
    one = [fp32.score(q, p).score for q, p in zip(qs, ps)]
    np.testing.assert_allclose([r.score for r in fp32.score_batch(qs, ps)], one, atol=1e-5)
    calls = []
    run = fp32._model.run
    fp32._model.run = lambda feeds: calls.append(feeds["input_ids"].shape) or run(feeds)
    fp32.score_batch(qs, ps)
    assert len(calls) > 1 and all(b * L <= 200 or b == 1 for b, L in calls)


def _has_ov_int8(bundle) -> bool:
    from suffice.serving.bundle import read_manifest

    return bool(read_manifest(bundle).openvino_int8_model_file)


@pytest.fixture
def openvino():
    return pytest.importorskip("openvino", reason="OpenVINO is optional: pip install 'suffice[openvino]'")


def test_openvino_fp32_matches_onnxruntime(bundles, openvino):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    qs, ps = [q for q, _, _ in ITEMS], [p for _, p, _ in ITEMS]
    ov = SufficiencyScorer.load(bundles[0], ScorerConfig(backend="openvino", precision="fp32"))
    ort = SufficiencyScorer.load(bundles[0], ScorerConfig(backend="onnxruntime", precision="fp32"))
    assert ov.variant == "openvino-fp32" and ov.describe()["probe"]["ok"]
    np.testing.assert_allclose([r.score for r in ov.score_batch(qs, ps)], [r.score for r in ort.score_batch(qs, ps)], atol=1e-4)


def test_openvino_bf16_on_a_bf16_cpu_is_probe_checked(bundles, openvino):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    s = SufficiencyScorer.load(bundles[0], ScorerConfig(backend="openvino", cpu=cpu(AMX)))
    d = s.describe()
    # a variant runs when it reproduces the probe; otherwise it is skipped with the numbers and the next one runs
    tried = [r["variant"] for r in d["rejected_variants"]] + [s.variant]
    from suffice.serving.bundle import read_manifest

    hinted = read_manifest(bundles[0]).parity.openvino_int8_bf16_passed
    order = [v for v in ("openvino-int8-bf16", "openvino-int8", "openvino-bf16", "openvino-fp32")
             if (v != "openvino-int8" or _has_ov_int8(bundles[0])) and (v != "openvino-int8-bf16" or hinted)]
    assert tried == order[: len(tried)] and d["probe"]["ok"]
    assert all("parity probe" in r["reason"] for r in d["rejected_variants"])
    assert s.score("Where is the Eiffel Tower?", ["The Eiffel Tower is in Paris."]).level


def test_readyz_names_the_variants(bundles, monkeypatch):
    pytest.importorskip("fastapi")
    from test_service_support import ServiceServer

    from suffice.serving import ScorerConfig, SufficiencyScorer, runtime
    from suffice.serving.gates.retrieval import RetrievalGate, RetrievalGateConfig
    from suffice.serving.service import create_app, load_service_config

    monkeypatch.setattr(runtime, "openvino_available", lambda: False)
    scorer = SufficiencyScorer.load(bundles[0], ScorerConfig(cpu=cpu(VNNI)))
    gate = RetrievalGate.load(bundles[1], RetrievalGateConfig(backend="onnxruntime", precision="fp32"))
    app = create_app(load_service_config(None), scorer, retrieval_gate=gate, api_keys=[], upstream_api_key=None)
    with ServiceServer(app) as s, s.client() as c:
        body = c.get("/readyz").json()
    assert body["variant"] == "onnxruntime-int8" and body["retrieval_gate_variant"] == "onnxruntime-fp32"
