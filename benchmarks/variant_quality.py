"""The variant ``backend="auto"`` picks on this CPU vs ONNX Runtime fp32, on labelled validation items.

    python benchmarks/variant_quality.py BUNDLE VALIDATION.jsonl > variant_quality.json

VALIDATION.jsonl: rows {question, passages, label 0/1, source}. Reports per variant macro-F1 at 0.5 and
AUROC (overall and per source), and between them the mean / largest |score change|, the agreement of
levels (0.8 / 0.5) overall and on the items whose fp32 score is more than 0.05 from both thresholds.
"""
import json, sys, time
import numpy as np
from suffice.serving import SufficiencyScorer
from suffice.serving.scorer import ScorerConfig
rows = [json.loads(l) for l in open(sys.argv[2])]
qs, ps = [r["question"] for r in rows], [r["passages"] for r in rows]
y = np.array([r["label"] for r in rows]); src = [r["source"] for r in rows]
out = {}
scores = {}
for name, cfg in {"fp32": ScorerConfig(backend="onnxruntime", precision="fp32", intra_op_threads=2),
                  "shipped_auto": ScorerConfig(intra_op_threads=2)}.items():
    s = SufficiencyScorer.load(sys.argv[1], cfg); t0 = time.time()
    scores[name] = np.array([r.score for r in s.score_batch(qs, ps, batch_size=32)])
    out[name] = {"variant": s.variant, "seconds": round(time.time() - t0, 1)}
from sklearn.metrics import f1_score, roc_auc_score
a, b = scores["fp32"], scores["shipped_auto"]
for name, sc in scores.items():
    pred = (sc >= 0.5).astype(int)
    out[name]["macro_f1_at_0.5"] = round(f1_score(y, pred, average="macro"), 4)
    out[name]["auroc"] = round(roc_auc_score(y, sc), 4)
    out[name]["per_source"] = {s_: {"macro_f1": round(f1_score(y[m], (sc[m] >= 0.5).astype(int), average="macro"), 4),
                                    "auroc": round(roc_auc_score(y[m], sc[m]), 4)}
                               for s_ in sorted(set(src)) for m in [np.array([x == s_ for x in src])]}
lv = lambda s: np.where(s >= 0.8, 2, np.where(s >= 0.5, 1, 0))
far = (np.abs(a - 0.8) > 0.05) & (np.abs(a - 0.5) > 0.05)
out["items"] = len(rows)
out["mean_abs_score_change"] = round(float(np.abs(a - b).mean()), 5)
out["max_abs_score_change"] = round(float(np.abs(a - b).max()), 5)
out["level_agreement"] = round(float((lv(a) == lv(b)).mean()), 5)
out["level_agreement_away_from_thresholds_0.05"] = round(float((lv(a)[far] == lv(b)[far]).mean()), 5)
out["items_away_from_thresholds"] = int(far.sum())
print(json.dumps(out, indent=1))
