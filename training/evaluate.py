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

from suffice.training.metrics import (
    flat_metrics,
    format_table,
    json_safe,
    per_source_metrics,
    plot_confusion_matrix,
    plot_precision_recall,
    plot_reliability,
    plot_selective_accuracy,
    selective_accuracy,
)

EVAL_EXPERIMENT = "suffice-evaluate"
BINARY_NAMES = {"sufficiency": ["insufficient", "sufficient"], "retrieval_gate": ["RETRIEVE", "SKIP"]}


# ------------------------------------------------------------------------------------------
# reports (shared with training's final test evaluation)
# ------------------------------------------------------------------------------------------
def _column(ds, name: str, default: Any) -> list:
    return list(ds[name]) if name in ds.column_names else [default] * len(ds)


def classification_report(probs: np.ndarray, ds, *, label_names: Sequence[str], positive_index: int, ece_bins: int = 15,
                          predictions: np.ndarray | None = None, labels: np.ndarray | None = None) -> dict[str, dict[str, float]]:
    """Per-source metrics of ``probs`` against the ``labels`` column of an encoded dataset ``ds``.

    Kappa with the autorater is computed on the rows whose ``label_source`` is ``autorater``
    (all rows when the column is absent); kappa with gold on rows whose ``gold_label`` >= 0.
    """
    y = np.asarray(ds["labels"] if labels is None else labels)
    label_sources = _column(ds, "label_source", "autorater")
    autorater = np.array([s in ("autorater", "") for s in label_sources]) if "label_source" in ds.column_names else None
    return per_source_metrics(
        probs, y, _column(ds, "source", "all"), label_names=list(label_names), positive_index=positive_index,
        predictions=predictions, ece_bins=ece_bins, autorater_mask=autorater,
        gold_labels=np.asarray(_column(ds, "gold_label", -1), dtype=np.int64),
    )


def answers_for(ds) -> list[list[str]] | None:
    """Gold answers per row: the ``answers`` column, else looked up by id (or parent id) in the
    shared items.jsonl; None when neither exists (answer_in_context is then skipped)."""
    if "answers" in ds.column_names:
        return [list(a or []) for a in ds["answers"]]
    from suffice.training.baselines import load_gold_answers
    from suffice.training.paths import data_dir

    d = data_dir(required=False)
    if d is None:
        return None
    lookup = load_gold_answers(d / "items.jsonl")
    parents = _column(ds, "parent_id", "")
    out = []
    for rid, parent in zip(ds["id"], parents):
        out.append(lookup.get(rid, lookup.get(parent or "", [])))
    return out


def full_report(probs: np.ndarray, test_ds, *, train_ds, id2label: Mapping[int, str], positive_index: int, ece_bins: int,
                thresholds: Mapping[str, float], baselines: Sequence[str], split: str, task: str | None = None) -> dict[str, Any]:
    """Model metrics per source, the same for each baseline (fitted on ``train_ds``), and the arrays for plots.

    Baselines decide positive-vs-rest, so they are compared with the model's binary view
    (``macro_f1`` for a binary model, ``binary_macro_f1`` for three levels).
    """
    from suffice.training.baselines import run_baselines

    names = [id2label[i] for i in range(len(id2label))]
    task = task or ("retrieval_gate" if "SKIP" in names else "sufficiency")
    labels = np.asarray(test_ds["labels"])
    model_table = classification_report(probs, test_ds, label_names=names, positive_index=positive_index, ece_bins=ece_bins)
    pos_true = (labels == positive_index).astype(np.int64)
    _add_threshold_metrics(model_table, probs[:, positive_index], pos_true, _column(test_ds, "source", "all"), thresholds)
    baseline_tables: dict[str, Any] = {}
    baseline_scores: dict[str, np.ndarray] = {}
    baseline_preds: dict[str, np.ndarray] = {}
    thresholds_used: dict[str, float] = {}
    if baselines and train_ds is not None and len(test_ds):
        tr_pos = (np.asarray(train_ds["labels"]) == positive_index).astype(np.int64)
        answers_test = answers_for(test_ds) if "answer_in_context" in baselines else None
        answers_train = answers_for(train_ds) if answers_test is not None else None
        runs = run_baselines(
            baselines,
            {"question": train_ds["question"], "passages": train_ds["passages"], "label": tr_pos, "answers": answers_train},
            {"question": test_ds["question"], "passages": test_ds["passages"], "label": pos_true, "answers": answers_test},
        )
        for name, r in runs.items():
            p2 = np.stack([1.0 - r.scores, r.scores], axis=1)
            baseline_tables[name] = classification_report(p2, test_ds, label_names=BINARY_NAMES[task], positive_index=1,
                                                          ece_bins=ece_bins, predictions=r.predictions, labels=pos_true)
            baseline_scores[name], baseline_preds[name], thresholds_used[name] = r.scores, r.predictions, r.threshold
    return {
        "split": split, "task": task, "id2label": {int(k): v for k, v in id2label.items()}, "positive_index": positive_index,
        "thresholds": dict(thresholds), "ece_bins": ece_bins, "model": model_table, "baselines": baseline_tables,
        "baseline_thresholds": thresholds_used,
        "_arrays": {"probs": probs, "labels": labels, "scores": baseline_scores, "preds": baseline_preds},
    }


