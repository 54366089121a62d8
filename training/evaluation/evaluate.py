"""``suffice evaluate``: a model and the baselines on the same items, per source and overall.

    suffice evaluate --model models/sufficiency-lora-20250101-120000 --split test
    suffice evaluate --model models:/suffice-sufficiency/3 --split test
    suffice evaluate --model bundles/sufficiency-v3 --split validation --config configs/sufficiency.yaml

``--model`` is a trained-model directory (scored with torch), an exported bundle folder holding
``suffice.json`` (scored with the serving code, onnxruntime), or a ``models:/`` / ``runs:/`` URI
resolved through the registry. The items come from the config the model was trained with
(``train_config.yaml`` in its directory) unless ``--config`` or ``--key=value`` overrides say
otherwise; they are packed with the model's own window and long-context strategy.

Printed and logged (an MLflow run in the ``suffice-evaluate`` experiment, tagged with the
evaluated run): accuracy, macro-F1, F1 per class, AUROC, ECE, Cohen's kappa with the autorater
labels and with gold labels, for the model and for the keyword-coverage, answer-in-context and
TF-IDF + logistic-regression baselines, plus a confusion matrix, a reliability diagram, a
precision-recall curve and selective accuracy vs coverage (PNG).

>>> main(["--model", "models/demo", "--split", "test", "--no-mlflow"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from suffice.serving.config import not_overrides
from suffice.serving.bundle import DEFAULT_THRESHOLDS, MANIFEST_NAME
from suffice.training.evaluation.report import full_report, render_report, report_json, report_metrics, save_plots

EVAL_EXPERIMENT = "suffice-evaluate"


# ------------------------------------------------------------------------------------------
# scoring a model directory or a bundle
# ------------------------------------------------------------------------------------------
def resolve_model(model: str) -> Path:
    """The local folder of ``--model``: a directory as given, or a registry URI's download.

    What the folder is (an exported bundle holding ``suffice.json``, or a trained-model directory
    holding ``suffice_model.json``) is decided by :func:`model_info` from its files.
    """
    from suffice.serving.model_uri import is_registry_uri
    from suffice.training.export.registry import download, find_dir, resolve_bundle, resolve_model_dir

    if not is_registry_uri(model):
        p = Path(model)
        if not p.is_dir():
            raise FileNotFoundError(f"--model {model}: no such directory; give a trained-model directory, a bundle or models:/NAME/N")
        return p
    if find_dir(download(model), MANIFEST_NAME) is not None:
        return resolve_bundle(model)  # validated: manifest and checksums
    return resolve_model_dir(model)  # versions of suffice-sufficiency-model point at a trained-model directory


def model_info(path: Path) -> dict[str, Any]:
    """What evaluation needs to know about a model directory or a bundle, in one shape."""
    if (path / MANIFEST_NAME).is_file():
        from suffice.serving.bundle import read_manifest

        m = read_manifest(path)
        return {"kind": "bundle", "task": m.task, "label_scheme": m.label_scheme, "id2label": dict(m.id2label),
                "positive_label": m.positive_label, "max_length": m.max_length, "strategy": m.long_context_strategy,
                "temperature": m.temperature, "calibration": m.calibrator.to_record(), "thresholds": dict(m.thresholds),
                "run_id": m.mlflow_run_id,
                "name": f"{m.registered_model or path.name}:{m.model_version or '-'}"}
    from suffice.training.fit.meta import ModelMeta

    meta = ModelMeta.read(path)
    mlf = meta.mlflow or {}
    return {"kind": "model_dir", "task": meta.task, "label_scheme": meta.label_scheme,
            "id2label": meta.labels, "positive_label": meta.positive_label,
            "max_length": int(meta.max_length), "strategy": meta.long_context_strategy,
            "temperature": meta.temperature, "calibration": meta.calibrator.to_record(), "thresholds": dict(meta.thresholds or {}),
            "run_id": mlf.get("run_id"), "name": f"{mlf.get('registered_model') or path.name}:{mlf.get('version') or '-'}"}


def model_dir_logits(path: Path, ds, batch_size: int, pad_id: int) -> np.ndarray:
    """Raw logits of the merged torch model, rows in ``ds`` order (what a calibration is fitted on)."""
    from accelerate import Accelerator

    from suffice.training.fit.encode import eval_dataloader
    from suffice.training.fit.loop import predict
    from suffice.training.fit.model import load_model_dir

    accelerator = Accelerator()
    model, _ = load_model_dir(path)
    model, dl = accelerator.prepare(model, eval_dataloader(ds, batch_size, pad_id))
    logits, _ = predict(accelerator, model, dl)
    return logits


def score_model_dir(path: Path, ds, batch_size: int, calibration: Mapping[str, Any], pad_id: int, positive_index: int) -> np.ndarray:
    """Calibrated probabilities from the merged torch model, rows in ``ds`` order; ``calibration`` is the
    model's calibration record (``model_info(path)["calibration"]``), applied as serving applies it."""
    from suffice.serving.calibration import Calibration

    return Calibration.from_record(calibration).probabilities(model_dir_logits(path, ds, batch_size, pad_id), positive_index)


