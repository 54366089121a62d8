"""Quality parts of the benchmark: the student against the autorater and gold, the long-context
strategy against plain truncation, and the retrieval gate against its baseline.

Metrics come from ``suffice.training.evaluation`` (the code behind
``suffice evaluate``); this module only arranges the same items for several scorers and strategies.

>>> ev_set = EvalSet.load(bundle=Path("models/demo/bundle"), model_dir=Path("models/demo"))  # doctest: +SKIP
>>> quality(ev_set, Path("out"))["vs_autorater"]["student_int8"]["overall"]["macro_f1"]  # doctest: +SKIP
0.87
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

MULTI_HOP = ("hotpotqa-fullwiki", "hotpotqa-distractor", "musique")
COVERAGE_POINTS = (0.5, 0.8, 1.0)
BINARY = ["insufficient", "sufficient"]


# ------------------------------------------------------------------------------------------
# the evaluated items, loaded once
# ------------------------------------------------------------------------------------------
@dataclass
class EvalSet:
    """The student bundle, its metadata and the encoded train/test splits it is evaluated on."""

    bundle: Path
    model_dir: Path | None
    info: dict[str, Any]
    cfg: Any
    config_used: str
    splits: Any
    train: Any
    test: Any
    data_hash_matches_model: bool | None
    seconds: float
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [self.info["id2label"][i] for i in range(len(self.info["id2label"]))]

    @property
    def positive_index(self) -> int:
        return next(i for i, n in self.info["id2label"].items() if n == self.info["positive_label"])

    @property
    def has_int8(self) -> bool:
        from suffice.serving.bundle import read_manifest

        return read_manifest(self.bundle).int8_model_file is not None

    @classmethod
    def load(cls, bundle: Path, model_dir: Path | None, split: str = "test") -> "EvalSet":
        """Encode ``split`` and train with the bundle's window and strategy, from the model's own training config."""
        import datasets

        from suffice.serving.bundle import sha256_file
        from suffice.serving.packing import ContextPacker
        from suffice.training.evaluation import evaluate as ev
        from suffice.training.evaluation import report as evr
        from suffice.training.fit.model import load_tokenizer
        from suffice.training.fit.encode import encode_split

        t0 = time.perf_counter()
        datasets.disable_caching()  # encoded copies stay in memory: nothing is written into data/
        datasets.disable_progress_bars()
        info = ev.model_info(bundle)
        cfg, config_used = ev.eval_config(info, model_dir if model_dir is not None else bundle, None, [])
        splits = load_splits_readonly(cfg)
        if splits[split] is None or len(splits[split]) == 0:
            raise ValueError(f"the {split!r} split is empty for config {config_used}: nothing to evaluate")
        packer = ContextPacker(load_tokenizer(bundle), max_length=info["max_length"], strategy=info["strategy"])
        tok_hash = sha256_file(bundle / "tokenizer.json")
        test = encode_split(splits[split], packer, cfg, tok_hash)
        train = encode_split(splits["train"], packer, cfg, tok_hash)
        matches = None
        if model_dir is not None and (model_dir / "suffice_model.json").is_file():
            import json

            trained_on = json.loads((model_dir / "suffice_model.json").read_text()).get("data_hash")
            matches = None if not trained_on else trained_on == splits.data_hash
        return cls(bundle, model_dir, info, cfg, config_used, splits, train, test, matches, time.perf_counter() - t0)

    def student_probs(self, precision: str) -> np.ndarray:
        """Calibrated probabilities of the bundle on the test split (``int8`` or ``fp32``), cached."""
        key = f"probs_{precision}"
        if key not in self.cache:
            from suffice.training.evaluation import evaluate as ev
            from suffice.training.evaluation import report as evr

            t0 = time.perf_counter()
            self.cache[key] = ev.score_bundle(self.bundle, self.test, self.info, 32, precision)
            self.cache[f"seconds_{precision}"] = time.perf_counter() - t0
        return self.cache[key]

    @property
    def student_precisions(self) -> list[str]:
        return ["int8", "fp32"] if self.has_int8 else ["fp32"]


def load_splits_readonly(cfg):
    """The model's splits, reading an already prepared dataset as it is (a run in progress may be
    using it); only when none exists is it prepared."""
    from suffice.training.fit.splits import load_prepared_splits, load_splits

    if cfg.task == "sufficiency" and not cfg.train_file:
        try:
            return load_prepared_splits(cfg, is_main=False)
        except FileNotFoundError:
            pass
    return load_splits(cfg)


def _binary_view(probs: np.ndarray, pos: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 2) [not positive, positive] probabilities and positive-vs-rest decisions of a model."""
    p = probs[:, pos]
    return np.stack([1.0 - p, p], axis=1), (probs.argmax(axis=1) == pos).astype(np.int64)


