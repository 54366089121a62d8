"""``suffice score``: offline batch scoring of a JSONL or Parquet file on one machine, streaming.

    suffice score --input items.jsonl --output scored.parquet --model models:/suffice-sufficiency@production
    suffice score --input big.parquet --output scored.jsonl --model bundles/v3 --chunk-rows 2048 --threads 2

Rows are read ``--chunk-rows`` at a time (JSONL line by line, Parquet by record batches with
pyarrow), scored with :class:`~suffice.serving.SufficiencyScorer` and written before the next
chunk is read, so memory stays flat however large the file is. Each input row needs a
``question`` and either ``passages`` (a list of strings or ``{title, text}`` objects) or
``context`` (one string), the pyfunc model's input schema. Each output row carries the input's
columns (all but ``passages``/``context`` unless ``--keep-columns`` says otherwise) plus
``score``, ``level`` and ``latency_ms``. The output is written to ``OUTPUT.partial`` and renamed
when the last row is in, so a file at ``--output`` is always complete.

A progress bar (rows, rows/s) goes to stderr; the summary (rows, seconds, rows/s, levels) is
printed as JSON on stdout.

>>> summary = score_file("items.jsonl", "scored.jsonl", SufficiencyScorer.load("bundles/v3"))  # doctest: +SKIP
>>> summary.rows, round(summary.rows_per_s)  # doctest: +SKIP
(8133, 412)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from suffice.serving.backends import BACKENDS, PRECISIONS
from suffice.serving.jsonl import JSONLError, iter_jsonl, json_safe
from suffice.serving.pyfunc import rows_from_frame
from suffice.serving.scorer import ScorerConfig, SufficiencyScorer

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
RESULT_COLUMNS = ("score", "level", "latency_ms")
INPUT_ONLY_COLUMNS = ("passages", "context")


class BatchScoreError(ValueError):
    """The input, output or options of ``suffice score`` are unusable; the message names the fix."""


@dataclass
class ScoreSummary:
    """What one ``suffice score`` run did."""

    input: str
    output: str
    rows: int = 0
    seconds: float = 0.0
    levels: dict[str, int] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3), "rows_per_s": round(self.rows_per_s, 1)}


def file_format(path: str | os.PathLike, role: str) -> str:
    """``jsonl`` or ``parquet`` from the file name.

    >>> file_format("x.parquet", "input"), file_format("y.jsonl", "output")
    ('parquet', 'jsonl')
    """
    suffix = Path(path).suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise BatchScoreError(f"{role} {path}: unknown format {suffix or '(no suffix)'!r}: name the file *.jsonl or *.parquet")


# ------------------------------------------------------------------------------------------
# readers: lists of row dicts, a chunk at a time
# ------------------------------------------------------------------------------------------
def iter_jsonl_chunks(path: str | os.PathLike, chunk_rows: int) -> Iterator[tuple[list[dict[str, Any]], list[str]]]:
    """Yield (rows, row labels for error messages) of at most ``chunk_rows`` rows, reading line by line."""
    rows: list[dict[str, Any]] = []
    labels: list[str] = []
    n = 0
    try:
        for line_no, row in iter_jsonl(path, "a JSON object with question and passages/context"):
            rows.append(row)
            labels.append(f"{n} (line {line_no})")
            n += 1
            if len(rows) >= chunk_rows:
                yield rows, labels
                rows, labels = [], []
    except JSONLError as e:
        raise BatchScoreError(str(e)) from e
    if rows:
        yield rows, labels


def iter_parquet_chunks(path: str | os.PathLike, chunk_rows: int) -> Iterator[tuple[list[dict[str, Any]], list[str]]]:
    """Yield (rows, row labels) from a Parquet file, one record batch (at most ``chunk_rows`` rows) at a time."""
    import pyarrow.parquet as pq

    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows):
        rows = batch.to_pylist()
        yield rows, [str(n + i) for i in range(len(rows))]
        n += len(rows)


def count_rows(path: str | os.PathLike) -> int | None:
    """Rows in a Parquet file from its footer; None for JSONL (counting would read the file twice)."""
    if file_format(path, "input") != "parquet":
        return None
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


# ------------------------------------------------------------------------------------------
# writers
# ------------------------------------------------------------------------------------------
class JsonlRowWriter:
    """Appends rows as JSON lines (NaN becomes null: JSON has no NaN)."""

    def __init__(self, path: Path):
        self._f = open(path, "w", encoding="utf-8")

    def write(self, rows: Sequence[dict[str, Any]]) -> None:
        self._f.writelines(json.dumps(json_safe(r), ensure_ascii=False) + "\n" for r in rows)

    def close(self) -> None:
        self._f.close()


class ParquetRowWriter:
    """Appends each chunk as a row group.

    With Parquet input the schema is the input's kept fields plus the results, exactly. With
    JSONL input there is no schema to keep: nested values (objects, lists) are written as JSON
    strings, so a field that differs between rows (``gold`` of two sources) loses nothing, and
    the first chunk fixes the column set.
    """

    def __init__(self, path: Path, input_schema: Any | None = None):
        self._path = path
        self._schema = input_schema
        self._nested_as_json = input_schema is None
        self._writer = None
        self._chunk = 0

    def write(self, rows: Sequence[dict[str, Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._chunk += 1
        if self._nested_as_json:
            rows = [{k: json.dumps(json_safe(v), ensure_ascii=False) if isinstance(v, (dict, list)) else v for k, v in r.items()}
                    for r in rows]
        try:
            table = pa.Table.from_pylist(list(rows), schema=self._schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise BatchScoreError(f"output chunk {self._chunk} does not fit the Parquet schema of the first chunk ({e}): a column "
                                  "changes type between rows; drop it with --keep-columns or write *.jsonl") from e
        if self._writer is None:
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self._path, self._schema)
        self._writer.write_table(table)

    def close(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._writer is None:  # no rows at all: still write a valid (empty) file
            schema = self._schema or pa.schema([("score", pa.float64()), ("level", pa.string()), ("latency_ms", pa.float64())])
            pq.write_table(schema.empty_table(), self._path)
        else:
            self._writer.close()


def _keeps(name: str, keep: set[str] | None) -> bool:
    if name in RESULT_COLUMNS:
        return False
    if keep is None:
        return name not in INPUT_ONLY_COLUMNS
    return "*" in keep or name in keep


def _output_schema(input_path: str | os.PathLike, keep: set[str] | None):
    """For Parquet input: the kept input fields plus the result fields (one schema for every chunk)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.ParquetFile(input_path).schema_arrow
    missing = sorted((keep or set()) - {"*"} - set(schema.names))
    if missing:
        raise BatchScoreError(f"--keep-columns names {missing}, which {input_path} does not have (its columns: {schema.names})")
    fields = [f for f in schema if _keeps(f.name, keep)]
    return pa.schema(fields + [pa.field("score", pa.float64()), pa.field("level", pa.string()), pa.field("latency_ms", pa.float64())])