def score_bundle(path: Path, ds, info: Mapping[str, Any], batch_size: int, precision: str) -> np.ndarray:
    """Calibrated probabilities from the exported ONNX bundle, with the serving code."""
    questions, passages = list(ds["question"]), list(ds["passages"])
    names = [info["id2label"][i] for i in range(len(info["id2label"]))]
    if info["task"] == "sufficiency":
        from suffice.serving import ScorerConfig, SufficiencyScorer

        scorer = SufficiencyScorer.load(path, ScorerConfig(precision=precision, batch_size=batch_size))
        results = scorer.score_batch(questions, passages)
        return np.array([[r.probabilities[n] for n in names] for r in results], dtype=np.float64)
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    clf = OnnxClassifier(path, RuntimeConfig(precision=precision))
    out = []
    for i in range(0, len(questions), batch_size):
        packed = [clf.packer.pack(q, p) for q, p in zip(questions[i : i + batch_size], passages[i : i + batch_size])]
        out.append(clf.predict_packed(packed)[1])
    return np.concatenate(out).astype(np.float64) if out else np.zeros((0, len(names)))


def eval_config(info: Mapping[str, Any], path: Path, config: str | None, overrides: Sequence[str]):
    from suffice.training.paths import REPO_ROOT
    from suffice.training.fit.config import build_train_config

    if config is None:
        own = path / "train_config.yaml"
        default = REPO_ROOT / "configs" / ("retrieval-gate.yaml" if info["task"] == "retrieval_gate" else "sufficiency.yaml")
        config = str(own if own.is_file() else default)
    # the model decides how items are packed and labelled; the config only where they come from
    forced = [f"--task={info['task']}", f"--label_scheme={info['label_scheme']}", f"--max_length={info['max_length']}",
              f"--long_context_strategy={info['strategy']}", "--resume=false"]
    return build_train_config(config, list(overrides) + forced), config


