"""How far two label sources agree, per data source: accuracy, Cohen's kappa, confusion table.

A label source is a rater in the store (``NAME`` or ``NAME@VERSION``), the shipped teacher file
(``cached`` / ``llm-autorater-v1`` when the store does not hold it), or ``gold`` (the label each
dataset's own annotations imply, :func:`suffice.training.data.loaders.gold_label`). Only items both
sources labelled are compared; unparsed rows are left out and counted.

>>> round(cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0]), 3)
0.5
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

from suffice.serving.jsonl import json_safe


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Cohen's kappa of two equally long label sequences (nan when chance agreement is 1: kappa is undefined).

    >>> cohen_kappa([1, 0, 1, 0], [1, 0, 1, 0])
    1.0
    """
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa: sequences differ in length ({len(a)} vs {len(b)})")
    n = len(a)
    if n == 0:
        return math.nan
    po = sum(x == y for x, y in zip(a, b)) / n
    ca, cb = Counter(a), Counter(b)
    pe = sum(ca[k] * cb.get(k, 0) for k in ca) / (n * n)
    if pe >= 1.0:
        return math.nan
    return (po - pe) / (1 - pe)


@dataclass
class SourceAgreement:
    """Agreement on one data source (or ``all``)."""

    source: str
    n: int = 0
    accuracy: float = math.nan
    kappa: float = math.nan
    confusion: dict[tuple[Any, Any], int] = field(default_factory=dict)  # (a value, b value) -> count
    share_a_positive: float = math.nan
    share_b_positive: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            x = json_safe(x)  # NaN (undefined on no items) -> None
            return None if x is None else round(x, 4)

        return {"source": self.source, "n": self.n, "accuracy": num(self.accuracy), "kappa": num(self.kappa),
                "share_a_positive": num(self.share_a_positive), "share_b_positive": num(self.share_b_positive),
                "confusion": [{"a": a, "b": b, "count": c} for (a, b), c in sorted(self.confusion.items(), key=str)]}


def compare(a: Mapping[str, Any], b: Mapping[str, Any], source_of: Mapping[str, str] | None = None,
            positive: Any = 1) -> list[SourceAgreement]:
    """Agreement of two ``{item_id: value}`` maps on their common ids, per source and over ``all``.

    ``source_of`` maps item id -> source; by default the canonical id prefix (``squad2:...``).

    >>> [r.accuracy for r in compare({"s:1": 1, "s:2": 0}, {"s:1": 1, "s:2": 1})]
    [0.5, 0.5]
    """
    common = sorted(set(a) & set(b))
    groups: dict[str, list[str]] = defaultdict(list)
    for iid in common:
        src = (source_of or {}).get(iid) or (iid.split(":", 1)[0] if ":" in iid else "unknown")
        groups[src].append(iid)
    out = []
    for src in sorted(groups) + ["all"]:
        ids = common if src == "all" else groups[src]
        xa, xb = [a[i] for i in ids], [b[i] for i in ids]
        r = SourceAgreement(source=src, n=len(ids))
        if ids:
            r.accuracy = sum(x == y for x, y in zip(xa, xb)) / len(ids)
            r.kappa = cohen_kappa(xa, xb)
            r.confusion = dict(Counter(zip(xa, xb)))
            r.share_a_positive = sum(x == positive for x in xa) / len(ids)
            r.share_b_positive = sum(x == positive for x in xb) / len(ids)
        out.append(r)
    return out


def format_agreement(rows: Sequence[SourceAgreement], name_a: str, name_b: str, values: Sequence[Any] = (1, 0)) -> str:
    """A table: n, accuracy, kappa, the share each side calls positive, and the confusion counts
    (inline for two values, as one matrix per source for more)."""
    def f(x: float, spec: str = ".3f") -> str:
        return "  n/a" if isinstance(x, float) and math.isnan(x) else format(x, spec)

    inline = len(values) <= 2
    pairs = [(x, y) for x in values for y in values]
    head = f"{'source':<22}{'n':>6}{'acc':>8}{'kappa':>8}{'a pos':>8}{'b pos':>8}"
    if inline:
        head += "   " + "  ".join(f"a={x}/b={y}" for x, y in pairs)
    lines = [f"agreement: a = {name_a}, b = {name_b}", head, "-" * len(head)]
    for r in rows:
        line = (f"{r.source:<22}{r.n:>6}{f(r.accuracy):>8}{f(r.kappa):>8}{f(r.share_a_positive, '.1%'):>8}"
                f"{f(r.share_b_positive, '.1%'):>8}")
        if inline:
            line += "   " + "  ".join(f"{r.confusion.get((x, y), 0):>{len(f'a={x}/b={y}')}}" for x, y in pairs)
        lines.append(line)
    if not inline:
        width = max(len(str(v)) for v in values) + 2
        for r in rows:
            lines += ["", f"{r.source}: rows = a ({name_a}), columns = b ({name_b})",
                      " " * width + "".join(f"{str(v):>{width}}" for v in values)]
            lines += [f"{str(x):<{width}}" + "".join(f"{r.confusion.get((x, y), 0):>{width}}" for y in values) for x in values]
    return "\n".join(lines)
