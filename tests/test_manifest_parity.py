"""The manifest's parity record is typed (ParityReport) and keeps the JSON layout every bundle has had."""

from __future__ import annotations

import dataclasses

import pytest

from suffice.serving.bundle import BundleManifest, ManifestError, ParityReport, VariantCheck

OLD_LAYOUT = {
    "fp32_vs_torch_max_abs_diff": 2e-6, "fp32_vs_torch_items": 40, "graph_optimization": "ORT basic", "quantization": "dynamic int8",
    "int8_items": 40, "int8_agreement": 0.975, "int8_rule": "confident agreement >= 0.99",
    "openvino_int8": {"items": 40, "max_abs_logit_diff": 0.1, "passed": True, "quantization": "nncf",
                      "bf16_hint": {"items": 40, "passed": False, "refused": "int8_score_shift: not used by serving"}},
    "benchmark_quantization": "a note a benchmark wrote",
}


def test_the_old_layout_round_trips_unchanged():
    report = ParityReport.from_dict(OLD_LAYOUT)
    assert report.to_dict() == OLD_LAYOUT
    assert report.int8["agreement"] == 0.975 and report.openvino_int8.numbers["quantization"] == "nncf"
    assert report.openvino_int8.passed and not report.openvino_int8_bf16_passed
    assert report.other == {"benchmark_quantization": "a note a benchmark wrote"}
    hinted = dataclasses.replace(report, openvino_int8=dataclasses.replace(report.openvino_int8, bf16_hint=VariantCheck(passed=True)))
    assert hinted.openvino_int8_bf16_passed


def test_manifests_with_and_without_parity_load(tmp_path):
    base = {"task": "sufficiency", "id2label": {"0": "insufficient", "1": "sufficient"}, "positive_label": "sufficient",
            "max_length": 64, "long_context_strategy": "select", "temperature": 1.0, "thresholds": {}, "base_model": "x",
            "files": {"model.onnx": "0", "tokenizer.json": "0"}}
    assert BundleManifest.from_dict(base).parity == ParityReport()  # bundles from before the parity record
    m = BundleManifest.from_dict({**base, "parity": OLD_LAYOUT})
    assert m.to_dict()["parity"] == OLD_LAYOUT and BundleManifest.from_dict(m.to_dict()) == m
    with pytest.raises(ManifestError, match="parity.openvino_int8 must be a JSON object"):
        BundleManifest.from_dict({**base, "parity": {"openvino_int8": 3}})
    with pytest.raises(ManifestError, match="parity must be a ParityReport"):
        BundleManifest(**{**BundleManifest.from_dict(base).__dict__, "parity": {"quantization": None}})
