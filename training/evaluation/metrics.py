"""Classification metrics for sufficiency models and baselines, per source and overall, and plots.

Every model and baseline is reported the same way: accuracy, macro-F1, F1 per class, AUROC of
the positive score, ECE of the positive score (the calibrated probability a service sees),
Cohen's kappa with the autorater labels and with the gold labels, and a selective-accuracy
curve (accuracy on the most confident fraction of items).

>>> import numpy as np
>>> p = np.array([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.6, 0.4]])
>>> m = classification_metrics(p, np.array([0, 1, 1, 1]), label_names=["insufficient", "sufficient"], positive_index=1)
>>> m["accuracy"], round(m["macro_f1"], 3), m["auroc"]
(0.75, 0.733, 1.0)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np


TABLE_COLUMNS = ("n", "accuracy", "macro_f1", "auroc", "ece", "kappa_autorater", "kappa_gold")


def expected_calibration_error(scores: np.ndarray, outcomes: np.ndarray, bins: int = 15) -> float:
    """ECE of probabilities ``scores`` for binary ``outcomes``: sum over equal-width bins of
    (bin share) x |mean score - observed frequency|.

    >>> expected_calibration_error(np.array([0.9, 0.9, 0.1, 0.1]), np.array([1, 1, 0, 0]), bins=10)
    0.1
    """
    scores = np.asarray(scores, dtype=np.float64)
    outcomes = np.asarray(outcomes, dtype=np.float64)
    if len(scores) == 0:
        return float("nan")
    idx = np.minimum((scores * bins).astype(int), bins - 1)
    ece = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            ece += sel.mean() * abs(scores[sel].mean() - outcomes[sel].mean())
    return float(round(ece, 12))


def reliability_bins(scores: np.ndarray, outcomes: np.ndarray, bins: int = 15) -> list[dict[str, float]]:
    """Per bin: lower edge, mean score, observed frequency and count (for the reliability diagram)."""
    scores = np.asarray(scores, dtype=np.float64)
    outcomes = np.asarray(outcomes, dtype=np.float64)
    idx = np.minimum((scores * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        sel = idx == b
        out.append({
            "lo": b / bins,
            "score": float(scores[sel].mean()) if sel.any() else float("nan"),
            "frequency": float(outcomes[sel].mean()) if sel.any() else float("nan"),
            "count": int(sel.sum()),
        })
    return out


def auroc(scores: np.ndarray, outcomes: np.ndarray) -> float:
    """Area under the ROC curve; NaN when only one class is present (undefined, not 0.5)."""
    outcomes = np.asarray(outcomes)
    if len(np.unique(outcomes)) < 2:
        return float("nan")
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(outcomes, scores))


def paired_auroc(scores: np.ndarray, outcomes: np.ndarray, groups: Sequence[str]) -> float:
    """AUROC over the (positive, negative) pairs that share a group (``""`` = none): how well the
    scores order items over the same passage, where the passage alone cannot tell them apart and
    only the question can (SQuAD 2.0's unanswerable questions sit beside answerable ones over one
    paragraph). Ties count half; NaN when no group holds both classes.

    >>> paired_auroc(np.array([0.9, 0.2, 0.4, 0.6, 0.7]), np.array([1, 0, 1, 0, 1]), ["a", "a", "b", "b", ""])
    0.5
    """
    scores = np.asarray(scores, dtype=np.float64)
    outcomes = np.asarray(outcomes)
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if g:
            members.setdefault(g, []).append(i)
    wins = pairs = 0.0
    for rows in members.values():
        idx = np.asarray(rows)
        pos, neg = scores[idx[outcomes[idx] == 1]], scores[idx[outcomes[idx] != 1]]
        if len(pos) and len(neg):
            diff = pos[:, None] - neg[None, :]
            wins += float((diff > 0).sum() + 0.5 * (diff == 0).sum())
            pairs += diff.size
    return wins / pairs if pairs else float("nan")


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float:
    """Cohen's kappa between two label vectors; NaN when empty, 1.0 when both are one identical constant."""
    a, b = np.asarray(a), np.asarray(b)
    if len(a) == 0:
        return float("nan")
    if len(np.unique(np.concatenate([a, b]))) < 2:
        return 1.0
    from sklearn.metrics import cohen_kappa_score

    return float(cohen_kappa_score(a, b))


