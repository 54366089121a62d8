"""The training path end to end on a tiny random BERT (no downloads): model directory contract,
merged-vs-adapter parity, calibration, the MLflow run (params, metrics, artifacts) and the
registered version, the evaluated rows as MLflow datasets, the headline/ metrics and the registered
bundle versions (signature, input example, headline tags); full fine-tuning and three levels; the retrieval-gate data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from suffice.training.fit.features import TrainingFeature
from suffice.training.fit.run import run
from suffice.training.fit.config import build_train_config

REPO = Path(__file__).resolve().parent.parent
FIXTURE = str(REPO / "tests" / "fixtures" / "train20.jsonl")


def tiny_config(base: Path, out: Path, *extra: str):
    return build_train_config(None, [
        f"--train_file={FIXTURE}", f"--base_model={base}", f"--output_dir={out}", "--max_length=64",
        "--per_device_train_batch_size=4", "--num_train_epochs=2", "--lora.r=4", "--lora.alpha=8",
        "--torch_threads=1", "--log_every_steps=1", "--learning_rate=1e-3", *extra,
    ])


def _pack(model_dir: Path, rows):
    from suffice.serving.packing import ContextPacker
    from suffice.training.fit.model import load_tokenizer

    packer = ContextPacker(load_tokenizer(model_dir), max_length=64, strategy="select")
    feeds, _ = packer.pack_batch([r["question"] for r in rows], [r["passages"] for r in rows])
    return feeds


@pytest.fixture(scope="module")
def trained(tiny_bert_dir, tmp_path_factory):
    """One LoRA run shared by the tests below, with its own MLflow store (module scope runs
    before the per-test isolation, so it isolates itself)."""
    root = tmp_path_factory.mktemp("trained")
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SUFFICE_MLRUNS_DIR", str(root / "mlruns"))
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        (root / "mlruns").mkdir()
        summary = run(tiny_config(tiny_bert_dir, root / "model"))
    return root / "model", summary, uri


def test_lora_run_writes_the_model_directory_contract(trained, tiny_bert_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    out, summary, _ = trained
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "adapter/adapter_config.json",
                 "adapter/adapter_model.safetensors", "suffice_model.json", "train_config.yaml"):
        assert (out / name).is_file(), name
    meta = json.loads((out / "suffice_model.json").read_text())
    assert meta["task"] == "sufficiency" and meta["label_scheme"] == "binary"
    assert meta["id2label"] == {"0": "insufficient", "1": "sufficient"} and meta["positive_label"] == "sufficient"
    assert meta["max_length"] == 64 and meta["long_context_strategy"] == "select"
    assert meta["calibration"]["method"] == "temperature" and meta["calibration"]["temperature"] > 0
    assert meta["thresholds"] == {"sufficient": 0.8, "partial": 0.5}
    assert meta["label_source"] == "autorater" and len(meta["data_hash"]) == 16
    assert meta["mlflow"]["registered_model"] == "suffice-sufficiency-model" and meta["mlflow"]["version"] == "1"  # export: false
    assert set(meta["metrics"]["test"]) >= {"accuracy", "macro_f1", "auroc", "ece", "kappa_autorater"}
    json.dumps(meta, allow_nan=False)  # strict JSON: NaN became null

    # the merged model gives the adapter model's logits (head restored from modules_to_save)
    rows = [json.loads(line) for line in open(FIXTURE)][:6]
    feeds = {k: torch.from_numpy(v) for k, v in _pack(out, rows).items()}
    merged = AutoModelForSequenceClassification.from_pretrained(out).eval()
    base = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dir, num_labels=2)
    adapted = PeftModel.from_pretrained(base, out / "adapter").eval()
    with torch.no_grad():
        a, b = merged(**feeds).logits, adapted(**feeds).logits
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    assert merged.config.id2label == {0: "insufficient", 1: "sufficient"}


def test_training_moves_the_weights_and_keeps_the_best_epoch(trained, tiny_bert_dir):
    from safetensors.torch import load_file

    out, summary, _ = trained
    before = load_file(tiny_bert_dir / "model.safetensors")
    after = load_file(out / "model.safetensors")
    key = "encoder.layer.0.attention.self.query.weight"
    assert not np.allclose(before[key].numpy(), after[f"bert.{key}"].numpy())  # LoRA merged in
    assert len(summary["history"]) == 2 and summary["best_epoch"] in (1, 2)
    assert (out / "checkpoints" / "best-trainable.safetensors").is_file()
    assert len(list((out / "checkpoints").glob("step-*"))) == 2  # one per epoch, limit 2


def test_mlflow_run_has_params_metrics_artifacts_and_a_registered_version(trained):
    from mlflow.tracking import MlflowClient

    out, summary, uri = trained
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run_ = client.get_run(summary["mlflow_run_id"])
    params = run_.data.params
    for key in ("lora.r", "learning_rate", "max_length", "long_context_strategy", "calibration.sufficient", "git_commit",
                "data_hash", "label_source", "effective_batch_size", "train_file"):
        assert key in params, key
    assert params["lora.r"] == "4"
    metrics = run_.data.metrics
    for key in ("val_loss", "val_accuracy", "val_macro_f1", "val_auroc", "val_ece", "val_source_macro_f1", "val_source_auroc", "val_temperature", "test_macro_f1",
                "test_auroc", "test_ece", "test_squad2_macro_f1", "test_qed_accuracy", "test_baseline_tfidf_lr_macro_f1",
                "test_baseline_keyword_coverage_auroc", "test_baseline_answer_in_context_accuracy", "train_loss"):
        assert key in metrics, key
    assert [m.step for m in client.get_metric_history(run_.info.run_id, "val_loss")] == [1, 2]
    assert 0.0 <= metrics["val_source_macro_f1"] <= 1.0  # the mean over the validation sources (early stopping can use it)

    def listing(path=""):
        out = []
        for f in client.list_artifacts(run_.info.run_id, path):
            out += listing(f.path) if f.is_dir else [f.path]
        return out

    files = set(listing())
    for name in ("resolved_config.yaml", "evaluation/test_confusion_matrix.png", "evaluation/test_reliability.png",
                 "evaluation/test_precision_recall.png", "evaluation/test_selective_accuracy.png", "evaluation/test_metrics.json",
                 "model/model.safetensors", "model/config.json", "model/suffice_model.json", "model/tokenizer.json",
                 "model/adapter/adapter_model.safetensors"):
        assert name in files, name
    assert not any(f.startswith("model/checkpoints") for f in files)

    mv = client.get_model_version("suffice-sufficiency-model", "1")  # the trained-model folder; export: false, so no bundle version
    assert mv.run_id == run_.info.run_id and mv.source.endswith("/model")
    assert client.search_model_versions("name='suffice-sufficiency'") == []
    for tag in ("base_model", "label_source", "data_hash", "test_macro_f1"):
        assert tag in mv.tags, tag
    assert mv.tags["label_source"] == "autorater"
    assert run_.info.status == "FINISHED"


def test_run_logs_the_evaluated_rows_as_datasets_and_the_headline_metrics(trained):
    """The runs table and the version comparison need: the evaluated rows as MLflow datasets (contexts
    validation and test, digest, rows per source, no passage text) and the headline/ metrics."""
    from mlflow.tracking import MlflowClient

    _, summary, uri = trained
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run_ = client.get_run(summary["mlflow_run_id"])
    inputs = {next(t.value for t in d.tags if t.key == "mlflow.data.context"): d for d in run_.inputs.dataset_inputs}
    assert set(inputs) == {"validation", "test"}
    rows = [json.loads(line) for line in open(FIXTURE)]
    for split, d in inputs.items():
        tags = {t.key: t.value for t in d.tags}
        expected = {}
        for r in rows:
            if r["split"] == split:
                expected[r["source"]] = expected.get(r["source"], 0) + 1
        assert json.loads(tags["suffice.rows_by_source"]) == expected
        assert tags["suffice.data_hash"] == run_.data.params["data_hash"]
        assert d.dataset.name == f"data-{split}" and len(d.dataset.digest) >= 8 and FIXTURE in d.dataset.source
        columns = [c["name"] for c in json.loads(d.dataset.schema)["mlflow_colspec"]]
        assert columns == ["id", "source", "question", "label", "label_source"]  # never the passages
        assert json.loads(d.dataset.profile)["num_rows"] == sum(expected.values())

    metrics = run_.data.metrics
    for src in ("overall", "squad2", "qed", "hotpotqa-fullwiki"):
        for k in ("macro_f1", "auroc", "ece"):
            name = f"headline/test_{k}" if src == "overall" else f"headline/test_{src}_{k}"
            flat = f"test_{k}" if src == "overall" else f"test_{src}_{k}"
            if flat in metrics:  # AUROC is undefined (not logged) on a source with one class
                assert metrics[name] == pytest.approx(metrics[flat]), name
    assert "headline/test_macro_f1" in metrics and "headline/test_squad2_macro_f1" in metrics
    meta = json.loads((trained[0] / "suffice_model.json").read_text())
    assert metrics["headline/val_coverage_at_sufficient"] == pytest.approx(meta["metrics"]["validation_levels"]["coverage_at_sufficient"])
    assert "headline/test_coverage_at_sufficient" in metrics
    mv = client.get_model_version("suffice-sufficiency-model", "1")  # the version names its run's headline numbers
    assert mv.tags["headline/test_macro_f1"] == f"{metrics['headline/test_macro_f1']:.4f}"


def test_registered_bundle_versions_carry_signature_example_and_the_runs_numbers(trained, tiny_bert_dir, tmp_path_factory, tmp_path,
                                                                                 monkeypatch):
    """A registered version of suffice-sufficiency shows its signature and input example (get_model_info),
    links its run (whose params and metrics MLflow's version comparison lays side by side) and carries
    the run's headline metrics as tags; two versions of two runs compare param by param."""
    pytest.importorskip("optimum")
    import shutil

    import mlflow
    from mlflow.tracking import MlflowClient

    from pyfunc_support import mlflow_store, tiny_bundle
    from suffice.training.export.registry import register_bundle
    from suffice.training.tracking import HEADLINE_COLUMNS, headline_summary

    _, summary, uri = trained
    store = tmp_path / "store"  # a copy of the trained store: registering here leaves the shared one as the other tests expect
    store.mkdir()
    shutil.copy(uri[len("sqlite:///"):], store / "mlflow.db")
    with mlflow_store(store, monkeypatch) as copy_uri:
        client = MlflowClient(tracking_uri=copy_uri, registry_uri=copy_uri)
        source_run = client.get_run(summary["mlflow_run_id"])
        other = client.create_run(source_run.info.experiment_id, run_name="other")
        client.log_param(other.info.run_id, "lora.r", "8")
        client.log_metric(other.info.run_id, "headline/test_squad2_macro_f1", 0.25)
        versions = []
        for run_id in (source_run.info.run_id, other.info.run_id):
            bundle = shutil.copytree(tiny_bundle(tmp_path_factory, tiny_bert_dir), tmp_path / f"bundle-{run_id}")
            versions.append(register_bundle(bundle, run_id=run_id)[1])
        assert versions == ["1", "2"]
        for version, run_id in zip(versions, (source_run.info.run_id, other.info.run_id)):
            mv = client.get_model_version("suffice-sufficiency", version)
            assert mv.run_id == run_id
            run_metrics = client.get_run(run_id).data.metrics
            # the runs table's headline columns as tags (the versions table lists every tag in a version's row)
            assert {k: v for k, v in mv.tags.items() if k.startswith("headline/")} == {
                k: f"{v:.4f}" for k, v in run_metrics.items() if k.startswith("headline/") and k[len("headline/"):] in HEADLINE_COLUMNS}
            assert mv.description.startswith(headline_summary(run_metrics)), mv.description
            info = mlflow.models.get_model_info(f"models:/suffice-sufficiency/{version}")
            assert info.signature.inputs.input_names() == ["question", "passages", "context"]
            assert info.signature.outputs.input_names() == ["score", "level", "latency_ms"]
            assert info.saved_input_example_info["artifact_path"] == "input_example.json"
            assert info.flavors["python_function"]["loader_module"] == "suffice.serving.pyfunc"
        assert client.get_model_version("suffice-sufficiency", "1").tags["headline/test_macro_f1"] == \
            f"{source_run.data.metrics['headline/test_macro_f1']:.4f}"
        assert client.get_model_version("suffice-sufficiency", "2").tags["headline/test_squad2_macro_f1"] == "0.2500"
        # what the comparison view reads: each version's run, its params and metrics
        params = [client.get_run(client.get_model_version("suffice-sufficiency", v).run_id).data.params.get("lora.r") for v in versions]
        assert params == ["4", "8"]


def test_full_finetuning_three_levels_without_tracking(tiny_bert, tmp_path):
    out = tmp_path / "full"
    summary = run(tiny_config(tiny_bert, out, "--finetune=full", "--label_scheme=three_level", "--tracking.enabled=false",
                              "--learning_rate=1e-4", "--num_train_epochs=1", "--baselines=[]"))
    assert not (out / "adapter").exists()
    meta = json.loads((out / "suffice_model.json").read_text())
    assert meta["id2label"] == {"0": "insufficient", "1": "partial", "2": "sufficient"}
    assert meta["mlflow"]["version"] is None and "mlflow_run_id" in summary
    assert "binary_macro_f1" in meta["metrics"]["test"]


def test_retrieval_gate_rows_and_group_split(tmp_path):
    from suffice.training.fit.splits import load_splits

    threads = tmp_path / "gate.jsonl"
    lines = []
    for i in range(40):
        opener = f"how do refunds work for order type {i % 8}?"
        msgs = [{"role": "user", "content": opener}, {"role": "assistant", "content": "Refunds take 5 days."},
                {"role": "user", "content": "thanks!" if i % 2 else "what about shipping to Norway?"}]
        lines.append(json.dumps({"id": f"t{i}", "messages": msgs, "label": "SKIP" if i % 2 else "RETRIEVE", "category": "x"}))
    threads.write_text("\n".join(lines) + "\n")
    cfg = build_train_config(REPO / "configs" / "retrieval-gate.yaml", [f"--gate.path={threads}", "--gate.split=opening_message", "--gate.validation_fraction=0.25",
                                                                        "--gate.test_fraction=0.25", "--gate.styles=[]"])
    splits = load_splits(cfg)
    row = splits.train[0]
    assert row["passages"][0]["title"] == "user" and row["passages"][1]["title"] == "assistant"
    assert row["question"] in ("thanks!", "what about shipping to Norway?") and row["label"] in (0, 1)
    groups = {name: set(splits[name]["group"]) for name in ("train", "validation", "test")}
    assert not (groups["train"] & groups["validation"]) and not (groups["train"] & groups["test"])
    assert sum(len(splits[n]) for n in ("train", "validation", "test")) == 40

    threads.write_text(json.dumps({"id": "bad", "messages": [{"role": "user", "content": "x"}], "label": "MAYBE"}) + "\n")
    from suffice.serving.config import ConfigError

    with pytest.raises(ConfigError, match="line 1.*label"):
        load_splits(cfg)


def test_prepared_data_section_feeds_training(shared_data_dir):
    from suffice.training.fit.splits import load_splits

    cfg = build_train_config(REPO / "configs" / "sufficiency.yaml", ["--data.name=pytest", "--data.sources=[qed]",
                                                                     "--data.include_variants=false"])
    assert cfg.data_config().include_synthetic  # the demo config's synthetic squad2 questions ...
    splits = load_splits(cfg)
    assert set(splits.train["source"]) == {"qed"} and len(splits.validation) > 0 and len(splits.test) > 0  # ... follow sources
    assert splits.manifest["dropped"]["synthetic filtered out by sources"] > 0
    assert splits.label_source == "autorater" and len(splits.data_hash) >= 16


def test_export_true_writes_a_bundle_the_service_can_load(tiny_bert, tmp_path):
    pytest.importorskip("suffice.training.export")
    from suffice.serving.bundle import read_manifest

    out = tmp_path / "exported"
    summary = run(tiny_config(tiny_bert, out, "--export", "--tracking.enabled=false", "--num_train_epochs=1", "--baselines=[]"))
    assert summary["bundle"] == str(out / "bundle")
    manifest = read_manifest(out / "bundle")
    meta = json.loads((out / "suffice_model.json").read_text())
    assert manifest.temperature == pytest.approx(meta["calibration"]["temperature"])
    assert manifest.max_length == 64 and manifest.positive_label == "sufficient"



def test_refused_int8_still_ships_the_checked_fp32_bundle(tiny_bert, tmp_path, monkeypatch, capsys):
    """An int8 parity failure must not leave a trained model without a bundle: fp32 only, said aloud."""
    from functools import partial

    from suffice.serving.bundle import read_manifest
    from suffice.training.export import bundle as export

    monkeypatch.setattr(export, "ParityConfig", partial(export.ParityConfig, min_confident_agreement=1.01, min_agreement=1.01))  # int8 can never pass
    out = tmp_path / "exported"
    summary = run(tiny_config(tiny_bert, out, "--export", "--tracking.enabled=false", "--num_train_epochs=1", "--baselines=[]"))
    assert summary["bundle"] == str(out / "bundle")
    assert sorted(p.name for p in (out / "bundle").iterdir()) == ["model.onnx", "probe.npz", "suffice.json", "tokenizer.json"]
    m = read_manifest(out / "bundle")
    assert m.parity.quantization is None and m.parity.fp32_vs_torch_max_abs_diff <= 1e-4
    assert "int8 refused" in capsys.readouterr().err

@pytest.mark.slow
def test_real_minilm_overfits_a_dozen_items(minilm_dir, tmp_path):
    """The loop learns: real all-MiniLM-L6-v2 drives the loss on 12 items towards zero."""
    rows = [json.loads(line) for line in open(FIXTURE) if json.loads(line)["split"] == "train"]
    data = tmp_path / "twelve.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = run(build_train_config(None, [
        f"--train_file={data}", f"--validation_file={data}", "--base_model=minilm-l6", f"--output_dir={tmp_path / 'm'}",
        "--max_length=96", "--per_device_train_batch_size=4", "--num_train_epochs=12", "--early_stopping_patience=0",
        "--learning_rate=1e-3", "--tracking.enabled=false", "--evaluate_test=false", "--torch_threads=1"]))
    first, last = summary["history"][0], summary["history"][-1]
    assert last["loss"] < 0.3 < first["loss"], (first["loss"], last["loss"])
    assert last["accuracy"] == 1.0