def gold_table(p2: np.ndarray, preds: np.ndarray, ds, ece_bins: int) -> dict[str, dict[str, float]]:
    """Per-source metrics of binary probabilities / decisions against the gold labels (rows with gold only)."""
    from suffice.training.evaluation.metrics import per_source_metrics

    gold = np.asarray(ds["gold_label"], dtype=np.int64)
    sel = gold >= 0
    if not sel.any():
        return {}
    sources = np.asarray(ds["source"], dtype=object)[sel]
    return per_source_metrics(p2[sel], gold[sel], sources, label_names=BINARY, positive_index=1, predictions=preds[sel], ece_bins=ece_bins)


def coverage_table(confidence: np.ndarray, correct: np.ndarray) -> dict[str, float]:
    """Accuracy on the most confident 50% / 80% / 100% of items."""
    from suffice.training.evaluation.metrics import selective_accuracy

    cov, acc = selective_accuracy(confidence, correct, points=20)
    return {f"acc_at_{int(c * 100)}": float(acc[int(round(c * 20)) - 1]) for c in COVERAGE_POINTS} if len(cov) else {}


# ------------------------------------------------------------------------------------------
# part: quality
# ------------------------------------------------------------------------------------------
def quality(es: EvalSet, out: Path) -> dict[str, Any]:
    """Student (int8, fp32) and baselines per source against the autorater labels and gold, calibration,
    selective accuracy; writes reliability and selective-accuracy PNGs into ``out``."""
    from suffice.training.evaluation import evaluate as ev
    from suffice.training.evaluation import report as evr
    from suffice.serving.jsonl import json_safe
    from suffice.training.evaluation.metrics import plot_reliability, plot_selective_accuracy, reliability_bins, selective_accuracy

    pos, names, bins = es.positive_index, es.names, es.cfg.calibration.ece_bins
    thresholds = es.info["thresholds"] or {"sufficient": 0.8, "partial": 0.5}
    precisions = es.student_precisions
    probs = {p: es.student_probs(p) for p in precisions}
    main = precisions[0]
    t0 = time.perf_counter()
    report = evr.full_report(probs[main], es.test, train_ds=es.train, id2label=es.info["id2label"], positive_index=pos, ece_bins=bins,
                            thresholds=thresholds, baselines=es.cfg.resolved_baselines(), split="test", task=es.info["task"])
    baseline_seconds = time.perf_counter() - t0
    labels = np.asarray(es.test["labels"])
    pos_true = (labels == pos).astype(np.int64)
    vs_auto: dict[str, Any] = {f"student_{main}": report["model"]}
    vs_gold: dict[str, Any] = {}
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    coverage: dict[str, dict[str, float]] = {}
    for p in precisions:
        if p != main:
            vs_auto[f"student_{p}"] = evr.classification_report(probs[p], es.test, label_names=names, positive_index=pos, ece_bins=bins)
        p2, pred = _binary_view(probs[p], pos)
        vs_gold[f"student_{p}"] = gold_table(p2, pred, es.test, bins)
        conf, correct = np.abs(probs[p][:, pos] - 0.5), (pred == pos_true).astype(int)
        curves[f"student {p}"] = selective_accuracy(conf, correct)
        coverage[f"student_{p}"] = coverage_table(conf, correct)
    arr = report["_arrays"]
    for name, table in report["baselines"].items():
        vs_auto[name] = table
        s, pr = arr["scores"][name], arr["preds"][name]
        vs_gold[name] = gold_table(np.stack([1.0 - s, s], axis=1), pr, es.test, bins)
        conf, correct = np.abs(s - report["baseline_thresholds"][name]), (pr == pos_true).astype(int)
        curves[name] = selective_accuracy(conf, correct)
        coverage[name] = coverage_table(conf, correct)
    # the teacher itself against gold: the ceiling a student of these labels is measured under
    vs_gold["autorater_labels"] = gold_table(np.stack([1.0 - pos_true, pos_true], axis=1).astype(float), pos_true, es.test, bins)

    out.mkdir(parents=True, exist_ok=True)
    plots = [
        plot_reliability(probs[main][:, pos], pos_true, out / "reliability.png", bins=bins,
                         title=f"test: {main} student, P({names[pos]}) vs autorater"),
        plot_selective_accuracy(curves, out / "selective_accuracy.png", title="test: selective accuracy vs coverage (autorater labels)"),
    ]
    n_gold = int((np.asarray(es.test["gold_label"]) >= 0).sum())
    parity = {}
    if len(precisions) == 2:  # what the export's int8 parity check measures, on the whole test split
        a, b = probs["int8"], probs["fp32"]
        parity = {"decision_agreement": float((a.argmax(1) == b.argmax(1)).mean()), "max_abs_score_diff": float(np.abs(a[:, pos] - b[:, pos]).max()),
                  "mean_score_diff_int8_minus_fp32": float((a[:, pos] - b[:, pos]).mean())}
    return json_safe({
        "split": "test", "n": len(es.test), "n_gold": n_gold, "data_hash": es.splits.data_hash,
        "data_hash_matches_model": es.data_hash_matches_model, "config": es.config_used,
        "label_source": es.splits.label_source, "positive_label": names[pos], "thresholds": dict(thresholds),
        "baseline_thresholds": report["baseline_thresholds"], "vs_autorater": vs_auto, "vs_gold": vs_gold,
        "int8_vs_fp32": parity, "selective_accuracy": coverage,
        "selective_curves": {k: {"coverage": c.tolist(), "accuracy": a.tolist()} for k, (c, a) in curves.items()},
        "reliability": reliability_bins(probs[main][:, pos], pos_true, bins),
        "scoring_seconds": {p: es.cache.get(f"seconds_{p}") for p in precisions}, "baseline_seconds": baseline_seconds,
        "margins_deployable": evr.margins(report, deployable_only=True),
        "plots": [p.name for p in plots],
    })


