"""The autorater prompts (Sufficient Context criterion, Joren et al., ICLR 2025) and their version hash.

The recipe follows the paper's best rater: one worked example (1-shot), then for the item at hand
step-by-step sub-questions answered from the context alone, a short explanation, and a JSON
verdict on the last line. The paper's rater reached 0.935 F1 against human labels this way
(0-shot: 0.878), so the example and the step-by-step part are not decoration.

Two schemes share the method: ``binary`` ends in ``{"Sufficient Context": 1|0}``; ``three_level``
adds ``"Level": "sufficient" | "partial" | "insufficient"`` (partial: some of the needed facts are
there, not all). The prompt version is a hash of every text the model sees, so editing a word
gives new store keys and never mixes labels from two prompts.

>>> prompt = get_prompt("binary")
>>> prompt.version.startswith("binary-") and len(prompt.version) == len("binary-") + 12
True
>>> msgs = prompt.messages("Who wrote Hamlet?", [{"title": "Hamlet", "text": "Hamlet is a play by Shakespeare."}])
>>> [m["role"] for m in msgs]
['system', 'user']
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from suffice.serving.lexical import passage_text

SYSTEM = (
    "You are a meticulous annotator for retrieval-augmented question answering. You decide whether a "
    "retrieved context is sufficient to answer a question. You judge only what the text supports, "
    "never what you happen to know."
)

CRITERION = """\
Decide whether the CONTEXT is sufficient to answer the QUESTION.

The context is SUFFICIENT if a diligent reader could craft a definitive answer to the question using \
only the information in the context. Allowed: combining facts from several passages (multi-hop \
reasoning), and simple arithmetic or date calculations over stated facts. The context is NOT \
sufficient if the answer needs any outside knowledge, if a needed fact is missing or only hinted at, \
if the question is ambiguous and the context does not settle which reading is meant, or if the \
passages contradict each other on a needed fact. Whether the answer is true in the real world does \
not matter; only whether the text supports it. A passage on the right topic that does not state the \
needed fact is not enough."""

METHOD_BINARY = """\
Work in three parts:
1. Step-by-step: break the question into the sub-questions needed to answer it (Q1, Q2, ...). \
Answer each one from the context alone, citing the passage number, or write "not in the context".
2. Explanation: one or two sentences on whether every step is answered by the context.
3. Verdict: on the last line, only this JSON: {"Sufficient Context": 1} if the context is \
sufficient, {"Sufficient Context": 0} if it is not."""

METHOD_THREE_LEVEL = """\
Work in three parts:
1. Step-by-step: break the question into the sub-questions needed to answer it (Q1, Q2, ...). \
Answer each one from the context alone, citing the passage number, or write "not in the context".
2. Explanation: one or two sentences on whether every step is answered by the context.
3. Verdict: on the last line, only this JSON: {"Sufficient Context": 1 or 0, "Level": LEVEL} where \
LEVEL is "sufficient" (every step is answered; Sufficient Context 1), "partial" (some of the needed \
information is in the context but not all of it; Sufficient Context 0) or "insufficient" (the context \
does not provide the information the question needs; Sufficient Context 0)."""

# A fictional two-hop example, so it cannot leak an answer into any real dataset. It shows the case
# raters get wrong most: the bridge entity is present, a passage about it is present, and the
# needed fact is still missing.
EXAMPLE_QUESTION = 'In what year was the director of the film "The Lighthouse at Skarvik" born?'
EXAMPLE_PASSAGES = (
    {"title": "The Lighthouse at Skarvik",
     "text": "The Lighthouse at Skarvik is a 1998 Norwegian drama film directed by Ingrid Saether. "
             "It premiered at the Bergen International Film Festival."},
    {"title": "Ingrid Saether",
     "text": "Ingrid Saether is a Norwegian film director and screenwriter. She studied at the "
             "Norwegian Film School and made her feature debut in 1994."},
    {"title": "Skarvik",
     "text": "Skarvik is a fishing village in Troms county, Norway, with about 300 inhabitants."},
)
EXAMPLE_STEPS = """\
Step-by-step:
Q1: Who directed "The Lighthouse at Skarvik"? A1: Ingrid Saether (passage 1).
Q2: In what year was Ingrid Saether born? A2: not in the context; passage 2 describes her career \
and gives her 1994 debut, but not her birth date.
Explanation: The first hop is answered, but no passage states the director's birth year, and it \
cannot be computed from the debut year. Answering would need outside knowledge."""
EXAMPLE_VERDICT = {"binary": '{"Sufficient Context": 0}',
                   "three_level": '{"Sufficient Context": 0, "Level": "partial"}'}

