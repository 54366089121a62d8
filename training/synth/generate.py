"""Question writing for ``suffice synth``: the writer and the resumable batch that asks it.

A teacher LLM reads one passage (or, in multi-passage mode, two) and writes K new questions, each
with ``kind``, ``label``, ``level`` and ``answer``. The parts of that step:

``synth.prompt``       :class:`GenerationPrompt`: the prompt for one (mode, kinds, K) and its version hash.
``synth.questions``    ``extract_questions`` / ``validate_question``: reading the reply.
``synth.store``        :class:`SynthStore`: the label store plus the generation cache keyed by
                       (generator, prompt version, passage id): a re-run never asks twice for a passage.
here                   :class:`QuestionGenerator` (the autorater's OpenAI-compatible client: retries,
                       Retry-After, key redaction, fatal 401/403/404, with the generation prompt) and
                       :func:`generate_async` (a batch on the autorater's resumable worker loop).

>>> gen = QuestionGenerator(LabelingConfig(rater="openai-compatible", model="m", api_key_env=""),  # doctest: +SKIP
...                         GenerationPrompt("single", SINGLE_KINDS, 10))
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

from suffice.training.autorater.labeling_config import LabelingConfig
from suffice.training.autorater.raters import GiveUp, OpenAICompatibleRater, Rating
from suffice.training.autorater.runner import Accounting, pending, run_resumable
from suffice.training.data.schema import Passage
from suffice.training.synth.prompt import (ALL_KINDS, ANSWERABLE_KINDS, MODES, MULTI_KINDS, REMINDER, SINGLE_KINDS,
                                           UNANSWERABLE_KINDS, GenerationPrompt, kind_label, split_counts)
from suffice.training.synth.questions import (GeneratedQuestion, GenerationParseError, extract_questions,
                                              validate_question)
from suffice.training.synth.store import GenerationRecord, SynthStore

log = logging.getLogger("suffice.synth")


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
        result = Generation(status="failed")
        started = time.monotonic()
        messages = self.prompt.messages(seed.passages, seed.already_asked)
        try:
            first = self._llm.redact(await self._llm.complete(messages, result, seed.id))
            try:
                questions, raw = extract_questions(first), first
            except GenerationParseError as e:
                result.failures["unparsed_reply"] += 1
                log.debug("passage %s: reply without questions (%s); re-asking once", seed.id, e.reason)
                again = messages + [{"role": "assistant", "content": first}, {"role": "user", "content": REMINDER}]
                second = self._llm.redact(await self._llm.complete(again, result, seed.id))
                raw = f"{first}\n\n--- reply after the reminder ---\n{second}"
                try:
                    questions = extract_questions(second)
                except GenerationParseError as e2:
                    result.status, result.raw, result.error = "unparsed", raw, f"unparsed: {e2.reason}"
                    result.latency_s = time.monotonic() - started
                    return result
        except GiveUp as e:
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
    store.register_rater(generator.id, generator.prompt_version, **generator.describe())
    todo = pending(unique, store.done_passages(generator.id, generator.prompt_version, include_unparsed=not retry_unparsed), acc)

    def put(seed: Seed, result: Generation) -> bool:
        return store.put_generation(generator.id, generator.prompt_version, seed.id, GenerationRecord.from_generation(result),
                                    replace_unparsed=retry_unparsed)

    return await run_resumable(todo, generator.generate, put, acc, concurrency=concurrency, desc=f"generate {generator.id}",
                               unit="passage", progress=progress, aclose=generator.aclose)


__all__ = [
    "ALL_KINDS", "ANSWERABLE_KINDS", "MODES", "MULTI_KINDS", "SINGLE_KINDS", "UNANSWERABLE_KINDS", "GeneratedQuestion",
    "Generation", "GenerationAccounting", "GenerationParseError", "GenerationPrompt", "GenerationRecord", "QuestionGenerator",
    "Seed", "SynthStore", "extract_questions", "generate_async", "kind_label", "split_counts", "validate_question",
]
