"""The one schema every loader maps into, and the typed errors for bad input.

An :class:`Item` is a (question, passages) pair plus its label. Loaders for SQuAD 2.0,
HotPotQA, MuSiQue, QED and the canonical JSONL all produce items; everything downstream
(labelling, variants, training, evaluation) reads only this schema.

>>> item = Item(id="demo:1", question="Where is Paris?", passages=[Passage("Paris", "Paris is in France.")])
>>> item.context_chars
19
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


SYNTHETIC_SUFFIX = "-synthetic"  # a teacher-written set's source name: "<seed source>-synthetic"


def is_synthetic_source(source: str) -> bool:
    """Whether items of ``source`` were written by the teacher (``wiki-synthetic``...), not drawn from a real
    dataset; they are never in a test split."""
    return str(source).endswith(SYNTHETIC_SUFFIX)

LABEL_SOURCES = ("autorater", "gold", "synthetic", "constructed", "rater")
SPLITS = ("train", "validation", "test")


class DataFormatError(ValueError):
    """Bad input data. The message names the file, the line (1-based) and the field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None, field: str | None = None):
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.path, self.line, self.field = path, line, field


@dataclass(frozen=True)
class Passage:
    title: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"title": self.title, "text": self.text}


def level_to_label(level: str | None) -> int | None:
    if level is None:
        return None
    return 1 if level == "sufficient" else 0


@dataclass
class Item:
    """One (question, passages) example in suffice's canonical schema.

    label: 1 sufficient / 0 not / None unlabelled. level: sufficient / partial / insufficient / None.
    label_source: where the label came from (autorater, gold, synthetic, constructed, rater).
    variant: the rule that constructed this item from another one (None for real items).
    """

    id: str
    question: str
    passages: list[Passage]
    label: int | None = None
    level: str | None = None
    label_source: str | None = None
    split: str | None = None
    source: str | None = None
    group: str | None = None
    gold: dict[str, Any] = field(default_factory=dict)
    variant: str | None = None
    parent_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def context_chars(self) -> int:
        return sum(len(p.text) for p in self.passages)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passages"] = [p.to_dict() for p in self.passages]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Item":
        d = dict(d)
        d["passages"] = [p if isinstance(p, Passage) else Passage(str(p.get("title") or ""), str(p.get("text") or "")) for p in d.get("passages") or []]
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})