def parse_keep_columns(value: str) -> set[str] | None:
    """``--keep-columns``: ``default`` (None: all but passages/context), ``all``, ``none`` or a comma list.

    >>> sorted(parse_keep_columns("id,source")), parse_keep_columns("default")
    (['id', 'source'], None)
    """
    v = value.strip()
    if v == "default":
        return None
    if v == "none":
        return set()
    if v == "all":
        return {"*"}
    cols = {c.strip() for c in v.split(",") if c.strip()}
    if not cols:
        raise BatchScoreError(f"--keep-columns {value!r}: give default, all, none or a comma-separated list of column names")
    return cols


def _kept(row: dict[str, Any], keep: set[str] | None) -> dict[str, Any]:
    if keep is None or "*" in keep:
        return {k: v for k, v in row.items() if _keeps(k, keep)}
    return {k: row.get(k) for k in sorted(keep) if k not in RESULT_COLUMNS}


# ------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------
def score_file(input_path: str | os.PathLike, output_path: str | os.PathLike, scorer: SufficiencyScorer, *,
               chunk_rows: int = 1024, keep_columns: set[str] | None = None, progress: bool = True,
               overwrite: bool = False) -> ScoreSummary:
    """Score every row of ``input_path`` into ``output_path`` chunk by chunk; returns the summary.

    >>> score_file("items.parquet", "scored.parquet", SufficiencyScorer.load("bundles/v3"), chunk_rows=2048)  # doctest: +SKIP
    ScoreSummary(input='items.parquet', output='scored.parquet', rows=8133, ...)
    """
    src, dst = Path(input_path), Path(output_path)
    in_fmt, out_fmt = file_format(src, "--input"), file_format(dst, "--output")
    if not src.is_file():
        raise BatchScoreError(f"--input {src} does not exist: give a *.jsonl or *.parquet file of rows with question and passages/context")
    if dst.exists() and not overwrite:
        raise BatchScoreError(f"--output {dst} already exists: choose another file or pass --overwrite")
    if src.resolve() == dst.resolve():
        raise BatchScoreError(f"--output {dst} is the input file: write the scores to another file")
    if not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise BatchScoreError(f"--chunk-rows {chunk_rows!r} must be a positive integer")
    dst.parent.mkdir(parents=True, exist_ok=True)
    partial = dst.with_name(dst.name + ".partial")
    chunks = iter_parquet_chunks(src, chunk_rows) if in_fmt == "parquet" else iter_jsonl_chunks(src, chunk_rows)
    if out_fmt == "parquet":
        schema = _output_schema(src, keep_columns) if in_fmt == "parquet" else None
        writer: JsonlRowWriter | ParquetRowWriter = ParquetRowWriter(partial, schema)
    else:
        writer = JsonlRowWriter(partial)

    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: nothing to adjust on a steady stream
    summary = ScoreSummary(input=str(src), output=str(dst))
    levels: Counter[str] = Counter()
    bar = tqdm(total=count_rows(src), unit="row", desc="scoring", disable=not progress, file=sys.stderr,
               mininterval=0.5, smoothing=0.1, dynamic_ncols=True)
    t0 = time.perf_counter()
    try:
        for rows, labels in chunks:
            try:
                questions, passages = rows_from_frame(rows, index=labels)
                results = scorer.score_batch(questions, passages)
            except (TypeError, ValueError) as e:
                raise BatchScoreError(f"{src}: {e}") from e
            writer.write([{**_kept(row, keep_columns), "score": r.score, "level": r.level, "latency_ms": r.latency_ms}
                          for row, r in zip(rows, results)])
            levels.update(r.level for r in results)
            summary.rows += len(rows)
            bar.update(len(rows))
        writer.close()
    except BaseException:
        bar.close()
        try:
            writer.close()
        finally:
            partial.unlink(missing_ok=True)
        raise
    bar.close()
    summary.seconds = time.perf_counter() - t0
    summary.levels = dict(sorted(levels.items()))
    os.replace(partial, dst)
    return summary


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="suffice score", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--input", required=True, help="*.jsonl or *.parquet: rows with question and passages (or context)")
    ap.add_argument("--output", required=True, help="*.jsonl or *.parquet to write (kept input columns + score, level, latency_ms)")
    ap.add_argument("--model", required=True, help="bundle folder, MLflow model folder, models:/NAME/VERSION or models:/NAME@ALIAS")
    ap.add_argument("--chunk-rows", type=int, default=1024, help="rows read, scored and written at a time (memory ~ this)")
    ap.add_argument("--batch-size", type=int, default=32, help="pairs per ONNX call")
    ap.add_argument("--backend", choices=BACKENDS, default="auto",
                    help="auto: the fastest variant the bundle holds that this CPU supports (openvino: pip install 'suffice[openvino]')")
    ap.add_argument("--precision", choices=PRECISIONS, default="auto")
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0 = one per physical core)")
    ap.add_argument("--keep-columns", default="default",
                    help="input columns to copy to the output: default (all but passages/context), all, none, or a,b,c")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from suffice.serving.backends import BackendUnavailableError
    from suffice.serving.bundle import BundleError
    from suffice.serving.model_uri import resolve_bundle_uri

    try:
        keep = parse_keep_columns(args.keep_columns)
        file_format(args.input, "--input")
        file_format(args.output, "--output")
        bundle = resolve_bundle_uri(args.model)
        scorer = SufficiencyScorer.load(bundle, ScorerConfig(precision=args.precision, intra_op_threads=args.threads,
                                                             batch_size=args.batch_size, backend=args.backend))
        print(f"suffice score: {args.input} -> {args.output} with {bundle} ({scorer.variant}, window "
              f"{scorer.manifest.max_length} tokens, {args.chunk_rows} rows per chunk, batch {args.batch_size})", file=sys.stderr)
        summary = score_file(args.input, args.output, scorer, chunk_rows=args.chunk_rows, keep_columns=keep,
                             progress=not args.no_progress, overwrite=args.overwrite)
    except (BatchScoreError, BundleError, BackendUnavailableError) as e:
        print(f"suffice score: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # ScorerConfig: batch size, threads
        print(f"suffice score: {e}", file=sys.stderr)
        return 2
    print(f"suffice score: {summary.rows} rows in {summary.seconds:.1f} s ({summary.rows_per_s:.1f} rows/s)", file=sys.stderr)
    print(json.dumps({**summary.to_dict(), "model": args.model, "bundle": str(bundle), "precision": scorer.precision,
                      "variant": scorer.variant}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
