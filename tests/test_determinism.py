"""The same input scores the same in every process: nothing may depend on Python's hash seed.

Set iteration order follows ``PYTHONHASHSEED``; a float sum over a set then rounds differently
in another process and a tie between sentences breaks the other way. These rows are built so
that ties happen (eight shared words, sentences that reuse them); with the unsorted sums they
packed differently under hash seeds 0 and 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROWS = r'''
import random
V = "alpha bravo charlie delta echo foxtrot golf hotel".split()
rng = random.Random(1)
ROWS = []
for _ in range(N_ROWS):
    q = "What " + " ".join(rng.sample(V, 8)) + "?"
    ROWS.append((q, [" ".join(" ".join(rng.sample(V, rng.randint(3, 5))).capitalize() + "." for _ in range(4))
                     for _ in range(N_PASSAGES)]))
'''


def run_with_hash_seed(seed: int, script: str, timeout: float = 120.0) -> str:
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_packing_is_identical_under_two_hash_seeds(minilm_dir):
    script = ROWS.replace("N_ROWS", "200").replace("N_PASSAGES", "3") + f'''
import json
from tokenizers import Tokenizer
from suffice.serving.packing import ContextPacker
packer = ContextPacker(Tokenizer.from_file({str(minilm_dir / "tokenizer.json")!r}), 48, "select")
print(json.dumps([packer.pack(q, ps).input_ids for q, ps in ROWS]))
'''
    a, b = (json.loads(run_with_hash_seed(s, script)) for s in (0, 1))
    differ = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    assert not differ, f"{len(differ)} of {len(a)} rows packed differently under PYTHONHASHSEED 0 and 1 (first: row {differ[0]})"


def test_bm25_retriever_ranks_identically_under_two_hash_seeds():
    script = ROWS.replace("N_ROWS", "60").replace("N_PASSAGES", "1") + '''
import json
from suffice.serving.service.retrievers import BM25Retriever
r = BM25Retriever.from_documents([{"id": str(i), "text": ps[0]} for i, (_, ps) in enumerate(ROWS)])
print(json.dumps([[(d.id, d.score) for d in r.retrieve(q, k=10)] for q, _ in ROWS]))
'''
    assert run_with_hash_seed(0, script) == run_with_hash_seed(1, script)
