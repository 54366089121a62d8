"""The generation cache of ``suffice synth``: the label store's SQLite file plus a ``generations`` table,
one row per (generator, prompt version, passage id), so a re-run never asks twice for a passage.

>>> with SynthStore(":memory:") as s:
...     s.put_generation("gen:m", "gen-single-0", "p:1", GenerationRecord(status="ok", questions=[]))
...     sorted(s.generations("gen:m", "gen-single-0"))
True
['p:1']
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from suffice.training.autorater.store import REPLY_COLUMNS_SQL, LabelStore, StoredReply

GENERATIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS generations (
    generator       TEXT NOT NULL,
    prompt_version  TEXT NOT NULL,
    passage_id      TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('ok', 'unparsed')),
    questions       TEXT,
""" + REPLY_COLUMNS_SQL + """    PRIMARY KEY (generator, prompt_version, passage_id),
    CHECK ((status = 'ok') = (questions IS NOT NULL))
);
"""
_REPLY_COLUMNS = ["status", "questions", "raw", "tokens_in", "tokens_out", "latency_s", "attempts"]


@dataclass
class GenerationRecord(StoredReply):
    """One stored generation reply: ``ok`` with the question objects it held (validated when read), or
    ``unparsed`` with the raw reply kept for inspection."""

    questions: list[Any] | None = None
    passage_id: str | None = None  # filled when read back

    what: ClassVar[str] = "generation"
    payload: ClassVar[str] = "questions"
    payload_rule: ClassVar[str] = "'ok' needs a list, 'unparsed' none"

    @classmethod
    def from_generation(cls, generation: Any) -> "GenerationRecord":
        """The record of a finished (``ok`` or ``unparsed``) :class:`~suffice.training.synth.generate.Generation`."""
        return cls(**cls.reply_fields(generation), questions=generation.questions)


class SynthStore(LabelStore):
    """The label store plus the generation cache, in one SQLite file (WAL, safe to kill and resume).

    Labels (the re-judging rater's verdicts, imported synthetic labels) go to the ``labels`` table as
    for ``suffice label``; generation replies go to ``generations``, one row per (generator, prompt
    version, passage id), committed as each arrives.
    """

    def __init__(self, path: Any, *, timeout_s: float = 30.0):
        super().__init__(path, timeout_s=timeout_s)
        self.add_schema(GENERATIONS_SCHEMA)

    def put_generation(self, generator: str, prompt_version: str, passage_id: str, record: GenerationRecord, *,
                       replace_unparsed: bool = False) -> bool:
        """Store one reply; True if written. An existing row is kept, except an ``unparsed`` one when ``replace_unparsed``."""
        values = {c: getattr(record, c) for c in _REPLY_COLUMNS}
        if record.questions is not None:
            values["questions"] = json.dumps(record.questions, ensure_ascii=False)
        return self.insert_reply("generations", {"generator": generator, "prompt_version": prompt_version, "passage_id": passage_id},
                                 values, replace_unparsed=replace_unparsed)

    def generations(self, generator: str, prompt_version: str) -> dict[str, GenerationRecord]:
        """``{passage_id: record}`` of one generator and prompt version."""
        out = {}
        for r in self.query("SELECT * FROM generations WHERE generator=? AND prompt_version=? ORDER BY passage_id",
                            (generator, prompt_version)):
            out[r["passage_id"]] = GenerationRecord(
                status=r["status"], questions=None if r["questions"] is None else json.loads(r["questions"]), raw=r["raw"],
                tokens_in=r["tokens_in"], tokens_out=r["tokens_out"], latency_s=r["latency_s"], attempts=r["attempts"],
                passage_id=r["passage_id"], created_at=r["created_at"])
        return out

    def done_passages(self, generator: str, prompt_version: str, *, include_unparsed: bool = True) -> set[str]:
        """Passage ids already stored for this generator and prompt version."""
        sql = "SELECT passage_id FROM generations WHERE generator=? AND prompt_version=?"
        if not include_unparsed:
            sql += " AND status='ok'"
        return {r[0] for r in self.query(sql, (generator, prompt_version))}
