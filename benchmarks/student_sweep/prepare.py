"""Build the compact input of the GPU student sweep (``train_gpu.py``) from suffice's own data pipeline.

    python benchmarks/student_sweep/prepare.py --out .sweep/data.json.xz

What it writes (one xz-compressed JSON, passages stored once and referenced by index):

- ``train`` / ``validation`` / ``test``: the rows of ``suffice data prepare`` with both synthetic
  files (``synthetic_paths``: the wiki validation split of unseen titles is the ``wiki-synthetic``
  new-topic check) and retrieval-like copies (``retrieval_like_fraction=0.3``), exactly what
  ``configs/sufficiency-full.yaml`` trains on. (The 2026-11-28 GPU runs used this script's first
  version, commit c205e13, which built the same two additions itself: 36,544 train rows.)
- ``stage0``: pair-reading pretraining rows made for free from every train question whose answer
  is known, by ``suffice.training.data.pretrain.stage0_rows`` (what ``configs/pretrain.yaml``
  trains on): own passage = 1, answer-bearing sentences +-1 = 1, passage without them = 0,
  another paragraph of the article (else of another title) = 0. ``--stage0-kinds`` picks kinds;
  the 2026-11-28 runs used the first three without evidence rows (script version c205e13).

Only train-split items feed ``stage0`` and the training rows; validation/test rows are the
prepared splits as training sees them. Nothing here reads a test label into training.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

from suffice.training.evaluation.baselines import load_gold_answers
from suffice.training.data.builder import DataConfig, prepare
from suffice.training.data.pretrain import KINDS, stage0_rows
from suffice.training.paths import data_dir


class PassageTable:
    """Passages stored once; rows keep indices."""

    def __init__(self) -> None:
        self.items: list[list[str]] = []
        self.index: dict[tuple[str, str], int] = {}

    def add(self, title: str, text: str) -> int:
        key = (title, text)
        if key not in self.index:
            self.index[key] = len(self.items)
            self.items.append([title, text])
        return self.index[key]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--retrieval-like-fraction", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--stage0-kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    args = ap.parse_args(argv)
    d = data_dir()
    table = PassageTable()

    dsd, manifest = prepare(DataConfig(name="student-sweep", synthetic_paths=["synthetic/squad2-questions.jsonl", "synthetic/wiki-questions.jsonl"],
                                       retrieval_like_fraction=args.retrieval_like_fraction, seed=args.seed), progress=False)
    rows: dict[str, list[dict]] = {s: [dict(r) for r in dsd[s]] for s in ("train", "validation", "test") if s in dsd}
    answers = load_gold_answers(d / "items.jsonl")
    for f in ("squad2-questions.jsonl", "wiki-questions.jsonl"):
        answers.update(load_gold_answers(d / "synthetic" / f))

    def compact(r: dict, passages=None) -> dict:
        ps = passages if passages is not None else r["passages"]
        return {"id": r["id"], "q": r["question"], "p": [table.add(p["title"], p["text"]) for p in ps],
                "label": int(r["label"]), "source": r["source"], "kind": r.get("kind") or "",
                "variant": r.get("variant") or "", "group": r.get("group") or ""}

    out: dict[str, list[dict]] = {s: [compact(r) for r in rs if int(r["label"]) in (0, 1)] for s, rs in rows.items()}
    n_rl = sum(r["variant"] == "retrieval_like" for r in out["train"])

    # stage 0: pair reading from known answers (train only), built by the product's stage-0 builder
    stage0 = [compact(r) for r in stage0_rows(rows["train"], answers, seed=args.seed, kinds=args.stage0_kinds.split(","),
                                              held_out_texts=(p["text"] for s in ("validation", "test") for r in rows.get(s, [])
                                                              for p in r["passages"]))]
    out["stage0"] = stage0

    payload = {"passages": table.items, "splits": out, "manifest": {"data_hash": manifest.get("data_hash"), "retrieval_like": n_rl}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(args.out, "wt", encoding="utf-8", preset=6) as f:
        json.dump(payload, f)
    counts = {s: len(v) for s, v in out.items()}
    print(json.dumps({"counts": counts, "passages": len(table.items), "retrieval_like": n_rl,
                      "bytes": Path(args.out).stat().st_size}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
