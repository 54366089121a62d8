"""One item to score, the same in every room: HTTP, the pyfunc model, ``suffice score`` and Spark.

An item is a ``question`` and its context, given as ``passages`` (a list: strings or
``{title, text}`` objects) or ``context`` (one string). When ``passages`` is missing or empty the
``context`` is the context, so ``passages: []`` beside a ``context`` scores the context; when
both hold something, ``passages`` wins. Every bad form has one error, whichever room it came in by
(HTTP answers it as a 422 naming the field).

>>> SufficiencyItem.from_fields("Where is it?", passages=[], context="It is in Paris.").passages
('It is in Paris.',)
>>> SufficiencyItem.from_fields("Where is it?", passages="It is in Paris.")
Traceback (most recent call last):
...
ValueError: passages must be a list of strings or {title, text} objects, got str 'It is in Paris.': put a single context string in 'context' instead
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

QUESTION_FORM = "question must be a non-empty string"
CONTEXT_FORM = "context must be a string; lists of passages go in 'passages'"


def is_missing(value: Any) -> bool:
    """None, NaN, or pandas' NA / NaT (recognised by type name: pandas is not imported here)."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ in ("NAType", "NaTType")


def passages_form_error(value: Any) -> str:
    """The one message for a ``passages`` value that is not a list."""
    return (f"passages must be a list of strings or {{title, text}} objects, got {type(value).__name__} "
            f"{str(value)[:80]!r}: put a single context string in 'context' instead")


def as_passage_list(value: Any) -> list[Any]:
    """A ``passages`` value as a list (Arrow, Parquet and Spark hand lists over as numpy arrays, structs
    as dicts or Rows); a bare string or a single object is refused with :func:`passages_form_error`."""
    if hasattr(value, "tolist") and not isinstance(value, (list, str)):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(passages_form_error(value))
    out = []
    for p in value:
        if hasattr(p, "asDict"):  # pyspark.sql.Row
            p = p.asDict()
        if isinstance(p, Mapping):
            p = {k: ("" if is_missing(v) else v) for k, v in p.items()}
        out.append(p)
    return out


@dataclass(frozen=True)
class SufficiencyItem:
    """A question and the passages it is scored on (strings or ``{title, text}`` mappings)."""

    question: str
    passages: tuple[Any, ...] = ()

    @classmethod
    def from_fields(cls, question: Any, passages: Any = None, context: Any = None) -> "SufficiencyItem":
        """The item from its fields as any room receives them (missing = None / NaN); ``ValueError`` names the bad one."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{QUESTION_FORM}, got {question!r}")
        found = [] if is_missing(passages) else as_passage_list(passages)
        if not found and not is_missing(context):
            if not isinstance(context, str):
                raise ValueError(f"{CONTEXT_FORM}, got {type(context).__name__}")
            found = [context]
        return cls(question, tuple(found))
