"""benchmarks/bench_handwritten.py: the hand-written probe's reader, its metrics and a run on a tiny bundle."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_handwritten
    finally:
        sys.path.pop(0)
    return bench_handwritten


def test_the_shipped_probe_is_balanced_and_well_formed(bench):
    items = bench.load_items()
    assert len(items) == 120 and sum(it["label"] for it in items) == 60
    assert {it["length"] for it in items} == {"short", "paragraph", "multi"}
    assert all(it["passages"] and all(p["text"].strip() for p in it["passages"]) for it in items)
    assert len({it["id"] for it in items}) == len(items)


@pytest.mark.parametrize("line, match", [
    ("{not json", r"items.jsonl:2: not JSON"),
    (json.dumps({"question": "q", "passages": ["p"]}), r"items.jsonl:2: missing field 'label'"),
    (json.dumps({"question": "q", "passages": ["p"], "label": "yes"}), r"items.jsonl:2: field 'label' is 'yes': use 1"),
])
def test_bad_items_name_line_field_and_fix(bench, tmp_path, line, match):
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"question": "q", "passages": ["p"], "label": 1}) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=match):
        bench.load_items(path)


def test_quality_figures(bench):
    q = bench.quality(np.array([0.9, 0.85, 0.6, 0.2]), np.array([1, 0, 1, 0]), partial=0.5, sufficient=0.8)
    assert q["n"] == 4 and q["share_at_sufficient"] == 0.5 and q["precision_at_sufficient"] == 0.5
    assert q["auroc"] == pytest.approx(0.75) and q["macro_f1"] == pytest.approx(0.733, abs=1e-3)
    assert q["mean_score_sufficient"] == pytest.approx(0.75) and q["mean_score_not"] == pytest.approx(0.525)


def test_run_on_a_tiny_bundle(bench, bundles):
    r = bench.run(bundles["sufficiency"], threads=1)
    assert r["overall"]["n"] == 120 and set(r["by_length"]) == {"short", "paragraph", "multi"}
    assert sum(q["n"] for q in r["by_length"].values()) == 120 and len(r["scores"]) == 120
    assert all(0.0 <= s <= 1.0 for s in r["scores"].values())
    text = bench.format_report(r)
    assert "hand-written items" in text and f"wrong at the partial threshold ({len(r['wrong'])})" in text
