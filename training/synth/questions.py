"""Reading a question-writing reply: the question objects out of free text (fenced, bare, lenient JSON),
and each object checked into a :class:`GeneratedQuestion` or the reason it is unusable.

>>> q, why = validate_question({"question": "When was it built?", "kind": "premise_date", "label": 0}, ("premise_date",))
>>> (q.label, q.level, q.answer, why)
(0, 'partial', None, None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from suffice.training.autorater.parsing import as_label, as_level, balanced_objects, lenient_json
from suffice.training.synth.prompt import DEFAULT_LEVEL, MAX_QUESTION_CHARS, kind_label


class GenerationParseError(ValueError):
    """The reply holds no question objects; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def extract_questions(text: str | None) -> list[Any]:
    """The question objects in a generation reply: the last ``{"questions": [...]}`` object, else every
    object with a ``question`` key (a bare JSON array, or one object per line).

    >>> extract_questions('Sure!\\n```json\\n{"questions": [{"question": "Who?", "kind": "direct"}]}\\n```')
    [{'question': 'Who?', 'kind': 'direct'}]
    >>> extract_questions("I cannot help with that.")
    Traceback (most recent call last):
    ...
    suffice.training.synth.questions.GenerationParseError: no questions found (expected a JSON object like {"questions": [{"question": ...}]})
    """
    if not text or not text.strip():
        raise GenerationParseError("empty reply")
    wrapped: list[Any] | None = None
    loose: list[Any] = []
    for start, end in balanced_objects(text):
        obj = lenient_json(text[start:end])
        if not isinstance(obj, dict):
            continue
        if isinstance(obj.get("questions"), list):
            wrapped = obj["questions"]  # the last wrapper wins (the model may echo the format first)
        elif "question" in obj:
            loose.append(obj)
    if wrapped is not None:
        return wrapped
    if loose:
        return loose
    raise GenerationParseError('no questions found (expected a JSON object like {"questions": [{"question": ...}]})')


@dataclass(frozen=True)
class GeneratedQuestion:
    """One usable question as the writer labelled it."""

    question: str
    kind: str
    label: int
    level: str
    answer: str | None


def validate_question(obj: Any, kinds: Sequence[str]) -> tuple[GeneratedQuestion | None, str | None]:
    """``(question, None)`` when ``obj`` is usable, else ``(None, reason)``.

    The writer's label must match its kind (an answerable kind is label 1); a missing label or level
    is derived from the kind; an answerable question needs an answer.

    >>> validate_question({"question": "Who?", "kind": "direct", "label": 0}, ["direct"])
    (None, 'label_contradicts_kind')
    """
    if not isinstance(obj, dict):
        return None, "not_an_object"
    q = obj.get("question")
    if not isinstance(q, str) or not q.strip():
        return None, "no_question"
    q = " ".join(q.split())
    if len(q) > MAX_QUESTION_CHARS:
        return None, "too_long"
    kind = str(obj.get("kind") or "").strip().lower().replace("-", "_").replace(" ", "_")
    if kind not in kinds:
        return None, "unknown_kind"
    expected = kind_label(kind)
    label = as_label(obj.get("label")) if obj.get("label") is not None else expected
    if label is None:
        return None, "bad_label"
    if label != expected:
        return None, "label_contradicts_kind"
    level = as_level(obj.get("level")) if obj.get("level") is not None else None
    if obj.get("level") is not None and level is None:
        return None, "bad_level"
    if level is None:
        level = "sufficient" if label == 1 else DEFAULT_LEVEL.get(kind, "partial")
    if (level == "sufficient") != (label == 1):
        return None, "level_contradicts_label"
    answer = obj.get("answer")
    if label == 1:
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = f"{answer:g}" if isinstance(answer, float) else str(answer)
        if not isinstance(answer, str) or not answer.strip():
            return None, "answerable_without_answer"
        answer = answer.strip()
    else:
        answer = None
    return GeneratedQuestion(q, kind, label, level, answer), None
