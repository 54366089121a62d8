"""The retrieval gate on held-out threads: quality against the goal, the baseline, latency, examples.

Runs the exported gate exactly as a service does (``RetrievalGate.decide`` on whole threads,
torch-free) on the test threads of the split that training used (same seed, same fractions,
rebuilt from ``configs/retrieval-gate.yaml``), next to TF-IDF + logistic regression fitted on
the same train threads. Reports macro-F1, SKIP precision, the share of follow-ups skipped, the
latency of ``decide`` at 128-token inputs (int8), and the issue's acceptance examples.

Goal (issue 7): macro-F1 >= 0.90, SKIP precision >= 0.95 while skipping >= 30% of follow-ups,
>= 3 F1 points above TF-IDF + LR, p50 <= 10 ms at 128 tokens (int8). How the goals are checked:
macro-F1 and the margin over TF-IDF + LR at each classifier's own decision (P(SKIP) >= 0.5);
SKIP precision and skip rate at the stored, precision-first SKIP threshold (what ``decide`` uses);
latency on test threads that fill the 128-token window. The report also gives macro-F1 at the
stored threshold, so the stricter reading (every goal at one operating point) can be read off.

    python benchmarks/bench_retrieval_gate.py --bundle models/gate-x/bundle --out gate.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

FRUIT_THREAD = [
    {"role": "user", "content": "What fruit do you have and what do they cost?"},
    {"role": "assistant", "content": "Here are today's fruit prices:\n\n| Fruit | Price per lb |\n|---|---|\n"
                                     "| Bananas | $0.69 |\n| Mangoes | $2.49 |\n| Cherries | $5.99 |\n| Grapes | $3.29 |"},
]
# (latest user message, expected decision): the acceptance examples, asked after the first answer.
ACCEPTANCE = [
    ("Sort that by price descending", "SKIP"),
    ("What about apples?", "RETRIEVE"),
    ("Explain that in simpler terms", "SKIP"),
    ("Now find me all fruits under $2", "RETRIEVE"),
    ("Thanks!", "SKIP"),
    ("Actually, what vegetables do you have?", "RETRIEVE"),
]
FIRST_MESSAGE = ("What is the price of bananas?", "RETRIEVE")


def acceptance(gate) -> list[dict]:
    """The issue's examples, each decided on the fruit-price thread (and one first message)."""
    out = []
    for text, want in ACCEPTANCE:
        d = gate.decide([*FRUIT_THREAD, {"role": "user", "content": text}])
        out.append({"message": text, "expected": want, "decision": d.decision, "p_skip": d.score, "ok": d.decision == want})
    d = gate.decide([{"role": "user", "content": FIRST_MESSAGE[0]}])
    out.append({"message": FIRST_MESSAGE[0] + " (first message)", "expected": FIRST_MESSAGE[1], "decision": d.decision,
                "p_skip": d.score, "ok": d.decision == FIRST_MESSAGE[1]})
    return out


def test_threads(config: str, overrides: list[str], cfg=None):
    """(train rows, test rows) exactly as training split them (``cfg``, when given, is the resolved
    training config and wins over ``config`` / ``overrides``)."""
    from suffice.training.fit.splits import load_gate_splits
    from suffice.training.fit.config import build_train_config

    cfg = cfg if cfg is not None else build_train_config(config, overrides)
    splits = load_gate_splits(cfg)
    return splits.train, splits.test


def thread_of(row: dict) -> list[dict]:
    return [{"role": p["title"], "content": p["text"]} for p in row["passages"]] + [{"role": "user", "content": row["question"]}]


