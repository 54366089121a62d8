"""Retrieval-gate threads: the one reader (validated), the rows training reads, the items export checks.

A thread is ``{id, messages: [{role, content}, ...], label: RETRIEVE|SKIP, category?, domain?, pair?}``
whose last message is the user's new turn. ``domain`` names the deployment the thread was written for;
``pair`` joins two threads into a contrastive pair: one conversation prefix, two final user messages, one
SKIP and one RETRIEVE (retrieval-gate/pairs.jsonl). The gate model sees it the way serving's
:func:`suffice.serving.gates.retrieval.thread_input` builds it: the latest user message is the question,
the earlier turns are the passages (title = role); label 1 = SKIP, 0 = RETRIEVE.

- :func:`load_retrieval_threads`: validated :class:`RetrievalThread` objects (errors name file, line, field).
- :func:`gate_training_rows`: those threads as the rows training reads (prepared-data columns).
- :func:`split_gate_rows`: training's split rule (a seeded hash of the conversation group).
- :func:`thread_item`: one thread record as a (question, passages, label) item, for export's parity check.
- :func:`gate_domain_rows` and :func:`split_by_domain`: the leave-domains-out evaluation (rows that also
  carry ``domain`` and ``pair``; whole domains, pairs kept together, assigned to train/validation/test).

>>> rows = gate_training_rows("tests/fixtures/retrieval.jsonl")  # doctest: +SKIP
>>> rows[0]["label"], rows[0]["passages"][0]["title"]  # doctest: +SKIP
(1, 'user')
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from suffice.serving.bundle import RETRIEVAL_GATE, SKIP
from suffice.serving.gates.retrieval import thread_input
from suffice.training.data.records import Record, iter_strict_records
from suffice.training.data.splits import check_fractions, hash_split, hash_unit

GATE_LABELS = RETRIEVAL_GATE.labels("binary")  # (RETRIEVE, SKIP): the logit columns
ROLES = ("system", "user", "assistant")


@dataclass
class RetrievalThread:
    """One chat thread whose last user message is labelled RETRIEVE (needs new content) or SKIP."""

    id: str
    messages: list[dict[str, str]]
    label: str
    category: str | None
    split: str
    domain: str | None = None
    pair: str | None = None

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
    pairs: dict[str, list[tuple[Record, RetrievalThread]]] = {}
    for rec in iter_strict_records(p):
        rid = rec.text("id")
        if rid in seen:
            raise rec.fail("duplicate id", "id", f"duplicate id {rid!r} (first at line {seen[rid]})")
        messages = _checked_messages(rec)
        label = _checked_label(rec)
        key = rid if split_by == "id" else messages[0]["content"]
        seen[rid] = rec.line
        thread = RetrievalThread(id=rid, messages=messages, label=label, category=rec.get("category", str, required=False),
                                 split=hash_split(key, fractions), domain=_optional_name(rec, "domain"), pair=_optional_name(rec, "pair"))
        if thread.pair is not None:
            _check_pair_member(rec, thread, pairs.setdefault(thread.pair, []))
        out.append(thread)
    for members in pairs.values():
        if len(members) == 1:
            rec, t = members[0]
            other = GATE_LABELS[1 - t.label_id]
            raise rec.fail("incomplete pair", "pair", f"pair {t.pair!r} has only this {t.label} thread: add its {other} partner "
                           f"(the same messages except the last user message, the same pair id) or drop the 'pair' field")
    return out


def _optional_name(rec: Record, key: str) -> str | None:
    """An optional non-empty string field (``domain``, ``pair``), stripped."""
    value = rec.get(key, str, required=False)
    if value is not None and not value.strip():
        raise rec.fail("missing field", key, f"'{key}' is empty: give a name or drop the field")
    return None if value is None else value.strip()


def _check_pair_member(rec: Record, thread: RetrievalThread, members: list[tuple[Record, RetrievalThread]]) -> None:
    """A pair holds exactly one SKIP and one RETRIEVE thread, of one domain, whose messages agree except the last."""
    lines = ", ".join(str(r.line) for r, _ in members)
    if len(members) >= 2:
        raise rec.fail("bad pair", "pair", f"pair {thread.pair!r} already has two threads (lines {lines}): a pair holds exactly "
                       "one SKIP and one RETRIEVE thread; give this thread a pair id of its own")
    if members:
        first_rec, first = members[0]
        where = f"line {first_rec.line}"
        if first.label == thread.label:
            raise rec.fail("bad pair", "label", f"pair {thread.pair!r} has two {thread.label} threads (this one and {where}): "
                           "a pair holds one SKIP and one RETRIEVE thread; fix one label or the pair id")
        if first.domain != thread.domain:
            raise rec.fail("bad pair", "domain", f"pair {thread.pair!r} spans two domains ({first.domain!r} at {where}, "
                           f"{thread.domain!r} here): both threads of a pair belong to one domain")
        a, b = first.messages[:-1], thread.messages[:-1]
        if a != b:
            k = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            raise rec.fail("bad pair", f"messages[{k}]", f"pair {thread.pair!r}: this thread's conversation differs from its "
                           f"partner's ({where}) at messages[{k}] ({len(b)} vs {len(a)} earlier messages): the two threads of a "
                           "pair share every message except the last user message")
        if first.messages[-1] == thread.messages[-1]:
            raise rec.fail("bad pair", f"messages[{len(b)}]", f"pair {thread.pair!r}: the last user message equals its partner's "
                           f"({where}) under the opposite label: the two threads of a pair end in different user messages")
    members.append((rec, thread))


def conversation_group(thread: RetrievalThread) -> str:
    """The group of a thread: threads opening with the same message share it (12 hex of sha1)."""
    return hashlib.sha1(thread.messages[0]["content"].encode()).hexdigest()[:12]


def gate_training_row(thread: RetrievalThread) -> dict[str, Any]:
    """One thread as the row training reads: (question, passages) as serving builds them
    (:func:`~suffice.serving.gates.retrieval.thread_input`), label 1 = SKIP, 0 = RETRIEVE, group = :func:`conversation_group`."""
    label = thread.label_id
    question, passages = thread_input(thread.messages)
    return {
        "id": thread.id, "question": question, "passages": passages,
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
    u = hash_unit(f"{seed}:{group}")
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
    question, passages = thread_input(messages)
    item: dict[str, Any] = {"question": question, "passages": passages}
    if label is not None:
        item["label"] = int(label == SKIP)
    return item


def gate_domain_row(thread: RetrievalThread, origin: str = "") -> dict[str, Any]:
    """:func:`gate_training_row` plus ``domain`` and ``pair`` ("" when the thread has none) and ``origin`` (the
    file it came from), for evaluation cut by domain, pair, category (``kind``) and writer's file. Training rows
    stay :func:`gate_training_row`'s, unchanged."""
    return {**gate_training_row(thread), "domain": thread.domain or "", "pair": thread.pair or "", "origin": origin}


