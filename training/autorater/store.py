"""LabelStore: every label any rater produced, in one SQLite file, safe to kill and resume.

One row per (rater, prompt version, item id), the primary key, so a label is never stored twice:
re-running a batch skips what is there, and two runs writing the same row keep the first. Each
label is committed as soon as it arrives, in WAL mode, so killing the labeller at any moment
loses at most the requests in flight, never a finished label.

A row's ``status`` is ``ok`` (``label`` 0/1, ``level`` when the scheme has one) or ``unparsed``
(no usable verdict: ``label`` is NULL and ``raw`` keeps the reply for inspection). Requests that
failed outright (retries exhausted) are not stored, so the next run tries those items again.

>>> store = LabelStore(":memory:")
>>> store.put("lexical-coverage", "coverage-0.8-0.5", "squad2:1", LabelRecord(status="ok", label=1, level="sufficient"))
True
>>> store.done_ids("lexical-coverage", "coverage-0.8-0.5")
{'squad2:1'}
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Iterable, Sequence

STATUSES = ("ok", "unparsed")
SCHEMA_VERSION = "1"

# The columns every stored reply has (labels and synth's generations), after its payload columns.
REPLY_COLUMNS_SQL = """\
    raw             TEXT,
    tokens_in       INTEGER NOT NULL DEFAULT 0,
    tokens_out      INTEGER NOT NULL DEFAULT 0,
    latency_s       REAL,
    attempts        INTEGER NOT NULL DEFAULT 1,
    created_at      TEXT NOT NULL,
"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS labels (
    rater           TEXT NOT NULL,
    prompt_version  TEXT NOT NULL,
    item_id         TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('ok', 'unparsed')),
    label           INTEGER CHECK (label IN (0, 1)),
    level           TEXT CHECK (level IS NULL OR level IN ('sufficient', 'partial', 'insufficient')),
    rationale       TEXT,
