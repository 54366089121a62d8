"""Fitting a question and its passages into the encoder window: the long-context strategy.

Multi-passage RAG contexts run to thousands of tokens; the encoder sees 256-512. The question
is never truncated. What happens to the context is a named, recorded strategy, the same code in
training and in serving (so a model is always scored on inputs shaped like its training data):

``select`` (default)
    Question-aware sentence selection. Every passage is split into sentences; each sentence is
    scored by the IDF-weighted overlap of its terms with the question's (IDF within the item, so
    rare bridge entities count more than words every passage shares), plus the overlap of the
    passage title. Sentences are admitted best-first until the window is full and then laid out
    in their original order under their passage titles. When everything fits, nothing changes.
``truncate``
    Plain truncation of the concatenated context (``title: text`` per passage) at the window.
``recent``
    Keep the most recent passages (for chat turns: the latest turns), dropping the oldest first.
``select_lines``
    ``select`` with every line break also ending a unit, so a table row, list item or heading is
    selected on its own (chat replies and markdown; ``select`` reads a whole table as one
    sentence). The retrieval gate's default: the lines of earlier turns that share terms with
    the new message are what tells "already answered" from "needs new knowledge".
``referenced_turn``
    ``select_lines`` that serves the turn the new message refers to first: the latest passage
    titled ``assistant`` (the reply a follow-up is about; the last passage when none is), whole
    when it fits, else its most relevant lines; then the passage right before it when that is the
    ``user`` turn it answered; then the lines of the other passages by relevance. Without it a
    long earlier exchange that shares words with the new message can crowd the reply out.
``referenced_exchange``
    ``referenced_turn`` with the user turn before the reply served first (the latest exchange in
    order: the question, then the reply), so a long reply does not push out what was asked.

Each packed input reports how many context tokens and sentences it kept, so a caller can see
what was left out (the scorer turns that into a confidence factor).

>>> from tokenizers import Tokenizer
>>> packer = ContextPacker(Tokenizer.from_file(TOKENIZER_JSON), max_length=64)  # doctest: +SKIP
>>> p = packer.pack("Where is the Eiffel Tower?", [{"title": "Paris", "text": "The Eiffel Tower is in Paris."}])  # doctest: +SKIP
>>> p.truncated  # doctest: +SKIP
False
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from suffice.serving.lexical import content_terms, stem, tokenize_words

STRATEGIES = ("select", "truncate", "recent", "select_lines", "referenced_turn", "referenced_exchange")
LINE_STRATEGIES = ("select_lines", "referenced_turn", "referenced_exchange")  # every line break ends a unit
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'”’)\]]))\s+(?=[\"'“‘(\[]?[A-Z0-9])")


# [CLS] question [SEP] context [SEP]: the tokens every packed input spends besides question and context
SPECIAL_TOKENS = 3
# the context room a too-long question is asked to leave when it is shortened
MIN_CONTEXT_TOKENS = 32


def question_room(max_length: int) -> int:
    """The most question tokens a ``max_length`` window takes (the context is then empty): the one
    "does the question fit" rule, which the packer, the service and the chat gateway share.

    >>> question_room(128)
    125
    """
    return max_length - SPECIAL_TOKENS


class QuestionTooLongError(ValueError):
    """The question alone does not fit the window (questions are never truncated)."""


def split_sentences(text: str, lines: bool = False) -> list[str]:
    """Split text into sentences on end punctuation followed by a capital or digit; with
    ``lines=True`` every line break ends a unit too (blank lines are dropped).

    >>> split_sentences("Paris is big. It has 2 million people! Really? yes.")
    ['Paris is big.', 'It has 2 million people!', 'Really? yes.']
    >>> split_sentences("Fees:\\n| Under $35 | $7.99 |\\n| $75 and up | Free |", lines=True)
    ['Fees:', '| Under $35 | $7.99 |', '| $75 and up | Free |']
    """
    if lines:
        return [s for line in text.splitlines() for s in split_sentences(line)]
    text = " ".join(text.split())
    if not text:
        return []
    return [s for s in (part.strip() for part in _SENTENCE_END.split(text)) if s]


def normalise_passages(passages: Any) -> list[tuple[str, str]]:
    """Passages as ``(title, text)`` tuples; accepts strings, ``{title, text}`` mappings or objects.

    >>> normalise_passages(["a", {"title": "T", "text": "b"}])
    [('', 'a'), ('T', 'b')]
    """
    if passages is None:
        return []
    if isinstance(passages, (str, Mapping)):
        passages = [passages]
    out = []
    for i, p in enumerate(passages):
        if isinstance(p, str):
            out.append(("", p))
        elif isinstance(p, Mapping):
            if "text" not in p:
                raise ValueError(f"passage {i} has no 'text' key (keys: {sorted(p)}): give {{'title': ..., 'text': ...}} or a string")
            out.append((str(p.get("title") or ""), str(p.get("text") or "")))
        elif hasattr(p, "text"):
            out.append((str(getattr(p, "title", "") or ""), str(p.text or "")))
        else:
            raise ValueError(f"passage {i} is a {type(p).__name__}: give a string or a {{'title', 'text'}} mapping")
    return out


@dataclass(frozen=True)
class PackedInput:
    """One encoded (question, context) pair and what the strategy did to the context."""

    input_ids: list[int]
    token_type_ids: list[int]
    attention_mask: list[int]
    strategy: str
    question_tokens: int
    context_tokens_total: int
    context_tokens_kept: int
    sentences_total: int
    sentences_kept: int
    passages_total: int
    passages_kept: int

    @property
    def truncated(self) -> bool:
        return self.context_tokens_kept < self.context_tokens_total

    @property
    def kept_fraction(self) -> float:
        return 1.0 if self.context_tokens_total == 0 else self.context_tokens_kept / self.context_tokens_total


class ContextPacker:
    """Encode (question, passages) pairs as ``[CLS] question [SEP] context [SEP]`` within ``max_length``.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` (the bundle's ``tokenizer.json``); its own truncation
    and padding are switched off here because the strategy decides what goes in.
    """

    def __init__(self, tokenizer: Any, max_length: int = 256, strategy: str = "select"):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown long-context strategy {strategy!r}: choose one of {list(STRATEGIES)}")
        if not isinstance(max_length, int) or max_length < 16:
            raise ValueError(f"max_length must be an integer >= 16, got {max_length!r}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.strategy = strategy
        tokenizer.no_truncation()
        tokenizer.no_padding()
        ids = {t: tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"tokenizer has no {missing} token(s): suffice packs BERT-style inputs; use a BERT-family encoder")
        self.cls_id, self.sep_id, self.pad_id = ids["[CLS]"], ids["[SEP]"], ids["[PAD]"]

    def question_tokens(self, question: str) -> int:
        """Tokens of ``question`` as :meth:`pack` encodes it (no special tokens)."""
        return len(self.encode_texts([question])[0])

    def question_fits(self, question: str) -> bool:
        """Whether :meth:`pack` takes ``question`` (else it raises :class:`QuestionTooLongError`)."""
        return self.question_tokens(question) <= question_room(self.max_length)

    # -- encoding helpers ------------------------------------------------------------------
    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text without special tokens, as passages are encoded (no truncation, no padding)."""
        if not texts:
            return []
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def pack(self, question: str, passages: Any) -> PackedInput:
        """Pack one pair. Raises :class:`QuestionTooLongError` if the question alone overflows."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty string, got {question!r}")
        pairs = normalise_passages(passages)
        q_ids = self.encode_texts([question])[0]
        budget = question_room(self.max_length) - len(q_ids)
        if budget < 0:
            raise QuestionTooLongError(
                f"the question is {len(q_ids)} tokens and max_length is {self.max_length}: questions are never "
                f"truncated, so shorten the question or use a model with max_length >= {len(q_ids) + SPECIAL_TOKENS + MIN_CONTEXT_TOKENS}"
            )
        # Units: per passage, a title header ("title:") and its sentences.
        titles = [f"{t}:" if t else "" for t, _ in pairs]
        sents = [split_sentences(text, lines=self.strategy in LINE_STRATEGIES) for _, text in pairs]
        flat = [s for ss in sents for s in ss]
        enc = self.encode_texts([t for t in titles if t] + flat)
        title_ids: list[list[int]] = []
        k = 0
        for t in titles:
            if t:
                title_ids.append(enc[k])
                k += 1
            else:
                title_ids.append([])
        sent_ids: list[list[list[int]]] = []
        for ss in sents:
            sent_ids.append(enc[k : k + len(ss)])
            k += len(ss)
        n_sent = len(flat)
        kept_passages = [i for i, ss in enumerate(sent_ids) if ss]
        total = sum(len(title_ids[i]) + sum(len(s) for s in sent_ids[i]) for i in kept_passages)

        if total <= budget:
            chosen = {(i, j) for i in kept_passages for j in range(len(sent_ids[i]))}
            partial: dict[tuple[int, int], int] = {}
        elif self.strategy == "truncate":
            chosen, partial = self._truncate_order(title_ids, sent_ids, budget, reverse=False)
        elif self.strategy == "recent":
            chosen, partial = self._truncate_order(title_ids, sent_ids, budget, reverse=True)
        else:
            tiers = (referenced_tiers([t for t, _ in pairs], question_first=self.strategy == "referenced_exchange")
                     if self.strategy in ("referenced_turn", "referenced_exchange") else None)
            chosen, partial = self._select(question, pairs, sents, title_ids, sent_ids, budget, tiers)

        ctx: list[int] = []
        p_used = 0
        for i in range(len(pairs)):
            js = sorted(j for (pi, j) in chosen if pi == i)
            if not js:
                continue
            p_used += 1
            ctx += title_ids[i]
            for j in js:
                ids = sent_ids[i][j]
                ctx += ids[: partial[(i, j)]] if (i, j) in partial else ids
        ctx = ctx[:budget]  # safety net: the strategies above already respect the budget
        input_ids = [self.cls_id] + q_ids + [self.sep_id] + ctx + [self.sep_id]
        type_ids = [0] * (len(q_ids) + 2) + [1] * (len(ctx) + 1)
        return PackedInput(
            input_ids=input_ids,
            token_type_ids=type_ids,
            attention_mask=[1] * len(input_ids),
            strategy=self.strategy,
            question_tokens=len(q_ids),
            context_tokens_total=total,
            context_tokens_kept=len(ctx),
            sentences_total=n_sent,
            sentences_kept=len(chosen),
            passages_total=len(pairs),
            passages_kept=p_used,
        )

    @staticmethod
    def _truncate_order(title_ids, sent_ids, budget: int, reverse: bool):
        """Contiguous prefix (truncate) or suffix (recent) of the passages, cut at the budget."""
        order = [(i, j) for i in range(len(sent_ids)) for j in range(len(sent_ids[i]))]
        if reverse:
            order = order[::-1]
        chosen: set[tuple[int, int]] = set()
        partial: dict[tuple[int, int], int] = {}
        opened: set[int] = set()
        used = 0
        for i, j in order:
            cost = len(sent_ids[i][j]) + (0 if i in opened else len(title_ids[i]))
            if used + cost <= budget:
                chosen.add((i, j))
                opened.add(i)
                used += cost
                continue
            room = budget - used - (0 if i in opened else len(title_ids[i]))
            if room > 0 and not reverse:
                chosen.add((i, j))
                partial[(i, j)] = room
            break
        return chosen, partial

    @staticmethod
    def _select(question, pairs, sents, title_ids, sent_ids, budget: int, tiers: Sequence[int] | None = None):
        q_terms = set(content_terms(question))
        sent_stems = [[{stem(w) for w in tokenize_words(s)} for s in ss] for ss in sents]
        title_stems = [{stem(w) for w in tokenize_words(t)} for t, _ in pairs]
        n_docs = sum(len(ss) for ss in sents) or 1
        df: dict[str, int] = {}
        for ss in sent_stems:
            for st in ss:
                for t in st & q_terms:
                    df[t] = df.get(t, 0) + 1
        idf = {t: math.log(1.0 + n_docs / (1 + df.get(t, 0))) for t in q_terms}
        # sums run over sorted terms: a set's order follows the per-process hash seed, and float
        # addition is not associative, so unsorted sums can break ties differently in another process
        scored = []
        for i, ss in enumerate(sent_stems):
            title_score = sum(idf[t] for t in sorted(title_stems[i] & q_terms))
            for j, st in enumerate(ss):
                s = sum(idf[t] for t in sorted(st & q_terms)) + 0.5 * title_score
                # a passage's opening sentence usually names its subject: small prior
                s += 0.25 if j == 0 else 0.0
                scored.append((tiers[i] if tiers else 0, -s, i, j))
        scored.sort()
        chosen: set[tuple[int, int]] = set()
        partial: dict[tuple[int, int], int] = {}
        opened: set[int] = set()
        used = 0
        for _, _, i, j in scored:
            cost = len(sent_ids[i][j]) + (0 if i in opened else len(title_ids[i]))
            if used + cost <= budget:
                chosen.add((i, j))
                opened.add(i)
                used += cost
            elif not chosen:
                # the best sentence alone overflows the window: keep its head rather than nothing
                room = budget - (0 if i in opened else len(title_ids[i]))
                if room > 0:
                    chosen.add((i, j))
                    partial[(i, j)] = room
                    opened.add(i)
                    used = budget
            if used >= budget:
                break
        return chosen, partial

    def pack_batch(self, questions: Sequence[str], passages_list: Sequence[Any]) -> tuple[dict[str, np.ndarray], list[PackedInput]]:
        """Pack many pairs and pad them to the longest: int64 arrays keyed like BERT's inputs."""
        if len(questions) != len(passages_list):
            raise ValueError(f"got {len(questions)} questions but {len(passages_list)} passage lists: give one list per question")
        packed = [self.pack(q, p) for q, p in zip(questions, passages_list)]
        return pad_packed(packed, self.pad_id), packed


def referenced_tiers(titles: Sequence[str], question_first: bool = False) -> list[int]:
    """``referenced_turn``'s priority per passage (0 first): 0 = the turn a follow-up refers to (the
    latest ``assistant`` passage, else the last passage), 1 = the ``user`` turn right before it (the
    question that reply answered), 2 = every other passage; ``question_first`` (``referenced_exchange``)
    swaps the first two.

    >>> referenced_tiers(["user", "assistant", "user", "assistant"])
    [2, 2, 1, 0]
    >>> referenced_tiers(["user", "assistant", "user", "assistant"], question_first=True)
    [2, 2, 0, 1]
    >>> referenced_tiers(["Paris", "London"])
    [2, 0]
    """
    if not titles:
        return []
    ref = max((i for i, t in enumerate(titles) if t == "assistant"), default=len(titles) - 1)
    tiers = [2] * len(titles)
    tiers[ref] = 0
    if ref > 0 and titles[ref - 1] == "user":
        tiers[ref - 1] = 1
        if question_first:
            tiers[ref - 1], tiers[ref] = 0, 1
    return tiers


def pad_packed(packed: Sequence[PackedInput], pad_id: int) -> dict[str, np.ndarray]:
    n = len(packed)
    width = max((len(p.input_ids) for p in packed), default=0)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    types = np.zeros((n, width), dtype=np.int64)
    mask = np.zeros((n, width), dtype=np.int64)
    for r, p in enumerate(packed):
        L = len(p.input_ids)
        ids[r, :L] = p.input_ids
        types[r, :L] = p.token_type_ids
        mask[r, :L] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
