"""Writing styles for the retrieval gate's threads: the same request, written by someone else.

Both gate training files were written by one teacher in one style, so a split by domain still shares
the writer. The message styles (:data:`MESSAGE_STYLES`) change how the user's *new message* is written,
never what it asks: no content word is added or removed (``terse`` drops only politeness and filler,
``verbose`` wraps the request in framing that names nothing), so the label (RETRIEVE / SKIP) provably
stays. The conversation styles (:data:`CONVERSATION_STYLES`) change the earlier turns the same way:
another assistant's pleasantries around its unchanged replies (``chatty_assistant``), a content-free
greeting exchange first (``small_talk_first``); the facts the label depends on stay where they were.

Each style is a deterministic function of (message, seed): a thread's styled copy is the same in every
process. Training adds styled copies of its train threads (``gate.styles``, ``gate.style_copies``);
the benchmark (``benchmarks/bench_retrieval_gate.py --styles``) tests on the styles training did *not*
use, the held-out-style split of the issue.

>>> apply_style("lowercase", "What does the Pro plan cost?", seed=0)
'what does the pro plan cost?'
>>> apply_style("terse", "Could you please sort that by price?", seed=0)
'sort that by price?'
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any, Callable, Mapping, Sequence

_WORDS = re.compile(r"[A-Za-z]+")
# keys next to each other on a QWERTY keyboard (a typo hits a neighbour, not a random letter)
_NEIGHBOURS = {
    "a": "qwsz", "b": "vghn", "c": "xdfv", "d": "serfcx", "e": "wsdr", "f": "drtgvc", "g": "ftyhbv", "h": "gyujnb",
    "i": "ujko", "j": "huikmn", "k": "jiolm", "l": "kop", "m": "njk", "n": "bhjm", "o": "iklp", "p": "ol",
    "q": "wa", "r": "edft", "s": "awedxz", "t": "rfgy", "u": "yhji", "v": "cfgb", "w": "qase", "x": "zsdc",
    "y": "tghu", "z": "asx",
}


def _typo(word: str, rng: random.Random) -> str:
    """One keyboard slip in a word of >= 4 letters: swap two inner letters, drop, double or hit a neighbour."""
    if len(word) < 4:
        return word
    i = rng.randrange(1, len(word) - 1)
    op = rng.choice(("swap", "drop", "double", "neighbour"))
    if op == "swap":
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if op == "drop":
        return word[:i] + word[i + 1:]
    if op == "double":
        return word[:i] + word[i] + word[i:]
    c = word[i].lower()
    sub = rng.choice(_NEIGHBOURS.get(c, c))
    return word[:i] + (sub.upper() if word[i].isupper() else sub) + word[i + 1:]


def typos(text: str, rng: random.Random) -> str:
    """About one word in four of >= 4 letters misspelt (at least one)."""
    spans = [m for m in _WORDS.finditer(text) if len(m.group()) >= 4]
    if not spans:
        return text
    chosen = {m.start() for m in spans if rng.random() < 0.25} or {rng.choice(spans).start()}
    out, last = [], 0
    for m in spans:
        if m.start() in chosen:
            out += [text[last:m.start()], _typo(m.group(), rng)]
            last = m.end()
    return "".join(out) + text[last:]


def lowercase(text: str, rng: random.Random) -> str:
    return text.lower()


def shouting(text: str, rng: random.Random) -> str:
    return text.upper()


def no_punct(text: str, rng: random.Random) -> str:
    """Punctuation dropped (keeps $, %, digits' separators and apostrophes inside words)."""
    text = re.sub(r"[?!;:\"()]+", "", text)
    text = re.sub(r"(?<![0-9])[.,]|[.,](?![0-9])", "", text)
    return re.sub(r"\s+", " ", text).strip()


_GREETINGS = ("hi!", "hey,", "hello again.", "ok thanks.", "great, thanks.", "cool.", "thx!", "hmm ok.", "good morning!")
_SIGNOFFS = ("thanks!", "thank you", "ty", "cheers", ":)", "thx", "please", "appreciate it!")


def greeting(text: str, rng: random.Random) -> str:
    """A greeting or acknowledgement before the request, sometimes a sign-off after it."""
    out = f"{rng.choice(_GREETINGS)} {text}"
    return f"{out} {rng.choice(_SIGNOFFS)}" if rng.random() < 0.5 else out


_FRAMES = (
    "Sorry, one more question. {m}", "I hope this isn't a silly question, but {m}", "Quick follow-up on what you just said: {m}",
    "I was wondering about something. {m} I'd really appreciate a clear answer.", "Okay, so, just so I understand properly: {m}",
    "{m} Sorry if I'm asking a lot today.", "Before I decide anything, {m}", "Following up on your last message, {m}",
)


def verbose(text: str, rng: random.Random) -> str:
    """The request inside framing sentences that name nothing new."""
    return _frame(text, rng.choice(_FRAMES))


# Other framings of the same kind, none shared with _FRAMES: a gate trained on ``verbose`` is tested on
# ``framed`` to see whether it learnt "framing names nothing" or only those eight sentences.
_OTHER_FRAMES = (
    "Going back to what we discussed, {m}", "Regarding your previous answer, {m}", "One more thing I still need: {m}",
    "Can I ask something else? {m}", "{m} That's the last thing, I promise.", "Just to double-check, {m}",
    "Based on everything above, {m}", "Also, while I have you here: {m}",
)


def framed(text: str, rng: random.Random) -> str:
    """Like ``verbose`` with other framing sentences (none of ``verbose``'s): a held-out form of the same style."""
    return _frame(text, rng.choice(_OTHER_FRAMES))


def _frame(text: str, frame: str) -> str:
    m = text[0].lower() + text[1:] if text[:1].isupper() and not text[1:2].isupper() else text
    return frame.format(m=text if frame.startswith("{m}") else m)


_ASIDES = (
    "I'm in a bit of a hurry.", "My manager asked me to check this.", "This is for a report I'm writing.",
    "I'm asking for a friend.", "Sorry for all the questions.", "I'm on my phone, sorry for typos.",
    "Trying to sort this out today.", "Long day here.",
)


def aside(text: str, rng: random.Random) -> str:
    """A sentence about the writer (names nothing the answer depends on) before or after the request."""
    a = rng.choice(_ASIDES)
    return f"{a} {text}" if rng.random() < 0.5 else f"{text} {a}"


_FILLER = re.compile(
    r"^(?:(?:ok(?:ay)?|so|well|hey|hi|great|cool|thanks|thank you|alright|and|also|um+|hmm+)[,.!]?\s+)+"
    r"|\b(?:could you(?: please)?|can you(?: please)?|would you(?: please)?|would you mind|please|kindly|"
    r"i(?:'d| would) like to know|i want to know|i was wondering|do you know|just|actually|quickly)\b[,]?\s*",
    re.IGNORECASE,
)


def terse(text: str, rng: random.Random) -> str:
    """Politeness and filler words dropped ("could you please", "just", a leading "ok so")."""
    out = re.sub(r"\s+", " ", _FILLER.sub("", text)).strip(" ,")
    if not out or not _WORDS.search(out):
        return text
    return out[0].lower() + out[1:] if out[:1].isupper() and not out[1:2].isupper() else out


MESSAGE_STYLES: dict[str, Callable[[str, random.Random], str]] = {
    "lowercase": lowercase, "shouting": shouting, "no_punct": no_punct, "typos": typos,
    "greeting": greeting, "verbose": verbose, "terse": terse, "aside": aside, "framed": framed,
}
"""The styles of the user's new message."""


# ---- the conversation: another product's assistant, another thread's opening ------------------------
# The earlier turns hold the referents the label depends on, so these add nothing but words that name
# nothing: an assistant's pleasantries around its unchanged reply, a content-free opening exchange.
_OPENERS = ("Sure!", "Great question!", "Happy to help.", "Of course.", "Absolutely.", "Good question.", "Certainly!")
_CLOSERS = ("Hope that helps!", "Happy to help further.", "I hope this is useful.", "Glad I could help.")


def chatty_assistant(turns: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Each assistant turn opens with a pleasantry; one that does not end on a question (an offer the new
    message may answer) also closes with one. The reply itself is unchanged."""
    out = []
    for t in turns:
        if t.get("title") == "assistant" and str(t.get("text", "")).strip():
            text = f"{rng.choice(_OPENERS)} {t['text']}"
            if not text.rstrip().endswith("?"):
                text = f"{text} {rng.choice(_CLOSERS)}"
            t = {**t, "text": text}
        out.append(t)
    return out


_OPENING_EXCHANGES = (("hi", "Hello! How can I help you today?"), ("hello", "Hi there, what can I do for you?"),
                      ("hey there", "Hey! What would you like to know?"), ("good morning", "Good morning! How can I help?"))


def small_talk_first(turns: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """A content-free greeting exchange before the thread's first turn: every turn moves two places back."""
    user, assistant = rng.choice(_OPENING_EXCHANGES)
    return [{"title": "user", "text": user}, {"title": "assistant", "text": assistant}, *turns]


CONVERSATION_STYLES: dict[str, Callable[[list[dict[str, Any]], random.Random], list[dict[str, Any]]]] = {
    "chatty_assistant": chatty_assistant, "small_talk_first": small_talk_first,
}
"""The styles of the earlier turns (the new message unchanged)."""

STYLES: dict[str, Callable[..., Any]] = {**MESSAGE_STYLES, **CONVERSATION_STYLES}
"""Every style by name (the ``gate.styles`` and ``--styles`` vocabulary)."""


def check_styles(names: Sequence[str], where: str = "gate.styles") -> list[str]:
    """The names, validated against :data:`STYLES` (a ValueError names the unknown one and the choices)."""
    out = []
    for n in names:
        if n not in STYLES:
            raise ValueError(f"{where}: unknown style {n!r}: choose from {sorted(STYLES)}")
        if n not in out:
            out.append(n)
    return out


def _rng(*parts: Any) -> random.Random:
    return random.Random(int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:16], 16))


