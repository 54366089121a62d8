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

A bad row (not JSON, no question, a malformed passage, a row the scorer refuses) stops the run
with an error naming its row and line (``--on-error fail``, the default), or is written with
empty results and an ``error`` column saying what was wrong and counted in the summary
(``--on-error skip``). Completed chunks are never lost: they stay in ``OUTPUT.partial`` with a
progress record ``OUTPUT.progress.json`` (:mod:`suffice.serving.batch_io`), and the same command
with ``--resume`` continues after the last complete chunk; the result equals one uninterrupted run.

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
from typing import Any

from suffice.serving.backends import BACKENDS, PRECISIONS
from suffice.serving.batch_io import (
    ERROR_COLUMN, BatchScoreError, InputRow, JsonlChunkWriter, ParquetChunkWriter, count_rows, file_format, input_identity,
    iter_chunks, kept, output_schema, read_progress, write_progress,
)
from suffice.serving.pyfunc import rows_from_frame
from suffice.serving.scorer import ScorerConfig, SufficiencyScorer

ON_ERROR = ("fail", "skip")
__all__ = ["BatchScoreError", "ScoreSummary", "file_format", "main", "parse_keep_columns", "score_file"]


@dataclass
class ScoreSummary:
    """What one ``suffice score`` run did (``rows``, ``errors`` and ``levels`` count the whole file, resumed rows included)."""

    input: str
    output: str
    rows: int = 0
    seconds: float = 0.0
    levels: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    resumed_rows: int = 0

    @property
    def rows_per_s(self) -> float:
        return (self.rows - self.resumed_rows) / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3), "rows_per_s": round(self.rows_per_s, 1)}


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


# ------------------------------------------------------------------------------------------
# one chunk
# ------------------------------------------------------------------------------------------
def _row_errors(chunk: list[InputRow], scorer: SufficiencyScorer | None) -> dict[int, str]:
    """Which rows fail on their own, and why (each message names its row): parsed one by one, and with
    ``scorer`` also scored one by one (for a chunk the scorer refused whole although every row parses)."""
    columns = {k for item in chunk for k in item.row}
    fill = {k: None for k in ("passages", "context") if k in columns}  # what the chunk as a whole gives the row
    errors: dict[int, str] = {}
    for i, item in enumerate(chunk):
        if item.error:
            continue
        try:
            q, p = rows_from_frame([{**fill, **item.row}], index=[item.label])
            if scorer is not None:
                scorer.score_batch(q, p)
        except (TypeError, ValueError) as e:
            errors[i] = str(e) if str(e).startswith(f"row {item.label}") else f"row {item.label}: {e}"
    return errors


def score_chunk(chunk: list[InputRow], scorer: SufficiencyScorer, on_error: str, src: Path) -> list[tuple[Any, str | None]]:
    """(result or None, error or None) per row. ``fail``: the first bad row raises :class:`BatchScoreError` naming it.

    The chunk is scored in one call; only when that fails are its rows checked one by one, so
    a clean chunk costs nothing extra and the good rows of a bad chunk are still scored together.
    """
    hint = " (--on-error skip writes such rows with an error column and goes on)"
    errors = {i: item.error for i, item in enumerate(chunk) if item.error}
    if errors and on_error == "fail":
        raise BatchScoreError(f"{errors[min(errors)]}{hint}")
    good = [i for i in range(len(chunk)) if i not in errors]
    try:
        q, p = rows_from_frame([chunk[i].row for i in good], index=[chunk[i].label for i in good]) if good else ([], [])
        results = scorer.score_batch(q, p) if good else []
    except (TypeError, ValueError) as e:
        found = _row_errors(chunk, None) or _row_errors(chunk, scorer)
        if not found:
            raise BatchScoreError(f"{src}: rows {chunk[0].label} to {chunk[-1].label} fail together but not one by one: {e}") from e
        if on_error == "fail":
            raise BatchScoreError(f"{src}: {found[min(found)]}{hint}") from e
        marked = [InputRow(item.row, item.label, found.get(i, item.error)) for i, item in enumerate(chunk)]
        return score_chunk(marked, scorer, on_error, src)
    by_row = dict(zip(good, results))
    return [(by_row.get(i), errors.get(i)) for i in range(len(chunk))]


def output_rows(chunk: list[InputRow], scored: list[tuple[Any, str | None]], keep: set[str] | None, with_error: bool) -> list[dict[str, Any]]:
    out = []
    for item, (r, err) in zip(chunk, scored):
        row = {**kept(item.row, keep), "score": r.score if r else None, "level": r.level if r else None,
               "latency_ms": r.latency_ms if r else None}
        out.append({**row, ERROR_COLUMN: err} if with_error else row)
    return out


# ------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------
def _check_paths(src: Path, dst: Path, chunk_rows: int, overwrite: bool, on_error: str) -> None:
    if not src.is_file():
        raise BatchScoreError(f"--input {src} does not exist: give a *.jsonl or *.parquet file of rows with question and passages/context")
    if dst.exists() and not overwrite:
        raise BatchScoreError(f"--output {dst} already exists: choose another file or pass --overwrite")
    if src.resolve() == dst.resolve():
        raise BatchScoreError(f"--output {dst} is the input file: write the scores to another file")
    if not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise BatchScoreError(f"--chunk-rows {chunk_rows!r} must be a positive integer")
    if on_error not in ON_ERROR:
        raise BatchScoreError(f"--on-error {on_error!r}: choose one of {list(ON_ERROR)}")


