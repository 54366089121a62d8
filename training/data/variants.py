"""Constructed training variants: new insufficient examples made from real items by a named rule.

Every variant is flagged ``variant=<rule>``, ``parent_id=<parent id>``, ``label_source="constructed"``,
label 0, and stays in its parent's split and group. Rules:

``drop_supporting``
    Multi-hop items (HotPotQA, MuSiQue): remove one or all supporting passages that are present.
    Level ``partial`` while at least one supporting passage remains, ``insufficient`` otherwise.
``other_paragraph``
    Single-passage items (SQuAD, QED): pair the question with another paragraph of the same
    article (same source, same passage title) from the **same split**, one that contains none of
    the parent's answer strings. Level ``insufficient``.
``remove_answer_sentence``
    Items whose gold label is sufficient: delete every sentence holding an answer string.
    Level ``insufficient`` (``partial`` for multi-hop items whose other supporting passages are
    left intact). Yes/no answers are skipped: they name no span to remove.

``retrieval_like`` (:func:`retrieval_like_variants`, not a negative)
    Single-paragraph train items (real or synthetic) set among 2-9 paragraphs of *other titles*
    from the same split, at a seeded position: real retrieval hands the student ten paragraphs,
    not one. The label and level stay the parent's (other titles add no answer);
    ``label_source`` stays the parent's too.

Choices are deterministic: each (seed, rule, parent id) seeds its own generator, so adding or
removing other items never changes an item's variants.

>>> from suffice.training.data.schema import Item, Passage
>>> a = Item(id="s:1", question="Who?", passages=[Passage("A", "Bob did it.")], split="train", source="s", gold={"answerable": True, "answers": ["Bob"]})
>>> b = Item(id="s:2", question="When?", passages=[Passage("A", "It rained in 1990.")], split="train", source="s", gold={"answerable": True, "answers": ["1990"]})
>>> [v.variant for v in make_variants([a, b], rules=["other_paragraph"])]
['other_paragraph', 'other_paragraph']
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from typing import Iterable, Sequence

from suffice.serving.packing import split_sentences
from suffice.training.data.loaders import gold_answers, gold_label, supporting_positions
from suffice.training.data.schema import Item, Passage

RULES = ("drop_supporting", "other_paragraph", "remove_answer_sentence")
RETRIEVAL_LIKE = "retrieval_like"
ALL_RULES = (*RULES, RETRIEVAL_LIKE)
_YES_NO = {"yes", "no"}


def _variant(parent: Item, rule: str, k: int, passages: list[Passage], level: str, gold: dict) -> Item:
    return Item(id=f"{parent.id}#{rule}-{k}", question=parent.question, passages=passages, label=0, level=level,
                label_source="constructed", split=parent.split, source=parent.source, group=parent.group,
                gold=gold, variant=rule, parent_id=parent.id, meta={})


def _contains_any(text: str, needles: Iterable[str]) -> bool:
    low = text.lower()
    return any(n.lower() in low for n in needles)


def drop_supporting(item: Item) -> list[Item]:
    """Candidates that remove one supporting passage each, plus one that removes all of them."""
    present = supporting_positions(item)
    if not present:
        return []
    drops = [[k] for k in present] + ([list(present)] if len(present) > 1 else [])
    out = []
    for n, dropped in enumerate(drops):
        kept = [p for k, p in enumerate(item.passages) if k not in dropped]
        gold = copy.deepcopy(item.gold)
        remaining = len(present) - len(dropped)
        if "supporting_idx" in gold:  # positions shift once passages go
            gold["supporting_idx"] = [k - sum(d < k for d in dropped) for k in present if k not in dropped]
        if "supporting_present" in gold:
            gold["supporting_present"] = remaining
        gold["supporting_missing"] = len(dropped) + int(gold.get("supporting_missing") or 0)
        out.append(_variant(item, "drop_supporting", n, kept, "partial" if remaining else "insufficient", gold))
    return out


def other_paragraph(item: Item, pool: dict[tuple, list[str]]) -> list[Item]:
    """Candidates pairing the question with another same-article paragraph of the same split."""
    if len(item.passages) != 1:
        return []
    title, own = item.passages[0].title, item.passages[0].text
    answers = gold_answers(item)
    texts = [t for t in pool.get((item.source, item.split, title), []) if t != own and not _contains_any(t, answers)]
    gold = {"answerable": False, "answers": [], "rule": "other_paragraph"}
    return [_variant(item, "other_paragraph", n, [Passage(title, t)], "insufficient", dict(gold)) for n, t in enumerate(texts)]


def remove_answer_sentence(item: Item) -> list[Item]:
    """One candidate without any sentence that holds an answer string (only for gold-sufficient items)."""
    answers = [a for a in gold_answers(item) if a.strip().lower() not in _YES_NO]
    if gold_label(item) != 1 or not answers:
        return []
    support = set(supporting_positions(item) or [])
    kept, touched = [], set()
    for k, p in enumerate(item.passages):
        sentences = split_sentences(p.text)
        left = [s for s in sentences if not _contains_any(s, answers)]
        if len(left) != len(sentences):
            touched.add(k)
        if left:
            kept.append(Passage(p.title, " ".join(left)))
    if not touched or not kept:  # an emptied context is a trivial negative, not a useful one
        return []
    level = "partial" if support - touched else "insufficient"
    gold = {"answerable": False, "answers": list(item.gold.get("answers") or []), "rule": "remove_answer_sentence"}
    return [_variant(item, "remove_answer_sentence", 0, kept, level, gold)]


def paragraph_pool(items: Iterable[Item]) -> dict[tuple, list[str]]:
    """(source, split, title) -> distinct single-passage texts, in first-seen order.

    Keyed by split so that pairing can never bring a paragraph across a split boundary.
    """
    pool: dict[tuple, list[str]] = defaultdict(list)
    seen: set[tuple] = set()
    for it in items:
        if len(it.passages) == 1 and it.variant is None:
            key = (it.source, it.split, it.passages[0].title)
            if (key, it.passages[0].text) not in seen:
                seen.add((key, it.passages[0].text))
                pool[key].append(it.passages[0].text)
    return dict(pool)


def make_variants(items: Sequence[Item], rules: Sequence[str] = RULES, per_item: int = 1, seed: int = 13,
                  parent_fraction: float = 1.0, splits: Sequence[str] | None = None, progress: bool = False) -> list[Item]:
    """Constructed variants of ``items``: at most ``per_item`` per parent per rule.

    ``parent_fraction`` keeps a seeded share of the eligible parents (to control how many
    constructed negatives join the data); ``splits`` limits parents to those splits (None: all).
    The pairing pool is built from all of ``items``, per split. Items with a passage that also
    appears in another split get no variants, so no variant text can cross a split boundary.

    >>> make_variants([], rules=["drop_supporting"])
    []
    """
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        raise ValueError(f"unknown variant rule(s) {unknown}: choose from {list(RULES)}")
    if per_item < 1:
        raise ValueError(f"per_item={per_item} must be at least 1")
    if not 0.0 <= parent_fraction <= 1.0:
        raise ValueError(f"parent_fraction={parent_fraction} must be between 0 and 1")
    pool = paragraph_pool(items) if "other_paragraph" in rules else {}
    # a paragraph already shared across splits (the same retrieved text under two questions) would
    # carry its derived text across too; such parents get no variants
    text_splits: dict[str, set] = defaultdict(set)
    for it in items:
        for p in it.passages:
            text_splits[p.text].add(it.split)
    parents = [it for it in items if it.variant is None and (splits is None or it.split in splits)
               and all(len(text_splits[p.text]) == 1 for p in it.passages)]
    if progress:
        from tqdm.auto import tqdm

        parents = tqdm(parents, desc="variants", unit=" item", leave=False)
    out: list[Item] = []
    for it in parents:
        for rule in rules:
            rng = random.Random(f"{seed}|{rule}|{it.id}")
            if rng.random() >= parent_fraction:
                continue
            if rule == "other_paragraph":
                cands = other_paragraph(it, pool)
            else:
                cands = drop_supporting(it) if rule == "drop_supporting" else remove_answer_sentence(it)
            out.extend(rng.sample(cands, min(per_item, len(cands))))
    return out


def retrieval_like_variants(items: Sequence[Item], *, fraction: float, seed: int = 13, min_others: int = 2,
                            max_others: int = 9, splits: Sequence[str] = ("train",)) -> list[Item]:
    """Copies of single-paragraph items of ``splits`` with ``min_others``-``max_others`` paragraphs of
    other titles (same split) around their own, at a seeded position; label, level and group kept.

    Each parent draws from its own generator (seed, rule, id), so other items never change its copy.

    >>> from suffice.training.data.schema import Item, Passage
    >>> its = [Item(id=f"s:{i}", question="Q?", passages=[Passage(f"T{i}", f"Text {i}.")], label=i % 2, split="train", source="s")
    ...        for i in range(12)]
    >>> v = retrieval_like_variants(its, fraction=1.0)
    >>> len(v), v[0].variant, v[0].label == its[0].label, 3 <= len(v[0].passages) <= 10
    (12, 'retrieval_like', True, True)
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction={fraction} must be between 0 and 1")
    if not 1 <= min_others <= max_others:
        raise ValueError(f"need 1 <= min_others <= max_others, got {min_others}, {max_others}")
    by_split: dict[str, dict[str, list[Passage]]] = defaultdict(lambda: defaultdict(list))
    seen: set[tuple] = set()
    for it in items:
        for p in it.passages:
            if (it.split, p.title, p.text) not in seen:
                seen.add((it.split, p.title, p.text))
                by_split[it.split][p.title].append(p)
    titles = {split: sorted(pool) for split, pool in by_split.items()}
    out: list[Item] = []
    for it in items:
        if it.variant is not None or it.split not in splits or len(it.passages) != 1 or it.label not in (0, 1):
            continue
        rng = random.Random(f"{seed}|{RETRIEVAL_LIKE}|{it.id}")
        if rng.random() >= fraction:
            continue
        own = it.passages[0]
        pool = titles[it.split]
        k = min(len(pool) - 1, rng.randint(min_others, max_others))
        if k < min_others:
            continue
        names = [t for t in rng.sample(pool, k + 1) if t != own.title][:k]
        picked = [rng.choice(by_split[it.split][t]) for t in names]
        picked.insert(rng.randrange(len(picked) + 1), own)
        out.append(Item(id=f"{it.id}#{RETRIEVAL_LIKE}", question=it.question, passages=copy.deepcopy(picked), label=it.label,
                        level=it.level, label_source=it.label_source, split=it.split, source=it.source, group=it.group,
                        gold=dict(it.gold or {}), variant=RETRIEVAL_LIKE, parent_id=it.id, meta=dict(it.meta or {})))
    return out
