"""Export: tiny LoRA BERT -> bundle, parity checks, round trip, failures leave nothing, registry."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serving_support import ITEMS, make_model_dir, torch_scores, validation_items

pytest.importorskip("optimum")


@pytest.fixture(scope="module")
def exported(tiny_bert_dir, tmp_path_factory):
    from suffice.training.export import export_bundle

    root = tmp_path_factory.mktemp("export")
    model_dir = make_model_dir(tiny_bert_dir, root / "model")
    bundle = export_bundle(model_dir, root / "bundle", validation_items(40))
    return model_dir, bundle


def test_bundle_is_self_describing(exported):
    from suffice.serving.bundle import read_manifest, sha256_file

    model_dir, bundle = exported
    m = read_manifest(bundle)
    ov = ["model.int8.bin", "model.int8.xml"] if m.openvino_int8_model_file else []  # only where nncf is installed
    assert sorted(p.name for p in bundle.iterdir()) == sorted(ov + ["model.int8.onnx", "model.onnx", "probe.npz", "suffice.json", "tokenizer.json"])
    assert m.task == "sufficiency" and m.id2label == {0: "insufficient", 1: "sufficient"} and m.probe_file == "probe.npz"
    assert m.temperature == 1.5 and m.max_length == 128 and m.long_context_strategy == "select"
    assert m.thresholds == {"sufficient": 0.8, "partial": 0.5}
    assert all(sha256_file(bundle / f) == h for f, h in m.files.items())
    assert m.parity.fp32_vs_torch_max_abs_diff <= 1e-4
    assert m.parity.int8["confident_agreement"] >= 0.99 and m.parity.int8["mean_abs_score_change"] <= 0.01
    assert 0 <= m.parity.int8["agreement"] <= 1 and "rule" in m.parity.int8
    assert not [p for p in bundle.parent.iterdir() if p.name.startswith(".suffice-export-")]


def test_round_trip_matches_training_side_model(exported):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    model_dir, bundle = exported
    pairs = [(q, p) for q, p, _ in ITEMS]
    want = torch_scores(model_dir, pairs, temperature=1.5)
    fp32 = SufficiencyScorer.load(bundle, ScorerConfig(precision="fp32")).score_batch([q for q, _ in pairs], [p for _, p in pairs])
    np.testing.assert_allclose([r.score for r in fp32], want, atol=1e-5)
    int8 = SufficiencyScorer.load(bundle).score_batch([q for q, _ in pairs], [p for _, p in pairs])
    np.testing.assert_allclose([r.score for r in int8], want, atol=2e-2)


def test_openvino_int8_is_made_checked_by_the_int8_rule_and_loaded(exported):
    pytest.importorskip("nncf", reason="the OpenVINO int8 model needs nncf: pip install 'suffice[openvino]'")
    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving.bundle import read_manifest

    model_dir, bundle = exported
    m = read_manifest(bundle)
    ov = m.parity.openvino_int8
    assert ov.passed and ov.numbers["mean_abs_score_change"] <= 0.01 and ov.numbers["confident_agreement"] >= 0.99, ov
    assert "nncf" in ov.numbers["quantization"] and "preset mixed" in ov.numbers["quantization"] and ov.numbers["items"] == 40
    assert m.openvino_int8_model_file == "model.int8.xml" and {"model.int8.xml", "model.int8.bin"} <= set(m.files)
    pairs = [(q, p) for q, p, _ in ITEMS]
    s = SufficiencyScorer.load(bundle, ScorerConfig(backend="openvino", precision="int8"))
    # the bf16 hint around the int8 layers is tried first where export's rule passed it and the CPU has bf16 units
    assert s.variant in ("openvino-int8", "openvino-int8-bf16") and s.describe()["probe"]["ok"]
    assert s.variant == "openvino-int8" or (ov.bf16_hint is not None and ov.bf16_hint.passed)
    want = torch_scores(model_dir, pairs, temperature=1.5)
    np.testing.assert_allclose([r.score for r in s.score_batch([q for q, _ in pairs], [p for _, p in pairs])], want, atol=2e-2)


def test_refused_openvino_int8_is_left_out_with_the_reason(exported, tmp_path, monkeypatch):
    pytest.importorskip("nncf", reason="the OpenVINO int8 model needs nncf: pip install 'suffice[openvino]'")
    from suffice.serving.bundle import read_manifest
    from suffice.training.export import export_bundle, parity

    model_dir, _ = exported
    monkeypatch.setattr(parity, "openvino_int8_parity", lambda *a, **k: {"passed": False, "refused": "int8_score_shift: moved by 0.02"})
    b = export_bundle(model_dir, tmp_path / "b", validation_items(10))
    m = read_manifest(b)
    assert m.openvino_int8_model_file is None and not (b / "model.int8.xml").exists() and not (b / "model.int8.bin").exists()
    assert m.parity.openvino_int8.refused == "int8_score_shift: moved by 0.02" and "nncf" in m.parity.openvino_int8.numbers["quantization"]
    assert "model.int8.bin" not in m.files and m.int8_model_file == "model.int8.onnx"


def test_export_without_nncf_ships_the_rest_and_says_why(exported, tmp_path, monkeypatch):
    from suffice.training.export import ExportError, export_bundle, steps

    model_dir, _ = exported
    monkeypatch.setattr(steps, "nncf_missing", lambda: "nncf not installed: pip install 'suffice[openvino]' to add the OpenVINO int8 model")
    b = export_bundle(model_dir, tmp_path / "b", validation_items(10))
    m = json.loads((b / "suffice.json").read_text())
    assert m["openvino_int8_model_file"] is None and m["int8_model_file"] == "model.int8.onnx"
    assert m["parity"]["openvino_int8"] == {"passed": False, "refused": "nncf not installed: pip install 'suffice[openvino]' to add the OpenVINO int8 model"}
    with pytest.raises(ExportError, match=r"openvino_int8=True but nncf not installed: pip install 'suffice\[openvino\]'"):
        export_bundle(model_dir, tmp_path / "b2", validation_items(10), openvino_int8=True)
    assert not (tmp_path / "b2").exists()


def refuse_first(monkeypatch, times: int) -> list[str]:
    """Make the ONNX Runtime int8 rule refuse its first ``times`` calls (score shift); returns the recipes it saw."""
    from suffice.training.export import ParityError, parity

    seen, real = [], parity.int8_verdict

    def verdict(out, pc, remedy=parity.ORT_INT8_REMEDY):
        if remedy != parity.ORT_INT8_REMEDY:  # the OpenVINO int8 model's rule: not this test's
            return real(out, pc, remedy)
        seen.append(out["int8_mean_abs_score_change"])
        if len(seen) <= times:
            return ParityError("int8 moves the calibrated score by 0.0140 on average (allowed 0.01)", check="int8_score_shift",
                               largest_difference=0.014, tolerance=0.01)
        return real(out, pc, remedy)

    monkeypatch.setattr(parity, "int8_verdict", verdict)
    return seen


def test_refused_ort_int8_is_made_again_with_the_output_projections_in_fp32(exported, tmp_path, monkeypatch):
    from suffice.serving.bundle import read_manifest
    from suffice.training.export import export_bundle
    from suffice.training.export.steps import ORT_INT8_KEEP_FP32

    model_dir, _ = exported
    seen = refuse_first(monkeypatch, 1)
    b = export_bundle(model_dir, tmp_path / "b", validation_items(10), openvino_int8=False)
    m = read_manifest(b)
    assert len(seen) == 2 and m.int8_model_file == "model.int8.onnx" and "model.int8.onnx" in m.files
    q, first = m.parity.quantization, m.parity.int8["first_recipe"]
    assert "fp32 kept for 4 nodes" in q and str(list(ORT_INT8_KEEP_FP32)) in q, q  # tiny BERT: 2 layers x (attention + FFN) outputs
    assert "fp32 kept" not in first["quantization"] and first["refused"].startswith("int8_score_shift: ") and "refused" not in m.parity.int8
    assert first["mean_abs_score_change"] == seen[0] and m.parity.int8["mean_abs_score_change"] == seen[1]
    assert {"macro_f1_fp32", "macro_f1_int8", "auroc_fp32", "auroc_int8"} <= set(first) & set(m.parity.int8)  # labelled items


def test_ort_int8_refused_by_both_recipes_is_left_out_naming_both(exported, tmp_path, monkeypatch):
    from suffice.serving.bundle import read_manifest
    from suffice.training.export import ParityError, export_bundle
    from suffice.training.export.bundle import export_shipping_what_passes

    model_dir, _ = exported
    seen = refuse_first(monkeypatch, 99)
    b, refused = export_shipping_what_passes(model_dir, tmp_path / "b", validation_items(10), openvino_int8=False)
    m = read_manifest(b)
    assert len(seen) == 2 and m.int8_model_file is None and not (b / "model.int8.onnx").exists()
    assert refused.startswith("int8_score_shift: ") and "and the first recipe's int8_score_shift: " in refused, refused
    assert m.parity.quantization is None and "fp32 kept for" in m.parity.int8["quantization"]
    with pytest.raises(ParityError, match="int8 moves the calibrated score"):  # not optional: the second refusal raises
        export_bundle(model_dir, tmp_path / "b2", validation_items(10), openvino_int8=False, probe_items=0)
    assert not (tmp_path / "b2").exists()


def test_failed_parity_raises_typed_error_and_leaves_no_bundle(exported, tmp_path):
    from suffice.training.export import ParityConfig, ParityError, export_bundle

    model_dir, _ = exported
    out = tmp_path / "never"
    with pytest.raises(ParityError) as e:
        export_bundle(model_dir, out, validation_items(10), parity=ParityConfig(atol=1e-12))
    assert e.value.check == "fp32_vs_torch" and e.value.largest_difference > 1e-12
    assert "largest" in str(e.value) or "differ" in str(e.value)
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name != "mlruns"] == []


def test_existing_out_dir_is_refused(exported):
    from suffice.training.export import ExportError, export_bundle

    model_dir, bundle = exported
    with pytest.raises(ExportError, match="already exists"):
        export_bundle(model_dir, bundle)


def test_adapter_only_dir_is_merged(tiny_bert_dir, tmp_path):
    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.training.export import export_bundle

    model_dir = make_model_dir(tiny_bert_dir, tmp_path / "model")
    want = torch_scores(model_dir, [(q, p) for q, p, _ in ITEMS[:3]], temperature=1.5)
    (model_dir / "model.safetensors").unlink()  # only the adapter is left: export must merge it into the base
    (model_dir / "config.json").unlink()
    bundle = export_bundle(model_dir, tmp_path / "bundle", validation_items(10), quantize=False)
    assert json.loads((bundle / "suffice.json").read_text())["int8_model_file"] is None
    got = SufficiencyScorer.load(bundle, ScorerConfig(precision="fp32")).score_batch([q for q, _, _ in ITEMS[:3]], [p for _, p, _ in ITEMS[:3]])
    np.testing.assert_allclose([r.score for r in got], want, atol=1e-4)


def test_register_resolve_promote_round_trip(exported, tmp_path):
    import mlflow

    from suffice.serving import SufficiencyScorer
    from suffice.training.export import registry
    from suffice.training.paths import default_tracking_uri

    _, bundle = exported
    local = tmp_path / "b"
    import shutil

    shutil.copytree(bundle, local)
    mlflow.set_tracking_uri(default_tracking_uri())
    exp = mlflow.create_experiment("train-test", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=exp) as run:
        pass
    name, version = registry.register_bundle(local, run_id=run.info.run_id)
    assert name == "suffice-sufficiency" and version == "1"
    path = registry.resolve_bundle(f"models:/{name}/{version}")
    manifest = json.loads((path / "suffice.json").read_text())
    assert manifest["model_version"] == "1" and manifest["mlflow_run_id"] == run.info.run_id
    assert SufficiencyScorer.load(path).score("Where is the Eiffel Tower?", ["It is in Paris."]).level in ("sufficient", "partial", "insufficient")
    assert registry.main(["--name", name, "--version", version, "--alias", "production"]) == 0
    assert registry.resolve_bundle(f"models:/{name}@production") .is_dir()
    with pytest.raises(registry.RegistryError):
        registry.resolve_bundle("models:/suffice-sufficiency/")


def test_cli_exports_and_registers(tiny_bert_dir, tmp_path, capsys):
    from suffice.training import export
    from suffice.training.export import registry

    model_dir = make_model_dir(tiny_bert_dir, tmp_path / "model")
    data = tmp_path / "val.jsonl"
    data.write_text("\n".join(json.dumps({**d, "split": "validation"}) for d in validation_items(12)))
    assert export.main(["--model", str(model_dir), "--out", str(tmp_path / "bundle"), "--validation-data", str(data), "--register"]) == 0
    out = capsys.readouterr().out
    assert "models:/suffice-sufficiency/1" in out
    assert registry.resolve_bundle("models:/suffice-sufficiency/1").is_dir()
    assert export.main(["--model", str(tmp_path / "nope"), "--out", str(tmp_path / "b2")]) == 2


def test_parity_subset_smaller_than_validation_set(exported, tmp_path):
    from suffice.training.export import ParityConfig, export_bundle

    model_dir, _ = exported
    b = export_bundle(model_dir, tmp_path / "b", validation_items(13), parity=ParityConfig(parity_items=5, batch_size=4))
    p = json.loads((b / "suffice.json").read_text())["parity"]
    assert p["fp32_vs_torch_items"] == 5 and p["int8_items"] == 13


def test_validation_data_reads_items_and_gate_threads(tmp_path):
    """--validation-data takes canonical items or retrieval-gate threads (packed as the gate packs them)."""
    from suffice.training.export import ExportError, load_validation_jsonl

    f = tmp_path / "v.jsonl"
    thread = {"id": "t1", "label": "SKIP", "messages": [{"role": "user", "content": "Plans?"},
                                                        {"role": "assistant", "content": "Basic $5."},
                                                        {"role": "user", "content": "Thanks!"}]}
    item = {"question": "Q?", "passages": ["ctx"], "label": 1, "split": "train"}
    f.write_text(json.dumps(thread) + "\n" + json.dumps(item) + "\n")
    got = load_validation_jsonl(f, None)
    assert got[0] == {"question": "Thanks!", "label": 1, "passages": [{"title": "user", "text": "Plans?"},
                                                                       {"title": "assistant", "text": "Basic $5."}]}
    assert got[1]["question"] == "Q?" and len(load_validation_jsonl(f, "validation")) == 1  # the train item is left out
    f.write_text(json.dumps({**thread, "label": "MAYBE"}) + "\n")
    with pytest.raises(ExportError, match="line 1, field 'label': unknown label 'MAYBE'"):
        load_validation_jsonl(f, None)
    f.write_text(json.dumps({**thread, "messages": thread["messages"][:2]}) + "\n")
    with pytest.raises(ExportError, match="last message must be the user's new turn"):
        load_validation_jsonl(f, None)


def test_cli_ships_what_passes_when_onnx_runtime_int8_is_refused(exported, tmp_path, capsys, monkeypatch):
    """`suffice export` as training's `export: true`: a refused ONNX Runtime int8 model leaves the bundle
    without it (fp32, plus OpenVINO int8 when that passes on its own) instead of no bundle at all, in one
    export pass (the model is converted once, not again without int8), the refusal in the manifest."""
    from suffice.serving import SufficiencyScorer
    from suffice.serving.bundle import read_manifest
    from suffice.training import export
    from suffice.training.export import bundle as bundle_mod

    conversions = []
    real_to_onnx = bundle_mod.to_onnx
    monkeypatch.setattr(bundle_mod, "to_onnx", lambda *a, **k: conversions.append(1) or real_to_onnx(*a, **k))

    model_dir, _ = exported
    data = tmp_path / "val.jsonl"
    data.write_text("\n".join(json.dumps({**d, "split": "validation"}) for d in validation_items(12)))
    out = tmp_path / "bundle"
    # no int8 model moves scores by less than 1e-9 on average: the rule refuses it
    assert export.main(["--model", str(model_dir), "--out", str(out), "--validation-data", str(data),
                        "--max-mean-score-shift", "1e-9"]) == 0
    err = capsys.readouterr().err
    assert "ONNX Runtime int8 refused by its parity check (int8_score_shift" in err and "ships without it" in err
    m = read_manifest(out)
    assert m.int8_model_file is None and not (out / "model.int8.onnx").exists() and (out / m.model_file).is_file()
    assert m.parity.int8["refused"].startswith("int8_score_shift") and len(conversions) == 1
    assert m.parity.quantization is None and m.parity.int8["quantization"].startswith("dynamic-int8")  # what was tried, not shipped
    assert SufficiencyScorer.load(out).score("Where is the Eiffel Tower?", ["It is in Paris."]).level in ("sufficient", "partial", "insufficient")