def _add_threshold_metrics(table: dict[str, dict[str, float]], scores: np.ndarray, positive: np.ndarray, sources: Sequence[str],
                           thresholds: Mapping[str, float]) -> None:
    """Precision / recall / share of the decisions ``score >= t`` for each stored threshold (the
    gate's SKIP threshold, the sufficiency 0.8 / 0.5): what a service acting on the score gets."""
    src = np.asarray(list(sources), dtype=object)
    for where, m in table.items():
        sel = np.ones(len(scores), dtype=bool) if where == "overall" else src == where
        for name, t in thresholds.items():
            fire = scores[sel] >= t
            m[f"share_at_{name}"] = float(fire.mean()) if sel.any() else float("nan")
            m[f"precision_at_{name}"] = float(positive[sel][fire].mean()) if fire.any() else float("nan")
            hits = positive[sel].sum()
            m[f"recall_at_{name}"] = float((positive[sel] & fire).sum() / hits) if hits else float("nan")


def _binary_f1_key(report: Mapping[str, Any]) -> str:
    return "binary_macro_f1" if len(report["id2label"]) > 2 else "macro_f1"


GOLD_READING = ("answer_in_context",)  # read the gold answers: a reference, not something a service can run


def margins(report: Mapping[str, Any], deployable_only: bool = False) -> dict[str, float]:
    """Model macro-F1 minus the best baseline's, per source, in F1 points (x 100).

    ``deployable_only`` leaves out baselines that read gold annotations (answer_in_context),
    which on SQuAD 2.0 is close to an oracle for the autorater's labels.
    """
    key = _binary_f1_key(report)
    tables = {n: t for n, t in report["baselines"].items() if not (deployable_only and n in GOLD_READING)}
    out = {}
    for src, m in report["model"].items():
        best = max((t[src]["macro_f1"] for t in tables.values() if src in t and "macro_f1" in t[src]), default=None)
        if best is not None and key in m:
            out[src] = 100.0 * (m[key] - best)
    return out


def render_report(report: Mapping[str, Any]) -> str:
    """The printed tables: model per source, each baseline per source, and the margin over the best baseline."""
    names = [report["id2label"][i] for i in range(len(report["id2label"]))]
    cols = ["n", "accuracy", "macro_f1"] + [f"f1_{n}" for n in names] + ["auroc", "ece", "kappa_autorater", "kappa_gold"]
    if len(names) > 2:
        cols.insert(3, "binary_macro_f1")
    parts = [format_table({f"model / {s}": m for s, m in report["model"].items()}, cols, title=f"== {report['split']}: model ==")]
    th_cols = [f"{k}_at_{name}" for name in report["thresholds"] for k in ("share", "precision", "recall")]
    parts.append(format_table({f"model / {s}": m for s, m in report["model"].items()}, th_cols,
                              title="== decisions at the stored thresholds (score >= t): share of items, precision, recall of "
                                    f"{names[report['positive_index']]} ==  "
                                    + ", ".join(f"{k}={v:.3f}" for k, v in report["thresholds"].items())))
    for name, table in report["baselines"].items():
        bcols = ["n", "accuracy", "macro_f1"] + [f"f1_{n}" for n in BINARY_NAMES[report["task"]]] + ["auroc", "ece", "kappa_autorater", "kappa_gold"]
        parts.append(format_table({f"{name} / {s}": m for s, m in table.items()}, bcols,
                                  title=f"== {report['split']}: baseline {name} (threshold {report['baseline_thresholds'][name]:.3f}) =="))
    for deployable, label in ((False, "the best baseline"), (True, "the best deployable baseline (not reading gold answers)")):
        mg = margins(report, deployable)
        if mg and (not deployable or set(report["baselines"]) & set(GOLD_READING)):
            parts.append(f"== macro-F1 points over {label} ({_binary_f1_key(report)}) ==\n"
                         + "  ".join(f"{s}: {v:+.1f}" for s, v in mg.items()))
    return "\n\n".join(parts)


