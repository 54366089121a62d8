"""Located record reading shared by the data readers: every bad record becomes a :class:`DataFormatError`
naming the file, the line (JSON Lines and top-level JSON arrays) or field path, and the field.

The line reader here yields a bad line as an error value instead of raising, so ``load_items(...,
on_error="skip")`` can count it and read on (``suffice.serving.jsonl.iter_jsonl`` stops at the first bad
line, which is what the simple readers want).

>>> rec = Record({"id": " a "}, Path("x.jsonl"), 3)
>>> rec.text("id")
'a'
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from suffice.training.data.schema import DataFormatError, Item

JSONL_SUFFIXES = (".jsonl", ".jsonlines", ".ndjson")


# ---------------------------------------------------------------- reports and errors


@dataclass
class LoadReport:
    """What one load did: records read, items kept, records dropped by reason, empty contexts."""

    path: str
    format: str
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    empty_passages: int = 0
    first_errors: list[str] = field(default_factory=list)  # a few messages, to show what was dropped

    def drop(self, reason: str, error: Exception | None = None) -> None:
        self.dropped[reason] += 1
        if error is not None and len(self.first_errors) < 5:
            self.first_errors.append(str(error))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "read": self.read, "kept": self.kept,
                "dropped": dict(sorted(self.dropped.items())), "empty_passages": self.empty_passages,
                "first_errors": list(self.first_errors)}


class LoadedItems(list):
    """A ``list[Item]`` that also carries the :class:`LoadReport` of the load that made it."""

    def __init__(self, items: Sequence[Item] = (), report: LoadReport | None = None):
        super().__init__(items)
        self.report = report


def located_error(reason: str, message: str, path: Any, line: int | None, field_: str | None) -> DataFormatError:
    """A :class:`DataFormatError` at ``path``/``line``/``field_`` whose ``reason`` is the drop-counter key."""
    err = DataFormatError(message, path=str(path), line=line, field=field_)
    err.reason = f"{reason}: {field_}" if field_ else reason  # the drop-counter key under on_error="skip"
    return err


class Record:
    """One raw record plus where it came from, with typed getters that raise located errors."""

    def __init__(self, obj: Any, path: Path, line: int | None, where: str = ""):
        self.obj, self.path, self.line, self.where = obj, path, line, where
        if not isinstance(obj, dict):
            raise located_error("wrong type", f"expected a JSON object, got {type(obj).__name__}: {short_repr(obj)}",
                         path, line, where or None)

    def fail(self, reason: str, key: str, message: str) -> DataFormatError:
        return located_error(reason, message, self.path, self.line, f"{self.where}.{key}" if self.where else key)

    def get(self, key: str, types: type | tuple[type, ...], *, required: bool = True, default: Any = None) -> Any:
        if key not in self.obj or self.obj[key] is None:
            if required:
                raise self.fail("missing field", key, f"required field '{key}' is missing (record keys: {sorted(self.obj)})")
            return default
        value = self.obj[key]
        if not isinstance(value, types) or isinstance(value, bool) and bool not in _as_tuple(types):
            names = "/".join(t.__name__ for t in _as_tuple(types))
            raise self.fail("wrong type", key, f"'{key}' must be {names}, got {type(value).__name__}: {short_repr(value)}")
        return value

    def text(self, key: str, *, required: bool = True, default: str = "") -> str:
        value = self.get(key, (str, int), required=required, default=default)
        value = str(value).strip()
        if required and not value:
            raise self.fail("missing field", key, f"'{key}' is empty: every record needs a non-empty {key}")
        return value


def _as_tuple(t: Any) -> tuple:
    return t if isinstance(t, tuple) else (t,)


def short_repr(value: Any, n: int = 80) -> str:
    """A JSON preview of ``value`` cut to ``n`` characters (for error messages)."""
    s = json.dumps(value, ensure_ascii=False, default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


# ---------------------------------------------------------------- reading files


def iter_record_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, record) of a JSON Lines file; a malformed line is yielded as its :class:`DataFormatError`."""
    with path.open(encoding="utf-8") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield n, json.loads(raw)
            except json.JSONDecodeError as e:
                err = located_error("malformed JSON", f"malformed JSON ({e.msg} at column {e.colno}): {raw.strip()[:80]!r}", path, n, None)
                yield n, err


def _iter_json_array(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array with the line each starts on (json.load would lose it)."""
    dec, pos, line = json.JSONDecoder(), 0, 1

    def skip_ws(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def line_at(i: int) -> int:
        nonlocal pos, line
        line += text.count("\n", pos, i)
        pos = i
        return line

    i = skip_ws(0)
    if i >= len(text) or text[i] != "[":
        raise located_error("malformed JSON", "expected a JSON array of records", path, line_at(i), None)
    i = skip_ws(i + 1)
    if i < len(text) and text[i] == "]":
        return
    while True:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise located_error("malformed JSON", f"malformed JSON ({e.msg} at column {e.colno})", path, e.lineno, None) from None
        yield line_at(i), obj
        i = skip_ws(end)
        if i < len(text) and text[i] == ",":
            i = skip_ws(i + 1)
        elif i < len(text) and text[i] == "]":
            return
        else:
            raise located_error("malformed JSON", "expected ',' or ']' after an array element", path, line_at(min(i, len(text))), None)


def iter_strict_records(path: Path) -> Iterator[Record]:
    """Every line of a JSON Lines file as a :class:`Record`; the first malformed line raises its located error."""
    for line, obj in iter_record_lines(path):
        if isinstance(obj, DataFormatError):
            raise obj
        yield Record(obj, path, line)


def iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, record-or-error) for JSONL files and top-level JSON arrays."""
    if path.suffix.lower() in JSONL_SUFFIXES:
        yield from iter_record_lines(path)
    else:
        yield from _iter_json_array(path, path.read_text(encoding="utf-8"))


def load_json_document(path: Path) -> Any:
    """A whole JSON file; malformed JSON raises a located :class:`DataFormatError`."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise located_error("malformed JSON", f"malformed JSON ({e.msg} at column {e.colno})", path, e.lineno, None) from None


def write_jsonl_atomic(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> str:
    """Write ``rows`` as JSON Lines (UTF-8, non-ASCII kept) through a temporary file and a rename, so a
    killed run never leaves half a file; returns the sha256 of the written lines (without newlines).

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "x.jsonl"
    >>> len(write_jsonl_atomic([{"id": 1}], p)), p.read_text()
    (64, '{"id": 1}\n')
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    h = hashlib.sha256()
    with tmp.open("w", encoding="utf-8") as f:
        for r in rows:
            line = json.dumps(r, ensure_ascii=False)
            h.update(line.encode())
            f.write(line + "\n")
    os.replace(tmp, path)
    return h.hexdigest()