# ------------------------------------------------------------------------------------------
# part: long-context strategy vs plain truncation
# ------------------------------------------------------------------------------------------
def answer_in_window(items: Sequence[Any], tokenizer_path: Path, windows: Sequence[int],
                     strategies: Sequence[str] = ("select", "truncate")) -> dict[str, dict[str, Any]]:
    """Share of answerable items whose gold answer survives packing, per source, window and strategy.

    Model-free: the kept context tokens are decoded and searched for the (identically tokenised
    and decoded) gold answer, SQuAD-normalised. Items without gold answers are left out.
    """
    from tokenizers import Tokenizer

    from suffice.serving.packing import ContextPacker
    from suffice.training.evaluation.baselines import normalise_answer

    tok = Tokenizer.from_file(str(tokenizer_path))
    out: dict[str, dict[str, Any]] = {}
    packers = {(w, s): ContextPacker(Tokenizer.from_file(str(tokenizer_path)), max_length=w, strategy=s) for w in windows for s in strategies}
    for it in items:
        answers = [str(a) for a in ((it.gold or {}).get("answers") or []) if str(a).strip()]
        if not answers:
            continue
        norm_answers = [normalise_answer(tok.decode(tok.encode(a, add_special_tokens=False).ids)) for a in answers]
        norm_answers = [a for a in norm_answers if a]
        if not norm_answers:
            continue
        passages = [{"title": p.title, "text": p.text} for p in it.passages]
        full_ctx = normalise_answer(" ".join(tok.decode(tok.encode(f"{p['title']}: {p['text']}", add_special_tokens=False).ids) for p in passages))
        src = out.setdefault(it.source, {"items": 0, "answer_in_context": 0})
        src["items"] += 1
        src["answer_in_context"] += int(any(a in full_ctx for a in norm_answers))
        for (w, s), packer in packers.items():
            p = packer.pack(it.question, passages)
            ctx_ids = p.input_ids[p.question_tokens + 2 : -1]
            kept = normalise_answer(tok.decode(ctx_ids))
            key = f"{s}@{w}"
            src[key] = src.get(key, 0) + int(any(a in kept for a in norm_answers))
            src[f"truncated@{w}"] = src.get(f"truncated@{w}", 0) + (int(p.truncated) if s == strategies[0] else 0)
    for src in out.values():
        n = src["items"]
        for k in [k for k in src if "@" in k]:
            src[f"share_{k}"] = src[k] / n if n else float("nan")
    return out