def gate_domain_rows(*paths: str | Path) -> list[dict[str, Any]]:
    """Every thread of one or more retrieval-gate JSONL files as :func:`gate_domain_row` rows, in file order;
    an id in two files is an error (the splits and per-pair metrics key on it).

    >>> rows = gate_domain_rows("train.jsonl", "pairs.jsonl")  # doctest: +SKIP
    >>> rows[-1]["domain"], rows[-1]["pair"], rows[-1]["kind"]  # doctest: +SKIP
    ('veterinary clinic', 'set_8:veterinary-clinic-8', 'new_entity')
    """
    out: list[dict[str, Any]] = []
    first_file: dict[str, str] = {}
    for path in paths:
        for t in load_retrieval_threads(path):
            if t.id in first_file:
                raise ValueError(f"thread id {t.id!r} is in both {first_file[t.id]} and {path}: ids must be unique across "
                                 "the files of one evaluation (rename one)")
            first_file[t.id] = str(path)
            out.append(gate_domain_row(t, Path(path).name))
    return out


def domain_splits(domains: Sequence[str], seed: int, test_fraction: float, validation_fraction: float) -> dict[str, str]:
    """``{domain: split}``: the domains ranked by ``sha256("<seed>:domain:<name>")``; the first
    ``round(test_fraction * n)`` go to test, the next ``round(validation_fraction * n)`` to validation,
    the rest to train. Ranking (not a per-domain coin flip) gives every seed the same number of held-out
    domains, so the test size does not swing with the seed.

    >>> sorted(domain_splits(["a", "b", "c", "d"], 0, 0.25, 0.25).values())
    ['test', 'train', 'train', 'validation']
    """
    check_fractions((1.0 - test_fraction - validation_fraction, validation_fraction, test_fraction))
    names = sorted(set(domains), key=lambda d: (hashlib.sha256(f"{seed}:domain:{d}".encode()).hexdigest(), d))
    n_test = round(test_fraction * len(names))
    n_val = round(validation_fraction * len(names))
    return {d: "test" if k < n_test else "validation" if k < n_test + n_val else "train" for k, d in enumerate(names)}


