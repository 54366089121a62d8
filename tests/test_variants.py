"""Constructed variants: each rule, flags, determinism, and that no variant carries text across splits."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import pytest

from suffice.training.data.loaders import gold_label, load_items
from suffice.training.data.schema import Item, Passage
from suffice.training.data.variants import RULES, drop_supporting, make_variants, other_paragraph, paragraph_pool, remove_answer_sentence

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture
def items() -> dict[str, Item]:
    return {it.id: it for it in load_items(FIX / "shared" / "items.jsonl")}


def test_drop_supporting_hotpotqa(items):
    f1 = items["hotpotqa-fullwiki:f1"]
    cands = drop_supporting(f1)
    assert [[p.title for p in v.passages] for v in cands] == [["Port Alba", "Sylvania"], ["Freedonia", "Sylvania"], ["Sylvania"]]
    assert [v.level for v in cands] == ["partial", "partial", "insufficient"]
    assert [v.gold["supporting_present"] for v in cands] == [1, 1, 0]
    assert all(gold_label(v) == 0 and v.label == 0 for v in cands)
    assert drop_supporting(items["hotpotqa-fullwiki:f3"]) == []  # nothing present to drop
    assert drop_supporting(items["squad2:a1"]) == []  # not multi-hop


def test_drop_supporting_musique_reindexes(items):
    m1 = items["musique:m1"]
    first = drop_supporting(m1)[0]  # drops the passage at position 1
    assert [p.title for p in first.passages] == ["Phones", "Zapco"]
    assert first.gold["supporting_idx"] == [1] and first.passages[1].title == "Zapco"
    assert first.gold["supporting_missing"] == 1 and gold_label(first) == 0 and first.level == "partial"


def test_other_paragraph_same_article_same_split_only(items):
    pool = paragraph_pool(items.values())
    (v,) = other_paragraph(items["squad2:a1"], pool)
    assert v.passages[0].text.startswith("Today the stone") and v.level == "insufficient" and gold_label(v) == 0
    # Delta's other paragraph is a test item: a train parent must not be paired with it
    assert other_paragraph(items["squad2:d1"], pool) == []
    # a paragraph holding the parent's answer (or plausible answer) is no negative: skipped
    a3 = items["squad2:a3"]
    a3_with_answer = Item(id="squad2:a4", question="Where?", passages=a3.passages, split="train", source="squad2",
                          gold={"answerable": True, "answers": ["green"]})
    assert other_paragraph(a3_with_answer, pool) == []
    assert other_paragraph(items["squad2:a2"], pool) != []  # '1901' is not in Alpha:1


def test_remove_answer_sentence(items):
    (v,) = remove_answer_sentence(items["squad2:a1"])
    assert v.passages[0].text == "It was found in 1901." and v.level == "insufficient" and gold_label(v) == 0
    assert remove_answer_sentence(items["squad2:a2"]) == []  # unanswerable parent
    assert remove_answer_sentence(items["qed:2"]) == []  # explanation_type none
    (mh,) = remove_answer_sentence(items["hotpotqa-fullwiki:f1"])
    assert mh.level == "partial" and mh.passages[1].text == "Port Alba is a harbour city."  # Freedonia left intact
    yes = Item(id="h:yes", question="Both painters?", passages=[Passage("Ann", "Ann paints. Yes she does.")],
               gold={"answerable": True, "answers": ["yes"]})
    assert remove_answer_sentence(yes) == []
    only = Item(id="s:only", question="What colour?", passages=[Passage("A", "It is green.")], gold={"answerable": True, "answers": ["green"]})
    assert remove_answer_sentence(only) == []  # nothing would remain


def test_flags_split_group_and_limits(items):
    vs = make_variants(list(items.values()), splits=["train", "validation", "test"])
    assert {v.variant for v in vs} == set(RULES)
    for v in vs:
        parent = items[v.parent_id]
        assert (v.label, v.label_source, v.split, v.group, v.source) == (0, "constructed", parent.split, parent.group, parent.source)
        assert v.level in ("partial", "insufficient") and v.id.startswith(parent.id + "#" + v.variant)
    per = defaultdict(int)
    for v in vs:
        per[(v.parent_id, v.variant)] += 1
    assert max(per.values()) == 1
    three = make_variants([items["hotpotqa-fullwiki:f1"]], rules=["drop_supporting"], per_item=5)
    assert len(three) == 3
    assert {v.split for v in make_variants(list(items.values()), splits=["train"])} == {"train"}


def test_deterministic_and_order_independent(items):
    base = list(items.values())
    a = make_variants(base, seed=3, parent_fraction=0.6, per_item=2)
    shuffled = base[:]
    random.Random(9).shuffle(shuffled)
    b = make_variants(shuffled, seed=3, parent_fraction=0.6, per_item=2)
    assert sorted(v.to_dict().__repr__() for v in a) == sorted(v.to_dict().__repr__() for v in b)
    assert make_variants(base, parent_fraction=0.0) == []


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown variant rule"):
        make_variants([], rules=["shuffle"])
    with pytest.raises(ValueError, match="per_item"):
        make_variants([], per_item=0)


def _texts_by_split(items):
    out = defaultdict(set)
    for it in items:
        for p in it.passages:
            out[it.split].add(p.text)
    return out


def test_no_test_text_reaches_train_via_variants(items):
    vs = make_variants(list(items.values()), splits=["train", "validation", "test"], per_item=5, parent_fraction=1.0)
    texts = _texts_by_split(list(items.values()) + vs)
    assert not texts["test"] & texts["train"] and not texts["validation"] & texts["train"]


def test_real_variants_never_cross_splits(shared_data_dir):
    real = list(load_items(shared_data_dir / "items.jsonl"))
    groups = defaultdict(set)
    for it in real:
        groups[it.group].add(it.split)
    assert all(len(s) == 1 for s in groups.values())  # SQuAD paragraph groups never cross splits
    articles = defaultdict(set)
    for it in real:
        if it.source == "squad2":
            articles[it.group.rsplit(":", 1)[0]].add(it.split)
    assert all(len(s) == 1 for s in articles.values())
    vs = make_variants(real, splits=["train", "validation", "test"], parent_fraction=1.0)
    base_texts = _texts_by_split(real)
    for v in vs:
        for p in v.passages:
            if v.variant != "remove_answer_sentence":  # that rule rewrites its own parent's text
                assert p.text in base_texts[v.split], v.id
    before = base_texts["test"] & base_texts["train"]  # a few retrieved paragraphs recur across splits in the data itself
    after = _texts_by_split(real + vs)
    assert after["test"] & after["train"] == before
