"""Lexical signals shared by the lexical rater, the scorer's explanations and the gates.

Pure Python, no dependencies: content terms of a question, how many of them the context covers,
and which entities / numbers are missing. These are the "keyword coverage" heuristics RAG
gateways start with; suffice uses them as a baseline and to explain model scores in words.

>>> cov = keyword_coverage("When did Chopin move to Paris?", ["Chopin moved to Paris in 1831."])
>>> round(cov.score, 2), cov.missing
(1.0, [])
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

STOPWORDS = frozenset(
    """a about above after again against all also am an and any are aren't as at be because been before being
    below between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during
    each few for from further had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers
    herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more
    most mustn't my myself no nor not of off on once only or other ought our ours ourselves out over own same
    shan't she she'd she'll she's should shouldn't so some such than that that's the their theirs them themselves
    then there there's these they they'd they'll they're they've this those through to too under until up very
    was wasn't we we'd we'll we're we've were weren't what what's when when's where where's which while who who's
    whom why why's with won't would wouldn't you you'd you'll you're you've your yours yourself yourselves
    many much name named one ones did does kind type called call known whose whom used use get got make made
    s t d ll m o re ve y""".split()
)
QUESTION_WORDS = frozenset("what when where who whom whose which why how".split())
NEGATIONS = frozenset("not no never none nobody nothing neither nor n't without".split())

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-\.]*[A-Za-z0-9]|[A-Za-z0-9]")
_NUMBER = re.compile(r"^\d[\d,\.]*$")


def passage_text(p: Any) -> str:
    """Text of a passage given as a string or a ``{title, text}`` mapping (title prepended)."""
    if isinstance(p, str):
        return p
    if isinstance(p, Mapping):
        title, text = str(p.get("title") or ""), str(p.get("text") or "")
        return f"{title}. {text}" if title else text
    title, text = getattr(p, "title", ""), getattr(p, "text", None)
    if text is None:
        raise TypeError(f"a passage must be a string or a {{title, text}} mapping, got {type(p).__name__}")
    return f"{title}. {text}" if title else str(text)


def tokenize_words(text: str) -> list[str]:
    return [w.strip(".'-") for w in _WORD.findall(text)]


# irregular forms -> their base word, so 'left' meets 'leave' and 'won' meets 'win' (the suffix rules
# cannot). Only the words shown to users go through it (base_form): stem() feeds packing and the
# scores, whose behaviour a trained model depends on, so it stays as models were trained with it.
_IRREGULAR = {form: base for base, forms in {
    "be": "was were been is are am", "become": "became", "begin": "began begun", "break": "broke broken",
    "bring": "brought", "build": "built", "buy": "bought", "catch": "caught", "choose": "chose chosen",
    "come": "came", "do": "did done does", "draw": "drew drawn", "drive": "drove driven", "eat": "ate eaten",
    "fall": "fell fallen", "feel": "felt", "fight": "fought", "fly": "flew flown",
    "forget": "forgot forgotten", "freeze": "froze frozen", "get": "got gotten", "give": "gave given",
    "go": "went gone goes", "grow": "grew grown", "have": "had has", "hear": "heard", "hold": "held",
    "keep": "kept", "know": "knew known", "lead": "led", "leave": "left", "lend": "lent", "lose": "lost",
    "make": "made", "mean": "meant", "meet": "met", "pay": "paid", "ride": "rode ridden", "rise": "risen",
    "run": "ran", "say": "said", "see": "saw seen", "sell": "sold", "send": "sent", "shoot": "shot",
    "sing": "sang sung", "sit": "sat", "sleep": "slept", "speak": "spoke spoken", "spend": "spent",
    "stand": "stood", "steal": "stole stolen", "swim": "swam swum", "take": "took taken", "teach": "taught",
    "tell": "told", "think": "thought", "throw": "threw thrown", "understand": "understood",
    "wear": "wore worn", "win": "won", "write": "wrote written", "die": "died dying", "lie": "lain",
    "child": "children", "man": "men", "woman": "women", "person": "people",
}.items() for form in forms.split()}


def base_form(word: str) -> str:
    """:func:`stem` after mapping common irregular forms to their base word, for what users read.

    >>> base_form("left") == base_form("leave"), base_form("won") == stem("wins")
    (True, True)
    """
    w = word.lower()
    return stem(_IRREGULAR.get(w, w))


def stem(word: str) -> str:
    """A tiny suffix stripper: enough to match 'moved'/'move', 'cities'/'city' without NLTK.

    >>> stem("cities"), stem("moved") == stem("move")
    ('city', True)
    """
    w = word.lower()
    if _NUMBER.match(w):
        return w.replace(",", "")
    for suf, rep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if len(w) > len(suf) + 2 and w.endswith(suf):
            w = w[: -len(suf)] + rep
            break
    # 'move'/'moved' -> 'mov': drop a final e so both forms meet
    return w[:-1] if len(w) > 3 and w.endswith("e") else w


def content_terms(text: str) -> list[str]:
    """Lower-cased stems of the non-stopword words, in order, without duplicates.

    >>> content_terms("Who founded the city of Warsaw?")
    ['found', 'city', 'warsaw']
    """
    seen: dict[str, None] = {}
    for w in tokenize_words(text):
        lw = w.lower()
        if lw in STOPWORDS or lw in QUESTION_WORDS or len(lw) < 2 and not lw.isdigit():
            continue
        seen.setdefault(stem(lw), None)
    return list(seen)


def entities(text: str) -> list[str]:
    """Capitalised spans (names) and numbers of a question, skipping the first word's capital.

    >>> entities("When did Frederic Chopin leave Warsaw in 1830?")
    ['Frederic Chopin', 'Warsaw', '1830']

    In a message written in capitals, case says nothing about names: only its numbers are returned.

    >>> entities("WHAT ABOUT THE ONES UNDER 20 DOLLARS?")
    ['20']
    """
    words = tokenize_words(text)
    letters = [w for w in words if any(c.isalpha() for c in w)]
    shouted = len(letters) >= 3 and sum(w.isupper() and len(w) > 1 for w in letters) >= 0.6 * len(letters)
    spans: list[str] = []
    cur: list[str] = []
    for i, w in enumerate(words):
        is_name = not shouted and w[:1].isupper() and (i > 0 or w.lower() not in STOPWORDS | QUESTION_WORDS) and w.lower() not in QUESTION_WORDS
        if is_name:
            cur.append(w)
            continue
        if cur:
            spans.append(" ".join(cur))
            cur = []
        if _NUMBER.match(w):
            spans.append(w)
    if cur:
        spans.append(" ".join(cur))
    out: list[str] = []
    for s in spans:
        if s not in out:
            out.append(s)
    return out


@dataclass(frozen=True)
class Coverage:
    """How much of a question the context covers, lexically.

    score: weighted share of question content terms found in the context (names and numbers
    weigh double: a missing entity matters more than a missing verb). ``missing_words``: the
    missing terms whose base form (irregular verbs and plurals included) no passage holds either:
    what users are told is missing.
    """

    score: float
    covered: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    missing_entities: list[str] = field(default_factory=list)
    n_terms: int = 0
    missing_words: list[str] = field(default_factory=list)


def _context_stems(passages: Iterable[Any]) -> set[str]:
    return {stem(w) for p in passages for w in tokenize_words(passage_text(p))}


def keyword_coverage(question: str, passages: Sequence[Any]) -> Coverage:
    """Share of the question's content terms present in any passage (entities weigh double).

    >>> keyword_coverage("What is the capital of Peru?", ["Lima is a city."]).missing
    ['capital', 'peru']
    """
    terms = content_terms(question)
    if not terms:
        return Coverage(score=1.0 if passages else 0.0, n_terms=0)
    ctx = _context_stems(passages)
    ents = entities(question)
    ent_stems = {stem(t) for e in ents for t in tokenize_words(e)}
    covered, missing = [], []
    total = got = 0.0
    for t in terms:
        w = 2.0 if t in ent_stems else 1.0
        total += w
        if t in ctx:
            covered.append(t)
            got += w
        else:
            missing.append(t)
    missing_entities = [e for e in ents if not all(stem(t) in ctx for t in tokenize_words(e))]
    # what users are told is missing: a term whose base form the passages hold ('leave' / 'left') is not
    missing_words = missing
    if missing:
        ctx_base = {base_form(w) for p in passages for w in tokenize_words(passage_text(p))}
        missing_words = [t for t in missing if base_form(t) not in ctx_base]
    return Coverage(score=got / total, covered=covered, missing=missing, missing_entities=missing_entities, n_terms=len(terms),
                    missing_words=missing_words)


def sentence_relevance(question_terms: set[str], sentence: str, idf: Mapping[str, float] | None = None) -> float:
    """IDF-weighted overlap of a sentence with the question's terms (0 when nothing matches)."""
    if not question_terms:
        return 0.0
    stems = {stem(w) for w in tokenize_words(sentence)}
    hit = question_terms & stems
    if idf is None:
        return float(len(hit))
    return float(sum(idf.get(t, 1.0) for t in sorted(hit)))  # sorted: the same sum in every process