def selective_accuracy(confidence: np.ndarray, correct: np.ndarray, points: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy on the most confident ``coverage`` share of items, for coverage 1/points .. 1.

    >>> cov, acc = selective_accuracy(np.array([0.9, 0.8, 0.6, 0.55]), np.array([1, 1, 0, 1]), points=4)
    >>> cov.tolist(), acc.tolist()
    ([0.25, 0.5, 0.75, 1.0], [1.0, 1.0, 0.6666666666666666, 0.75])
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    n = len(confidence)
    if n == 0:
        return np.array([]), np.array([])
    order = np.argsort(-confidence, kind="stable")
    cum = np.cumsum(correct[order])
    coverage = np.arange(1, points + 1) / points
    k = np.maximum(1, np.round(coverage * n).astype(int))
    return coverage, cum[k - 1] / k


def classification_metrics(
    probs: np.ndarray,
    labels: np.ndarray,
    *,
    label_names: Sequence[str],
    positive_index: int,
    predictions: np.ndarray | None = None,
    ece_bins: int = 15,
    autorater_mask: np.ndarray | None = None,
    gold_labels: np.ndarray | None = None,
    groups: Sequence[str] | None = None,
) -> dict[str, float]:
    """Metrics of one model (or baseline) on one set of items.

    probs: (n, k) class probabilities (a baseline with one score passes ``[1 - s, s]``).
    labels: (n,) reference class indices in the same label space.
    predictions: class indices (default: argmax of probs).
    autorater_mask: rows whose reference label came from the autorater (kappa_autorater uses them).
    gold_labels: binary gold labels, -1 where there is none (kappa_gold, binary positive vs not).
    groups: each row's passage group (``""`` = none): adds ``paired_auroc`` (:func:`paired_auroc`).

    For three classes, ``binary_accuracy`` / ``binary_macro_f1`` score positive-vs-rest as well.
    """
    from sklearn.metrics import f1_score

    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    k = probs.shape[1] if probs.ndim == 2 else 0
    if probs.ndim != 2 or k != len(label_names) or len(probs) != len(labels):
        raise ValueError(f"probs {probs.shape} must be (n={len(labels)}, k={len(label_names)}) for labels {list(label_names)}")
    n = len(labels)
    out: dict[str, float] = {"n": float(n)}
    if n == 0:
        return out
    pred = probs.argmax(axis=1) if predictions is None else np.asarray(predictions, dtype=np.int64)
    out["accuracy"] = float((pred == labels).mean())
    out["macro_f1"] = float(f1_score(labels, pred, labels=list(range(k)), average="macro", zero_division=0))
    per_class = f1_score(labels, pred, labels=list(range(k)), average=None, zero_division=0)
    for name, f in zip(label_names, per_class):
        out[f"f1_{name}"] = float(f)
    pos_score = probs[:, positive_index]
    pos_true = (labels == positive_index).astype(int)
    pos_pred = (pred == positive_index).astype(int)
    out["positive_rate"] = float(pos_true.mean())
    out["auroc"] = auroc(pos_score, pos_true)
    if groups is not None:
        out["paired_auroc"] = paired_auroc(pos_score, pos_true, groups)
    out["ece"] = expected_calibration_error(pos_score, pos_true, ece_bins)
    out["nll"] = float(-np.log(np.clip(probs[np.arange(n), labels], 1e-12, 1.0)).mean())
    if k > 2:
        out["binary_accuracy"] = float((pos_pred == pos_true).mean())
        out["binary_macro_f1"] = float(f1_score(pos_true, pos_pred, labels=[0, 1], average="macro", zero_division=0))
        out["ece_top_label"] = expected_calibration_error(probs.max(axis=1), (pred == labels).astype(int), ece_bins)
    mask = np.ones(n, dtype=bool) if autorater_mask is None else np.asarray(autorater_mask, dtype=bool)
    out["kappa_autorater"] = cohen_kappa(pos_pred[mask], pos_true[mask]) if mask.any() else float("nan")
    if gold_labels is not None:
        gold = np.asarray(gold_labels, dtype=np.int64)
        g = gold >= 0
        out["n_gold"] = float(g.sum())
        out["kappa_gold"] = cohen_kappa(pos_pred[g], gold[g]) if g.any() else float("nan")
    return out


def per_source_metrics(
    probs: np.ndarray,
    labels: np.ndarray,
    sources: Sequence[str],
    **kwargs,
) -> dict[str, dict[str, float]]:
    """:func:`classification_metrics` for every source and ``overall`` (same keyword arguments).

    >>> t = per_source_metrics(np.array([[0.8, 0.2], [0.1, 0.9]]), np.array([0, 1]), ["a", "b"],
    ...                        label_names=["no", "yes"], positive_index=1)
    >>> sorted(t), t["overall"]["accuracy"]
    (['a', 'b', 'overall'], 1.0)
    """
    sources = np.asarray(list(sources), dtype=object)
    table: dict[str, dict[str, float]] = {}
    for src in sorted(set(sources.tolist())):
        sel = sources == src
        table[src] = classification_metrics(probs[sel], labels[sel], **_subset(kwargs, sel))
    table["overall"] = classification_metrics(probs, labels, **kwargs)
    return table


def source_means(table: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Means over sources (``overall`` left out) of macro-F1 and AUROC: ``source_macro_f1`` and
    ``source_auroc``. A pooled score rewards a model that has only learnt which source an item
    comes from (qed items are mostly sufficient, hotpotqa ones mostly not); these do not.
    Sources without both classes have no AUROC and are left out of that mean.

    >>> t = {"a": {"macro_f1": 0.5, "auroc": 0.6}, "b": {"macro_f1": 0.7, "auroc": float("nan")},
    ...      "overall": {"macro_f1": 0.9, "auroc": 0.9}}
    >>> {k: round(v, 3) for k, v in source_means(t).items()}
    {'source_macro_f1': 0.6, 'source_auroc': 0.6}
    """
    rows = [m for src, m in table.items() if src != "overall"]
    out = {}
    for key in ("macro_f1", "auroc"):
        vals = [float(m[key]) for m in rows if key in m and math.isfinite(float(m[key]))]
        out[f"source_{key}"] = float(np.mean(vals)) if vals else float("nan")
    return out


def _subset(kwargs: dict, sel: np.ndarray) -> dict:
    out = dict(kwargs)
    for key in ("predictions", "autorater_mask", "gold_labels", "groups"):
        if out.get(key) is not None:
            out[key] = np.asarray(out[key])[sel]
    return out


def flat_metrics(table: Mapping[str, Mapping[str, float]], prefix: str) -> dict[str, float]:
    """``{"overall": {"auroc": x}, "squad2": {...}}`` -> ``{"<prefix>_auroc": x, "<prefix>_squad2_auroc": ...}``
    (finite values only: MLflow rejects NaN in some stores and it says nothing in a comparison)."""
    out = {}
    for src, metrics in table.items():
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                key = f"{prefix}_{k}" if src == "overall" else f"{prefix}_{src}_{k}"
                out[key] = float(v)
    return out


def format_table(rows: Mapping[str, Mapping[str, float]], columns: Sequence[str] = TABLE_COLUMNS, title: str = "") -> str:
    """A fixed-width text table, one row per name (``model / squad2``...)."""
    width = max([len(r) for r in rows] + [10])
    widths = [max(9, len(c)) + 1 for c in columns]
    head = "".join(f"{c:>{w}}" for c, w in zip(columns, widths))
    lines = ([title] if title else []) + [f"{'':<{width}}{head}"]
    for name, m in rows.items():
        cells = []
        for c, w in zip(columns, widths):
            v = m.get(c, float("nan"))
            cells.append(f"{int(v):>{w}d}" if c in ("n", "n_gold") and math.isfinite(v) else f"{v:>{w}.3f}")
        lines.append(f"{name:<{width}}" + "".join(cells))
    return "\n".join(lines)


# -- plots (matplotlib Agg, PNG) -------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion_matrix(labels: np.ndarray, predictions: np.ndarray, label_names: Sequence[str], path: str | Path, title: str = "") -> Path:
    """Confusion matrix with counts and row-normalised shares, saved as PNG."""
    from sklearn.metrics import confusion_matrix

    plt = _pyplot()
    k = len(label_names)
    cm = confusion_matrix(labels, predictions, labels=list(range(k)))
    share = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(3 + k, 2.6 + k))
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    for i in range(k):
        for j in range(k):
            ax.text(j, i, f"{cm[i, j]}\n{share[i, j]:.0%}", ha="center", va="center", color="white" if share[i, j] > 0.6 else "black")
    ax.set_xticks(range(k), label_names, rotation=20)
    ax.set_yticks(range(k), label_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("reference")
    ax.set_title(title or "confusion matrix")
    return _save(fig, path)


def plot_reliability(scores: np.ndarray, outcomes: np.ndarray, path: str | Path, bins: int = 15, title: str = "") -> Path:
    """Reliability diagram of the positive score: observed frequency per score bin, with counts."""
    plt = _pyplot()
    rb = reliability_bins(scores, outcomes, bins)
    ece = expected_calibration_error(scores, outcomes, bins)
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
    xs = [b["score"] for b in rb if b["count"]]
    ys = [b["frequency"] for b in rb if b["count"]]
    ax.bar([b["lo"] for b in rb], [b["frequency"] if b["count"] else 0 for b in rb], width=1 / bins, align="edge",
           alpha=0.3, edgecolor="black", label="observed frequency per bin")
    ax.plot(xs, ys, "o-", label=f"ECE = {ece:.3f}")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("calibrated score")
    ax.set_ylabel("observed positive frequency")
    ax.set_title(title or "reliability diagram")
    ax.legend(loc="upper left")
    return _save(fig, path)


def plot_precision_recall(scores: np.ndarray, outcomes: np.ndarray, path: str | Path, title: str = "",
                          thresholds: Mapping[str, float] | None = None) -> Path:
    """Precision-recall curve of the positive score, with the decision thresholds marked."""
    from sklearn.metrics import average_precision_score, precision_recall_curve

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    if len(np.unique(outcomes)) == 2:
        prec, rec, thr = precision_recall_curve(outcomes, scores)
        ap = average_precision_score(outcomes, scores)
        ax.plot(rec, prec, label=f"AP = {ap:.3f}")
        for name, t in (thresholds or {}).items():
            i = int(np.searchsorted(thr, t)) if len(thr) else 0
            if i < len(thr):
                ax.plot(rec[i], prec[i], "o", label=f"{name} >= {t:.2f}: P={prec[i]:.2f} R={rec[i]:.2f}")
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_title(title or "precision-recall")
    ax.legend(loc="lower left")
    return _save(fig, path)


def plot_selective_accuracy(curves: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str | Path, title: str = "") -> Path:
    """Selective accuracy vs coverage, one line per model / baseline."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    for name, (cov, acc) in curves.items():
        ax.plot(cov, acc, "o-", markersize=3, label=name)
    ax.set_xlabel("coverage (share of items answered, most confident first)")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, 1.02)
    ax.set_title(title or "selective accuracy vs coverage")
    ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return p