def gate_quality(pred_skip: np.ndarray, y_skip: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import f1_score

    skipped = pred_skip == 1
    return {
        "n": int(len(y_skip)),
        "macro_f1": float(f1_score(y_skip, pred_skip, average="macro", labels=[0, 1], zero_division=0)),
        "accuracy": float((pred_skip == y_skip).mean()),
        "skip_precision": float(y_skip[skipped].mean()) if skipped.any() else float("nan"),
        "skip_recall": float(pred_skip[y_skip == 1].mean()) if (y_skip == 1).any() else float("nan"),
        "skip_rate": float(skipped.mean()),
    }


def latency_128(gate, rows, n: int = 200) -> dict[str, float]:
    """p50/p95/p99 of ``decide`` on test threads packed into a 128-token window (follow-ups only),
    the mean packed length, and p50 on the threads whose packed input fills the window (>= 120
    tokens): the "128-token input" of the goal (threads shorter than the window run faster)."""
    from suffice.serving.gates.retrieval import RetrievalGate  # noqa: F401  (same code path as services)

    threads = [thread_of(r) for r in rows][:n]
    for t in threads[:5]:
        gate.decide(t)
    ms, lens = [], []
    for t in threads:
        t0 = time.perf_counter()
        gate.decide(t)
        ms.append((time.perf_counter() - t0) * 1e3)
        lens.append(len(gate._packer.pack(*gate.build_input(t)).input_ids))
    a, L = np.asarray(ms), np.asarray(lens)
    full = a[L >= 120]
    return {"p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "p99_ms": float(np.percentile(a, 99)), "n": int(a.size), "mean_tokens": float(L.mean()),
            "full_window_n": int(full.size), "full_window_p50_ms": float(np.percentile(full, 50)) if full.size else float("nan")}


def run(bundle: str | Path, config: str = str(REPO / "configs" / "retrieval-gate.yaml"), overrides: list[str] | None = None,
        threads: int = 2, cfg=None) -> dict:
    """Every measurement of this module on one bundle, as a JSON-ready dict.

    The headline precision is int8; a bundle without an int8 model (its int8 failed the parity
    check at export) is measured in fp32 and says so (``headline_precision``)."""
    from suffice.serving.bundle import read_manifest
    from suffice.serving.gates.retrieval import RetrievalGate, RetrievalGateConfig
    from suffice.training.evaluation.baselines import TfidfLogisticBaseline
    from suffice.training.evaluation.metrics import auroc

    train, test = test_threads(config, overrides or [], cfg)
    head = "int8" if read_manifest(bundle).int8_model_file else "fp32"
    precisions = ("int8", "fp32") if head == "int8" else ("fp32",)
    y = np.asarray(test["label"], dtype=np.int64)  # 1 = SKIP
    out: dict = {"bundle": str(bundle), "n_train": len(train), "n_test": len(test),
                 "hardware": {"cpu": platform.processor() or platform.machine(), "threads": threads}}
    out["headline_precision"] = head
    for precision in precisions:
        gate = RetrievalGate.load(bundle, RetrievalGateConfig(precision=precision, intra_op_threads=threads))
        rows = list(test)
        decisions = [gate.decide(thread_of(r)) for r in rows]
        pred = np.asarray([1 if d.decision == "SKIP" else 0 for d in decisions])
        errors = [d.reason for d in decisions if d.score is None]
        q = gate_quality(pred, y)
        q["skip_threshold"] = gate.skip_threshold
        # the classifier's own decision (P(SKIP) >= 0.5, as TF-IDF + LR is scored) beside the
        # precision-first operating point above
        scores = np.asarray([np.nan if d.score is None else d.score for d in decisions])
        q["at_0.5"] = gate_quality((np.nan_to_num(scores, nan=0.0) >= 0.5).astype(int), y)
        q["auroc"] = auroc(np.nan_to_num(scores, nan=0.0), y)
        q["fail_open_count"] = len(errors)
        by_cat: dict[str, list[int]] = {}
        for r, p in zip(rows, pred):
            by_cat.setdefault(r["kind"] or "?", []).append(int(p == r["label"]))
        q["accuracy_by_category"] = {k: round(float(np.mean(v)), 3) for k, v in sorted(by_cat.items())}
        out[precision] = q
        if precision == head:
            # inputs of ~128 tokens: cap the window at 128 so the latency is the 128-token figure
            window = min(128, gate._model.manifest.max_length)
            gate128 = RetrievalGate.load(bundle, RetrievalGateConfig(precision=head, intra_op_threads=threads, max_tokens=window))
            out["latency_128"] = latency_128(gate128, rows)
            out["acceptance"] = acceptance(gate)
    base = TfidfLogisticBaseline().fit(train["question"], train["passages"], np.asarray(train["label"]))
    base_scores = base.score(test["question"], test["passages"])
    out["tfidf_lr"] = gate_quality(base.predict(base_scores), y)
    out["tfidf_lr"]["auroc"] = auroc(base_scores, y)
    # both deciders at their own 0.5 decision: the classifiers compared as classifiers
    out["f1_points_over_tfidf"] = 100 * (out[head]["at_0.5"]["macro_f1"] - out["tfidf_lr"]["macro_f1"])
    g = out[head]
    out["goals"] = {
        "macro_f1>=0.90": g["at_0.5"]["macro_f1"] >= 0.90,
        "skip_precision>=0.95": g["skip_precision"] >= 0.95,
        "skip_rate>=0.30": g["skip_rate"] >= 0.30,
        "f1_points_over_tfidf>=3": out["f1_points_over_tfidf"] >= 3,
        "p50_128_int8<=10ms": head == "int8" and out["latency_128"]["full_window_p50_ms"] <= 10.0,
        "acceptance_examples": all(a["ok"] for a in out["acceptance"]),
    }
    return out


def gate_rows(r: dict) -> list[tuple[str, dict]]:
    """(label, quality) rows: each precision at the stored SKIP threshold and at 0.5, then TF-IDF + LR."""
    rows = []
    for k in ("int8", "fp32"):
        if k in r:
            t = r[k]["skip_threshold"]
            rows.append((f"{k} @ {t:.3f} (stored)", r[k]))
            rows.append((f"{k} @ 0.5", {**r[k]["at_0.5"], "auroc": r[k]["auroc"]}))
    rows.append(("tfidf_lr @ 0.5", r["tfidf_lr"]))
    return rows


def format_report(r: dict) -> str:
    lines = [f"retrieval gate on {r['n_test']} held-out threads (trained on {r['n_train']})",
             f"{'decider':<22} {'macro-F1':>9} {'SKIP prec':>10} {'SKIP rate':>10} {'accuracy':>9} {'AUROC':>6}"]
    for name, q in gate_rows(r):
        lines.append(f"{name:<22} {q['macro_f1']:>9.3f} {q['skip_precision']:>10.3f} {q['skip_rate']:>10.3f} {q['accuracy']:>9.3f} "
                     f"{q.get('auroc', float('nan')):>6.3f}")
    lat = r["latency_128"]
    lines.append(f"decide() {r['headline_precision']}, test threads in a 128-token window (mean {lat['mean_tokens']:.0f} tokens): "
                 f"p50 {lat['p50_ms']:.2f} ms, p95 {lat['p95_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms; "
                 f"full 128-token windows: p50 {lat['full_window_p50_ms']:.2f} ms ({lat['full_window_n']} calls)")
    lines.append(f"F1 points over TF-IDF + LR: {r['f1_points_over_tfidf']:+.1f}")
    for a in r["acceptance"]:
        p = "-" if a["p_skip"] is None else f"{a['p_skip']:.2f}"
        lines.append(f"  {'ok ' if a['ok'] else 'BAD'} {a['message']!r:<50} -> {a['decision']:<8} (want {a['expected']}, P(SKIP)={p})")
    lines.append("goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in r["goals"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="an exported retrieval-gate bundle folder")
    ap.add_argument("--config", default=str(REPO / "configs" / "retrieval-gate.yaml"), help="the config the gate was trained with")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the results as JSON here")
    args, overrides = ap.parse_known_args(argv)
    r = run(args.bundle, args.config, overrides, args.threads)
    print(format_report(r))
    if args.out:
        Path(args.out).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
