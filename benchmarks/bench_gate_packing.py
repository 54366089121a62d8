"""What the retrieval gate's packing keeps of a thread: the latest assistant reply, whole or cut, per strategy.

Packs the held-out threads of a split (``RetrievalGate.build_input``'s thread -> (question, passages),
then ``ContextPacker`` in the bundle's window) with each strategy and reports, per split: the share of
threads whose context overflows the window, the share whose latest assistant reply (the turn a
follow-up usually refers to) survives whole, the mean share of the reply's tokens kept, and how
many threads two strategies pack differently. Tokenizer only: no model runs, seconds on a CPU.

    python benchmarks/bench_gate_packing.py --tokenizer models/gate/bundle/tokenizer.json --split domains
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def reply_kept(packer, question: str, passages: list[dict]) -> tuple[bool, float, bool]:
    """(context truncated?, share of the latest assistant reply's tokens in the window, reply whole?).

    The packer encodes every line on its own and lays the kept ones out in order, so a line is in the
    window when its token ids appear there contiguously."""
    from suffice.serving.packing import LINE_STRATEGIES, split_sentences

    packed = packer.pack(question, passages)
    ctx = packed.input_ids[packed.question_tokens + 2:-1]
    replies = [p for p in passages if p["title"] == "assistant"]
    if not replies:
        return packed.truncated, 1.0, True
    lines = split_sentences(replies[-1]["text"], lines=packer.strategy in LINE_STRATEGIES)
    enc = [e.ids for e in packer.tokenizer.encode_batch(lines, add_special_tokens=False)] if lines else []
    hay = " " + " ".join(map(str, ctx)) + " "
    kept = [(" " + " ".join(map(str, ids)) + " ") in hay for ids in enc]
    total = sum(len(ids) for ids in enc)
    share = sum(len(ids) for ids, k in zip(enc, kept) if k) / total if total else 1.0
    return packed.truncated, share, all(kept)


def packing_report(rows: Sequence[dict], tokenizer, max_length: int, strategies: Sequence[str]) -> dict:
    """Per strategy: n, truncated share, latest-reply-whole share (of all threads and of the truncated ones),
    mean reply share kept, by label; plus how many threads the first two strategies pack differently."""
    from suffice.serving.gates.retrieval import thread_input
    from suffice.serving.packing import ContextPacker

    from bench_retrieval_gate import thread_of

    inputs = [thread_input(thread_of(r)) for r in rows]
    out: dict = {"n": len(rows)}
    ids: dict[str, list] = {}
    for s in strategies:
        packer = ContextPacker(tokenizer, max_length, s)
        stats = [reply_kept(packer, q, ps) for q, ps in inputs]
        ids[s] = [packer.pack(q, ps).input_ids for q, ps in inputs]
        trunc = [t for t, _, _ in stats]
        n_trunc = sum(trunc) or 1
        out[s] = {
            "truncated": sum(trunc) / len(rows),
            "reply_whole": sum(w for _, _, w in stats) / len(rows),
            "reply_whole_when_truncated": sum(w for t, _, w in stats if t) / n_trunc,
            "reply_share_kept": sum(k for _, k, _ in stats) / len(rows),
            "reply_cut_skip_threads": sum(1 for r, (_, _, w) in zip(rows, stats) if r["label"] == 1 and not w),
            "skip_threads": sum(1 for r in rows if r["label"] == 1),
        }
    if len(strategies) >= 2:
        a, b = strategies[:2]
        out["packed_differently"] = sum(x != y for x, y in zip(ids[a], ids[b]))
    return out


def main(argv: list[str] | None = None) -> int:
    from tokenizers import Tokenizer

    from bench_retrieval_gate import split_threads
    from suffice.training.fit.config import build_train_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a tokenizer.json (a gate bundle's or its base model's)")
    ap.add_argument("--config", default=str(REPO / "configs" / "retrieval-gate.yaml"))
    ap.add_argument("--split", choices=["opening_message", "domains"], default="domains")
    ap.add_argument("--strategies", nargs="+", default=["select_lines", "referenced_turn"])
    ap.add_argument("--out", help="write the results as JSON here")
    args, overrides = ap.parse_known_args(argv)
    cfg = build_train_config(args.config, overrides)
    splits = split_threads(cfg, args.split)
    tok = Tokenizer.from_file(args.tokenizer)
    report = {name: packing_report(splits[name], tok, cfg.max_length, args.strategies) for name in ("validation", "test")}
    for name, r in report.items():
        print(f"== {args.split} {name}: {r['n']} threads, window {cfg.max_length}"
              + (f", packed differently by {args.strategies[0]} and {args.strategies[1]}: {r['packed_differently']}" if "packed_differently" in r else ""))
        for s in args.strategies:
            q = r[s]
            print(f"  {s:<16} context cut {q['truncated']:.0%}; latest reply whole {q['reply_whole']:.0%} "
                  f"({q['reply_whole_when_truncated']:.0%} of the cut threads); reply tokens kept {q['reply_share_kept']:.0%}; "
                  f"SKIP threads with the reply cut {q['reply_cut_skip_threads']}/{q['skip_threads']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
