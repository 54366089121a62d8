"""Retrieval-gate threads: the one reader (validated), the rows training reads, the items export checks.

A thread is ``{id, messages: [{role, content}, ...], label: RETRIEVE|SKIP, category?}`` whose last
message is the user's new turn. The gate model sees it the way :func:`suffice.serving.retrieval_gate.turns_as_passages`
packs it in production: the latest user message is the question, the earlier turns are the passages
(title = role); label 1 = SKIP, 0 = RETRIEVE.

- :func:`load_retrieval_threads`: validated :class:`RetrievalThread` objects (errors name file, line, field).
- :func:`gate_training_rows`: those threads as the rows training reads (prepared-data columns).
- :func:`split_gate_rows`: training's split rule (a seeded hash of the conversation group).
- :func:`thread_item`: one thread record as a (question, passages, label) item, for export's parity check.

>>> rows = gate_training_rows("tests/fixtures/retrieval.jsonl")  # doctest: +SKIP
>>> rows[0]["label"], rows[0]["passages"][0]["title"]  # doctest: +SKIP
(1, 'user')
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from suffice.serving.gates.retrieval import turns_as_passages
from suffice.training.data.records import Record, iter_strict_records
from suffice.training.data.splits import check_fractions, hash_split

GATE_LABELS = ("RETRIEVE", "SKIP")
ROLES = ("system", "user", "assistant")


@dataclass
class RetrievalThread:
    """One chat thread whose last user message is labelled RETRIEVE (needs new content) or SKIP."""

    id: str
    messages: list[dict[str, str]]
    label: str
    category: str | None
    split: str

    @property
    def label_id(self) -> int:
        """0 = RETRIEVE, 1 = SKIP (the retrieval-gate model's id2label)."""
        return GATE_LABELS.index(self.label)


def _checked_messages(rec: Record) -> list[dict[str, str]]:
    """The record's messages as ``{role, content}`` dicts: non-empty, known roles, string contents, the user's turn last."""
    messages = rec.get("messages", list)
    if not messages:
        raise rec.fail("missing field", "messages", "a thread needs at least one message")
    for k, m in enumerate(messages):
        mrec = Record(m, rec.path, rec.line, f"messages[{k}]")
        role = mrec.get("role", str)
        if role not in ROLES:
            raise mrec.fail("unknown role", "role", f"unknown role {role!r}: use one of {list(ROLES)}")
        mrec.get("content", str)
    if messages[-1]["role"] != "user":
        raise rec.fail("bad thread", f"messages[{len(messages) - 1}].role", "the last message must be the user's new turn (role 'user')")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _checked_label(rec: Record, *, required: bool = True) -> str | None:
    label = rec.get("label", str, required=required)
    if label is not None and label not in GATE_LABELS:
        raise rec.fail("unknown label", "label", f"unknown label {label!r}: use one of {list(GATE_LABELS)}")
    return label


def load_retrieval_threads(path: str | Path, fractions: Sequence[float] = (0.8, 0.1, 0.1),
                           split_by: Literal["id", "conversation"] = "id") -> list[RetrievalThread]:
    """Validated retrieval-gate threads with a deterministic split from a hash.

    ``split_by="id"`` hashes each thread id; ``"conversation"`` hashes the first message, so
    follow-ups of one conversation (which share their opening turns) always land in one split.

    >>> threads = load_retrieval_threads("../shared/data/retrieval-gate/train.jsonl")  # doctest: +SKIP
    >>> threads[0].label, threads[0].messages[-1]["role"]  # doctest: +SKIP
    ('SKIP', 'user')
    """
    check_fractions(fractions)
    if split_by not in ("id", "conversation"):
        raise ValueError(f"split_by={split_by!r}: choose 'id' or 'conversation'")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"retrieval-gate file {p} does not exist")
    out: list[RetrievalThread] = []
    seen: dict[str, int] = {}
    for rec in iter_strict_records(p):
        rid = rec.text("id")
        if rid in seen:
            raise rec.fail("duplicate id", "id", f"duplicate id {rid!r} (first at line {seen[rid]})")
        messages = _checked_messages(rec)
        label = _checked_label(rec)
        key = rid if split_by == "id" else messages[0]["content"]
        seen[rid] = rec.line
        out.append(RetrievalThread(id=rid, messages=messages, label=label, category=rec.get("category", str, required=False),
                                   split=hash_split(key, fractions)))
    return out


def conversation_group(thread: RetrievalThread) -> str:
    """The group of a thread: threads opening with the same message share it (12 hex of sha1)."""
    return hashlib.sha1(thread.messages[0]["content"].encode()).hexdigest()[:12]


def gate_training_row(thread: RetrievalThread) -> dict[str, Any]:
    """One thread as the row training reads: question = latest user message, passages = earlier turns
    (title = role), label 1 = SKIP, 0 = RETRIEVE, group = :func:`conversation_group`."""
    label = 1 if thread.label == "SKIP" else 0
    return {
        "id": thread.id, "question": thread.messages[-1]["content"], "passages": turns_as_passages(thread.messages[:-1]),
        "label": label, "level": "", "label_source": "gate-dataset", "source": "retrieval-gate",
        "group": conversation_group(thread), "gold_label": label, "variant": "", "parent_id": "",
        "kind": str(thread.category or ""), "answers": [],
    }


def gate_training_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every thread of a retrieval-gate JSONL (validated by :func:`load_retrieval_threads`) as training rows, in file order.

    >>> [r["label"] for r in gate_training_rows("tests/fixtures/retrieval.jsonl")]  # doctest: +SKIP
    [1, 0, 1]
    """
    return [gate_training_row(t) for t in load_retrieval_threads(path)]


def gate_split(group: str, seed: int, test_fraction: float, validation_fraction: float) -> str:
    """Training's split of a gate row: ``sha256("<seed>:<group>")`` as a uniform number against the fractions,
    so a whole conversation lands in one split and another seed reshuffles them.

    >>> gate_split("abc", 0, 0.0, 0.0)
    'train'
    """
    u = int(hashlib.sha256(f"{seed}:{group}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if u < test_fraction else "validation" if u < test_fraction + validation_fraction else "train"


def split_gate_rows(rows: Sequence[dict[str, Any]], seed: int, test_fraction: float,
                    validation_fraction: float) -> dict[str, list[dict[str, Any]]]:
    """``{"train": [...], "validation": [...], "test": [...]}`` by :func:`gate_split` of each row's group, order kept."""
    out: dict[str, list[dict[str, Any]]] = {"train": [], "validation": [], "test": []}
    for r in rows:
        out[gate_split(r["group"], seed, test_fraction, validation_fraction)].append(r)
    return out


def thread_item(record: Mapping[str, Any], path: str | Path | None = None, line: int | None = None) -> dict[str, Any]:
    """A thread record (``messages``, optional ``label`` RETRIEVE/SKIP) as the item the gate scores:
    ``{question, passages[, label]}``. Bad records raise a :class:`DataFormatError` naming ``path`` and ``line``.

    >>> thread_item({"messages": [{"role": "user", "content": "hi"}], "label": "SKIP"})
    {'question': 'hi', 'passages': [], 'label': 1}
    """
    rec = Record(record, Path(path) if path is not None else Path("<thread>"), line)
    messages = _checked_messages(rec)
    label = _checked_label(rec, required=False)
    item: dict[str, Any] = {"question": messages[-1]["content"], "passages": turns_as_passages(messages[:-1])}
    if label is not None:
        item["label"] = int(label == "SKIP")
    return item