def split_by_domain(rows: Sequence[dict[str, Any]], seed: int, test_fraction: float,
                    validation_fraction: float) -> dict[str, list[dict[str, Any]]]:
    """The leave-domains-out split: ``{"train": [...], "validation": [...], "test": [...]}``, order kept.

    Whole domains (the rows' ``domain``) go to one split by :func:`domain_splits`, so a test domain is one
    no training thread came from; both threads of a pair share a domain and so a split. Rows without a
    domain (train.jsonl's threads, written for the 30 domains training has always used) all go to train:
    a model trained on train.jsonl plus the train domains of pairs.jsonl is then tested on unseen domains
    only. A pair whose threads name two domains raises ``ValueError``.

    >>> rows = [{"domain": d, "pair": p} for d, p in [("a", "1"), ("a", "1"), ("b", "2"), ("b", "2"), ("", "")]]
    >>> {k: len(v) for k, v in split_by_domain(rows, 0, 0.5, 0.0).items()}
    {'train': 3, 'validation': 0, 'test': 2}
    """
    pair_domain: dict[str, str] = {}
    for r in rows:
        pair, domain = r.get("pair") or "", r.get("domain") or ""
        if pair and pair_domain.setdefault(pair, domain) != domain:
            raise ValueError(f"pair {pair!r} spans domains {pair_domain[pair]!r} and {domain!r}: both threads of a pair "
                             "belong to one domain (fix the data; load_retrieval_threads checks this)")
    assign = domain_splits([r["domain"] for r in rows if r.get("domain")], seed, test_fraction, validation_fraction)
    out: dict[str, list[dict[str, Any]]] = {"train": [], "validation": [], "test": []}
    for r in rows:
        out[assign[r["domain"]] if r.get("domain") else "train"].append(r)
    return out


GATE_SPLITS = ("opening_message", "domains")


def gate_splits(path: str | Path, split: str, seed: int, test_fraction: float, validation_fraction: float,
                pairs: str | Path | None = None, extra: Sequence[str | Path] = ()) -> dict[str, list[dict[str, Any]]]:
    """``{"train", "validation", "test"}`` rows of the retrieval-gate data, as training and the benchmark split it.

    ``opening_message``: the threads of ``path`` (and ``extra``) by a seeded hash of their opening message
    (:func:`split_gate_rows`). ``domains``: ``path`` plus ``pairs`` (default: ``pairs.jsonl`` beside
    ``path``) with ``domain``/``pair`` columns, whole domains held out (:func:`split_by_domain`);
    ``path``'s threads have no domain and all train. Each ``extra`` file (threads by further writers,
    ``gate.extra_paths``) is split by its own domains the same way, so ``path`` + ``pairs`` keep the split
    they have without it and every writer's file gives validation and test domains of its own.
    """
    if split == "opening_message":
        return split_gate_rows([r for f in (path, *extra) for r in gate_training_rows(f)], seed, test_fraction, validation_fraction)
    if split == "domains":
        pairs = Path(pairs) if pairs else Path(path).parent / "pairs.jsonl"
        if not pairs.is_file():
            raise FileNotFoundError(f"the domain-labelled threads {pairs} do not exist: give the pairs file "
                                    "(retrieval-gate/pairs.jsonl) or use the opening_message split")
        names = [Path(f).name for f in (path, pairs, *extra)]
        if len(set(names)) < len(names):
            raise ValueError(f"gate files {names}: each file of one split needs its own file name (the rows keep it as their origin)")
        rows = gate_domain_rows(path, pairs, *extra)  # ids unique across every file
        groups = [[r for r in rows if r["origin"] in (Path(path).name, pairs.name)]]
        groups += [[r for r in rows if r["origin"] == Path(f).name] for f in extra]
        out: dict[str, list[dict[str, Any]]] = {"train": [], "validation": [], "test": []}
        for group in groups:
            for k, v in split_by_domain(group, seed, test_fraction, validation_fraction).items():
                out[k] += v
        return out
    raise ValueError(f"unknown gate split {split!r}: choose one of {list(GATE_SPLITS)}")
