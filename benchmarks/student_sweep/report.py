"""Score the GPU sweep's returned logits as training scores a run: selection and temperature on validation only.

    python benchmarks/student_sweep/report.py --logits logits.npz [--logits more.npz] [--out report.json]

For each recipe: the epoch with the best mean validation macro-F1 over sources (squad2, qed,
hotpotqa-fullwiki, wiki-synthetic) is chosen on validation; a temperature is fitted on that
epoch's validation logits; the test split is then scored once per source (macro-F1 at the 0.5
decision, AUROC, ECE after temperature) with the decisiveness numbers of the student issue: the
share of autorater-sufficient test items that reach the 0.8 "sufficient" level and the precision there.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import numpy as np

from suffice.serving.calibration import softmax
from suffice.training.fit.calibration import fit_temperature
from suffice.training.evaluation.metrics import auroc, expected_calibration_error

VAL_SOURCES = ("squad2", "qed", "hotpotqa-fullwiki", "wiki-synthetic")


def macro_f1(y: np.ndarray, pred: np.ndarray) -> float:
    out = []
    for c in (0, 1):
        tp = np.sum((pred == c) & (y == c))
        fp = np.sum((pred == c) & (y != c))
        fn = np.sum((pred != c) & (y == c))
        out.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(out))


def source_table(p: np.ndarray, y: np.ndarray, src: np.ndarray) -> dict[str, dict[str, float]]:
    table = {}
    for s in sorted(set(src)):
        sel = src == s
        ys, ps = y[sel], p[sel]
        at8 = ps >= 0.8
        table[s] = {"n": int(sel.sum()), "macro_f1": round(macro_f1(ys, (ps >= 0.5).astype(int)), 4),
                    "auroc": round(float(auroc(ps, ys)), 4), "ece": round(float(expected_calibration_error(ps, ys)), 4),
                    "sufficient_reached_at_0.8": round(float(at8[ys == 1].mean()) if (ys == 1).any() else float("nan"), 4),
                    "precision_at_0.8": round(float(ys[at8].mean()) if at8.any() else float("nan"), 4)}
    return table


def report(npz_path: str) -> dict[str, dict]:
    z = np.load(npz_path)
    runs: dict[str, dict[int, dict[str, np.ndarray]]] = defaultdict(dict)
    for k in z.files:
        if "__" in k:
            name, split, ep = k.split("__")
            runs[name].setdefault(int(ep), {})[split] = z[k].astype(np.float32)
    yv, yt = z["val_label"], z["test_label"]
    sv, st = z["val_source"], z["test_source"]
    out = {}
    for name, epochs in runs.items():
        def val_mean(ep):
            p = softmax(epochs[ep]["val"])[:, 1]
            tab = source_table(p, yv, sv)
            return float(np.mean([tab[s]["macro_f1"] for s in VAL_SOURCES if s in tab]))

        best = max(epochs, key=val_mean)
        t = fit_temperature(epochs[best]["val"], yv)
        pv, pt = softmax(epochs[best]["val"], t)[:, 1], softmax(epochs[best]["test"], t)[:, 1]
        out[name] = {"best_epoch": best, "temperature": round(float(t), 4), "validation_source_mean_f1": round(val_mean(best), 4),
                     "validation": source_table(pv, yv, sv), "test": source_table(pt, yt, st),
                     "test_overall": source_table(pt, yt, np.asarray(["all"] * len(yt)))["all"]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logits", action="append", required=True)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    result = {}
    for p in args.logits:
        result.update(report(p))
    for name, r in result.items():
        print(f"\n{name}: best epoch {r['best_epoch']} (validation source-mean macro-F1 {r['validation_source_mean_f1']}), T={r['temperature']}")
        for split in ("validation", "test"):
            for s, m in r[split].items():
                print(f"  {split:10s} {s:18s} " + "  ".join(f"{k}={v}" for k, v in m.items()))
        print("  test overall      " + "  ".join(f"{k}={v}" for k, v in r["test_overall"].items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
