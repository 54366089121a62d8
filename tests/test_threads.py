"""Retrieval-gate threads: the data package's rows and split equal what training and export read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suffice.training.data.schema import DataFormatError
from suffice.training.data.threads import gate_split, gate_training_rows, split_gate_rows, thread_item

REPO = Path(__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures"


def _gate_file(tmp_path: Path) -> Path:
    p = tmp_path / "gate.jsonl"
    lines = []
    for i in range(40):
        opener = f"how do refunds work for order type {i % 8}?"
        msgs = [{"role": "user", "content": opener}, {"role": "assistant", "content": "Refunds take 5 days."},
                {"role": "user", "content": "thanks!" if i % 2 else "what about shipping to Norway?"}]
        lines.append(json.dumps({"id": f"t{i}", "messages": msgs, "label": "SKIP" if i % 2 else "RETRIEVE",
                                 "category": "x" if i % 3 else None}))
    p.write_text("\n".join(lines) + "\n")
    return p


def _training_splits(path: Path, seed: int):
    from suffice.training.fit.splits import load_splits
    from suffice.training.fit.config import build_train_config

    cfg = build_train_config(REPO / "configs" / "retrieval-gate.yaml", [f"--gate.path={path}", f"--seed={seed}", "--gate.split=opening_message",
                                                                                   "--gate.styles=[]"])  # the reader alone, no styled copies
    return cfg, load_splits(cfg)


@pytest.mark.parametrize("seed", [0, 7])
def test_gate_rows_and_split_equal_what_training_reads(tmp_path, seed):
    path = _gate_file(tmp_path)
    cfg, splits = _training_splits(path, seed)
    ours = split_gate_rows(gate_training_rows(path), cfg.seed, cfg.gate.test_fraction, cfg.gate.validation_fraction)
    for name in ("train", "validation", "test"):
        assert splits[name].to_list() == ours[name], name


def test_gate_rows_equal_the_training_reader_on_shared_data(shared_data_dir):
    path = shared_data_dir / "retrieval-gate" / "train.jsonl"
    rows = gate_training_rows(path)
    cfg, splits = _training_splits(path, 0)
    ours = split_gate_rows(rows, cfg.seed, cfg.gate.test_fraction, cfg.gate.validation_fraction)
    assert [len(ours[n]) for n in ("train", "validation", "test")] == [len(splits[n]) for n in ("train", "validation", "test")]
    assert splits["test"].to_list() == ours["test"]


def test_gate_split_is_by_group_and_seed():
    assert gate_split("g", 0, 1.0, 0.0) == "test" and gate_split("g", 0, 0.0, 1.0) == "validation"
    groups = [f"g{i}" for i in range(200)]
    assert [gate_split(g, 1, 0.2, 0.2) for g in groups] != [gate_split(g, 2, 0.2, 0.2) for g in groups]


def test_thread_item_equals_what_export_checks_with(tmp_path):
    export = pytest.importorskip("suffice.training.export")
    records = [json.loads(x) for x in (FIX / "retrieval.jsonl").read_text().splitlines()]
    records[2].pop("label")
    p = tmp_path / "threads.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert export.load_validation_jsonl(p, split=None) == [thread_item(r, p, n) for n, r in enumerate(records, 1)]
    assert "label" not in thread_item(records[2])


def test_thread_item_errors_name_file_and_line():
    with pytest.raises(DataFormatError, match="t.jsonl, line 4, field 'messages\\[0\\].role'"):
        thread_item({"messages": [{"role": "assistant", "content": "hi"}]}, "t.jsonl", 4)
    with pytest.raises(DataFormatError, match="unknown label 'MAYBE'"):
        thread_item({"messages": [{"role": "user", "content": "hi"}], "label": "MAYBE"})
