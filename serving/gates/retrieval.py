"""Should this chat turn trigger retrieval? RETRIEVE vs SKIP, failing open.

The latest user message is the "question" (never truncated); the previous turns are the
"passages" (title = role, :func:`thread_input`), packed with the bundle's long-context strategy,
as in training: ``select_lines`` (the shipped config's: the lines of earlier turns that share terms
with the new message, in their original order), ``referenced_exchange`` (the latest exchange first,
its user turn then the reply, then other lines sharing terms with the new message),
``referenced_turn`` (the same, the reply before its user turn) or ``recent`` (the newest turns, the
oldest trimmed first). The first user message of a thread is always RETRIEVE (nothing
to answer from yet) without running the model. Any error or malformed input gives RETRIEVE with the
reason: a gate that fails closed would silently starve the answerer of knowledge. So does a new message
unlike any the gate was trained on (:func:`out_of_distribution`: another script, another language, far
longer than training's follow-ups): SKIP claims the conversation holds the answer, and a model reading
what it never saw cannot back that claim. So does a message that asks for a search or for more than the
conversation showed (:func:`search_request`: "find me all ...", "any others?"): new knowledge by request.

>>> gate = RetrievalGate.load("bundles/retrieval-gate-v1")  # doctest: +SKIP
>>> gate.decide([{"role": "user", "content": "What is our refund policy?"},
...              {"role": "assistant", "content": "Refunds are accepted within 30 days."},
...              {"role": "user", "content": "Thanks! Can you make that a bullet list?"}]).decision  # doctest: +SKIP
'SKIP'
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from suffice.serving.bundle import RETRIEVE, SKIP
from suffice.serving.cpu import CpuInfo
from suffice.serving.lexical import foreign_words, script_share
from suffice.serving.runtime import OnnxClassifier, RuntimeConfig


def turns_as_passages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Chat turns as the gate's passages (title = role), in training, export and serving alike.

    >>> turns_as_passages([{"role": "assistant", "content": "Basic costs $5."}])
    [{'title': 'assistant', 'text': 'Basic costs $5.'}]
    """
    return [{"title": m.get("role", ""), "text": m["content"]} for m in messages]


CONTEXT_TURNS = 6


def thread_input(messages: Sequence[Mapping[str, Any]], context_turns: int = CONTEXT_TURNS) -> tuple[str, list[dict[str, str]]]:
    """A chat thread as the gate's (question, passages): the latest user message, and the non-empty turns
    before it (at most ``context_turns``, the most recent) as :func:`turns_as_passages`. Training builds
    its rows with this function and serving its inputs, so both hand the packer the same thread.

    >>> thread_input([{"role": "user", "content": "Plans?"}, {"role": "assistant", "content": "Basic is $5."},
    ...               {"role": "user", "content": "Sort by price"}])
    ('Sort by price', [{'title': 'user', 'text': 'Plans?'}, {'title': 'assistant', 'text': 'Basic is $5.'}])
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} mappings")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a mapping with string 'role' and 'content', got {m!r}")
    user_idx = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not user_idx:
        raise ValueError("the thread has no user message")
    last = user_idx[-1]
    question = messages[last]["content"]
    if not question.strip():
        raise ValueError("the latest user message is empty")
    prev = [m for m in messages[:last] if m["content"].strip()]
    return question, turns_as_passages(prev[-context_turns:] if context_turns else [])


MAX_MESSAGE_WORDS = 60
"""Longest new message the gate judges: the training threads' follow-ups have at most 32 words (p99 24)."""
MIN_LATIN_SHARE = 0.8
"""Share of the new message's letters that must be Latin: the training threads are written in Latin script."""


