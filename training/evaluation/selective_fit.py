"""``suffice fit-selective``: fit the selective-answering model (sufficiency x self-confidence).

Input: JSONL rows with ``confidence`` (the generator's self-rated confidence, 0..1), ``correct``
(0/1: was the generated answer right) and either ``sufficiency`` (a score) or ``question`` +
``passages`` (scored with ``--bundle``). Output: the model as JSON and, with ``--plot``, selective
accuracy vs coverage for confidence alone, sufficiency alone and both (as in Joren et al. 2025).

    suffice fit-selective --data answers.jsonl --bundle bundles/v3 --coverage 0.8 --out selective.json --plot curve.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from suffice.serving.jsonl import iter_jsonl
from suffice.serving.gates.selective import SelectiveAnswerer, selective_curve


def read_rows(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist: give a JSONL file with confidence, correct and sufficiency (or question+passages)")
    rows = []
    for n, d in iter_jsonl(p, "a row with confidence, correct and sufficiency"):
        for k in ("confidence", "correct"):
            if k not in d:
                raise ValueError(f"{p}, line {n}: field '{k}' is missing")
        if "sufficiency" not in d and not ("question" in d and "passages" in d):
            raise ValueError(f"{p}, line {n}: give 'sufficiency' or 'question' + 'passages' (scored with --bundle)")
        rows.append(d)
    if not rows:
        raise ValueError(f"{p} holds no rows")
    return rows


def plot_selective_curves(sufficiency: Sequence[float], confidence: Sequence[float], correct: Sequence[int],
                          model: SelectiveAnswerer, out: str | Path) -> Path:
    """Selective accuracy vs coverage for confidence alone, sufficiency alone and both (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for label, s in (("confidence alone", confidence), ("sufficiency alone", sufficiency),
                     ("sufficiency + confidence", model.p_correct(sufficiency, confidence))):
        cov, acc = selective_curve(s, correct)
        ax.plot(cov, acc, label=label)
    ax.set_xlabel("coverage (share of questions answered)")
    ax.set_ylabel("selective accuracy")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="suffice fit-selective", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="where to write the model JSON")
    ap.add_argument("--coverage", type=float, default=0.8, help="share of questions to answer (default 0.8)")
    ap.add_argument("--bundle", help="bundle to score rows that have question + passages but no sufficiency")
    ap.add_argument("--plot", help="write selective accuracy vs coverage (PNG)")
    args = ap.parse_args(argv)
    try:
        rows = read_rows(args.data)
        need = [i for i, r in enumerate(rows) if "sufficiency" not in r]
        if need:
            if not args.bundle:
                raise ValueError(f"{len(need)} rows have no 'sufficiency': pass --bundle to score them")
            from suffice.serving import SufficiencyScorer

            res = SufficiencyScorer.load(args.bundle).score_batch([rows[i]["question"] for i in need], [rows[i]["passages"] for i in need])
            for i, r in zip(need, res):
                rows[i]["sufficiency"] = r.score
        suff = np.array([float(r["sufficiency"]) for r in rows])
        conf = np.array([float(r["confidence"]) for r in rows])
        y = np.array([int(r["correct"]) for r in rows])
        model = SelectiveAnswerer.fit(suff, conf, y, coverage=args.coverage)
    except (ValueError, FileNotFoundError) as e:
        print(f"fit-selective failed: {e}", file=sys.stderr)
        return 2
    model.save(args.out)
    if args.plot:
        plot_selective_curves(suff, conf, y, model, args.plot)
    print(json.dumps(model.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
