"""Question writing for ``suffice synth``: the generation prompt, reading its reply, the cache, the writer.

A teacher LLM reads one passage (or, in multi-passage mode, two) and writes K new questions,
each with ``kind``, ``label``, ``level`` and ``answer``. This module holds the parts of that step:

``GenerationPrompt``   the prompt for one (mode, kinds, K) and its version hash (every text the model sees).
``extract_questions``  the question objects out of a free-text reply (fenced, bare, lenient JSON).
``validate_question``  one object -> :class:`GeneratedQuestion`, or the reason it is unusable.
``SynthStore``         the label store (same SQLite file, same class) plus a ``generations`` table keyed by
                       (generator, prompt version, passage id): a re-run never asks twice for a passage.
``QuestionGenerator``  the writer: the autorater's OpenAI-compatible client (retries, Retry-After,
                       redaction of the key, fatal 401/403/404) with the generation prompt.
``generate_async``     a batch with bounded concurrency, resumable, every cost accounted.

>>> prompt = GenerationPrompt(mode="single", kinds=("direct", "premise_date"), per_passage=2)
>>> prompt.version.startswith("gen-single-")
True
>>> q, why = validate_question({"question": "When was it built?", "kind": "premise_date", "label": 0}, prompt.kinds)
>>> (q.label, q.level, q.answer, why)
(0, 'partial', None, None)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from suffice.training.autorater.config import LabelingConfig
from suffice.training.autorater.parsing import _as_label, _as_level, _balanced_objects, _lenient_json
from suffice.training.autorater.prompts import CRITERION, format_context
from suffice.training.autorater.raters import Rating, RaterFatalError
from suffice.training.autorater.runner import Accounting, run_bounded
from suffice.training.autorater.store import LabelStore, _now
from suffice.training.data.schema import Passage

log = logging.getLogger("suffice.synth")

ANSWERABLE_KINDS: dict[str, str] = {
    "direct": "asks for a fact the passage states, worded differently from the sentence that states it",
    "paraphrase": "asks for a stated fact with its key words replaced by synonyms or a description, so matching "
                  "words does not find the answer",
    "combine": "needs two sentences of the passage together, or a small calculation over stated numbers or dates "
               "(a difference, a sum, which came first)",
}
UNANSWERABLE_KINDS: dict[str, str] = {
    "premise_date": "repeats a stated fact with a different date or year, so its premise is not what the passage says",
    "premise_number": "repeats a stated fact with a different number or quantity",
    "premise_entity": "repeats a stated fact with a different person, place or organisation",
    "premise_negation": "asks about the opposite of what is stated (negated or reversed)",
    "missing_attribute": "asks for something the passage never states about an entity it mentions (a date, a "
                         "number, a reason, a name)",
    "related_entity": "asks about a neighbouring entity the passage names or implies but does not describe",
}
MULTI_KINDS: dict[str, str] = {
    "bridge": "finds an entity through one passage and asks for a fact about it that only the other passage states",
    "comparison": "compares the subjects of the two passages on an attribute both passages state (which is older, "
                  "larger, came first...)",
}
SINGLE_KINDS = tuple(ANSWERABLE_KINDS) + tuple(UNANSWERABLE_KINDS)
ALL_KINDS = SINGLE_KINDS + tuple(MULTI_KINDS)
MODES = ("single", "multi")
# What the shipped questions use when the writer gave no level: a neighbouring entity is usually not covered at all.
DEFAULT_LEVEL = {"related_entity": "insufficient"}
MAX_QUESTION_CHARS = 400
MAX_ALREADY_ASKED = 10

SYSTEM = (
    "You write questions for training and testing retrieval-augmented question answering. You write questions a "
    "real user could ask about a text, and you label honestly whether the text alone answers each one."
)

REMINDER = ('Your reply did not hold the questions in the required form. Reply again with only the JSON object '
            '{"questions": [...]}, one entry per question with the fields question, kind, label, level and answer.')

_RULES_SINGLE = """\
Rules:
- Each question stands alone: it names what it asks about (never "the passage" or "the text") and ends with "?".
- No two questions ask the same thing, and none repeats a question listed under ALREADY ASKED.
- An unanswerable question must look answerable: it is about the passage's subject and uses its words; only a \
careful reader sees that the passage does not settle it.
- label is 1 for an answerable question (level "sufficient"; answer: the short answer as the passage gives it) \
and 0 for an unanswerable one (level "partial" when the passage holds some of what is needed, "insufficient" \
when it holds none of it; answer null)."""

_RULES_MULTI = """\
Rules:
- Each question needs a fact from passage [1] AND a fact from passage [2]: with either passage alone it cannot \
be answered.
- Each question stands alone: it names what it asks about (never "the passage") and ends with "?".
- No two questions ask the same thing, and none repeats a question listed under ALREADY ASKED.
- label is 1, level "sufficient", answer: the short answer the two passages give together."""

_FORMAT_SINGLE = ('{"questions": [{"question": "...", "kind": "direct", "label": 1, "level": "sufficient", '
                  '"answer": "..."}, {"question": "...", "kind": "missing_attribute", "label": 0, "level": "partial", '
                  '"answer": null}]}')
_FORMAT_MULTI = '{"questions": [{"question": "...", "kind": "bridge", "label": 1, "level": "sufficient", "answer": "..."}]}'


def kind_label(kind: str) -> int:
    """1 for the answerable kinds (single and multi-passage), 0 for the unanswerable ones.

    >>> kind_label("combine"), kind_label("premise_negation"), kind_label("bridge")
    (1, 0, 1)
    """
    if kind in UNANSWERABLE_KINDS:
        return 0
    if kind in ANSWERABLE_KINDS or kind in MULTI_KINDS:
        return 1
    raise ValueError(f"unknown question kind {kind!r}: choose from {list(ALL_KINDS)}")


def split_counts(per_passage: int, kinds: Sequence[str]) -> tuple[int, int]:
    """(answerable, unanswerable) questions to ask for: half and half (odd K: one more answerable),
    all of one side when ``kinds`` holds only that side.

    >>> split_counts(5, SINGLE_KINDS), split_counts(4, ["premise_date"]), split_counts(3, ["bridge"])
    ((3, 2), (0, 4), (3, 0))
    """
    has_ans = any(kind_label(k) == 1 for k in kinds)
    has_un = any(kind_label(k) == 0 for k in kinds)
    if has_ans and has_un:
        return math.ceil(per_passage / 2), per_passage // 2
    return (per_passage, 0) if has_ans else (0, per_passage)


@dataclass(frozen=True)
class GenerationPrompt:
    """One version of the question-writing prompt: mode, allowed kinds, questions per passage, and its hash.

    mode ``single`` writes answerable and plausibly unanswerable questions about one passage;
    ``multi`` writes questions that need both of two passages (bridge / comparison).

    >>> p = GenerationPrompt(mode="multi", kinds=("bridge", "comparison"), per_passage=2)
    >>> [m["role"] for m in p.messages([Passage("A", "a."), Passage("B", "b.")])]
    ['system', 'user']
    """

    mode: str
    kinds: tuple[str, ...]
    per_passage: int
    system: str = SYSTEM

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: choose one of {list(MODES)}")
        allowed = SINGLE_KINDS if self.mode == "single" else tuple(MULTI_KINDS)
        bad = [k for k in self.kinds if k not in allowed]
        if bad or not self.kinds:
            raise ValueError(f"kinds {list(self.kinds)} do not fit mode {self.mode}: choose from {list(allowed)}")
        if self.per_passage < 1:
            raise ValueError(f"per_passage={self.per_passage} must be >= 1")
        # A canonical order, so the same choice always gives the same prompt (and the same cache keys).
        object.__setattr__(self, "kinds", tuple(k for k in ALL_KINDS if k in self.kinds))

    @property
    def instructions(self) -> str:
        """Everything the model sees except the passage(s) and the questions already asked."""
        n_ans, n_un = split_counts(self.per_passage, self.kinds)
        if self.mode == "multi":
            kinds = "\n".join(f"- {k}: {MULTI_KINDS[k]}" for k in self.kinds)
            return (f"Write {self.per_passage} new questions that need BOTH of the PASSAGES below.\n\n{CRITERION}\n\n"
                    f"Kinds (spread the questions over them):\n{kinds}\n\n{_RULES_MULTI}\n\n"
                    f"Reply with only this JSON object, one entry per question:\n{_FORMAT_MULTI}")
        parts = [f"Write {self.per_passage} new questions about the PASSAGE below: {n_ans} answerable from the "
                 f"passage alone and {n_un} plausibly unanswerable (they look answerable from it, but it does not "
                 f"settle them).", CRITERION]
        ans = [k for k in self.kinds if k in ANSWERABLE_KINDS]
        un = [k for k in self.kinds if k in UNANSWERABLE_KINDS]
        if n_ans:
            parts.append(f"Kinds of answerable question (label 1; spread the {n_ans} over them):\n"
                         + "\n".join(f"- {k}: {ANSWERABLE_KINDS[k]}" for k in ans))
        if n_un:
            parts.append(f"Kinds of unanswerable question (label 0; spread the {n_un} over them):\n"
                         + "\n".join(f"- {k}: {UNANSWERABLE_KINDS[k]}" for k in un))
        parts += [_RULES_SINGLE, f"Reply with only this JSON object, one entry per question:\n{_FORMAT_SINGLE}"]
        return "\n\n".join(parts)

    @property
    def version(self) -> str:
        """``gen-<mode>-<12 hex>``: sha256 of every text the model sees (system, instructions, layout, reminder)."""
        h = hashlib.sha256("\x1f".join([self.mode, self.system, self.instructions, _layout(self.mode), REMINDER]).encode())
        return f"gen-{self.mode}-{h.hexdigest()[:12]}"

    def user_message(self, passages: Sequence[Passage], already_asked: Sequence[str] = ()) -> str:
        asked = ""
        if already_asked:
            asked = "\n\nALREADY ASKED (do not repeat):\n" + "\n".join(f"- {q}" for q in list(already_asked)[:MAX_ALREADY_ASKED])
        head = "PASSAGE" if self.mode == "single" else "PASSAGES"
        return f"{self.instructions}{asked}\n\n{head}:\n{format_context(passages)}"

    def messages(self, passages: Sequence[Passage], already_asked: Sequence[str] = ()) -> list[dict[str, str]]:
        """The chat messages for one passage (single) or pair (multi)."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user_message(passages, already_asked)}]

    def full_text(self) -> str:
        """Everything that defines this prompt, for logging next to what it produced."""
        return (f"# generation prompt {self.version}\n\n## system\n{self.system}\n\n## user\n{self.instructions}\n\n"
                f"{_layout(self.mode)}\n\n## reminder after an unparsable reply\n{REMINDER}\n")


