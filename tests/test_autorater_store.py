"""LabelStore: keys, idempotency, WAL mode, unparsed rows, constraints, version resolution."""

from __future__ import annotations

import sqlite3

import pytest

from suffice.training.autorater.store import LabelRecord, LabelStore


def test_put_is_idempotent_and_keyed_by_rater_version_item(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        assert store.put("r", "v1", "a", LabelRecord(status="ok", label=1, tokens_in=10, tokens_out=3, latency_s=0.2))
        assert not store.put("r", "v1", "a", LabelRecord(status="ok", label=0))  # first label kept
        assert store.put("r", "v2", "a", LabelRecord(status="ok", label=0))      # another prompt version
        assert store.put("other", "v1", "a", LabelRecord(status="ok", label=0))
        assert store.get("r", "v1", "a").label == 1
        assert store.count() == 3
    with LabelStore(path) as store:  # reopened: everything committed
        rec = store.get("r", "v1", "a")
        assert (rec.label, rec.tokens_in, rec.tokens_out, rec.latency_s) == (1, 10, 3, 0.2)
        assert rec.created_at
        assert store.done_ids("r", "v1") == {"a"}
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_unparsed_rows_keep_raw_and_can_be_replaced_on_request(tmp_path):
    with LabelStore(tmp_path / "s.sqlite") as store:
        store.put("r", "v", "x", LabelRecord(status="unparsed", raw="no verdict here"))
        store.put("r", "v", "y", LabelRecord(status="ok", label=1))
        assert store.done_ids("r", "v", include_unparsed=False) == {"y"}
        assert store.get("r", "v", "x").raw == "no verdict here" and store.get("r", "v", "x").label is None
        # A plain put never overwrites; replace_unparsed replaces unparsed rows only.
        assert not store.put("r", "v", "x", LabelRecord(status="ok", label=0))
        assert store.put("r", "v", "x", LabelRecord(status="ok", label=0), replace_unparsed=True)
        assert not store.put("r", "v", "y", LabelRecord(status="ok", label=0), replace_unparsed=True)
        assert store.get("r", "v", "x").label == 0 and store.get("r", "v", "y").label == 1


@pytest.mark.parametrize("kwargs", [dict(status="ok"), dict(status="unparsed", label=1), dict(status="failed"),
                                    dict(status="ok", label=2)])
def test_inconsistent_records_are_refused(kwargs):
    with pytest.raises(ValueError):
        LabelRecord(**kwargs)


def test_database_constraints_back_the_dataclass(tmp_path):
    with LabelStore(tmp_path / "s.sqlite") as store:
        with pytest.raises(sqlite3.IntegrityError):
            store.execute_retrying("INSERT INTO labels(rater, prompt_version, item_id, status, label, created_at) "
                                   "VALUES ('r', 'v', 'x', 'ok', NULL, 'now')", [])


def test_put_many_and_resolve(tmp_path):
    with LabelStore(tmp_path / "s.sqlite") as store:
        rows = [(f"i{k}", LabelRecord(status="ok", label=k % 2, level="sufficient" if k % 2 else "partial")) for k in range(5)]
        assert store.put_many("t", "shipped", rows) == 5
        assert store.put_many("t", "shipped", rows) == 0
        assert store.resolve("t") == ("t", "shipped")
        store.put("t", "other", "i0", LabelRecord(status="ok", label=1))
        with pytest.raises(KeyError, match="several prompt versions"):
            store.resolve("t")
        assert store.resolve("t@other") == ("t", "other")
        with pytest.raises(KeyError, match="no labels under prompt version"):
            store.resolve("t@nope")
        with pytest.raises(KeyError, match="stored raters"):
            store.resolve("nobody")
        summary = {(r["rater"], r["prompt_version"]): r for r in store.summary()}
        assert summary[("t", "shipped")]["n"] == 5 and summary[("t", "shipped")]["positive"] == 2


def test_two_connections_share_the_store(tmp_path):
    path = tmp_path / "s.sqlite"
    with LabelStore(path) as a, LabelStore(path) as b:
        a.put("r", "v", "x", LabelRecord(status="ok", label=1))
        assert not b.put("r", "v", "x", LabelRecord(status="ok", label=0))
        assert b.get("r", "v", "x").label == 1
