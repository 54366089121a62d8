"""Read the verdict out of an LLM's reply, robustly, and refuse to guess when there is none.

Models wrap the JSON in code fences, add text after it, use single quotes, write ``true`` for 1,
or echo the prompt's example verdict before their own. The rule: collect every JSON-like object in
the reply (fenced or bare, leniently decoded), keep those that carry a verdict, and take the LAST
one (the model's own conclusion comes after any echoed example). Failing any object, a bare
``Sufficient Context: 1`` line counts. Anything else raises :class:`VerdictParseError`: the caller
re-asks once and then stores the reply as ``unparsed``; it never becomes a label by default.

>>> parse_verdict('Explanation: all stated.\\n```json\\n{"Sufficient Context": 1}\\n```').label
1
>>> parse_verdict('{"Sufficient Context": 0, "Level": "partial"}', scheme="three_level").level
'partial'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from suffice.serving.bundle import LEVELS

_LABEL_KEYS = {"sufficientcontext", "sufficient", "sufficiency", "label", "verdict", "issufficient", "contextsufficient"}
_LEVEL_KEYS = {"level", "sufficiencylevel", "contextlevel", "grade"}
_FENCE = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)```", re.DOTALL)
_BARE = re.compile(r"[\"']?sufficient[\s_]*context[\"']?\s*[:=]\s*[\"']?(1|0|true|false|yes|no)\b", re.IGNORECASE)
_EXPLANATION = re.compile(r"explanation\s*[:\-]\s*(.*)", re.IGNORECASE | re.DOTALL)
MAX_RATIONALE_CHARS = 600


class VerdictParseError(ValueError):
    """The reply holds no usable verdict; ``reason`` says why (no verdict, conflicting, bad level...)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Verdict:
    """A parsed verdict: label 1/0, level (three-level scheme, or None), the rater's reason."""

    label: int
    level: str | None
    rationale: str


def _norm_key(k: Any) -> str:
    return re.sub(r"[^a-z]", "", str(k).lower())


def as_label(v: Any) -> int | None:
    """A 0/1 label from a verdict value (1/0, true/false, yes/no, sufficient...); None when it is not one."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)) and v in (0, 1):
        return int(v)
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("1", "true", "yes", "sufficient"):
            return 1
        if s in ("0", "false", "no", "insufficient", "not sufficient"):
            return 0
    return None


def as_level(v: Any) -> str | None:
    """A level name from a verdict value (``partial`` and its spellings); None when it is not one."""
    if not isinstance(v, str):
        return None
    s = v.strip().lower().replace("_", " ")
    if s in LEVELS:
        return s
    if s in ("partially sufficient", "partly sufficient", "partial context"):
        return "partial"
    if s in ("not sufficient", "none"):
        return "insufficient"
    return None


def balanced_objects(text: str) -> list[tuple[int, int]]:
    """Spans of top-level ``{...}`` blocks, brace-matched outside string literals."""
    spans, depth, start, in_str, quote, esc = [], 0, -1, False, "", False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == quote:
                in_str = False
            continue
        if ch in "\"" and depth > 0:
            in_str, quote = True, ch
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append((start, i + 1))
    return spans


def lenient_json(block: str) -> Any:
    """A JSON object from an LLM's block, forgiving single quotes and trailing commas."""
    try:
        return json.loads(block)
    except json.JSONDecodeError:
        pass
    fixed = re.sub(r",\s*([}\]])", r"\1", block)  # trailing commas
    fixed = re.sub(r"'", '"', fixed)  # single-quoted keys and strings
    fixed = re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", fixed))
    fixed = re.sub(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_ ]*?)(\s*:)", r'\1"\2"\3', fixed)  # unquoted keys
    try:
        return json.loads(fixed)
    except json.JSONDecodeError:
        return None


