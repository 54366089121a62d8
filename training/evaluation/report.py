"""The evaluation report: a model and the baselines per source, its tables, JSON, MLflow metrics and plots.

Shared by ``suffice evaluate`` and the final test evaluation of ``suffice train`` / ``suffice soup``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from suffice.serving.bundle import RETRIEVAL_GATE, SUFFICIENCY, TASK_SPECS
from suffice.serving.jsonl import json_safe
from suffice.training.evaluation.metrics import (
    flat_metrics,
    format_table,
    per_source_metrics,
    plot_confusion_matrix,
    plot_precision_recall,
    plot_reliability,
    plot_selective_accuracy,
    selective_accuracy,
)

GOLD_READING = ("answer_in_context",)  # read the gold answers: a reference, not something a service can run


def column(ds, name: str, default: Any) -> list:
    return list(ds[name]) if name in ds.column_names else [default] * len(ds)


def classification_report(probs: np.ndarray, ds, *, label_names: Sequence[str], positive_index: int, ece_bins: int = 15,
                          predictions: np.ndarray | None = None, labels: np.ndarray | None = None) -> dict[str, dict[str, float]]:
    """Per-source metrics of ``probs`` against the ``labels`` column of an encoded dataset ``ds``.

    Kappa with the autorater is computed on the rows whose ``label_source`` is ``autorater``
    (all rows when the column is absent); kappa with gold on rows whose ``gold_label`` >= 0.
    """
    y = np.asarray(ds["labels"] if labels is None else labels)
    label_sources = column(ds, "label_source", "autorater")
    autorater = np.array([s in ("autorater", "") for s in label_sources]) if "label_source" in ds.column_names else None
    return per_source_metrics(
        probs, y, column(ds, "source", "all"), label_names=list(label_names), positive_index=positive_index,
        predictions=predictions, ece_bins=ece_bins, autorater_mask=autorater,
        gold_labels=np.asarray(column(ds, "gold_label", -1), dtype=np.int64),
        groups=column(ds, "group", ""),
    )


def answers_for(ds) -> list[list[str]] | None:
    """Gold answers per row: the ``answers`` column, else looked up by id (or parent id) in the
    shared items.jsonl; None when neither exists (answer_in_context is then skipped)."""
    if "answers" in ds.column_names:
        return [list(a or []) for a in ds["answers"]]
    from suffice.training.evaluation.baselines import load_gold_answers
    from suffice.training.paths import data_dir

    d = data_dir(required=False)
    if d is None:
        return None
    lookup = load_gold_answers(d / "items.jsonl")
    parents = column(ds, "parent_id", "")
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
    from suffice.training.evaluation.baselines import run_baselines

    names = [id2label[i] for i in range(len(id2label))]
    task = task or (RETRIEVAL_GATE.name if RETRIEVAL_GATE.positive_label in names else SUFFICIENCY.name)
    labels = np.asarray(test_ds["labels"])
    model_table = classification_report(probs, test_ds, label_names=names, positive_index=positive_index, ece_bins=ece_bins)
    pos_true = (labels == positive_index).astype(np.int64)
    add_threshold_metrics(model_table, probs[:, positive_index], pos_true, column(test_ds, "source", "all"), thresholds)
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
            baseline_tables[name] = classification_report(p2, test_ds, label_names=list(TASK_SPECS[task].labels("binary")), positive_index=1,
                                                          ece_bins=ece_bins, predictions=r.predictions, labels=pos_true)
            baseline_scores[name], baseline_preds[name], thresholds_used[name] = r.scores, r.predictions, r.threshold
    return {
        "split": split, "task": task, "id2label": {int(k): v for k, v in id2label.items()}, "positive_index": positive_index,
        "thresholds": dict(thresholds), "ece_bins": ece_bins, "model": model_table, "baselines": baseline_tables,
        "baseline_thresholds": thresholds_used,
        "_arrays": {"probs": probs, "labels": labels, "scores": baseline_scores, "preds": baseline_preds},
    }


def add_threshold_metrics(table: dict[str, dict[str, float]], scores: np.ndarray, positive: np.ndarray, sources: Sequence[str],
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


def binary_f1_key(report: Mapping[str, Any]) -> str:
    return "binary_macro_f1" if len(report["id2label"]) > 2 else "macro_f1"


def margins(report: Mapping[str, Any], deployable_only: bool = False) -> dict[str, float]:
    """Model macro-F1 minus the best baseline's, per source, in F1 points (x 100).

    ``deployable_only`` leaves out baselines that read gold annotations (answer_in_context),
    which on SQuAD 2.0 is close to an oracle for the autorater's labels.
    """
    key = binary_f1_key(report)
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
    cols = ["n", "accuracy", "macro_f1"] + [f"f1_{n}" for n in names] + ["auroc", "paired_auroc", "ece", "kappa_autorater", "kappa_gold"]
    if len(names) > 2:
        cols.insert(3, "binary_macro_f1")
    parts = [format_table({f"model / {s}": m for s, m in report["model"].items()}, cols, title=f"== {report['split']}: model ==")]
    th_cols = [f"{k}_at_{name}" for name in report["thresholds"] for k in ("share", "precision", "recall")]
    parts.append(format_table({f"model / {s}": m for s, m in report["model"].items()}, th_cols,
                              title="== decisions at the stored thresholds (score >= t): share of items, precision, recall of "
                                    f"{names[report['positive_index']]} ==  "
                                    + ", ".join(f"{k}={v:.3f}" for k, v in report["thresholds"].items())))
    for name, table in report["baselines"].items():
        bcols = ["n", "accuracy", "macro_f1"] + [f"f1_{n}" for n in TASK_SPECS[report["task"]].labels("binary")] + ["auroc", "ece", "kappa_autorater", "kappa_gold"]
        parts.append(format_table({f"{name} / {s}": m for s, m in table.items()}, bcols,
                                  title=f"== {report['split']}: baseline {name} (threshold {report['baseline_thresholds'][name]:.3f}) =="))
    for deployable, label in ((False, "the best baseline"), (True, "the best deployable baseline (not reading gold answers)")):
        mg = margins(report, deployable)
        if mg and (not deployable or set(report["baselines"]) & set(GOLD_READING)):
            parts.append(f"== macro-F1 points over {label} ({binary_f1_key(report)}) ==\n"
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
