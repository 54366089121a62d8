"""``suffice score``: JSONL/Parquet in and out, equal to the direct scorer, errors that name the row,
a registry alias as --model, and streaming: a file larger than the memory the process may use."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pyfunc_support import MIXED_ROWS, as_scorer_input, mlflow_store, shared_store, tiny_bundle

pytest.importorskip("optimum")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_bert_dir):
    return tiny_bundle(tmp_path_factory, tiny_bert_dir)


def _write_jsonl(path, rows, blank_every: int = 0):
    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps(r) + "\n")
            if blank_every and i % blank_every == 0:
                f.write("\n")


def _direct(bundle, rows, **cfg):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    q, p = as_scorer_input(rows)
    return SufficiencyScorer.load(bundle, ScorerConfig(**cfg)).score_batch(q, p)


def test_jsonl_in_jsonl_out_equals_the_direct_scorer(bundle, tmp_path, capsys):
    from suffice.serving.batch import main

    rows = [{"id": f"r{i}", **r, "meta": {"k": i}} for i, r in enumerate(MIXED_ROWS)]
    _write_jsonl(tmp_path / "in.jsonl", rows, blank_every=2)
    assert main(["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"), "--model", str(bundle),
                 "--chunk-rows", "4", "--batch-size", "4"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rows"] == len(rows) and summary["rows_per_s"] > 0 and sum(summary["levels"].values()) == len(rows)
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["id"] for o in out] == [r["id"] for r in rows]
    assert set(out[0]) == {"id", "question", "meta", "score", "level", "latency_ms"}  # passages/context dropped by default
    assert out[0]["meta"] == {"k": 0}
    # chunks of 4 rows scored 4 per ONNX call: the same batches as scoring the chunks directly
    want = _direct(bundle, rows[:4], batch_size=4) + _direct(bundle, rows[4:], batch_size=4)
    np.testing.assert_allclose([o["score"] for o in out], [r.score for r in want], atol=1e-6)
    assert [o["level"] for o in out] == [r.level for r in want]
    assert not (tmp_path / "out.jsonl.partial").exists()


def test_parquet_in_parquet_out_keeps_the_input_schema(bundle, tmp_path):
    from suffice.serving.batch import main

    passage = pa.struct([("title", pa.string()), ("text", pa.string())])
    schema = pa.schema([("id", pa.int64()), ("question", pa.string()), ("passages", pa.list_(passage)), ("context", pa.string())])
    rows = [{"id": i, "question": r["question"],
             "passages": [p if isinstance(p, dict) else {"title": "", "text": p} for p in r["passages"]] if "passages" in r else None,
             "context": r.get("context")} for i, r in enumerate(MIXED_ROWS * 3)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "in.parquet", row_group_size=5)
    assert main(["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out.parquet"), "--model", str(bundle),
                 "--precision", "fp32", "--chunk-rows", "5", "--no-progress"]) == 0
    f = pq.ParquetFile(tmp_path / "out.parquet")
    assert f.metadata.num_row_groups == 4 and f.metadata.num_rows == len(rows)
    assert f.schema_arrow == pa.schema([("id", pa.int64()), ("question", pa.string()), ("score", pa.float64()),
                                        ("level", pa.string()), ("latency_ms", pa.float64())])
    out = f.read().to_pylist()
    want = _direct(bundle, [{"question": r["question"], "passages": r["passages"], "context": r["context"]} for r in rows], precision="fp32")
    np.testing.assert_allclose([o["score"] for o in out], [r.score for r in want], atol=1e-5)
    assert [o["level"] for o in out] == [r.level for r in want] and [o["id"] for o in out] == list(range(len(rows)))

    # JSONL -> Parquet: nested values become JSON strings, so rows of different shapes lose nothing
    _write_jsonl(tmp_path / "mixed.jsonl", [{**MIXED_ROWS[0], "gold": {"a": 1}}, {**MIXED_ROWS[1], "gold": {"b": [1, 2]}}])
    assert main(["--input", str(tmp_path / "mixed.jsonl"), "--output", str(tmp_path / "mixed.parquet"), "--model", str(bundle),
                 "--chunk-rows", "1", "--no-progress", "--keep-columns", "gold"]) == 0
    got = pq.read_table(tmp_path / "mixed.parquet").to_pylist()
    assert [json.loads(r["gold"]) for r in got] == [{"a": 1}, {"b": [1, 2]}]


def test_registry_alias_as_model_and_progress_with_throughput(bundle, tmp_path, tmp_path_factory, monkeypatch):
    root, _, _ = shared_store(tmp_path_factory, bundle)
    _write_jsonl(tmp_path / "in.jsonl", MIXED_ROWS)
    with mlflow_store(root, monkeypatch):
        p = subprocess.run([sys.executable, "-m", "suffice.training.cli", "score", "--input", str(tmp_path / "in.jsonl"),
                            "--output", str(tmp_path / "out.parquet"), "--model", "models:/suffice-sufficiency@production"],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "row/s" in p.stderr and "rows/s)" in p.stderr  # tqdm's rate, then the summary line
    assert json.loads(p.stdout.strip().splitlines()[-1])["rows"] == len(MIXED_ROWS)
    assert pq.ParquetFile(tmp_path / "out.parquet").metadata.num_rows == len(MIXED_ROWS)


@pytest.mark.parametrize("lines, message", [
    (['{"question": "Q?", "context": "c"}', "{not json"], "line 2: not valid JSON"),
    (['{"question": "Q?", "context": "c"}', '{"question": "", "context": "c"}'], "row 1 (line 2): question must be a non-empty string"),
    (['{"question": "Q?", "passages": [{"title": "t"}]}'], "no 'text' key"),
    (['{"question": "Q?"}'], "neither a 'passages' nor a 'context' column"),
    (['["Q?", "c"]'], "expected a JSON object"),
    # a bare string is no passage list: the error HTTP's 422 gives
    (['{"question": "Q?", "passages": "c"}'], "row 0 (line 1): passages must be a list of strings or {title, text} objects, got str 'c': "
                                              "put a single context string in 'context' instead"),
])
def test_bad_rows_are_named_and_completed_chunks_kept(bundle, tmp_path, capsys, lines, message):
    from suffice.serving.batch import main

    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"), "--model", str(bundle),
                 "--chunk-rows", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "--on-error skip" in err
    assert not (tmp_path / "out.jsonl").exists()
    if len(lines) == 1:  # nothing was complete: nothing kept
        assert not (tmp_path / "out.jsonl.partial").exists() and not (tmp_path / "out.jsonl.progress.json").exists()
    else:  # the chunk before the bad row stays, ready for --resume
        assert len((tmp_path / "out.jsonl.partial").read_text().splitlines()) == 1 and "--resume" in err
        assert json.loads((tmp_path / "out.jsonl.progress.json").read_text())["rows"] == 1


@pytest.mark.parametrize("args, message", [
    (["--input", "x.csv", "--output", "o.jsonl"], "name the file *.jsonl or *.parquet"),
    (["--input", "missing.jsonl", "--output", "o.jsonl"], "does not exist"),
    (["--input", "in.jsonl", "--output", "in.jsonl"], "already exists"),
    (["--input", "in.jsonl", "--output", "o.jsonl", "--keep-columns", ","], "--keep-columns"),
    (["--input", "in.jsonl", "--output", "o.jsonl", "--batch-size", "0"], "batch_size"),
])
def test_bad_options_are_named(bundle, tmp_path, capsys, monkeypatch, args, message):
    from suffice.serving.batch import main

    monkeypatch.chdir(tmp_path)
    _write_jsonl(tmp_path / "in.jsonl", MIXED_ROWS[:1])
    assert main([*args, "--model", str(bundle), "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_streams_a_file_larger_than_the_memory_it_may_use(bundle, tmp_path):
    """Once the scorer is loaded, the process may allocate 48 MiB more; the input is ~160 MB."""
    row_bytes, rows = 100_000, 1600
    with open(tmp_path / "big.jsonl", "w", encoding="utf-8") as f:
        for i in range(rows):
            r = MIXED_ROWS[i % len(MIXED_ROWS)]
            f.write(json.dumps({"id": i, **r, "payload": "x" * row_bytes}) + "\n")
    size = (tmp_path / "big.jsonl").stat().st_size
    headroom = 48 << 20
    assert size > 3 * headroom
    _write_jsonl(tmp_path / "warm.jsonl", MIXED_ROWS)
    code = textwrap.dedent(f"""
        import json, resource, sys
        from suffice.serving.batch import main
        # onnxruntime: the address-space limit measures streaming, and OpenVINO reserves far more virtual
        # memory when it compiles the model (which the second main() does after the limit is set)
        common = ["--model", {str(bundle)!r}, "--no-progress", "--keep-columns", "id", "--threads", "1", "--backend", "onnxruntime"]
        # warm up: every lazy import and the ONNX session's arenas exist before the limit is set
        assert main(["--input", {str(tmp_path / "warm.jsonl")!r}, "--output", {str(tmp_path / "warm.out.jsonl")!r}, *common]) == 0
        vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + {headroom}, resource.RLIM_INFINITY))
        rc = main(["--input", {str(tmp_path / "big.jsonl")!r}, "--output", {str(tmp_path / "big.out.jsonl")!r},
                   "--chunk-rows", "64", *common])
        try:  # the limit bites: reading the file whole is impossible in this process
            open({str(tmp_path / "big.jsonl")!r}).read()
            whole = "read"
        except MemoryError:
            whole = "MemoryError"
        print(json.dumps({{"rc": rc, "whole_file": whole}}))
    """)
    import os

    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"rc": 0, "whole_file": "MemoryError"}, p.stderr[-2000:]
    out = (tmp_path / "big.out.jsonl").read_text().splitlines()
    assert len(out) == rows and json.loads(out[-1])["id"] == rows - 1