def test_answer_lookup_reads_the_rows_gold_answers(tiny_bert, tmp_path):
    """answer_lookup (which `suffice weak` uses) maps ids to the gold answers of JSONL rows."""
    from suffice.training.fit.splits import answer_lookup, load_splits

    cfg = tiny_config(tiny_bert, tmp_path / "m", "--tracking.enabled=false")
    assert answer_lookup(cfg, load_splits(cfg).train)["fixture:00"] == ["1911"]


def test_answer_span_weight_is_gone():
    """The answer-span head (worse in both measured runs, no user) was deleted with its config key."""
    from suffice.serving.config import ConfigError

    with pytest.raises(ConfigError, match="answer_span_weight"):
        build_train_config(None, [f"--train_file={FIXTURE}", "--answer_span_weight=0.5"])


def test_feature_loss_gets_its_columns_and_joins_the_loss(tiny_bert, tmp_path):
    """A training feature's loss (the hook for optional training features) sees the columns it declares in
    every train batch, and what it returns is added to the classification loss."""
    calls = []

    class LengthPenalty(TrainingFeature):
        columns = ("length",)
        output_hidden_states = True

        def loss(self, outputs, batch):
            calls.append((tuple(batch["length"].shape), len(outputs.hidden_states)))
            return 0.0 * outputs.logits.sum()

    cfg = tiny_config(tiny_bert, tmp_path / "m", "--tracking.enabled=false", "--evaluate_test=false", "--num_train_epochs=1")
    run(cfg, features=[LengthPenalty()])
    assert calls and all(shape[0] >= 1 and n_hidden >= 2 for shape, n_hidden in calls)