def out_of_distribution(message: str, max_words: int = MAX_MESSAGE_WORDS) -> str | None:
    """Why a new user message lies outside what the gate was trained on, or None: ``script`` (under
    :data:`MIN_LATIN_SHARE` of its letters Latin), ``language`` (at least two non-English function words
    and more of them than English ones: :func:`~suffice.serving.lexical.foreign_words`) or ``length``
    (more than ``max_words`` words). The gate answers RETRIEVE for these without asking the model.

    >>> out_of_distribution("Sort that by price"), out_of_distribution("¿Y cuánto cuesta el envío para dos?")
    (None, 'language')
    """
    if script_share(message) < MIN_LATIN_SHARE:
        return "script"
    foreign, english = foreign_words(message)
    if foreign >= 2 and foreign > english:
        return "language"
    if len(message.split()) > max_words:
        return "length"
    return None


SEARCH_REQUEST = re.compile(
    r"(?<!\bi )(?<!\bto )\b(?:find|search|look (?:up|for)|lookup|browse)\b"
    r"|\bany (?:others?|more)\b|\banything else\b|\bwhat else\b|\b(?:other|more) (?:options|choices)\b", re.IGNORECASE)
"""A new message that asks to search, or for more than was shown: "find me", "look up", "any others", "what else"."""


def search_request(message: str) -> bool:
    """Whether the new user message asks for a search or for more than the conversation showed
    (:data:`SEARCH_REQUEST`): a request for new knowledge whatever the conversation holds, so the gate
    answers RETRIEVE without asking the model. In the gate's training threads these words appear in 48
    of 1,244 RETRIEVE follow-ups and in none of 1,250 SKIP ones (benchmarks/results/2026-12-03).

    >>> search_request("Now find me all fruits under $2"), search_request("Which of those are under $2?")
    (True, False)
    >>> search_request("I find that confusing, say it simpler")
    False
    """
    return SEARCH_REQUEST.search(message) is not None


@dataclass(frozen=True)
class RetrievalGateConfig:
    """RetrievalGate settings.

    skip_threshold: SKIP when P(SKIP) >= this; None uses the bundle's ``thresholds.skip``.
    context_turns: how many previous turns go in as context (the most recent ones); training's rows use
        the default (:data:`CONTEXT_TURNS`), so another value hands the model threads cut unlike its training's.
    max_tokens: window for question + context; None uses the bundle's max_length (never more).
    ood_guard: RETRIEVE without running the model when the new message is out of the training
        distribution (:func:`out_of_distribution`: script, language, length); False asks the model anyway.
    search_guard: RETRIEVE without running the model when the new message asks for a search or for more
        than the conversation showed (:func:`search_request`); False asks the model anyway.
    backend / precision / intra_op_threads / verify_checksums / cpu: as for the scorer (the same
        runtime selection: the fastest variant this CPU supports that passes the parity probe).
    """

    skip_threshold: float | None = None
    context_turns: int = CONTEXT_TURNS
    max_tokens: int | None = None
    ood_guard: bool = True
    search_guard: bool = True
    precision: str = "auto"
    intra_op_threads: int = 0
    verify_checksums: bool = True
    backend: str = "auto"
    cpu: CpuInfo | None = None

    def __post_init__(self) -> None:
        self.runtime()  # validates backend, precision and threads
        if self.skip_threshold is not None and not 0.0 <= self.skip_threshold <= 1.0:
            raise ValueError(f"skip_threshold={self.skip_threshold!r} must be in [0, 1]")
        if not isinstance(self.context_turns, int) or self.context_turns < 0:
            raise ValueError(f"context_turns={self.context_turns!r} must be an integer >= 0")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 16):
            raise ValueError(f"max_tokens={self.max_tokens!r} must be an integer >= 16")

    def runtime(self) -> RuntimeConfig:
        return RuntimeConfig(precision=self.precision, intra_op_threads=self.intra_op_threads,
                             verify_checksums=self.verify_checksums, backend=self.backend, cpu=self.cpu)


OOD_REASONS = {
    "script": "the message is not written in Latin script, which the gate was not trained on",
    "language": "the message is not in English, which the gate was trained on",
    "length": f"the message is longer than {MAX_MESSAGE_WORDS} words, far beyond the follow-ups the gate was trained on",
}


@dataclass(frozen=True)
class GateDecision:
    """decision: RETRIEVE or SKIP; score: P(SKIP) (None when the model did not run)."""

    decision: str
    score: float | None
    latency_ms: float
    reason: str


