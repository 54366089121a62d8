"""Reading and writing for ``suffice score`` (:mod:`suffice.serving.batch`): chunks in, chunks out,
and the progress record that lets an interrupted run resume.

Readers yield chunks of :class:`InputRow` (a row, its label for messages, or why it could not be
read). Writers make every completed chunk durable before the progress record says it is done:

- JSONL output is appended to ``OUTPUT.partial``, flushed and fsync'ed after each chunk; the
  progress record stores the byte length of the complete chunks, and a resume cuts anything
  after it (a chunk half-written when the process died).
- Parquet output cannot be appended to after a crash (its footer is written last), so each
  chunk is one file ``OUTPUT.partial/part-NNNNNN.parquet`` (written under a temporary name,
  then renamed); at the end the parts are copied, a row group at a time, into ``OUTPUT``.

The progress record ``OUTPUT.progress.json`` (written atomically after each chunk) names the
input (path, size, modification time), the options that shape the output, and the rows, chunks,
levels and errors done so far.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from suffice.serving.jsonl import JSONLError, json_safe, parse_json_line

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
RESULT_COLUMNS = ("score", "level", "latency_ms")
ERROR_COLUMN = "error"
INPUT_ONLY_COLUMNS = ("passages", "context")
PROGRESS_VERSION = 1


class BatchScoreError(ValueError):
    """The input, output or options of ``suffice score`` are unusable; the message names the fix."""


@dataclass
class InputRow:
    """One input row: ``label`` names it in messages (``5 (line 7)``: row 5, on line 7); ``error`` says why it could not be read."""

    row: dict[str, Any]
    label: str
    error: str | None = None


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
# readers: lists of InputRow, a chunk at a time
# ------------------------------------------------------------------------------------------
def iter_jsonl_chunks(path: str | os.PathLike, chunk_rows: int) -> Iterator[list[InputRow]]:
    """Chunks of at most ``chunk_rows`` rows, reading line by line; a line that is not a JSON object is
    an :class:`InputRow` with ``error`` set (the reader goes on: the caller decides whether to stop)."""
    chunk: list[InputRow] = []
    n = 0
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            label = f"{n} (line {line_no})"
            try:
                obj = parse_json_line(line, path, line_no)
                error = None if isinstance(obj, dict) else (
                    f"{os.fspath(path)}, line {line_no}: expected a JSON object with question and passages/context, "
                    f"got a JSON {type(obj).__name__}; each line must hold one JSON object")
            except JSONLError as e:
                obj, error = {}, str(e)
            chunk.append(InputRow(obj if error is None else {}, label, error))
            n += 1
            if len(chunk) >= chunk_rows:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def iter_parquet_chunks(path: str | os.PathLike, chunk_rows: int) -> Iterator[list[InputRow]]:
    """Chunks from a Parquet file, one record batch (at most ``chunk_rows`` rows) at a time."""
    import pyarrow.parquet as pq

    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows):
        rows = batch.to_pylist()
        yield [InputRow(r, str(n + i)) for i, r in enumerate(rows)]
        n += len(rows)


def iter_chunks(path: str | os.PathLike, chunk_rows: int, skip_rows: int = 0) -> Iterator[list[InputRow]]:
    """The input's chunks, after its first ``skip_rows`` rows (those a resumed run has done)."""
    chunks = iter_parquet_chunks(path, chunk_rows) if file_format(path, "--input") == "parquet" else iter_jsonl_chunks(path, chunk_rows)
    for chunk in chunks:
        if skip_rows >= len(chunk):
            skip_rows -= len(chunk)
            continue
        yield chunk[skip_rows:]
        skip_rows = 0


def count_rows(path: str | os.PathLike) -> int | None:
    """Rows in a Parquet file from its footer; None for JSONL (counting would read the file twice)."""
    if file_format(path, "input") != "parquet":
        return None
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


# ------------------------------------------------------------------------------------------
# output columns
# ------------------------------------------------------------------------------------------
def keeps(name: str, keep: set[str] | None) -> bool:
    """Whether input column ``name`` is copied to the output under ``--keep-columns`` ``keep``."""
    if name in RESULT_COLUMNS or name == ERROR_COLUMN:
        return False
    if keep is None:
        return name not in INPUT_ONLY_COLUMNS
    return "*" in keep or name in keep


def kept(row: dict[str, Any], keep: set[str] | None) -> dict[str, Any]:
    """The input columns of ``row`` that go to the output."""
    if keep is None or "*" in keep:
        return {k: v for k, v in row.items() if keeps(k, keep)}
    return {k: row.get(k) for k in sorted(keep) if keeps(k, {"*"})}


def result_types(with_error: bool) -> dict[str, Any]:
    import pyarrow as pa

    types = {"score": pa.float64(), "level": pa.string(), "latency_ms": pa.float64()}
    return {**types, ERROR_COLUMN: pa.string()} if with_error else types