""" + REPLY_COLUMNS_SQL + """    PRIMARY KEY (rater, prompt_version, item_id),
    CHECK ((status = 'ok') = (label IS NOT NULL))
);
CREATE TABLE IF NOT EXISTS raters (
    rater           TEXT NOT NULL,
    prompt_version  TEXT NOT NULL,
    kind            TEXT NOT NULL,
    scheme          TEXT,
    model           TEXT,
    base_url        TEXT,
    prompt_text     TEXT,
    created_at      TEXT NOT NULL,
    PRIMARY KEY (rater, prompt_version)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def now_iso() -> str:
    """The store's timestamp: UTC ISO 8601 with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class StoredReply:
    """What every stored LLM reply carries, whatever it holds: ``ok`` (its payload set) or ``unparsed``
    (no payload, ``raw`` keeps the reply), with its cost and provenance. Failed requests are not stored.

    Subclasses name the payload field (``payload``) and what they store (``what``) for error messages.
    """

    status: str
    raw: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float | None = None
    attempts: int = 1
    created_at: str | None = None  # filled when read back

    what: ClassVar[str] = "reply"
    payload: ClassVar[str] = ""
    payload_rule: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}: a stored {self.what} is one of {list(STATUSES)} (failed requests are not stored)")
        value = getattr(self, self.payload)
        if (self.status == "ok") != (value is not None):
            raise ValueError(f"status={self.status!r} with {self.payload}={value!r}: {self.payload_rule}")

    @classmethod
    def reply_fields(cls, rating: Any) -> dict[str, Any]:
        """The fields every record takes from a finished :class:`~suffice.training.autorater.raters.Rating`."""
        return {"status": rating.status, "raw": rating.raw, "tokens_in": rating.tokens_in, "tokens_out": rating.tokens_out,
                "latency_s": round(rating.latency_s, 6), "attempts": max(1, rating.requests)}


@dataclass
class LabelRecord(StoredReply):
    """One stored label (or unparsed reply) with its cost and provenance."""

    label: int | None = None
    level: str | None = None
    rationale: str | None = None
    item_id: str | None = None  # filled when read back

    what: ClassVar[str] = "label"
    payload: ClassVar[str] = "label"
    payload_rule: ClassVar[str] = "'ok' needs a label 0/1, 'unparsed' must have none"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.label is not None and self.label not in (0, 1):
            raise ValueError(f"label={self.label!r} must be 0 or 1")

    @classmethod
    def from_rating(cls, rating: Any) -> "LabelRecord":
        """The record of a finished (``ok`` or ``unparsed``) rating."""
        return cls(**cls.reply_fields(rating), label=rating.label, level=rating.level, rationale=rating.rationale)


_COLUMNS = [f.name for f in fields(LabelRecord) if f.name not in ("item_id", "created_at")]


class LabelStore:
    """The SQLite label store (stdlib sqlite3, WAL). Use as a context manager or call :meth:`close`.

    >>> with LabelStore(":memory:") as s:
    ...     s.put("r", "v", "a", LabelRecord(status="unparsed", raw="no idea"))
    ...     s.get("r", "v", "a").raw
    True
    'no idea'
    """

    def __init__(self, path: str | Path, *, timeout_s: float = 30.0):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        except sqlite3.OperationalError as e:
            raise OSError(f"cannot open the label store {self.path}: {e}; give a writable path with --store") from e
        self._conn.row_factory = sqlite3.Row
        if self.path != ":memory:":
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise OSError(f"label store {self.path}: SQLite refused WAL mode (got {mode!r}); put the store on a local disk")
        # NORMAL is durable against a killed process in WAL mode (only an OS crash can lose the last commits).
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        self._conn.executescript(_SCHEMA)
        self._conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "LabelStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ writing

    def register_rater(self, rater: str, prompt_version: str, *, kind: str, scheme: str | None = None,
                       model: str | None = None, base_url: str | None = None, prompt_text: str | None = None) -> None:
        """Record what a (rater, prompt version) pair is, once (no secrets: never pass headers or keys)."""
        self._conn.execute(
            "INSERT OR IGNORE INTO raters(rater, prompt_version, kind, scheme, model, base_url, prompt_text, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (rater, prompt_version, kind, scheme, model, base_url, prompt_text, now_iso()))

    def put(self, rater: str, prompt_version: str, item_id: str, record: LabelRecord, *, replace_unparsed: bool = False) -> bool:
        """Store one label; True if written. An existing row is kept (idempotent), except that
        ``replace_unparsed=True`` lets a new result overwrite an ``unparsed`` row."""
        return self.insert_reply("labels", {"rater": rater, "prompt_version": prompt_version, "item_id": item_id},
                                 {c: getattr(record, c) for c in _COLUMNS}, replace_unparsed=replace_unparsed)

    def insert_reply(self, table: str, key: dict[str, Any], values: dict[str, Any], *, replace_unparsed: bool = False) -> bool:
        """Insert one reply row into ``table`` (``key``: its primary-key columns); True if written. An existing
        row is kept, except an ``unparsed`` one when ``replace_unparsed``. Shared by labels and generations."""
        cols = list(values)
        sql = (f"INSERT INTO {table}({', '.join(key)}, {', '.join(cols)}, created_at) "
               f"VALUES ({', '.join('?' for _ in key)}, {', '.join('?' for _ in cols)}, ?) ")
        if replace_unparsed:
            sql += (f"ON CONFLICT({', '.join(key)}) DO UPDATE SET "
                    f"{', '.join(f'{c}=excluded.{c}' for c in cols)}, created_at=excluded.created_at "
                    f"WHERE {table}.status = 'unparsed'")
        else:
            sql += f"ON CONFLICT({', '.join(key)}) DO NOTHING"
        return self.execute_retrying(sql, [*key.values(), *values.values(), now_iso()]).rowcount > 0

    def query(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run a read query on the store (rows are :class:`sqlite3.Row`)."""
        return self._conn.execute(sql, params)

    def add_schema(self, script: str) -> None:
        """Create extra tables (``CREATE TABLE IF NOT EXISTS ...``) in the same file."""
        self._conn.executescript(script)

    def put_many(self, rater: str, prompt_version: str, records: Iterable[tuple[str, LabelRecord]]) -> int:
        """Store many labels in one transaction (imports); returns how many were new."""
        sql = (f"INSERT INTO labels(rater, prompt_version, item_id, {', '.join(_COLUMNS)}, created_at) "
               f"VALUES (?, ?, ?, {', '.join('?' for _ in _COLUMNS)}, ?) ON CONFLICT DO NOTHING")
        now = now_iso()
        before = self.count(rater, prompt_version)
        with self._transaction():
            self._conn.executemany(sql, ([rater, prompt_version, iid, *[getattr(r, c) for c in _COLUMNS], now] for iid, r in records))
        return self.count(rater, prompt_version) - before

    def execute_retrying(self, sql: str, params: list[Any], attempts: int = 5) -> sqlite3.Cursor:
        """Execute a write, retrying briefly when another process holds the lock."""
        # busy_timeout covers most lock waits; a second process checkpointing can still bounce us once.
        for i in range(attempts):
            try:
                return self._conn.execute(sql, params)
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or i == attempts - 1:
                    raise
                time.sleep(0.05 * 2**i)
        raise AssertionError("unreachable")

    class _Tx:
        def __init__(self, conn: sqlite3.Connection):
            self.conn = conn

        def __enter__(self) -> None:
            self.conn.execute("BEGIN IMMEDIATE")

        def __exit__(self, exc_type, *rest: object) -> None:
            self.conn.execute("ROLLBACK" if exc_type else "COMMIT")

    def _transaction(self) -> "_Tx":
        return LabelStore._Tx(self._conn)

    # ------------------------------------------------------------ reading

    def done_ids(self, rater: str, prompt_version: str, *, include_unparsed: bool = True) -> set[str]:
        """Item ids already stored for this rater and prompt version."""
        sql = "SELECT item_id FROM labels WHERE rater=? AND prompt_version=?"
        if not include_unparsed:
            sql += " AND status='ok'"
        return {r[0] for r in self._conn.execute(sql, (rater, prompt_version))}

    def get(self, rater: str, prompt_version: str, item_id: str) -> LabelRecord | None:
        row = self._conn.execute("SELECT * FROM labels WHERE rater=? AND prompt_version=? AND item_id=?",
                                 (rater, prompt_version, item_id)).fetchone()
        return None if row is None else _record(row)

    def rows(self, rater: str, prompt_version: str, *, status: str | None = None) -> list[LabelRecord]:
        """All stored rows of one rater and prompt version (optionally one status), by item id."""
        sql, params = "SELECT * FROM labels WHERE rater=? AND prompt_version=?", [rater, prompt_version]
        if status is not None:
            sql += " AND status=?"
            params.append(status)
        return [_record(r) for r in self._conn.execute(sql + " ORDER BY item_id", params)]

    def count(self, rater: str | None = None, prompt_version: str | None = None) -> int:
        sql, params = "SELECT COUNT(*) FROM labels WHERE 1=1", []
        if rater is not None:
            sql += " AND rater=?"
            params.append(rater)
        if prompt_version is not None:
            sql += " AND prompt_version=?"
            params.append(prompt_version)
        return int(self._conn.execute(sql, params).fetchone()[0])

    def versions(self, rater: str) -> list[str]:
        """Prompt versions stored for a rater, most recent first."""
        return [r[0] for r in self._conn.execute(
            "SELECT prompt_version, MAX(created_at) AS last FROM labels WHERE rater=? GROUP BY prompt_version ORDER BY last DESC", (rater,))]

    def resolve(self, spec: str) -> tuple[str, str]:
        """``RATER`` or ``RATER@VERSION`` -> (rater, version); a bare name must have exactly one version.

        >>> LabelStore(":memory:").resolve("nobody")
        Traceback (most recent call last):
        ...
        KeyError: "rater 'nobody' has no labels in the store :memory: (stored raters: none); run `suffice label` first"
        """
        rater, _, version = spec.partition("@")
        versions = self.versions(rater)
        if version:
            if version not in versions:
                raise KeyError(f"rater {rater!r} has no labels under prompt version {version!r}: stored versions are {versions}")
            return rater, version
        if not versions:
            known = sorted({r["rater"] for r in self.summary()}) or "none"
            raise KeyError(f"rater {rater!r} has no labels in the store {self.path} (stored raters: {known}); run `suffice label` first")
        if len(versions) > 1:
            raise KeyError(f"rater {rater!r} has labels under several prompt versions {versions}: name one as {rater}@VERSION")
        return rater, versions[0]

    def summary(self) -> list[dict[str, Any]]:
        """One dict per (rater, prompt version): counts by status and the share labelled sufficient."""
        out = []
        for r in self._conn.execute(
                "SELECT rater, prompt_version, COUNT(*) AS n, SUM(status='ok') AS ok, SUM(status='unparsed') AS unparsed, "
                "SUM(label=1) AS positive, SUM(tokens_in) AS tokens_in, SUM(tokens_out) AS tokens_out "
                "FROM labels GROUP BY rater, prompt_version ORDER BY rater, prompt_version"):
            out.append(dict(r))
        return out


def _record(row: sqlite3.Row) -> LabelRecord:
    return LabelRecord(**{c: row[c] for c in _COLUMNS}, item_id=row["item_id"], created_at=row["created_at"])