def apply_style(name: str, text: str, seed: Any = 0) -> str:
    """``text`` (a new message) written in message style ``name``, the same for the same ``(name, text, seed)``
    in every process."""
    name = check_styles([name], "style")[0]
    if name not in MESSAGE_STYLES:
        raise ValueError(f"style {name!r} rewrites the earlier turns, not a message: use styled_row on a gate row")
    return MESSAGE_STYLES[name](text, _rng(name, seed, text))


def styled_row(row: Mapping[str, Any], style: str) -> dict[str, Any]:
    """A gate row (``question`` = the new user message) with its question (or, for a conversation style,
    its earlier turns, ``passages``) in ``style``: id ``<id>~<style>``,
    source ``<source>~<style>`` (reports and the conservative threshold read the style there), pair
    ``<pair>~<style>`` so both threads of a styled pair stay partners; the label and the earlier turns as they were."""
    out = dict(row)
    if style in CONVERSATION_STYLES:
        out["passages"] = CONVERSATION_STYLES[style]([dict(t) for t in row["passages"]], _rng(style, row["id"], row["question"]))
    else:
        out["question"] = apply_style(style, row["question"], row["id"])
    out["id"] = f"{row['id']}~{style}"
    out["source"] = f"{row.get('source') or 'retrieval-gate'}~{style}"
    if row.get("pair"):
        out["pair"] = f"{row['pair']}~{style}"
    return out


def style_of(source: str) -> str:
    """The style named in a row's source (``""`` for the writer's own)."""
    return source.split("~", 1)[1] if "~" in source else ""


def styled_copies(rows: Sequence[Mapping[str, Any]], styles: Sequence[str], copies: int, seed: int) -> list[dict[str, Any]]:
    """``copies`` styled copies of each row, the styles drawn without replacement from ``styles`` per
    conversation group and pair (both threads of a pair get the same styles, so they stay a pair)."""
    styles = check_styles(styles)
    if copies < 0:
        raise ValueError(f"gate.style_copies={copies} must be >= 0")
    if not styles or not copies:
        return []
    k = min(copies, len(styles))
    out = []
    for r in rows:
        key = r.get("pair") or r["id"]
        for s in _rng("styles", seed, key).sample(styles, k):
            out.append(styled_row(r, s))
    return out