def report_metrics(report: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """Flat metric names for MLflow: ``test_macro_f1``, ``test_squad2_auroc``, ``test_baseline_tfidf_lr_macro_f1``..."""
    out = flat_metrics(report["model"], prefix)
    for name, table in report["baselines"].items():
        out.update(flat_metrics(table, f"{prefix}_baseline_{name}"))
    for deployable, name in ((False, "margin_over_best_baseline"), (True, "margin_over_best_deployable_baseline")):
        out.update({f"{prefix}_{name}" if s == "overall" else f"{prefix}_{s}_{name}": v for s, v in margins(report, deployable).items()})
    return out


def report_json(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report without its arrays (NaN as null), for a JSON artifact."""
    return json_safe({k: v for k, v in report.items() if k != "_arrays"}
                     | {"margins": margins(report), "margins_deployable": margins(report, deployable_only=True)})


def save_plots(report: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """Confusion matrix, reliability diagram, precision-recall and selective accuracy (PNG) for the report's split."""
    out = Path(out_dir)
    arr = report["_arrays"]
    probs, labels = arr["probs"], arr["labels"]
    pos = report["positive_index"]
    names = [report["id2label"][i] for i in range(len(report["id2label"]))]
    split = report["split"]
    pos_true = (labels == pos).astype(int)
    pred = probs.argmax(axis=1)
    curves = {"model": selective_accuracy(probs.max(axis=1), (pred == labels).astype(int))}
    if len(names) > 2:  # the binary view too, comparable with the baselines
        curves["model (binary)"] = selective_accuracy(np.abs(probs[:, pos] - 0.5), ((probs[:, pos] >= 0.5) == pos_true).astype(int))
    for name, s in arr["scores"].items():
        curves[name] = selective_accuracy(np.abs(s - report["baseline_thresholds"][name]), (arr["preds"][name] == pos_true).astype(int))
    th = {k: v for k, v in report["thresholds"].items()}
    return [
        plot_confusion_matrix(labels, pred, names, out / f"{split}_confusion_matrix.png", title=f"{split}: confusion matrix"),
        plot_reliability(probs[:, pos], pos_true, out / f"{split}_reliability.png", bins=report["ece_bins"],
                         title=f"{split}: reliability of P({names[pos]})"),
        plot_precision_recall(probs[:, pos], pos_true, out / f"{split}_precision_recall.png", title=f"{split}: precision-recall, {names[pos]}",
                              thresholds=th),
        plot_selective_accuracy(curves, out / f"{split}_selective_accuracy.png", title=f"{split}: selective accuracy vs coverage"),
    ]


# ------------------------------------------------------------------------------------------
# scoring a model directory or a bundle
# ------------------------------------------------------------------------------------------
def _resolve(model: str) -> Path:
    if not model.startswith(("models:/", "runs:/")):
        p = Path(model)
        if not p.is_dir():
            raise FileNotFoundError(f"--model {model}: no such directory; give a trained-model directory, a bundle or models:/NAME/N")
        return p
    from suffice.training.registry import RegistryError, resolve_bundle, resolve_model_dir

    try:
        return resolve_bundle(model)
    except RegistryError as e:
        if "suffice.json" not in str(e):
            raise
        return resolve_model_dir(model)  # versions registered by training point at the model directory


def _model_info(path: Path) -> dict[str, Any]:
    """What evaluation needs to know about a model directory or a bundle, in one shape."""
    if (path / "suffice.json").is_file():
        from suffice.serving.bundle import read_manifest

        m = read_manifest(path)
        return {"kind": "bundle", "task": m.task, "label_scheme": m.label_scheme, "id2label": dict(m.id2label),
                "positive_label": m.positive_label, "max_length": m.max_length, "strategy": m.long_context_strategy,
                "temperature": m.temperature, "thresholds": dict(m.thresholds), "run_id": m.mlflow_run_id,
                "name": f"{m.registered_model or path.name}:{m.model_version or '-'}"}
    from suffice.training.model import read_model_meta

    meta = read_model_meta(path)
    mlf = meta.get("mlflow") or {}
    return {"kind": "model_dir", "task": meta["task"], "label_scheme": meta["label_scheme"],
            "id2label": {int(k): v for k, v in meta["id2label"].items()}, "positive_label": meta["positive_label"],
            "max_length": int(meta["max_length"]), "strategy": meta["long_context_strategy"],
            "temperature": float(meta["calibration"]["temperature"]), "thresholds": dict(meta.get("thresholds") or {}),
            "run_id": mlf.get("run_id"), "name": f"{mlf.get('registered_model') or path.name}:{mlf.get('version') or '-'}"}


def score_model_dir(path: Path, ds, batch_size: int, temperature: float, pad_id: int) -> np.ndarray:
    """Calibrated probabilities from the merged torch model, rows in ``ds`` order."""
    from accelerate import Accelerator

    from suffice.training.calibration import softmax
    from suffice.training.model import load_model_dir
    from suffice.training.train import eval_dataloader, predict

    accelerator = Accelerator()
    model, _ = load_model_dir(path)
    model, dl = accelerator.prepare(model, eval_dataloader(ds, batch_size, pad_id))
    logits, _ = predict(accelerator, model, dl)
    return softmax(logits, temperature)


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


def _eval_config(info: Mapping[str, Any], path: Path, config: str | None, overrides: Sequence[str]):
    from suffice.training.paths import REPO_ROOT
    from suffice.training.train_config import build_train_config

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
    from suffice.serving.packing import ContextPacker
    from suffice.training.model import load_tokenizer
    from suffice.training.train import encode_split, load_splits

    path = _resolve(model)
    info = _model_info(path)
    cfg, config_used = _eval_config(info, path, config, overrides)
    splits = load_splits(cfg)
    if splits[split] is None or len(splits[split]) == 0:
        raise ValueError(f"the {split!r} split is empty for config {config_used}: choose another --split")
    tok_dir = path
    packer = ContextPacker(load_tokenizer(tok_dir), max_length=info["max_length"], strategy=info["strategy"])
    from suffice.serving.bundle import sha256_file

    tok_hash = sha256_file(path / "tokenizer.json")

    eval_ds = encode_split(splits[split], packer, cfg, tok_hash)
    train_ds = encode_split(splits["train"], packer, cfg, tok_hash) if split != "train" else eval_ds
    t0 = time.perf_counter()
    if info["kind"] == "bundle":
        probs = score_bundle(path, eval_ds, info, batch_size, precision)
    else:
        probs = score_model_dir(path, eval_ds, batch_size, info["temperature"], packer.pad_id)
    seconds = time.perf_counter() - t0
    positive_index = next(i for i, n in info["id2label"].items() if n == info["positive_label"])
    thresholds = info["thresholds"] or ({"skip": 0.5} if info["task"] == "retrieval_gate" else {"sufficient": 0.8, "partial": 0.5})
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
    bad = [o for o in overrides if not (o.startswith("--") and "=" in o)]
    if bad:
        print(f"suffice evaluate: unrecognised argument(s) {bad}: options are listed by --help; data overrides look like --key=value",
              file=sys.stderr)
        return 2
    from suffice.training.config import ConfigError

    baselines = None if args.baselines is None else [b for b in args.baselines.split(",") if b]
    try:
        evaluate(args.model, args.split, args.config, overrides, baselines, args.batch_size, args.precision, args.out, not args.no_mlflow)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"suffice evaluate: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