def _layout(mode: str) -> str:
    head = "PASSAGE" if mode == "single" else "PASSAGES"
    return f"[ALREADY ASKED (do not repeat): up to {MAX_ALREADY_ASKED} real questions]\n\n{head}:\n[1] {{title}}: {{text}}"


# ---------------------------------------------------------------- reading the reply


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
    suffice.training.synth.generate.GenerationParseError: no questions found (expected a JSON object like {"questions": [{"question": ...}]})
    """
    if not text or not text.strip():
        raise GenerationParseError("empty reply")
    wrapped: list[Any] | None = None
    loose: list[Any] = []
    for start, end in _balanced_objects(text):
        obj = _lenient_json(text[start:end])
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
    label = _as_label(obj.get("label")) if obj.get("label") is not None else expected
    if label is None:
        return None, "bad_label"
    if label != expected:
        return None, "label_contradicts_kind"
    level = _as_level(obj.get("level")) if obj.get("level") is not None else None
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


# ---------------------------------------------------------------- the store


_GEN_SCHEMA = """
CREATE TABLE IF NOT EXISTS generations (
    generator       TEXT NOT NULL,
    prompt_version  TEXT NOT NULL,
    passage_id      TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('ok', 'unparsed')),
    questions       TEXT,
    raw             TEXT,
    tokens_in       INTEGER NOT NULL DEFAULT 0,
    tokens_out      INTEGER NOT NULL DEFAULT 0,
    latency_s       REAL,
    attempts        INTEGER NOT NULL DEFAULT 1,
    created_at      TEXT NOT NULL,
    PRIMARY KEY (generator, prompt_version, passage_id),
    CHECK ((status = 'ok') = (questions IS NOT NULL))
);
"""


@dataclass
class GenerationRecord:
    """One stored generation reply: ``ok`` with the question objects it held (validated when read), or
    ``unparsed`` with the raw reply kept for inspection."""

    status: str
    questions: list[Any] | None = None
    raw: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float | None = None
    attempts: int = 1
    passage_id: str | None = None  # filled when read back
    created_at: str | None = None

    def __post_init__(self) -> None:
        if self.status not in ("ok", "unparsed"):
            raise ValueError(f"status={self.status!r}: a stored generation is 'ok' or 'unparsed' (failed requests are not stored)")
        if (self.status == "ok") != (self.questions is not None):
            raise ValueError(f"status={self.status!r} with questions={self.questions!r}: 'ok' needs a list, 'unparsed' none")


class SynthStore(LabelStore):
    """The label store plus the generation cache, in one SQLite file (WAL, safe to kill and resume).

    Labels (the re-judging rater's verdicts, imported synthetic labels) go to the ``labels`` table as
    for ``suffice label``; generation replies go to ``generations``, one row per (generator, prompt
    version, passage id), committed as each arrives.

    >>> with SynthStore(":memory:") as s:
    ...     s.put_generation("gen:m", "gen-single-0", "p:1", GenerationRecord(status="ok", questions=[]))
    ...     sorted(s.generations("gen:m", "gen-single-0"))
    True
    ['p:1']
    """

    def __init__(self, path: Any, *, timeout_s: float = 30.0):
        super().__init__(path, timeout_s=timeout_s)
        self._conn.executescript(_GEN_SCHEMA)

    def put_generation(self, generator: str, prompt_version: str, passage_id: str, record: GenerationRecord, *,
                       replace_unparsed: bool = False) -> bool:
        """Store one reply; True if written. An existing row is kept, except an ``unparsed`` one when ``replace_unparsed``."""
        cols = ["status", "questions", "raw", "tokens_in", "tokens_out", "latency_s", "attempts"]
        values = [record.status, None if record.questions is None else json.dumps(record.questions, ensure_ascii=False),
                  record.raw, record.tokens_in, record.tokens_out, record.latency_s, record.attempts]
        sql = (f"INSERT INTO generations(generator, prompt_version, passage_id, {', '.join(cols)}, created_at) "
               f"VALUES (?, ?, ?, {', '.join('?' for _ in cols)}, ?) ")
        if replace_unparsed:
            sql += (f"ON CONFLICT(generator, prompt_version, passage_id) DO UPDATE SET "
                    f"{', '.join(f'{c}=excluded.{c}' for c in cols)}, created_at=excluded.created_at "
                    f"WHERE generations.status = 'unparsed'")
        else:
            sql += "ON CONFLICT(generator, prompt_version, passage_id) DO NOTHING"
        return self._retrying(sql, [generator, prompt_version, passage_id, *values, _now()]).rowcount > 0

    def generations(self, generator: str, prompt_version: str) -> dict[str, GenerationRecord]:
        """``{passage_id: record}`` of one generator and prompt version."""
        out = {}
        for r in self._conn.execute("SELECT * FROM generations WHERE generator=? AND prompt_version=? ORDER BY passage_id",
                                    (generator, prompt_version)):
            out[r["passage_id"]] = GenerationRecord(
                status=r["status"], questions=None if r["questions"] is None else json.loads(r["questions"]), raw=r["raw"],
                tokens_in=r["tokens_in"], tokens_out=r["tokens_out"], latency_s=r["latency_s"], attempts=r["attempts"],
                passage_id=r["passage_id"], created_at=r["created_at"])
        return out

    def done_passages(self, generator: str, prompt_version: str, *, include_unparsed: bool = True) -> set[str]:
        sql = "SELECT passage_id FROM generations WHERE generator=? AND prompt_version=?"
        if not include_unparsed:
            sql += " AND status='ok'"
        return {r[0] for r in self._conn.execute(sql, (generator, prompt_version))}


# ---------------------------------------------------------------- the writer


@dataclass(frozen=True)
class Seed:
    """What one generation request is about: one passage (single mode) or two (multi mode), with the
    split and group every question written about it inherits."""

    id: str
    passages: tuple[Passage, ...]
    split: str
    group: str
    source: str
    already_asked: tuple[str, ...] = ()


@dataclass
class Generation(Rating):
    """A :class:`Rating` (requests, tokens, failures, raw reply) that carries question objects instead of a label."""

    questions: list[Any] | None = None


class QuestionGenerator:
    """The teacher LLM writing questions, through the autorater's OpenAI-compatible client.

    >>> gen = QuestionGenerator(LabelingConfig(rater="openai-compatible", model="m", api_key_env=""),  # doctest: +SKIP
    ...                         GenerationPrompt("single", SINGLE_KINDS, 10))
    >>> asyncio.run(gen.generate(seed)).questions  # doctest: +SKIP
    """

    kind = "generator"

    def __init__(self, cfg: LabelingConfig, prompt: GenerationPrompt, *, generator_id: str | None = None):
        from suffice.training.autorater.raters import OpenAICompatibleRater

        self.cfg, self.prompt = cfg, prompt
        self.id = generator_id or f"gen:{cfg.model}"
        self.prompt_version = prompt.version
        self._llm = OpenAICompatibleRater(cfg)  # its HTTP client, retry policy and key redaction; not its prompt

    def describe(self) -> dict[str, Any]:
        """What the store's ``raters`` table records (never headers or keys)."""
        return {"kind": self.kind, "scheme": self.prompt.mode, "model": self.cfg.model, "base_url": self.cfg.base_url,
                "prompt_text": self.prompt.full_text()}

    async def aclose(self) -> None:
        await self._llm.aclose()

    async def generate(self, seed: Seed) -> Generation:
        """Ask for one seed's questions; re-asks once when the reply holds none. Never raises for a
        per-seed problem (that is a ``failed`` Generation); :class:`RaterFatalError` stops the batch."""
        from suffice.training.autorater.raters import _GiveUp  # the client's "retries exhausted" signal

        result = Generation(status="failed")
        started = time.monotonic()
        messages = self.prompt.messages(seed.passages, seed.already_asked)
        try:
            first = self._llm.redact(await self._llm._complete(messages, result, seed.id))
            try:
                questions, raw = extract_questions(first), first
            except GenerationParseError as e:
                result.failures["unparsed_reply"] += 1
                log.debug("passage %s: reply without questions (%s); re-asking once", seed.id, e.reason)
                again = messages + [{"role": "assistant", "content": first}, {"role": "user", "content": REMINDER}]
                second = self._llm.redact(await self._llm._complete(again, result, seed.id))
                raw = f"{first}\n\n--- reply after the reminder ---\n{second}"
                try:
                    questions = extract_questions(second)
                except GenerationParseError as e2:
                    result.status, result.raw, result.error = "unparsed", raw, f"unparsed: {e2.reason}"
                    result.latency_s = time.monotonic() - started
                    return result
        except _GiveUp as e:
            result.error, result.latency_s = self._llm.redact(str(e)), time.monotonic() - started
            result.failures["gave_up"] += 1
            log.warning("passage %s: no usable reply (%s)", seed.id, result.error)
            return result
        result.status, result.questions, result.raw = "ok", questions, raw
        result.latency_s = time.monotonic() - started
        return result


class GenerationAccounting(Accounting):
    """:class:`Accounting` of a generation batch: ``items_in_input`` counts seeds (passages or pairs), and
    there is no label distribution (the questions are counted by the synth report)."""

    def add(self, rating: Rating) -> None:
        super().add(rating)
        self.labels.pop(None, None)

    def summary(self) -> dict[str, Any]:
        s = super().summary()
        s.pop("labels", None)
        s.pop("levels", None)
        s["generator"] = s.pop("rater")
        return s


async def generate_async(seeds: Sequence[Seed], generator: QuestionGenerator, store: SynthStore, *, concurrency: int = 8,
                         progress: bool = True, retry_unparsed: bool = False, price_per_1k_input: float = 0.0,
                         price_per_1k_output: float = 0.0) -> GenerationAccounting:
    """Ask ``generator`` for the questions of every seed the store does not hold yet, ``concurrency`` at a
    time, committing each reply as it arrives. The generator is closed at the end.

    >>> acc = asyncio.run(generate_async(seeds, gen, store, progress=False))  # doctest: +SKIP
    >>> acc.stored_ok, acc.requests  # doctest: +SKIP
    (12, 13)
    """
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency} must be >= 1")
    acc = GenerationAccounting(generator.id, generator.prompt_version, price_per_1k_input, price_per_1k_output)
    unique = list({s.id: s for s in seeds}.values())
    acc.items_in_input = len(unique)
    store.register_rater(generator.id, generator.prompt_version, **generator.describe())
    done = store.done_passages(generator.id, generator.prompt_version, include_unparsed=not retry_unparsed)
    todo = [s for s in unique if s.id not in done]
    acc.skipped, acc.to_label = len(unique) - len(todo), len(todo)

    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=f"generate {generator.id}", unit="passage", disable=not progress, file=sys.stderr,
               dynamic_ncols=True, smoothing=0.1)
    started = time.monotonic()

    async def handle(seed: Seed) -> None:
        result = await generator.generate(seed)
        acc.add(result)
        if result.status == "failed":
            acc.failed += 1
        else:
            record = GenerationRecord(status=result.status, questions=result.questions, raw=result.raw,
                                      tokens_in=result.tokens_in, tokens_out=result.tokens_out,
                                      latency_s=round(result.latency_s, 6), attempts=max(1, result.requests))
            if store.put_generation(generator.id, generator.prompt_version, seed.id, record, replace_unparsed=retry_unparsed):
                if result.status == "ok":
                    acc.stored_ok += 1
                else:
                    acc.stored_unparsed += 1
            else:
                acc.not_stored_duplicate += 1
        bar.update(1)
        bar.set_postfix(cost=f"${acc.cost_usd:.4f}", unparsed=acc.stored_unparsed, failed=acc.failed, refresh=False)

    try:
        await run_bounded(todo, handle, concurrency)
    except RaterFatalError as e:
        acc.stopped = str(e)
        e.accounting = acc
        raise
    except (asyncio.CancelledError, KeyboardInterrupt):
        acc.stopped = "interrupted"
        raise
    finally:
        acc.elapsed_s = time.monotonic() - started
        bar.close()
        await generator.aclose()
    return acc


__all__ = [
    "ALL_KINDS", "ANSWERABLE_KINDS", "MULTI_KINDS", "SINGLE_KINDS", "UNANSWERABLE_KINDS", "GeneratedQuestion", "Generation",
    "GenerationAccounting", "GenerationParseError", "GenerationPrompt", "GenerationRecord", "QuestionGenerator", "Seed",
    "SynthStore", "extract_questions", "generate_async", "kind_label", "split_counts", "validate_question",
]