def _verdict_from_obj(obj: Any) -> tuple[int | None, str | None, bool, bool]:
    """(label, level, has_verdict_keys, has_unusable_level) from one decoded object."""
    if not isinstance(obj, dict):
        return None, None, False, False
    label = level = None
    seen = bad_level = False
    for k, v in obj.items():
        nk = _norm_key(k)
        if nk in _LABEL_KEYS:
            seen = True
            label = as_label(v) if label is None else label
            if label is None and as_level(v) is not None:  # {"Sufficiency": "partial"}
                level = as_level(v)
        elif nk in _LEVEL_KEYS:
            seen = True
            level = as_level(v) if level is None else level
            bad_level = bad_level or as_level(v) is None
    return label, level, seen, bad_level


def _rationale(text: str, verdict_start: int) -> str:
    before = text[:verdict_start]
    m = None
    for m in _EXPLANATION.finditer(before):
        pass
    chosen = m.group(1) if m else before
    chosen = _FENCE.sub("", chosen)
    chosen = re.sub(r"```[a-zA-Z]*\s*$", "", chosen.rstrip()).strip()  # the fence opening the verdict block
    if len(chosen) > MAX_RATIONALE_CHARS:
        chosen = "..." + chosen[-(MAX_RATIONALE_CHARS - 3):]
    return chosen


def parse_verdict(text: str | None, scheme: str = "binary") -> Verdict:
    """The verdict in an autorater reply, or :class:`VerdictParseError`.

    Binary: needs ``Sufficient Context`` 1/0 (a lone ``Level`` is accepted too: sufficient -> 1).
    Three-level: needs a level (a lone 1 maps to ``sufficient``; a lone 0 is ambiguous and refused);
    a label that contradicts the level is refused rather than resolved by guessing.

    >>> parse_verdict("The context names him.\\n{'Sufficient Context': 'yes'} Hope this helps!").label
    1
    >>> try:
    ...     parse_verdict("I cannot tell.")
    ... except VerdictParseError as e:
    ...     print(e.reason)
    no verdict found (expected a JSON line like {"Sufficient Context": 1})
    """
    if scheme not in ("binary", "three_level"):
        raise ValueError(f"unknown scheme {scheme!r}: choose binary or three_level")
    if not text or not text.strip():
        raise VerdictParseError("empty reply")
    # The model's own conclusion is the last object that carries verdict keys; an unusable last
    # verdict is refused even when an earlier object (an echoed example, a draft) looks fine.
    last: tuple[int, str, int | None, str | None, bool] | None = None  # (position, block, label, level, bad_level)
    for pos, block in ((s, text[s:e]) for s, e in balanced_objects(text)):  # fenced objects included
        label, level, seen, bad_level = _verdict_from_obj(lenient_json(block))
        if seen:
            last = (pos, block, label, level, bad_level)
    if last is not None:
        pos, block, label, level, bad_level = last
        if label is None and level is None:
            raise VerdictParseError(f"verdict has an unusable value: {block.strip()[:80]}")
        if bad_level and scheme == "three_level":
            raise VerdictParseError(f"verdict has an unknown level (use sufficient / partial / insufficient): {block.strip()[:80]}")
    else:
        bare = list(_BARE.finditer(text))
        if not bare:
            raise VerdictParseError('no verdict found (expected a JSON line like {"Sufficient Context": 1})')
        pos, label, level = bare[-1].start(), as_label(bare[-1].group(1)), None
    if scheme == "binary":
        if label is None:
            label = 1 if level == "sufficient" else 0
        level = None
    else:
        if level is None:
            if label == 1:
                level = "sufficient"
            else:
                raise VerdictParseError('three-level verdict has no "Level" (sufficient / partial / insufficient)')
        implied = 1 if level == "sufficient" else 0
        if label is not None and label != implied:
            raise VerdictParseError(f"conflicting verdict: Sufficient Context {label} with Level {level!r}")
        label = implied
    return Verdict(label=label, level=level, rationale=_rationale(text, pos))
