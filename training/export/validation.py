"""The items export checks parity on: validation JSONL (items or retrieval-gate threads), or built-in probe pairs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from suffice.serving.jsonl import JSONLError, iter_jsonl
from suffice.training.data.schema import DataFormatError
from suffice.training.data.threads import thread_item
from suffice.training.export.errors import ExportError

# Probe pairs used for parity when no validation data is given (export still checks something real).
PROBE_ITEMS = [
    ("Where is the Eiffel Tower?", ["The Eiffel Tower is a wrought-iron lattice tower in Paris, France."]),
    ("When did Chopin leave Warsaw?", [{"title": "Chopin", "text": "Chopin left Warsaw in 1830, shortly before the November Uprising."}]),
    ("Who founded the city of Lima?", ["Lima is the capital of Peru.", "It lies on the Pacific coast."]),
    ("What is the boiling point of water at sea level?", ["Water boils at 100 degrees Celsius at sea level."]),
    ("Which river flows through Vienna?", ["Vienna is known for its music and coffee houses."]),
    ("How many moons does Mars have?", [{"title": "Mars", "text": "Mars has two small moons, Phobos and Deimos."}]),
    ("Who painted the Mona Lisa?", ["The Louvre is the world's most visited museum."] * 3),
    ("What year did the Berlin Wall fall?", ["The Berlin Wall fell on 9 November 1989. " * 20]),
]




def as_pair(item: Any, i: int) -> tuple[str, Any, int | None]:
    if isinstance(item, tuple) and len(item) == 2:
        return item[0], item[1], None
    if isinstance(item, Mapping):
        q, ps, lab = item.get("question"), item.get("passages"), item.get("label")
    else:
        q, ps, lab = getattr(item, "question", None), getattr(item, "passages", None), getattr(item, "label", None)
    if not isinstance(q, str) or ps is None:
        raise ExportError(f"validation item {i} has no question/passages: give Items, dicts with question and passages, or (question, passages) tuples")
    return q, ps, (None if lab is None else int(lab))


def load_validation_jsonl(path: str | os.PathLike, split: str | None = "validation") -> list[dict[str, Any]]:
    """Items from a JSONL file (``question``, ``passages``, optional ``label``/``split``), or
    retrieval-gate threads (``messages``, ``label`` RETRIEVE/SKIP), turned into items the way the
    gate packs them: the latest user message is the question, earlier turns the passages."""
    p = Path(path)
    if not p.is_file():
        raise ExportError(f"validation data {p} does not exist: give a JSONL file of items (question, passages, label)")
    items = []
    try:
        for n, d in iter_jsonl(p, "an item {question, passages, label} or a thread {messages, label}"):
            if split and d.get("split") not in (None, split):
                continue
            if "messages" in d and "question" not in d:
                try:
                    d = thread_item(d, p, n)
                except DataFormatError as e:
                    raise ExportError(str(e)) from e
            items.append(d)
    except JSONLError as e:
        raise ExportError(str(e)) from e
    if not items:
        raise ExportError(f"{p} holds no items" + (f" of split {split!r}" if split else ""))
    return items
