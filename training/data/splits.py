"""Deterministic splits: which of train / validation / test a key belongs to.

>>> hash_split("qed:-3290814144789249484", (0.7, 0.15, 0.15))
'test'
"""

from __future__ import annotations

import hashlib
from typing import Sequence


def hash_unit(key: str) -> float:
    """``key`` as a number in [0, 1] from its sha256, the same in every process (seeded shares and splits).

    >>> 0.0 <= hash_unit("13:share:q1") <= 1.0, hash_unit("a") == hash_unit("a")
    (True, True)
    """
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def hash_split(key: str, fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> str:
    """Deterministic split from a key: ``sha256(key) % 100`` against (train, validation, test) percentages.

    The shared items.jsonl used this rule on the item id (qed: 70/15/15, hotpotqa-fullwiki: 60/20/20).

    >>> hash_split("qed:-3290814144789249484", (0.7, 0.15, 0.15))
    'test'
    """
    train, val, test = check_fractions(fractions)
    bucket = int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % 100
    if bucket < round(test * 100):
        return "test"
    if bucket < round((test + val) * 100):
        return "validation"
    return "train"


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"split fractions {list(fractions)} must be three non-negative numbers (train, validation, test) summing to 1, e.g. [0.8, 0.1, 0.1]")
    return float(fractions[0]), float(fractions[1]), float(fractions[2])