def output_schema(input_path: str | os.PathLike, keep: set[str] | None, with_error: bool):
    """For Parquet input: the kept input fields plus the result fields (one schema for every chunk)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.ParquetFile(input_path).schema_arrow
    missing = sorted((keep or set()) - {"*"} - set(schema.names))
    if missing:
        raise BatchScoreError(f"--keep-columns names {missing}, which {input_path} does not have (its columns: {schema.names})")
    fields = [f for f in schema if keeps(f.name, keep)]
    return pa.schema(fields + [pa.field(k, t) for k, t in result_types(with_error).items()])


# ------------------------------------------------------------------------------------------
# writers: durable chunks, resumable
# ------------------------------------------------------------------------------------------
class JsonlChunkWriter:
    """Appends rows as JSON lines to ``partial`` (NaN becomes null: JSON has no NaN).

    ``resume_bytes``: continue a file whose first ``resume_bytes`` bytes are complete chunks.
    """

    def __init__(self, partial: Path, resume_bytes: int | None = None):
        self.partial = partial
        if resume_bytes is None:
            self._f = open(partial, "wb")
        else:
            self._f = open(partial, "r+b")
            self._f.truncate(resume_bytes)  # a chunk half-written when the run died
            self._f.seek(resume_bytes)

    def write(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Write one chunk and make it durable; returns what the progress record needs to resume after it."""
        self._f.write("".join(json.dumps(json_safe(r), ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
        self._f.flush()
        os.fsync(self._f.fileno())
        return {"output_bytes": self._f.tell()}

    def close(self) -> None:
        self._f.close()

    def finish(self, dst: Path) -> None:
        self.close()
        os.replace(self.partial, dst)

    def discard(self) -> None:
        self.close()
        self.partial.unlink(missing_ok=True)


class ParquetChunkWriter:
    """Writes each chunk as ``partial/part-NNNNNN.parquet``; :meth:`finish` joins them, a row group per chunk.

    With Parquet input the schema is the input's kept fields plus the results, exactly. With
    JSONL input there is no schema to keep: nested values (objects, lists) are written as JSON
    strings, so a field that differs between rows (``gold`` of two sources) loses nothing, and
    the first chunk fixes the column set (the result columns have fixed types).
    """

    def __init__(self, partial: Path, input_schema: Any | None = None, *, with_error: bool = False, resume_parts: int | None = None):
        import pyarrow.parquet as pq

        self.partial = partial
        self._schema = input_schema
        self._nested_as_json = input_schema is None
        self._with_error = with_error
        if resume_parts is None:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            self._parts = 0
        else:
            self._parts = resume_parts
            for f in list(partial.iterdir()):  # a part written after the last progress record, or a half-written one
                if not (f.name.startswith("part-") and f.suffix == ".parquet" and int(f.name[5:11]) < resume_parts):
                    f.unlink()
            if resume_parts and self._schema is None:
                self._schema = pq.read_schema(self._part(0))

    def _part(self, i: int) -> Path:
        return self.partial / f"part-{i:06d}.parquet"

    def write(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._nested_as_json:
            rows = [{k: json.dumps(json_safe(v), ensure_ascii=False) if isinstance(v, (dict, list)) else v for k, v in r.items()}
                    for r in rows]
        try:
            if self._schema is None:
                table = pa.Table.from_pylist(list(rows))
                fixed = result_types(self._with_error)
                self._schema = pa.schema([pa.field(f.name, fixed.get(f.name, f.type)) for f in table.schema])
                table = table.cast(self._schema)
            else:
                table = pa.Table.from_pylist(list(rows), schema=self._schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise BatchScoreError(f"output chunk {self._parts + 1} does not fit the Parquet schema of the first chunk ({e}): a column "
                                  "changes type between rows; drop it with --keep-columns or write *.jsonl") from e
        tmp = self.partial / f".part-{self._parts:06d}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self._part(self._parts))
        self._parts += 1
        return {"parts": self._parts}

    def close(self) -> None:
        pass

    def finish(self, dst: Path) -> None:
        import pyarrow.parquet as pq

        assembling = dst.with_name(dst.name + ".assembling")
        if self._parts == 0:  # no rows at all: still write a valid (empty) file
            import pyarrow as pa

            schema = self._schema or pa.schema([pa.field(k, t) for k, t in result_types(self._with_error).items()])
            pq.write_table(schema.empty_table(), assembling)
        else:
            with pq.ParquetWriter(assembling, self._schema) as out:
                for i in range(self._parts):
                    part = pq.ParquetFile(self._part(i))
                    for g in range(part.num_row_groups):
                        out.write_table(part.read_row_group(g))
        os.replace(assembling, dst)
        shutil.rmtree(self.partial)

    def discard(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)


# ------------------------------------------------------------------------------------------
# the progress record
# ------------------------------------------------------------------------------------------
def input_identity(src: Path) -> dict[str, Any]:
    st = src.stat()
    return {"input": str(src.resolve()), "input_bytes": st.st_size, "input_mtime_ns": st.st_mtime_ns}


def write_progress(path: Path, record: dict[str, Any]) -> None:
    """Replace the progress record atomically (a crash leaves the old one or the new one, never half of one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": PROGRESS_VERSION, **record}, indent=1))
    os.replace(tmp, path)


def read_progress(path: Path, src: Path, options: dict[str, Any]) -> dict[str, Any]:
    """The progress record of an interrupted run of the same input with the same options, or :class:`BatchScoreError`."""
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BatchScoreError(f"--resume: the progress record {path} cannot be read ({e}): run again with --overwrite to start over") from e
    if record.get("version") != PROGRESS_VERSION:
        raise BatchScoreError(f"--resume: {path} is from another version of suffice score: run again with --overwrite to start over")
    now = input_identity(src)
    changed = [k for k in now if record.get(k) != now[k]]
    if changed:
        raise BatchScoreError(f"--resume: the input {src} changed since the interrupted run ({', '.join(changed)} differ), so its "
                              "rows no longer line up with the output: run again with --overwrite to start over")
    differ = {k: (record.get(k), v) for k, v in options.items() if record.get(k) != v}
    if differ:
        said = ", ".join(f"{k}: was {a!r}, now {b!r}" for k, (a, b) in differ.items())
        raise BatchScoreError(f"--resume with other options than the interrupted run ({said}): use the same options, "
                              "or --overwrite to start over")
    return record
