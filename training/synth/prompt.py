"""The question-writing prompt of ``suffice synth``: the question kinds, the rules, the reply format, and
the prompt's version hash (every text the model sees; a new hash gives new cache keys).

>>> prompt = GenerationPrompt(mode="single", kinds=("direct", "premise_date"), per_passage=2)
>>> prompt.version.startswith("gen-single-")
True
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

from suffice.training.autorater.prompts import CRITERION, format_context
from suffice.training.data.schema import Passage

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
