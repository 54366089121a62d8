"""Does a lexical referent check separate SKIP from RETRIEVE follow-ups? (model-free)

The retrieval-gate issue proposes a second opinion before SKIP: terms or entities of the new message
that the conversation never mentions force RETRIEVE. This measures, on the shared gate threads, how
often each form of the check fires on SKIP threads (skips it would cost) and on RETRIEVE threads
(wrong SKIPs it could catch). A useful veto fires on RETRIEVE far more often than on SKIP.

    python benchmarks/gate_referent_check.py [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from suffice.serving.gates.retrieval import thread_input
from suffice.serving.lexical import keyword_coverage
from suffice.training.paths import data_dir


def checks(messages) -> dict[str, bool]:
    """Which forms of the referent check fire on one thread (``keyword_coverage``: the serving lexical rules)."""
    question, passages = thread_input(messages)
    cov = keyword_coverage(question, [p["text"] for p in passages])
    return {"novel term >= 1": len(cov.missing) >= 1, "novel terms >= 2": len(cov.missing) >= 2,
            "novel entity": bool(cov.missing_entities)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None, help="the shared data directory (default: ../shared/data)")
    args = ap.parse_args(argv)
    root = data_dir(args.data_dir) / "retrieval-gate"
    fired: Counter = Counter()
    totals: Counter = Counter()
    for name in ("train.jsonl", "pairs.jsonl"):
        for line in (root / name).read_text().splitlines():
            row = json.loads(line)
            totals[row["label"]] += 1
            for check, on in checks(row["messages"]).items():
                fired[(check, row["label"])] += on
    print(f"threads: {dict(totals)}")
    print(f"{'check':<18} {'fires on SKIP':>14} {'fires on RETRIEVE':>18}")
    for check in ("novel term >= 1", "novel terms >= 2", "novel entity"):
        print(f"{check:<18} {fired[(check, 'SKIP')] / totals['SKIP']:>14.3f} {fired[(check, 'RETRIEVE')] / totals['RETRIEVE']:>18.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
