"""JSON Lines in and strict JSON out: the one reader every stage uses, and the one JSON-safe mapper.

Every JSONL file suffice reads (items, labels, synthetic questions, gate threads, batch-scoring
input) goes through :func:`iter_jsonl`, so a bad line is always reported the same way: the file,
the line number, what was wrong and the fix. Blank lines are skipped.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "x.jsonl"
>>> _ = p.write_text('{"id": 1}\\n\\n{"id": 2}\\n')
>>> [(n, row["id"]) for n, row in iter_jsonl(p)]
[(1, 1), (3, 2)]
>>> json_safe({"auroc": float("nan"), "n": [1.5, float("inf")]})
{'auroc': None, 'n': [1.5, None]}
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterator, Mapping


class JSONLError(ValueError):
    """A JSON Lines file has a line that is not a JSON object; the message names the file and line.

    ``line_no`` is the 1-based line; ``reason`` what was wrong with it, without the file and line.
    """

    def __init__(self, message: str, line_no: int | None = None, reason: str = ""):
        super().__init__(message)
        self.line_no = line_no
        self.reason = reason


def iter_json_lines(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, value)`` for every non-blank line, whatever JSON value it holds.

    For formats whose lines may be other than objects (a retrieval corpus accepts bare strings);
    :func:`iter_jsonl` is this plus the check that every line is an object.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.jsonl"; _ = p.write_text('"text"\\n{"a": 1}\\n')
    >>> list(iter_json_lines(p))
    [(1, 'text'), (2, {'a': 1})]
    """
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                yield line_no, parse_json_line(line, path, line_no)


def parse_json_line(line: bytes | str, path: str | os.PathLike, line_no: int) -> Any:
    """One JSONL line's value; :class:`JSONLError` naming the file and line when it is not valid JSON.

    For readers that go on after a bad line (``suffice score --on-error skip``).

    >>> parse_json_line(b'{"a": 1}', "x.jsonl", 3)
    {'a': 1}
    """
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise JSONLError(f"{os.fspath(path)}, line {line_no}: not valid JSON ({e}); fix or remove the line",
                         line_no, f"{e.msg} at column {e.colno}") from e
    except UnicodeDecodeError as e:
        raise JSONLError(f"{os.fspath(path)}, line {line_no}: not valid JSON ({e}); fix or remove the line",
                         line_no, f"not UTF-8: {e.reason} at byte {e.start}") from e


def iter_jsonl(path: str | os.PathLike, what: str = "a JSON object") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for every non-blank line of a JSONL file, reading line by line.

    ``what`` describes the expected object in the error message (``"an item with id, question and
    passages"``). A line that is not valid JSON, or not an object, raises :class:`JSONLError`
    naming the file and the 1-based line number.

    >>> next(iter_jsonl(__import__("io").StringIO('{"a": 1}')))  # doctest: +SKIP
    """
    for line_no, obj in iter_json_lines(path):
        if not isinstance(obj, dict):
            raise JSONLError(f"{os.fspath(path)}, line {line_no}: expected {what}, got a JSON {type(obj).__name__}; "
                             "each line must hold one JSON object", line_no, f"not {what}")
        yield line_no, obj


def read_jsonl(path: str | os.PathLike, what: str = "a JSON object") -> list[dict[str, Any]]:
    """All objects of a JSONL file (see :func:`iter_jsonl`).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.jsonl"; _ = p.write_text('{"a": 1}\\n')
    >>> read_jsonl(p)
    [{'a': 1}]
    """
    return [obj for _, obj in iter_jsonl(path, what)]


def json_safe(x: Any) -> Any:
    """Strict-JSON form of nested values: NaN/inf -> None, numpy scalars/arrays -> Python numbers/lists,
    dates -> ISO strings, string enums -> their value, mapping keys -> str, anything else unknown -> str.

    >>> import numpy as np
    >>> json_safe({"n": np.int64(3), "v": np.array([0.5, np.nan])})
    {'n': 3, 'v': [0.5, None]}
    """
    if isinstance(x, bool) or x is None or isinstance(x, (str, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalars and arrays
        return json_safe(x.tolist())
    if hasattr(x, "isoformat"):  # dates and timestamps (Parquet)
        return x.isoformat()
    if isinstance(getattr(x, "value", None), str):  # str enums
        return x.value
    return str(x)
