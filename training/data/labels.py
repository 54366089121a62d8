"""Labels for prepared data: the teacher's (autorater) or the dataset's own (gold) label per item, and
how well the two agree per source (the manifest's ``agreement``).

>>> cohen_kappa([1, 0, 1, 0], [1, 0, 0, 0])
0.5
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from suffice.training.data.loaders import gold_label, gold_level
from suffice.training.data.schema import Item


def cohen_kappa(a: list[int], b: list[int]) -> float | None:
    """Cohen's kappa of two binary label lists (None when undefined: empty, or chance agreement is 1).

    >>> cohen_kappa([1, 0, 1, 0], [1, 0, 0, 0])
    0.5
    """
    n = len(a)
    if n == 0 or n != len(b):
        return None
    po = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(a) / n, sum(b) / n
    pe = pa * pb + (1 - pa) * (1 - pb)
    return None if pe >= 1 else round((po - pe) / (1 - pe), 4)


def agreement_by_source(items: list[Item], teacher: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Teacher vs gold per source over items that have both: n, accuracy, kappa, positive rates."""
    pairs: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for it in items:
        g, t = gold_label(it), teacher.get(it.id)
        if g is not None and t is not None:
            pairs[it.source or "?"].append((t["label"], g))
    out = {}
    for src, ps in sorted(pairs.items()):
        t, g = [p[0] for p in ps], [p[1] for p in ps]
        out[src] = {"n": len(ps), "accuracy": round(sum(x == y for x, y in ps) / len(ps), 4), "kappa": cohen_kappa(t, g),
                    "teacher_sufficient": round(sum(t) / len(t), 4), "gold_sufficient": round(sum(g) / len(g), 4)}
    return out


def apply_labels(items: list[Item], teacher: dict[str, dict[str, Any]], label_source: str, fallback: str,
                 dropped: Counter) -> list[Item]:
    """Give every unlabelled item its ``label_source`` label (``autorater``: the teacher's, ``gold``: the
    dataset's own); ``fallback`` ``other`` tries the other source, ``drop`` drops the item (counted in ``dropped``),
    anything else keeps it unlabelled. Items that brought their own label keep it."""
    other = "gold" if label_source == "autorater" else "autorater"

    def lookup(it: Item, source: str) -> tuple[int, str | None] | None:
        if source == "autorater":
            t = teacher.get(it.id)
            return (t["label"], t["level"]) if t else None
        g = gold_label(it)
        return None if g is None else (g, gold_level(it))

    kept = []
    for it in items:
        if it.label is not None:  # a user file that brought its own label keeps it
            kept.append(it)
            continue
        found = lookup(it, label_source)
        used = label_source
        if found is None and fallback == "other":
            found, used = lookup(it, other), other
        if found is None and fallback == "drop":
            dropped[f"no {label_source} label (fallback=drop)"] += 1
            continue
        if found is not None:
            it.label, it.level, it.label_source = found[0], found[1], used
        kept.append(it)
    return kept