# Frequent function words of Spanish, French, German, Italian, Portuguese and Dutch that are not English
# words (ambiguous ones such as "die", "come", "pour", "son", "per", "no", "a" are left out): enough to
# tell that a message is not written in English without a language model.
FOREIGN_FUNCTION_WORDS = frozenset(
    """el los las del por para una uno unos unas es está están son como qué cuál cuánto cuánta cuántos dónde cuándo
    porque pero también muy hay tiene tienen puedo puede quiero necesito gracias hola eso esto esta este ese esa
    les des du et est sont avec dans une qui quoi combien où quand pourquoi je tu nous vous ils elles mais aussi très
    merci bonjour c'est est-ce cette ces mon ma mes votre vos leur peux veux
    der das und ist nicht mit für ein eine einen wie wer wo warum ich wir ihr sind auch sehr danke bitte kann können
    möchte gibt noch oder aber welche welcher wann wieviel viel kostet
    il gli di che sono dove quanto perché anche molto grazie ciao della delle questo questa
    um uma os não em com é são onde quando também muito obrigado obrigada você vocês
    het een niet zijn ook maar wat hoe waar waarom hoeveel dank bedankt""".split()
)
_ENGLISH_FUNCTION = STOPWORDS - FOREIGN_FUNCTION_WORDS


def script_share(text: str) -> float:
    """Share of the letters in ``text`` that are Latin (ASCII or accented Latin); 1.0 without letters.

    >>> script_share("How much is it?"), round(script_share("Сколько это стоит?"), 2)
    (1.0, 0.0)
    """
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 1.0
    return sum(c.isascii() or "\u00c0" <= c <= "\u024f" for c in letters) / len(letters)


def foreign_words(text: str) -> tuple[int, int]:
    """(non-English function words, English function words) among the words of ``text``.

    >>> foreign_words("¿Cuánto cuesta el plan para dos personas?"), foreign_words("How much is the plan for two?")
    ((3, 0), (0, 5))
    """
    words = [w.lower() for w in re.findall(r"[^\W\d_][^\W\d_'\-]*", text)]
    return sum(w in FOREIGN_FUNCTION_WORDS for w in words), sum(w in _ENGLISH_FUNCTION for w in words)