def _open_writer(src: Path, dst: Path, keep: set[str] | None, with_error: bool, state: dict[str, Any] | None):
    partial = dst.with_name(dst.name + ".partial")
    if file_format(dst, "--output") == "parquet":
        schema = output_schema(src, keep, with_error) if file_format(src, "--input") == "parquet" else None
        return ParquetChunkWriter(partial, schema, with_error=with_error, resume_parts=state["parts"] if state else None)
    return JsonlChunkWriter(partial, resume_bytes=state["output_bytes"] if state else None)


def score_file(input_path: str | os.PathLike, output_path: str | os.PathLike, scorer: SufficiencyScorer, *,
               chunk_rows: int = 1024, keep_columns: set[str] | None = None, progress: bool = True,
               overwrite: bool = False, on_error: str = "fail", resume: bool = False) -> ScoreSummary:
    """Score every row of ``input_path`` into ``output_path`` chunk by chunk; returns the summary.

    ``on_error``: ``fail`` (the first bad row stops the run, naming it) or ``skip`` (bad rows get
    an ``error`` column). ``resume``: continue an interrupted run after its last complete chunk.

    >>> score_file("items.parquet", "scored.parquet", SufficiencyScorer.load("bundles/v3"), chunk_rows=2048)  # doctest: +SKIP
    ScoreSummary(input='items.parquet', output='scored.parquet', rows=8133, ...)
    """
    src, dst = Path(input_path), Path(output_path)
    for path, role in ((src, "--input"), (dst, "--output")):
        file_format(path, role)
    _check_paths(src, dst, chunk_rows, overwrite, on_error)
    dst.parent.mkdir(parents=True, exist_ok=True)
    partial, progress_file = dst.with_name(dst.name + ".partial"), dst.with_name(dst.name + ".progress.json")
    options = {"output_format": file_format(dst, "--output"), "on_error": on_error,
               "keep_columns": None if keep_columns is None else sorted(keep_columns)}
    state = None
    if resume and progress_file.is_file() and partial.exists():
        state = read_progress(progress_file, src, options)
    elif progress_file.is_file() and partial.exists() and not overwrite:
        raise BatchScoreError(f"{partial} holds an interrupted run of this output ({progress_file}): pass --resume to continue "
                              "after its last complete chunk, or --overwrite to start over")
    if state is None:
        if resume:
            print(f"suffice score: --resume: no interrupted run of {dst} to continue; scoring from the first row", file=sys.stderr)
        progress_file.unlink(missing_ok=True)
    writer = _open_writer(src, dst, keep_columns, on_error == "skip", state)

    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: nothing to adjust on a steady stream
    done = {"rows": 0, "chunks": 0, "errors": 0, "levels": {}, **(state or {})}
    summary = ScoreSummary(input=str(src), output=str(dst), rows=done["rows"], errors=done["errors"], resumed_rows=done["rows"])
    levels: Counter[str] = Counter(done["levels"])
    bar = tqdm(total=count_rows(src), initial=summary.rows, unit="row", desc="scoring", disable=not progress, file=sys.stderr,
               mininterval=0.5, smoothing=0.1, dynamic_ncols=True)
    t0 = time.perf_counter()
    committed = summary.rows  # rows the progress record says are in the partial output
    try:
        for chunk in iter_chunks(src, chunk_rows, skip_rows=summary.rows):
            scored = score_chunk(chunk, scorer, on_error, src)
            written = writer.write(output_rows(chunk, scored, keep_columns, on_error == "skip"))
            levels.update(r.level for r, _ in scored if r is not None)
            summary.rows += len(chunk)
            summary.errors += sum(err is not None for _, err in scored)
            done["chunks"] += 1
            write_progress(progress_file, {**input_identity(src), **options, **written, "rows": summary.rows, "chunks": done["chunks"],
                                           "errors": summary.errors, "levels": dict(levels)})
            committed = summary.rows
            bar.update(len(chunk))
    except BaseException as e:
        bar.close()
        writer.close()
        if committed == 0:  # nothing to keep
            writer.discard()
            progress_file.unlink(missing_ok=True)
        else:
            kept_note = (f"{committed} rows already scored are kept in {partial} ({progress_file}); with the input unchanged, "
                         "the same command with --resume continues after them")
            if isinstance(e, BatchScoreError):
                raise BatchScoreError(f"{e}\n{kept_note}") from e
            print(f"suffice score: stopped: {kept_note}", file=sys.stderr)
        raise
    bar.close()
    writer.finish(dst)
    progress_file.unlink(missing_ok=True)
    summary.seconds = time.perf_counter() - t0
    summary.levels = dict(sorted(levels.items()))
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
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --output (and discard an interrupted run's partial output)")
    ap.add_argument("--on-error", choices=ON_ERROR, default="fail",
                    help="a bad row: fail (stop, naming its row and line) or skip (write it with an error column, count it, go on)")
    ap.add_argument("--resume", action="store_true", help="continue an interrupted run of the same command after its last complete chunk")
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
                             progress=not args.no_progress, overwrite=args.overwrite, on_error=args.on_error, resume=args.resume)
    except (BatchScoreError, BundleError, BackendUnavailableError) as e:
        print(f"suffice score: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # ScorerConfig: batch size, threads
        print(f"suffice score: {e}", file=sys.stderr)
        return 2
    print(f"suffice score: {summary.rows} rows in {summary.seconds:.1f} s ({summary.rows_per_s:.1f} rows/s)"
          + (f", {summary.errors} with errors (see the {ERROR_COLUMN} column)" if summary.errors else "")
          + (f", {summary.resumed_rows} of them from the interrupted run" if summary.resumed_rows else ""), file=sys.stderr)
    print(json.dumps({**summary.to_dict(), "model": args.model, "bundle": str(bundle), "precision": scorer.precision,
                      "variant": scorer.variant}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