ITEM_TEMPLATE = """\
QUESTION: {question}
CONTEXT:
{context}"""

REMINDER = {
    "binary": 'Your reply did not end with the verdict in the required form. Reply again, ending with '
              'exactly one line of JSON: {"Sufficient Context": 1} or {"Sufficient Context": 0}.',
    "three_level": 'Your reply did not end with the verdict in the required form. Reply again, ending with '
                   'exactly one line of JSON such as {"Sufficient Context": 0, "Level": "partial"}, where Level '
                   'is "sufficient", "partial" or "insufficient" and Sufficient Context is 1 only for "sufficient".',
}


def format_context(passages: Sequence[Any]) -> str:
    """Number the passages as the prompt cites them: ``[1] Title: text`` one per line.

    >>> format_context([{"title": "A", "text": "x."}, "y."])
    '[1] A: x.\\n[2] y.'
    >>> format_context([])
    '(no context was retrieved)'
    """
    lines = []
    for i, p in enumerate(passages, start=1):
        if isinstance(p, str):
            title, text = "", p
        elif isinstance(p, Mapping):
            title, text = str(p.get("title") or ""), str(p.get("text") or "")
        else:
            title, text = str(getattr(p, "title", "") or ""), passage_text(p) if getattr(p, "text", None) is None else str(p.text)
        lines.append(f"[{i}] {title.strip()}: {text.strip()}" if title.strip() else f"[{i}] {text.strip()}")
    return "\n".join(lines) if lines else "(no context was retrieved)"


@dataclass(frozen=True)
class SufficiencyPrompt:
    """One version of the autorater prompt: the texts, the scheme and their stable hash."""

    scheme: str
    system: str
    instructions: str  # criterion + method + worked example, shared by every item

    @property
    def version(self) -> str:
        """``<scheme>-<12 hex>``: sha256 of every text the model sees (system, instructions, template, reminder)."""
        h = hashlib.sha256("\x1f".join([self.scheme, self.system, self.instructions, ITEM_TEMPLATE, REMINDER[self.scheme]]).encode())
        return f"{self.scheme}-{h.hexdigest()[:12]}"

    def user_message(self, question: str, passages: Sequence[Any]) -> str:
        item = ITEM_TEMPLATE.format(question=question.strip(), context=format_context(passages))
        return f"{self.instructions}\n\nNow the item to judge.\n\n{item}"

    def messages(self, question: str, passages: Sequence[Any]) -> list[dict[str, str]]:
        """The chat messages for one item (system + one user turn holding example and item)."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user_message(question, passages)}]

    def reminder(self) -> str:
        return REMINDER[self.scheme]

    def full_text(self) -> str:
        """Everything that defines this prompt, for logging next to the labels it produced."""
        return (f"# prompt {self.version}\n\n## system\n{self.system}\n\n## user (item fields in braces)\n"
                f"{self.instructions}\n\nNow the item to judge.\n\n{ITEM_TEMPLATE}\n\n## reminder after an unparsable reply\n"
                f"{REMINDER[self.scheme]}\n")


def _instructions(scheme: str) -> str:
    method = METHOD_BINARY if scheme == "binary" else METHOD_THREE_LEVEL
    example = (f"EXAMPLE\n{ITEM_TEMPLATE.format(question=EXAMPLE_QUESTION, context=format_context(EXAMPLE_PASSAGES))}\n\n"
               f"{EXAMPLE_STEPS}\n{EXAMPLE_VERDICT[scheme]}")
    return f"{CRITERION}\n\n{method}\n\n{example}"


PROMPTS = {scheme: SufficiencyPrompt(scheme, SYSTEM, _instructions(scheme)) for scheme in ("binary", "three_level")}


def get_prompt(scheme: str) -> SufficiencyPrompt:
    """The prompt for ``binary`` or ``three_level``."""
    if scheme not in PROMPTS:
        raise ValueError(f"unknown label scheme {scheme!r}: choose one of {sorted(PROMPTS)}")
    return PROMPTS[scheme]
