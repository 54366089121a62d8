"""A sufficiency bundle on hand-written items by another writer than the teacher (issue 30's "hand-written items").

``benchmarks/data/handwritten-sufficiency.jsonl``: (question, passages, label) items written by hand for this
check, not by the teacher that wrote the training sets and not from any source the training reads: one-
or two-sentence contexts (the "Mars has two small moons" kind), single paragraphs with SQuAD 2.0-style minimal
edits, and 2-4 retrieved passages. They are a probe, not a split: report them beside validation and test,
never select on them.

Scores each item as a service would (``SufficiencyScorer.score_batch``, calibrated P(sufficient)) and prints,
overall and per ``length`` (short / paragraph / multi): macro-F1 at the partial threshold, AUROC, the share of
items at the sufficient level and its precision, the mean score of each label, then the items the model gets
wrong at the partial threshold.

    python benchmarks/bench_handwritten.py --bundle models/x/bundle [--out hw.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
ITEMS = REPO / "benchmarks" / "data" / "handwritten-sufficiency.jsonl"


def load_items(path: str | Path = ITEMS) -> list[dict]:
    """The probe's items; each needs ``question``, ``passages`` and ``label`` (0/1). Errors name the line and field."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg}): one JSON object per line") from None
        for key in ("question", "passages", "label"):
            if key not in item:
                raise ValueError(f"{path}:{n}: missing field {key!r}: give question, passages and label (1 sufficient, 0 not)")
        if item["label"] not in (0, 1):
            raise ValueError(f"{path}:{n}: field 'label' is {item['label']!r}: use 1 (sufficient) or 0 (not)")
        out.append(item)
    return out


def quality(scores: np.ndarray, y: np.ndarray, partial: float, sufficient: float) -> dict:
    """macro-F1 at ``partial``, AUROC, share at ``sufficient`` and its precision, mean score per label."""
    from sklearn.metrics import f1_score

    from suffice.training.evaluation.metrics import auroc

    at = scores >= sufficient
    return {"n": int(y.size), "macro_f1": float(f1_score(y, (scores >= partial).astype(int), average="macro", labels=[0, 1], zero_division=0)),
            "auroc": auroc(scores, y) if 0 < y.sum() < y.size else float("nan"),
            "share_at_sufficient": float(at.mean()), "precision_at_sufficient": float(y[at].mean()) if at.any() else float("nan"),
            "mean_score_sufficient": float(scores[y == 1].mean()) if (y == 1).any() else float("nan"),
            "mean_score_not": float(scores[y == 0].mean()) if (y == 0).any() else float("nan")}


def run(bundle: str | Path, items_path: str | Path = ITEMS, threads: int = 2) -> dict:
    from suffice.serving.scorer import ScorerConfig, SufficiencyScorer

    scorer = SufficiencyScorer.load(bundle, ScorerConfig(intra_op_threads=threads))
    items = load_items(items_path)
    res = scorer.score_batch([it["question"] for it in items], [it["passages"] for it in items])
    scores = np.asarray([r.score for r in res], dtype=np.float64)
    y = np.asarray([it["label"] for it in items])
    partial, sufficient = scorer.thresholds["partial"], scorer.thresholds["sufficient"]
    lengths = sorted({it.get("length", "?") for it in items})
    by_length = {k: quality(scores[sel], y[sel], partial, sufficient)
                 for k in lengths if (sel := np.asarray([it.get("length", "?") == k for it in items])).any()}
    wrong = [{"id": it.get("id"), "length": it.get("length"), "kind": it.get("kind"), "label": int(it["label"]),
              "score": round(float(s), 3), "question": it["question"]}
             for it, s in zip(items, scores) if int(s >= partial) != it["label"]]
    return {"bundle": str(bundle), "variant": scorer.variant, "items": str(items_path), "thresholds": {"partial": partial, "sufficient": sufficient},
            "overall": quality(scores, y, partial, sufficient), "by_length": by_length, "wrong": wrong,
            "scores": {str(it.get("id", i)): round(float(s), 4) for i, (it, s) in enumerate(zip(items, scores))}}


def format_report(r: dict) -> str:
    lines = [f"bundle {r['bundle']} ({r['variant']}) on {r['overall']['n']} hand-written items ({r['items']}); "
             f"partial >= {r['thresholds']['partial']:.2f}, sufficient >= {r['thresholds']['sufficient']:.2f}",
             f"{'set':<10} {'n':>4} {'macro-F1':>9} {'AUROC':>6} {'at suff.':>9} {'prec.':>6} {'mean s=1':>9} {'mean s=0':>9}"]
    for name, q in [("overall", r["overall"]), *r["by_length"].items()]:
        lines.append(f"{name:<10} {q['n']:>4} {q['macro_f1']:>9.3f} {q['auroc']:>6.3f} {q['share_at_sufficient']:>9.3f} "
                     f"{q['precision_at_sufficient']:>6.3f} {q['mean_score_sufficient']:>9.3f} {q['mean_score_not']:>9.3f}")
    lines.append(f"wrong at the partial threshold ({len(r['wrong'])}):")
    for w in r["wrong"]:
        lines.append(f"  {w['id']} [{w['length']}/{w['kind']}] label {w['label']} score {w['score']:.3f}: {w['question']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="an exported sufficiency bundle folder")
    ap.add_argument("--items", default=str(ITEMS), help="the hand-written items (JSONL with question, passages, label)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    r = run(args.bundle, args.items, args.threads)
    print(format_report(r))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
