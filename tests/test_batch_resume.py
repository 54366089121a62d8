"""``suffice score --on-error {fail,skip}`` and ``--resume``: a bad row at position N in JSONL and Parquet,
skip vs fail, and a run that crashes after chunk k and resumes to the same output as one uninterrupted run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyfunc_support import MIXED_ROWS, tiny_bundle

pytest.importorskip("optimum")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

N_BAD = 5  # 0-based position of the bad row; chunks of 4 put it in the second chunk
CHUNK = 4


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_bert_dir):
    return tiny_bundle(tmp_path_factory, tiny_bert_dir)


def _rows(n: int = 14) -> list[dict]:
    return [{"id": i, "question": MIXED_ROWS[i % len(MIXED_ROWS)]["question"],
             "passages": [{"title": "", "text": p} if isinstance(p, str) else p for p in MIXED_ROWS[i % len(MIXED_ROWS)].get("passages") or
                          [MIXED_ROWS[i % len(MIXED_ROWS)].get("context") or "No text."]]} for i in range(n)]


def _write_input(path, rows, fmt: str, bad_json_line: bool = False):
    """``rows`` with row N_BAD broken: an empty question (both formats), and for JSONL optionally a line that is not JSON."""
    rows = [dict(r) for r in rows]
    rows[N_BAD]["question"] = ""
    if fmt == "parquet":
        passage = pa.struct([("title", pa.string()), ("text", pa.string())])
        schema = pa.schema([("id", pa.int64()), ("question", pa.string()), ("passages", pa.list_(passage))])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=3)
        return
    lines = [json.dumps(r) for r in rows]
    if bad_json_line:
        lines[N_BAD + 3] = '{"id": 8, "question": "Broken?", "passages": ["x"'  # row 8, line 9
    path.write_text("\n".join(lines) + "\n")


def _read(path) -> list[dict]:
    if str(path).endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text().splitlines()]


def _score(bundle, src, dst, *extra) -> int:
    from suffice.serving.batch import main

    return main(["--input", str(src), "--output", str(dst), "--model", str(bundle), "--chunk-rows", str(CHUNK),
                 "--precision", "fp32", "--no-progress", *extra])


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_bad_row_at_position_n_skip_vs_fail(bundle, tmp_path, capsys, fmt):
    rows = _rows()
    src = tmp_path / f"in.{fmt}"
    _write_input(src, rows, fmt, bad_json_line=fmt == "jsonl")
    where = "row 5 (line 6)" if fmt == "jsonl" else "row 5"

    assert _score(bundle, src, tmp_path / "failed.jsonl") == 2
    err = capsys.readouterr().err
    assert f"{where}: question must be a non-empty string" in err and "--on-error skip" in err
    assert [r["id"] for r in _read(tmp_path / "failed.jsonl.partial")] == list(range(CHUNK))  # chunk 1 kept

    out = tmp_path / f"skipped.{fmt}"
    assert _score(bundle, src, out, "--on-error", "skip") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    got = _read(out)
    bad = {N_BAD, N_BAD + 3} if fmt == "jsonl" else {N_BAD}
    assert len(got) == len(rows) and summary["rows"] == len(rows) and summary["errors"] == len(bad)
    assert sum(summary["levels"].values()) == len(rows) - len(bad)
    for i, r in enumerate(got):
        if i in bad:
            assert r["score"] is None and r["level"] is None and r["error"]
        else:
            assert r["error"] is None and 0.0 <= r["score"] <= 1.0 and r["id"] == i
    assert f"{where}: question must be a non-empty string" in got[N_BAD]["error"]
    if fmt == "jsonl":
        assert "line 9: not valid JSON" in got[N_BAD + 3]["error"]
    else:
        assert pq.read_schema(out).field("error").type == pa.string()

    # the good rows score as they would without the bad ones (fp32: batch composition does not move scores)
    from suffice.serving import ScorerConfig, SufficiencyScorer

    good = [r for i, r in enumerate(rows) if i not in bad]
    want = SufficiencyScorer.load(bundle, ScorerConfig(precision="fp32")).score_batch([r["question"] for r in good], [r["passages"] for r in good])
    np.testing.assert_allclose([r["score"] for i, r in enumerate(got) if i not in bad], [w.score for w in want], atol=1e-5)


@pytest.mark.parametrize("out_fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("crash", ["while_scoring", "before_progress_record"])
def test_resume_after_a_crash_equals_an_uninterrupted_run(bundle, tmp_path, capsys, monkeypatch, out_fmt, crash):
    from suffice.serving import SufficiencyScorer, batch

    src = tmp_path / "in.jsonl"
    _write_input(src, _rows(14), "jsonl", bad_json_line=True)
    whole = tmp_path / f"whole.{out_fmt}"
    assert _score(bundle, src, whole, "--on-error", "skip") == 0
    capsys.readouterr()

    k = 2  # chunks 1..k complete, then the process dies in chunk k+1
    if crash == "while_scoring":  # the scorer dies in chunk k+1
        real, calls = SufficiencyScorer.score_batch, []

        def score_batch(self, *a, **kw):
            calls.append(1)
            if len(calls) > k:
                raise RuntimeError("simulated crash")
            return real(self, *a, **kw)
        monkeypatch.setattr(SufficiencyScorer, "score_batch", score_batch)
    else:  # chunk k+1 is written, the process dies before its progress record: resume must drop it
        real_wp, calls = batch.write_progress, []

        def write_progress(*a, **kw):
            calls.append(1)
            if len(calls) > k:
                raise RuntimeError("simulated crash")
            return real_wp(*a, **kw)
        monkeypatch.setattr(batch, "write_progress", write_progress)
    out = tmp_path / f"resumed.{out_fmt}"
    with pytest.raises(RuntimeError, match="simulated crash"):
        _score(bundle, src, out, "--on-error", "skip")
    assert not out.exists() and "--resume" in capsys.readouterr().err
    assert json.loads(out.with_name(out.name + ".progress.json").read_text())["rows"] == k * CHUNK
    monkeypatch.undo()

    assert _score(bundle, src, out, "--on-error", "skip") == 2  # no silent restart over an interrupted run
    assert "pass --resume" in capsys.readouterr().err
    assert _score(bundle, src, out, "--on-error", "skip", "--resume") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rows"] == 14 and summary["errors"] == 2 and summary["resumed_rows"] == k * CHUNK
    assert not out.with_name(out.name + ".partial").exists() and not out.with_name(out.name + ".progress.json").exists()

    def strip(rows):
        return [{c: v for c, v in r.items() if c != "latency_ms"} for r in rows]
    a, b = strip(_read(whole)), strip(_read(out))
    assert [r.get("id") for r in b] == [None if i == N_BAD + 3 else i for i in range(14)]  # row 8 is not JSON: no id to keep
    assert [r["error"] for r in a] == [r["error"] for r in b]
    np.testing.assert_allclose([r["score"] or -1 for r in b], [r["score"] or -1 for r in a], atol=1e-6)
    assert [{**r, "score": None} for r in a] == [{**r, "score": None} for r in b]
    if out_fmt == "parquet":
        assert pq.read_schema(out) == pq.read_schema(whole)


def test_resume_refuses_a_changed_input_or_other_options(bundle, tmp_path, capsys, monkeypatch):
    from suffice.serving import SufficiencyScorer

    src = tmp_path / "in.jsonl"
    _write_input(src, _rows(10), "jsonl")
    real, calls = SufficiencyScorer.score_batch, []

    def score_batch(self, *a, **kw):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("simulated crash")
        return real(self, *a, **kw)
    monkeypatch.setattr(SufficiencyScorer, "score_batch", score_batch)
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        _score(bundle, src, out, "--on-error", "skip")
    monkeypatch.undo()
    capsys.readouterr()
    assert _score(bundle, src, out, "--resume") == 2  # --on-error differs
    assert "on_error: was 'skip', now 'fail'" in capsys.readouterr().err
    src.write_text(src.read_text() + json.dumps({"id": 99, "question": "New?", "context": "c"}) + "\n")
    assert _score(bundle, src, out, "--on-error", "skip", "--resume") == 2
    assert "changed since the interrupted run" in capsys.readouterr().err
    assert _score(bundle, src, out, "--on-error", "skip", "--overwrite") == 0  # starting over is allowed
    assert len(_read(out)) == 11