def test_encoder_layers_keeps_the_lowest_layers(tiny_bert, tmp_path):
    """encoder_layers=N trains and saves an N-layer model whose kept layers start from the base weights."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from suffice.training.fit.model import build_model

    base = load_file(str(tiny_bert / "model.safetensors"))
    m = build_model(tiny_bert, id2label={0: "no", 1: "yes"}, finetune="full", encoder_layers=1)
    assert m.config.num_hidden_layers == 1 and len(m.bert.encoder.layer) == 1
    key = next(k for k in base if "encoder.layer.0.attention.self.query.weight" in k)
    assert np.allclose(m.state_dict()["bert.encoder.layer.0.attention.self.query.weight"].numpy(), base[key].numpy())
    with pytest.raises(ValueError, match="encoder_layers=9"):
        build_model(tiny_bert, id2label={0: "no", 1: "yes"}, encoder_layers=9)
    run(tiny_config(tiny_bert, tmp_path / "m", "--encoder_layers=1", "--tracking.enabled=false", "--evaluate_test=false",
                    "--num_train_epochs=1"))
    assert AutoConfig.from_pretrained(tmp_path / "m").num_hidden_layers == 1


def test_data_overrides_are_kept_typed_as_checked():
    """A mapping given on the command line (``--data.max_train_per_source={qed: 4000}``) is saved and printed
    as the mapping the run uses, not as the string the shell passed; the YAML keys the user did not name stay out."""
    from suffice.serving.config import dump_yaml

    cfg = build_train_config(Path(__file__).parents[1] / "configs" / "reading.yaml",
                             ["--data.max_train_per_source={qed: 4000}", "--data.seed=7", "--data.data_dir=/nonexistent"])
    assert cfg.data["max_train_per_source"] == {"qed": 4000}
    assert cfg.data["seed"] == 7 and "variant_rules" not in cfg.data
    assert "max_train_per_source:\n    qed: 4000" in dump_yaml(cfg)