def _strategy_probs(bundle: Path, precision: str, questions: Sequence[str], passages: Sequence[Any], strategy: str,
                    batch_size: int = 32) -> np.ndarray:
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    clf = OnnxClassifier(bundle, RuntimeConfig(precision=precision))
    packer = clf.packer_for(strategy=strategy)
    outs = []
    for i in range(0, len(questions), batch_size):
        packed = [packer.pack(q, p) for q, p in zip(questions[i : i + batch_size], passages[i : i + batch_size])]
        outs.append(clf.predict_packed(packed)[1])
    return np.concatenate(outs) if outs else np.zeros((0, clf.manifest.num_labels))


def long_context(es: EvalSet, items: Sequence[Any], windows: Sequence[int]) -> dict[str, Any]:
    """Answer-in-window coverage (model-free) and the student's metrics with ``select`` vs ``truncate``
    on the multi-hop items of the test split (autorater and gold labels) and, flagged, of the train split."""
    from suffice.training.evaluation import evaluate as ev
    from suffice.training.evaluation import report as evr
    from suffice.serving.jsonl import json_safe

    t0 = time.perf_counter()
    coverage = answer_in_window(items, es.bundle / "tokenizer.json", windows)
    coverage_seconds = time.perf_counter() - t0
    precision = es.student_precisions[0]
    pos, names, bins = es.positive_index, es.names, es.cfg.calibration.ece_bins
    models: dict[str, Any] = {}
    for split_name, ds, reference in (("test", es.test, "autorater labels (and gold)"), ("train", es.train, "gold labels; the student may have seen these items")):
        src = np.asarray(ds["source"], dtype=object)
        idx = np.flatnonzero(np.isin(src, MULTI_HOP))
        if not len(idx):
            continue
        sub = ds.select(idx.tolist())
        per: dict[str, Any] = {"n": len(sub), "reference": reference}
        for strategy in ("select", "truncate"):
            probs = _strategy_probs(es.bundle, precision, list(sub["question"]), list(sub["passages"]), strategy)
            p2, pred = _binary_view(probs, pos)
            per[strategy] = {"vs_labels": evr.classification_report(probs, sub, label_names=names, positive_index=pos, ece_bins=bins),
                             "vs_gold": gold_table(p2, pred, sub, bins)}
        models[split_name] = per
    return json_safe({"precision": precision, "model_strategy": es.info["strategy"], "window": es.info["max_length"],
                      "answer_in_window": coverage, "answer_in_window_seconds": coverage_seconds, "student": models})


def multi_hop_items(smoke_items: Path | None = None) -> list[Any]:
    """The multi-hop items (every split) of the shared items.jsonl, or of a smoke file."""
    from suffice.training.data.loaders import load_items
    from suffice.training.paths import data_dir

    path = smoke_items if smoke_items is not None else data_dir() / "items.jsonl"
    return [it for it in load_items(path) if it.source in MULTI_HOP]


