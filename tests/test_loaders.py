"""Loaders: every format into one schema, located errors for bad input, labels, threads, passages."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from suffice.training.data.loaders import (detect_format, gold_label, gold_level, hash_split, load_items, load_passages,
                                      load_retrieval_threads, read_autorater_labels)
from suffice.training.data.schema import SPLITS, DataFormatError

FIX = Path(__file__).parent / "fixtures"
SHARED_SOURCES = {  # file -> (format, source)
    "squad2-dev-half.json": ("squad2", "squad2"),
    "qed-dev.jsonl": ("qed", "qed"),
    "hotpotqa-dev-fullwiki500.jsonl": ("hotpotqa", "hotpotqa-fullwiki"),
    "hotpotqa-train-distractor100.json": ("hotpotqa", "hotpotqa-distractor"),
    "musique-train100.json": ("musique", "musique"),
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _jsonl(*records) -> str:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n"


# ---------------------------------------------------------------- each format


def test_squad2_json():
    items = load_items(FIX / "squad2.json")
    assert detect_format(FIX / "squad2.json") == "squad2"
    by_id = {it.id: it for it in items}
    assert list(by_id) == ["squad2:q-blue-1", "squad2:q-blue-2", "squad2:q-blue-3", "squad2:q-red-1"]
    blue1 = by_id["squad2:q-blue-1"]
    assert blue1.group == "squad2:Blue_Lake:0" and blue1.passages[0].title == "Blue Lake"
    assert blue1.gold == {"answerable": True, "answers": ["590 metres"], "plausible_answers": []}
    assert by_id["squad2:q-blue-3"].passages[0].text == "Fishing on the lake was banned in 1995. Boats need a permit."
    assert by_id["squad2:q-blue-3"].question == "When was fishing banned?"
    assert by_id["squad2:q-blue-2"].gold["plausible_answers"] == ["Oregon"]
    assert [gold_label(by_id[i]) for i in by_id] == [1, 0, 1, 1]  # no is_impossible = SQuAD 1.1 style: answerable
    assert items.report.read == items.report.kept == 4 and not items.report.dropped


def test_hotpotqa_distractor_json_list():
    items = load_items(FIX / "hotpotqa-distractor.json")
    assert detect_format(FIX / "hotpotqa-distractor.json") == "hotpotqa"
    d1 = items[0]
    assert d1.id == "hotpotqa-distractor:hp-d1" and d1.source == "hotpotqa-distractor"
    assert d1.passages[1].text == "Port Alba is a harbour city. The Silver River flows through Port Alba."
    assert d1.gold["supporting_titles"] == ["Freedonia", "Port Alba"] and d1.gold["supporting_present"] == 2
    assert gold_label(d1) == 1 and gold_level(d1) == "sufficient"


def test_hotpotqa_fullwiki_jsonl_with_missing_support_and_empty_context():
    items = load_items(FIX / "hotpotqa-fullwiki.jsonl")
    f1, f2 = items
    assert f1.source == "hotpotqa-fullwiki" and f1.gold["supporting_present"] == 1
    assert (gold_label(f1), gold_level(f1)) == (0, "partial")
    assert f2.passages == [] and (gold_label(f2), gold_level(f2)) == (0, "insufficient")
    assert items.report.empty_passages == 1 and items.report.kept == 2


def test_hotpotqa_hugging_face_layout(tmp_path):
    rec = {"id": "x1", "question": "Q?", "answer": "A", "type": "bridge", "level": "easy",
           "supporting_facts": {"title": ["T1"], "sent_id": [0]},
           "context": {"title": ["T1", "T2"], "sentences": [["A is here.", " More."], ["Other."]]}}
    p = _write(tmp_path, "hotpot_hf.jsonl", _jsonl(rec | {"_id": "x1"}))
    (item,) = load_items(p, source="hotpotqa-fullwiki")
    assert item.id == "hotpotqa-fullwiki:x1" and item.passages[0].text == "A is here. More."
    assert item.gold["supporting_facts"] == [["T1", 0]] and gold_label(item) == 1


def test_musique_json_list_and_jsonl(tmp_path):
    (m,) = load_items(FIX / "musique.json")
    assert m.id == "musique:2hop__1_2" and m.source == "musique" and len(m.passages) == 3
    assert m.gold == {"answers": ["Ada King", "A. King"], "supporting_idx": [1, 2], "hops": 2}
    assert gold_label(m) == 1
    rec = json.loads((FIX / "musique.json").read_text())[0]
    rec["answerable"] = False
    p = _write(tmp_path, "musique.jsonl", _jsonl(rec))
    (m2,) = load_items(p)
    assert detect_format(p) == "musique" and m2.gold["answerable"] is False and gold_label(m2) == 0


def test_qed_jsonl():
    q1, q2 = load_items(FIX / "qed.jsonl")
    assert (q1.id, q2.id) == ("qed:101", "qed:-202")
    assert q1.passages[0].title == "Moon landing" and q1.question == "who walked on the moon first"
    assert q1.gold["answers"] == ["Neil Armstrong"] and q1.gold["selected_sentence"]["start"] == 0
    assert (gold_label(q1), gold_label(q2)) == (1, 0)
    assert q2.gold["selected_sentence"] is None


def test_canonical_jsonl_with_labels(tmp_path):
    items = load_items(FIX / "shared" / "items.jsonl")
    assert detect_format(FIX / "shared" / "items.jsonl") == "canonical"
    assert len(items) == 14 and items.report.empty_passages == 1
    assert {it.source for it in items} == {"squad2", "qed", "hotpotqa-fullwiki", "musique"}
    assert all(it.label is None for it in items)
    p = _write(tmp_path, "mine.jsonl", _jsonl(
        {"id": "mine:1", "question": "Q?", "passages": [{"title": "T", "text": "x"}, "bare text"], "level": "partial", "split": "train", "note": "kept"},
        {"id": "mine:2", "question": "Q2?", "passages": [], "label": 1}))
    a, b = load_items(p)
    assert (a.label, a.level, a.label_source, a.source) == (0, "partial", "rater", "mine")
    assert a.passages[1].text == "bare text" and a.meta == {"note": "kept"}
    assert (b.label, b.level, b.group) == (1, None, "mine:2")


# ---------------------------------------------------------------- bad input


GOOD = {"id": "c:1", "question": "Q?", "passages": [{"title": "T", "text": "x"}]}


@pytest.mark.parametrize("bad, line, field_, words", [
    ('{"id": "c:2", "question": ', 2, None, "malformed JSON"),
    ({"id": "c:2", "passages": []}, 2, "question", "missing"),
    ({"id": "c:2", "question": "  ", "passages": []}, 2, "question", "empty"),
    ({"id": "c:2", "question": "Q", "passages": "some text"}, 2, "passages", "must be list"),
    ({"id": "c:2", "question": "Q", "passages": [7]}, 2, "passages[0]", "passage must be"),
    ({"id": "c:2", "question": "Q", "passages": [{"title": "T"}]}, 2, "passages[0].text", "needs a string 'text'"),
    ({"id": "c:2", "question": "Q", "passages": [], "label": 2}, 2, "label", "unknown label value 2"),
    ({"id": "c:2", "question": "Q", "passages": [], "label": "yes"}, 2, "label", "unknown label value"),
    ({"id": "c:2", "question": "Q", "passages": [], "level": "maybe"}, 2, "level", "unknown level value"),
    ({"id": "c:2", "question": "Q", "passages": [], "label": 1, "level": "partial"}, 2, "level", "contradicts"),
    ({"id": "c:2", "question": "Q", "passages": [], "split": "dev"}, 2, "split", "unknown split"),
    ({"id": "c:1", "question": "Q", "passages": []}, 2, "id", "duplicate id"),
    ("[1, 2]", 2, None, "expected a JSON object"),
])
def test_canonical_errors_name_file_line_field(tmp_path, bad, line, field_, words):
    p = _write(tmp_path, "bad.jsonl", _jsonl(GOOD, bad))
    with pytest.raises(DataFormatError) as e:
        load_items(p, "canonical")
    msg = str(e.value)
    assert "bad.jsonl" in msg and f"line {line}" in msg and words in msg
    assert e.value.line == line and e.value.field == field_
    if field_:
        assert f"field '{field_}'" in msg


def test_squad_error_names_field_path(tmp_path):
    doc = json.loads((FIX / "squad2.json").read_text())
    del doc["data"][1]["paragraphs"][0]["qas"][0]["question"]
    p = _write(tmp_path, "squad.json", json.dumps(doc))
    with pytest.raises(DataFormatError, match=r"squad\.json.*field 'data\[1\]\.paragraphs\[0\]\.qas\[0\]\.question'"):
        load_items(p)


def test_json_array_errors_carry_the_element_line(tmp_path):
    recs = json.loads((FIX / "hotpotqa-distractor.json").read_text())
    recs[1]["context"][0] = ["Ann", "not a sentence list"]
    p = _write(tmp_path, "hotpotqa-distractor.json", "[\n" + ",\n".join(json.dumps(r) for r in recs) + "\n]\n")
    with pytest.raises(DataFormatError) as e:
        load_items(p)
    assert e.value.line == 3 and e.value.field == "context[0]"


@pytest.mark.parametrize("name, mutate, field_", [
    ("musique.json", lambda r: r["paragraphs"][1].pop("paragraph_text"), "paragraphs[1].paragraph_text"),
    ("qed.jsonl", lambda r: r["annotation"].pop("explanation_type"), "annotation.explanation_type"),
])
def test_format_specific_missing_fields(tmp_path, name, mutate, field_):
    src = FIX / name
    recs = json.loads(src.read_text()) if name.endswith(".json") else [json.loads(x) for x in src.read_text().splitlines()]
    mutate(recs[0])
    p = _write(tmp_path, name.replace(".json", "-bad.json"), json.dumps(recs) if name.endswith(".json") else _jsonl(*recs))
    with pytest.raises(DataFormatError) as e:
        load_items(p)
    assert e.value.field == field_ and e.value.line == 1 and p.name in str(e.value)


def test_malformed_json_array_names_line(tmp_path):
    p = _write(tmp_path, "musique.json", '[\n{"id": "a",\n "question": }\n]')
    with pytest.raises(DataFormatError, match="line 3"):
        load_items(p, "musique")


def test_skip_mode_counts_every_drop(tmp_path):
    p = _write(tmp_path, "mixed.jsonl", _jsonl(GOOD, "{oops", {"id": "c:3", "passages": []},
                                              {"id": "c:4", "question": "Q", "passages": [], "label": 5},
                                              {"id": "c:5", "question": "Q", "passages": []}))
    items = load_items(p, "canonical", on_error="skip")
    rep = items.report
    assert [it.id for it in items] == ["c:1", "c:5"]
    assert (rep.read, rep.kept, sum(rep.dropped.values())) == (5, 2, 3)
    assert rep.dropped == Counter({"malformed JSON": 1, "missing field: question": 1, "unknown label: label": 1})
    assert rep.empty_passages == 1 and len(rep.first_errors) == 3


def test_unknown_format_is_explained(tmp_path):
    p = _write(tmp_path, "x.jsonl", _jsonl({"foo": 1}))
    with pytest.raises(DataFormatError, match="cannot tell the format.*qed"):
        load_items(p)
    with pytest.raises(ValueError, match="unknown format 'csv'"):
        load_items(FIX / "qed.jsonl", format="csv")


# ---------------------------------------------------------------- autorater labels, threads, passages


def test_read_autorater_labels():
    labels = read_autorater_labels(FIX / "shared" / "autorater-labels.jsonl")
    assert labels["squad2:a2"] == {"label": 0, "level": "partial", "rationale": "carver not named", "rater": "llm-autorater-v1"}
    assert len(labels) == 14


@pytest.mark.parametrize("rec, field_", [
    ({"id": "a", "label": 1, "level": "great"}, "level"),
    ({"id": "a", "label": 3, "level": "sufficient"}, "label"),
    ({"id": "a", "rationale": "none"}, "label"),
    ({"label": 1}, "id"),
])
def test_autorater_label_errors(tmp_path, rec, field_):
    p = _write(tmp_path, "labels.jsonl", _jsonl({"id": "z", "label": 0, "level": "partial"}, rec))
    with pytest.raises(DataFormatError) as e:
        read_autorater_labels(p)
    assert (e.value.line, e.value.field) == (2, field_) and "labels.jsonl" in str(e.value)


def test_retrieval_threads_fixture():
    threads = load_retrieval_threads(FIX / "retrieval.jsonl")
    assert [t.label for t in threads] == ["SKIP", "RETRIEVE", "SKIP"] and threads[1].label_id == 0
    assert all(t.split in SPLITS for t in threads)
    assert [t.split for t in threads] == [t.split for t in load_retrieval_threads(FIX / "retrieval.jsonl")]
    assert {t.split for t in load_retrieval_threads(FIX / "retrieval.jsonl", fractions=(1, 0, 0))} == {"train"}
    conv = load_retrieval_threads(FIX / "retrieval.jsonl", split_by="conversation")
    assert conv[0].split == conv[1].split  # same opening turn, same split
    with pytest.raises(ValueError, match="summing to 1"):
        load_retrieval_threads(FIX / "retrieval.jsonl", fractions=(0.5, 0.1, 0.1))


@pytest.mark.parametrize("mutate, field_", [
    (lambda r: r.update(label="MAYBE"), "label"),
    (lambda r: r["messages"][0].update(role="bot"), "messages[0].role"),
    (lambda r: r["messages"].append({"role": "assistant", "content": "hi"}), "messages[3].role"),
    (lambda r: r["messages"][1].pop("content"), "messages[1].content"),
    (lambda r: r.update(messages=[]), "messages"),
])
def test_retrieval_thread_errors(tmp_path, mutate, field_):
    recs = [json.loads(x) for x in (FIX / "retrieval.jsonl").read_text().splitlines()]
    mutate(recs[1])
    p = _write(tmp_path, "gate.jsonl", _jsonl(*recs))
    with pytest.raises(DataFormatError) as e:
        load_retrieval_threads(p)
    assert (e.value.line, e.value.field) == (2, field_) and "gate.jsonl" in str(e.value)


def test_load_passages(tmp_path):
    txt = load_passages(FIX / "passages.txt")
    assert [p.text for p in txt] == ["Blue Lake is a crater lake in Oregon.", "Red Hill is a mountain in Wales."]
    js = load_passages(FIX / "passages.jsonl")
    assert [(p.title, p.text) for p in js] == [("Blue Lake", "Blue Lake is a crater lake in Oregon."), ("", "A bare string passage.")]
    p = _write(tmp_path, "bad.jsonl", _jsonl({"title": "T", "text": "ok"}, {"title": "no text"}))
    with pytest.raises(DataFormatError, match=r"bad\.jsonl, line 2, field 'text'"):
        load_passages(p)


# ---------------------------------------------------------------- the real shared files


def test_real_items_match_readme(shared_data_dir):
    items = load_items(shared_data_dir / "items.jsonl", progress=False)
    assert len(items) == 8133 and not items.report.dropped
    counts = Counter((it.source, it.split) for it in items)
    expected = {"squad2": (4122, 635, 1321), "qed": (952, 211, 192), "hotpotqa-fullwiki": (290, 94, 116),
                "hotpotqa-distractor": (100, 0, 0), "musique": (100, 0, 0)}
    assert {it.source for it in items} == set(expected)
    for src, (tr, va, te) in expected.items():
        assert (counts[(src, "train")], counts[(src, "validation")], counts[(src, "test")]) == (tr, va, te), src
    assert items.report.empty_passages == 2
    assert {it.source for it in items if not it.passages} == {"hotpotqa-fullwiki"}
    labels = read_autorater_labels(shared_data_dir / "autorater-labels.jsonl")
    assert len(labels) == 7933 and set(labels) <= {it.id for it in items}


def test_real_sources_rebuild_items_exactly(shared_data_dir):
    """Each raw loader maps its source file onto exactly the canonical items (and the split rule holds)."""
    canon = {it.id: it for it in load_items(shared_data_dir / "items.jsonl")}
    fractions = {"qed": (0.7, 0.15, 0.15), "hotpotqa-fullwiki": (0.6, 0.2, 0.2)}
    for name, (fmt, source) in SHARED_SOURCES.items():
        items = load_items(shared_data_dir / "sources" / name)
        assert detect_format(shared_data_dir / "sources" / name) == fmt
        assert items.report.kept == sum(it.source == source for it in canon.values()), name
        for it in items:
            c = canon[it.id]
            assert (it.source, it.group, it.question, it.passages, it.gold) == (c.source, c.group, c.question, c.passages, c.gold), it.id
            if source in fractions:
                assert hash_split(it.id, fractions[source]) == c.split, it.id


def test_real_retrieval_threads(shared_data_dir):
    threads = load_retrieval_threads(shared_data_dir / "retrieval-gate" / "train.jsonl")
    assert len(threads) == 1214 and Counter(t.label for t in threads) == {"SKIP": 610, "RETRIEVE": 604}
    share = Counter(t.split for t in threads)
    assert 0.75 < share["train"] / 1214 < 0.85 and 0.07 < share["test"] / 1214 < 0.13