def evaluate(model: str, split: str = "test", config: str | None = None, overrides: Sequence[str] = (),
             baselines: Sequence[str] | None = None, batch_size: int = 64, precision: str = "auto",
             out_dir: str | Path | None = None, log_mlflow: bool = True) -> dict[str, Any]:
    """Evaluate ``model`` on ``split`` next to the baselines; returns the report (see :func:`full_report`)."""
    from suffice.serving.bundle import sha256_file
    from suffice.serving.packing import ContextPacker
    from suffice.training.fit.encode import encode_split
    from suffice.training.fit.model import load_tokenizer
    from suffice.training.fit.splits import load_splits

    path = resolve_model(model)
    info = model_info(path)
    cfg, config_used = eval_config(info, path, config, overrides)
    splits = load_splits(cfg)
    if splits[split] is None or len(splits[split]) == 0:
        raise ValueError(f"the {split!r} split is empty for config {config_used}: choose another --split")
    tok_dir = path
    packer = ContextPacker(load_tokenizer(tok_dir), max_length=info["max_length"], strategy=info["strategy"])
    tok_hash = sha256_file(path / "tokenizer.json")

    eval_ds = encode_split(splits[split], packer, cfg, tok_hash)
    train_ds = encode_split(splits["train"], packer, cfg, tok_hash) if split != "train" else eval_ds
    positive_index = next(i for i, n in info["id2label"].items() if n == info["positive_label"])
    t0 = time.perf_counter()
    if info["kind"] == "bundle":
        probs = score_bundle(path, eval_ds, info, batch_size, precision)
    else:
        probs = score_model_dir(path, eval_ds, batch_size, info["calibration"], packer.pad_id, positive_index)
    seconds = time.perf_counter() - t0
    thresholds = info["thresholds"] or dict(DEFAULT_THRESHOLDS[info["task"]])
    report = full_report(probs, eval_ds, train_ds=train_ds, id2label=info["id2label"], positive_index=positive_index,
                         ece_bins=cfg.calibration.ece_bins, thresholds=thresholds,
                         baselines=cfg.resolved_baselines() if baselines is None else list(baselines), split=split, task=info["task"])
    report["model_info"] = {k: v for k, v in info.items() if k != "id2label"} | {"path": str(path), "config": config_used,
                                                                                 "data_hash": splits.data_hash, "seconds": seconds}
    text = render_report(report)
    print(f"suffice evaluate: {info['name']} ({info['kind']}) on {split}, {len(eval_ds)} items, data {splits.data_hash}\n")
    print(text)
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix=f"suffice-eval-{split}-"))
    out.mkdir(parents=True, exist_ok=True)
    save_plots(report, out)
    (out / f"{split}_metrics.json").write_text(json.dumps(report_json(report), indent=2, default=str))
    (out / f"{split}_table.txt").write_text(text + "\n")
    if log_mlflow:
        _log_evaluation(report, info, split, out, splits.data_hash)
    print(f"\nreport and plots: {out}")
    return report


def _log_evaluation(report: Mapping[str, Any], info: Mapping[str, Any], split: str, out: Path, data_hash: str) -> None:
    from suffice.training.tracking import RunTracker

    tracker = RunTracker(True, experiment=EVAL_EXPERIMENT)
    tracker.start(f"evaluate-{info['name']}-{split}", tags={
        "evaluated_model": info["name"], "evaluated_run_id": info.get("run_id") or "", "model_kind": info["kind"],
        "split": split, "data_hash": data_hash, "task": info["task"]})
    tracker.log_params({"model": report["model_info"]["path"], "split": split, "config": report["model_info"]["config"],
                        "baselines": ",".join(report["baselines"]), "kind": info["kind"]})
    tracker.log_metrics(report_metrics(report, split))
    tracker.log_artifacts(out, "evaluation")
    tracker.end()
    print(f"MLflow run {tracker.run_id} (experiment {EVAL_EXPERIMENT})")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="suffice evaluate", description=__doc__.split("\n\n")[0],
                                 epilog="Other --key=value options override the data config (e.g. --data.sources=[squad2]).")
    ap.add_argument("--model", required=True, help="model directory, bundle folder, or models:/NAME/N | models:/NAME@alias | runs:/ID/PATH")
    ap.add_argument("--split", default="test", choices=["train", "validation", "test"])
    ap.add_argument("--config", help="training config whose data section to use (default: the model's own train_config.yaml)")
    ap.add_argument("--baselines", help="comma list from keyword_coverage,answer_in_context,tfidf_lr ('' for none; default: the config's)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "int8"], help="bundles only")
    ap.add_argument("--out", help="where the JSON report and plots go (default: a new temporary directory)")
    ap.add_argument("--no-mlflow", action="store_true", help="do not log the evaluation to MLflow")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, overrides = build_parser().parse_known_args(argv)
    bad = not_overrides(overrides)
    if bad:
        print(f"suffice evaluate: unrecognised argument(s) {bad}: options are listed by --help; data overrides look like --key=value",
              file=sys.stderr)
        return 2
    from suffice.serving.config import ConfigError

    baselines = None if args.baselines is None else [b for b in args.baselines.split(",") if b]
    try:
        evaluate(args.model, args.split, args.config, overrides, baselines, args.batch_size, args.precision, args.out, not args.no_mlflow)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"suffice evaluate: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