class RetrievalGate:
    """RETRIEVE/SKIP for the latest user turn of a chat thread; never raises from :meth:`decide`."""

    def __init__(self, model: OnnxClassifier, config: RetrievalGateConfig):
        self._model = model
        self.config = config
        m = model.manifest
        labels = set(m.id2label.values())
        if labels != {RETRIEVE, SKIP}:
            raise ValueError(f"a retrieval-gate bundle needs labels RETRIEVE and SKIP, this one has {sorted(labels)}")
        self._skip_idx = next(i for i, v in m.id2label.items() if v == SKIP)
        self.skip_threshold = config.skip_threshold if config.skip_threshold is not None else m.threshold("skip")
        if m.long_context_strategy == "truncate":
            raise ValueError("this retrieval-gate bundle packs with 'truncate' (oldest turns first): retrain it with "
                             "long_context_strategy select_lines, referenced_exchange, referenced_turn or recent")
        self._packer = model.packer_for(config.max_tokens)

    @classmethod
    def load(cls, path: str | os.PathLike, config: RetrievalGateConfig | None = None) -> "RetrievalGate":
        """Load a ``retrieval_gate`` bundle (manifest and checksums are validated)."""
        config = config or RetrievalGateConfig()
        return cls(OnnxClassifier(path, config.runtime(), expected_task="retrieval_gate"), config)

    @property
    def variant(self) -> str:
        """The model variant in use (``onnxruntime-int8``, ``openvino-bf16``, ...)."""
        return self._model.variant

    def __repr__(self) -> str:
        return f"RetrievalGate(bundle={str(self._model.path)!r}, variant={self.variant!r}, cpu={self._model.cpu.isa_class!r})"

    def build_input(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, str]]] | None:
        """(question, passages) for a thread (:func:`thread_input`, as training built its rows), or None
        when this is the thread's first user message.

        Raises ValueError for malformed threads (``decide`` turns that into RETRIEVE).
        """
        question, passages = thread_input(messages, self.config.context_turns)
        if sum(m["role"] == "user" for m in messages) == 1:
            return None
        return question, passages

    def guard(self, question: str) -> str | None:
        """Why the new message RETRIEVEs without asking the model (the guards the config switches on:
        :func:`out_of_distribution`, :func:`search_request`), or None when the model decides."""
        ood = out_of_distribution(question) if self.config.ood_guard else None
        if ood is not None:
            return f"out_of_distribution: {OOD_REASONS[ood]}"
        if self.config.search_guard and search_request(question):
            return "search_request: the message asks for a search or for more than the conversation showed"
        return None

    def decide(self, messages: Sequence[Mapping[str, Any]]) -> GateDecision:
        """RETRIEVE or SKIP for the latest user message; any problem gives RETRIEVE with the reason."""
        t0 = time.perf_counter()

        def ms() -> float:
            return (time.perf_counter() - t0) * 1e3

        try:
            built = self.build_input(messages)
        except (ValueError, TypeError, KeyError) as e:
            return GateDecision(RETRIEVE, None, ms(), f"malformed_input: {e}")
        if built is None:
            return GateDecision(RETRIEVE, None, ms(), "first_turn: the first user message of a thread always retrieves")
        question, passages = built
        guarded = self.guard(question)
        if guarded is not None:
            return GateDecision(RETRIEVE, None, ms(), guarded)
        try:
            packed = self._packer.pack(question, passages)
            _, probs = self._model.predict_packed([packed])
            p_skip = float(probs[0, self._skip_idx])
        except Exception as e:  # fail open by design: a broken gate must never block retrieval
            return GateDecision(RETRIEVE, None, ms(), f"error: {type(e).__name__}: {e}")
        if p_skip >= self.skip_threshold:
            return GateDecision(SKIP, p_skip, ms(), f"P(SKIP)={p_skip:.2f} >= {self.skip_threshold:g}: answerable from the conversation")
        return GateDecision(RETRIEVE, p_skip, ms(), f"P(SKIP)={p_skip:.2f} < {self.skip_threshold:g}: needs new knowledge")