# ------------------------------------------------------------------------------------------
# part: retrieval gate vs its baseline
# ------------------------------------------------------------------------------------------
def find_gate_model(explicit: str | None = None) -> tuple[str | None, str]:
    """(model reference, how it was found), or (None, why not): an explicit path or URI, the newest version
    of the ``suffice-retrieval-gate`` registered model, or the newest models/*/ holding a retrieval-gate model."""
    import json

    from suffice.training.paths import REPO_ROOT, default_tracking_uri

    if explicit:
        return explicit, "given with --gate-model"
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = default_tracking_uri()
        versions = MlflowClient(tracking_uri=uri, registry_uri=uri).search_model_versions("name='suffice-retrieval-gate'")
        if versions:
            v = max(int(mv.version) for mv in versions)
            return f"models:/suffice-retrieval-gate/{v}", f"newest version in the MLflow registry ({uri})"
    except (ImportError, MlflowException) as e:
        registry_error = f"{type(e).__name__}: {e}"
    else:
        registry_error = "no registered suffice-retrieval-gate model"
    candidates = []
    for meta in (REPO_ROOT / "models").glob("*/suffice_model.json"):
        try:
            if json.loads(meta.read_text()).get("task") == "retrieval_gate":
                candidates.append(meta.parent)
        except (OSError, ValueError):
            continue
    if candidates:
        newest = max(candidates, key=lambda p: p.stat().st_mtime)
        bundle = newest / "bundle"
        return str(bundle if (bundle / "suffice.json").is_file() else newest), "newest retrieval-gate model under models/"
    return None, f"no retrieval-gate model ({registry_error}; none under models/)"


def retrieval_gate(model: str, out: Path, baselines: Sequence[str] = ("tfidf_lr", "keyword_coverage")) -> dict[str, Any]:
    """The gate model on its test threads next to the baselines (same items, same metrics)."""
    from suffice.serving.bundle import sha256_file
    from suffice.serving.packing import ContextPacker
    from suffice.training.evaluation import evaluate as ev
    from suffice.training.evaluation import report as evr
    from suffice.serving.jsonl import json_safe
    from suffice.training.fit.model import load_tokenizer
    from suffice.training.fit.encode import encode_split
    from suffice.training.fit.splits import load_splits

    path = ev.resolve_model(model)
    info = ev.model_info(path)
    if info["task"] != "retrieval_gate":
        raise ValueError(f"{model} is a {info['task']!r} model, not a retrieval gate: give --gate-model a retrieval-gate model")
    cfg, config_used = ev.eval_config(info, path, None, [])
    splits = load_splits(cfg)
    packer = ContextPacker(load_tokenizer(path), max_length=info["max_length"], strategy=info["strategy"])
    tok_hash = sha256_file(path / "tokenizer.json")
    test, train = encode_split(splits["test"], packer, cfg, tok_hash), encode_split(splits["train"], packer, cfg, tok_hash)
    pos = next(i for i, n in info["id2label"].items() if n == info["positive_label"])
    t0 = time.perf_counter()
    if info["kind"] == "bundle":
        probs = ev.score_bundle(path, test, info, 32, "auto")
    else:
        probs = ev.score_model_dir(path, test, 32, info["calibration"], packer.pad_id, pos)
    seconds = time.perf_counter() - t0
    report = evr.full_report(probs, test, train_ds=train, id2label=info["id2label"], positive_index=pos, ece_bins=cfg.calibration.ece_bins,
                            thresholds=info["thresholds"] or {"skip": 0.5}, baselines=list(baselines), split="test", task="retrieval_gate")
    return json_safe({"model": model, "resolved": str(path), "kind": info["kind"], "config": config_used, "n_test": len(test),
                      "data_hash": splits.data_hash, "scoring_seconds": seconds, "thresholds": report["thresholds"],
                      "baseline_thresholds": report["baseline_thresholds"],
                      "tables": {"model": report["model"], **report["baselines"]}})
