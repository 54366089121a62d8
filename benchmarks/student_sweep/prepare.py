"""Build the compact input of the GPU student sweep (``train_gpu.py``) from suffice's own data pipeline.

    python benchmarks/student_sweep/prepare.py --out .sweep/data.json.xz

What it writes (one xz-compressed JSON, passages stored once and referenced by index):

- ``train`` / ``validation`` / ``test``: the rows of ``suffice data prepare`` with both synthetic
  files (``synthetic_paths``: the wiki validation split of unseen titles is the ``wiki-synthetic``
  new-topic check) and retrieval-like copies (``retrieval_like_fraction=0.3``), exactly what
  ``configs/sufficiency-full.yaml`` trains on. (The 2026-11-28 GPU runs used this script's first
  version, commit c205e13, which built the same two additions itself: 36,544 train rows.)
- ``stage0``: pair-reading pretraining rows made for free from every train question whose answer
  is known: (question, own passage) = 1; (question, passage without the answer-bearing
  sentences) = 0; (question, another paragraph of the same article, else of another title) = 0.

Only train-split items feed ``stage0`` and the training rows; validation/test rows are the
prepared splits as training sees them. Nothing here reads a test label into training.
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import re
import sys
from collections import defaultdict
from pathlib import Path

from suffice.serving.packing import split_sentences
from suffice.training.evaluation.baselines import load_gold_answers
from suffice.training.data.builder import DataConfig, prepare
from suffice.training.paths import data_dir


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.lower()).strip()


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
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
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

    # paragraphs of train items by title and by squad2 article (for stage 0's other-paragraph negatives)
    train_single = [r for r in rows["train"] if len(r["passages"]) == 1 and not r.get("variant")]
    by_title: dict[str, list[dict]] = defaultdict(list)
    seen = set()
    for r in train_single:
        p = r["passages"][0]
        if (p["title"], p["text"]) not in seen:
            seen.add((p["title"], p["text"]))
            by_title[p["title"]].append(p)
    titles = sorted(by_title)
    article_of = lambda r: (r.get("group") or "").rsplit(":", 1)[0]  # squad2:Article:k -> squad2:Article
    by_article: dict[str, list[dict]] = defaultdict(list)
    for r in train_single:
        if r["source"].startswith("squad2"):
            by_article[article_of(r)].append(r["passages"][0])

    def distractors(own_title: str, k: int) -> list[dict]:
        picked = []
        while len(picked) < k:
            t = titles[rng.randrange(len(titles))]
            if t != own_title:
                picked.append(by_title[t][rng.randrange(len(by_title[t]))])
        return picked

    # stage 0: pair reading from known answers (train only)
    stage0 = []
    for r in train_single:
        ans = [a for a in answers.get(r["id"], []) if a and a.strip()]
        if not ans:
            continue
        own = r["passages"][0]
        text = own["text"]
        if not any(_norm(a) in _norm(text) for a in ans):
            continue
        stage0.append(compact(r) | {"label": 1, "variant": "s0_own"})
        sents = split_sentences(text)
        kept = [s for s in sents if not any(_norm(a) in _norm(s) for a in ans)]
        if kept and len(kept) < len(sents):
            stage0.append(compact(r, [{"title": own["title"], "text": " ".join(kept)}]) | {"id": r["id"] + "#s0-noans", "label": 0, "variant": "s0_answer_removed"})
        pool = [p for p in by_article.get(article_of(r), []) if p["text"] != text and not any(_norm(a) in _norm(p["text"]) for a in ans)]
        other = pool[rng.randrange(len(pool))] if pool else distractors(own["title"], 1)[0]
        if not any(_norm(a) in _norm(other["text"]) for a in ans):
            stage0.append(compact(r, [other]) | {"id": r["id"] + "#s0-other", "label": 0, "variant": "s0_other_paragraph"})
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
