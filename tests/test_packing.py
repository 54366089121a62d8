import json

import pytest
from tokenizers import Tokenizer

from suffice.serving.packing import ContextPacker, QuestionTooLongError, normalise_passages, split_sentences


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))


LONG = [
    {"title": "Filler %d" % i, "text": " ".join(f"Sentence number {j} talks about weather in town {i}." for j in range(8))}
    for i in range(6)
] + [{"title": "Eiffel Tower", "text": "The weather is mild. The Eiffel Tower was completed in 1889 by Gustave Eiffel's company."}]


def test_short_context_is_kept_whole_and_strategies_agree(tok):
    q, ps = "Where is the Eiffel Tower?", [{"title": "Paris", "text": "The Eiffel Tower is in Paris. It is tall."}]
    a = ContextPacker(tok, 128, "select").pack(q, ps)
    b = ContextPacker(tok, 128, "truncate").pack(q, ps)
    assert a.input_ids == b.input_ids and not a.truncated and a.sentences_kept == 2
    text = tok.decode(a.input_ids)
    assert text.startswith("where is the eiffel tower") and "paris : the eiffel tower is in paris. it is tall." in text
    # [CLS] q [SEP] ctx [SEP]; token types switch after the first [SEP]
    sep = a.input_ids.index(tok.token_to_id("[SEP]"))
    assert a.input_ids[0] == tok.token_to_id("[CLS]") and a.input_ids[-1] == tok.token_to_id("[SEP]")
    assert set(a.token_type_ids[: sep + 1]) == {0} and set(a.token_type_ids[sep + 1 :]) == {1}


def test_select_finds_the_answer_sentence_truncate_does_not(tok):
    q = "When was the Eiffel Tower completed?"
    sel = ContextPacker(tok, 64, "select").pack(q, LONG)
    tru = ContextPacker(tok, 64, "truncate").pack(q, LONG)
    assert len(sel.input_ids) <= 64 and len(tru.input_ids) <= 64
    assert "1889" in tok.decode(sel.input_ids) and "1889" not in tok.decode(tru.input_ids)
    assert sel.truncated and tru.truncated and sel.context_tokens_total == tru.context_tokens_total


def test_recent_keeps_the_latest_turns(tok):
    turns = [{"title": r, "text": f"turn {i} " + "words " * 20} for i, r in enumerate(["user", "assistant"] * 5)]
    p = ContextPacker(tok, 64, "recent").pack("sort that by price", turns)
    text = tok.decode(p.input_ids)
    assert "turn 9" in text and "turn 0" not in text and len(p.input_ids) <= 64


REPLY = ("Greenbasket delivery fees depend on order size and the slot you pick:\n\n"
         "| Order subtotal | Standard slot | Express |\n|---|---|---|\n"
         + "".join(f"| Band {i} filler row | ${i}.99 | ${i + 5}.99 |\n" for i in range(12))
         + "| $75 and up | Free | $5.99 |\n\nEvening slots on Fridays add a $2.00 peak surcharge.")


def test_select_lines_picks_the_table_row_the_message_is_about(tok):
    q = "how much is express for orders of $75 and up?"
    turns = [{"title": "user", "text": "how much does delivery cost with greenbasket?"}, {"title": "assistant", "text": REPLY}]
    lines = ContextPacker(tok, 64, "select_lines").pack(q, turns)
    sel = ContextPacker(tok, 64, "select").pack(q, turns)
    rec = ContextPacker(tok, 64, "recent").pack(q, turns)
    def context(p):
        return tok.decode(p.input_ids[p.question_tokens + 2:])

    assert len(lines.input_ids) <= 64 and lines.strategy == "select_lines"
    assert "75 and up | free | $ 5. 99" in context(lines)
    # select reads the whole table as one sentence: it does not fit, so only a cut head of it goes in
    assert "75 and up" not in context(sel)
    # recent keeps whole sentences from the end; without line breaks this reply is one sentence
    # that does not fit, so nothing of it goes in
    assert "75 and up" not in context(rec) and rec.context_tokens_kept == 0
    # units counted: the user's turn, then the reply's opening line, table header, 13 rows, closing sentence
    assert lines.sentences_total == 1 + (1 + 2 + 13 + 1) and lines.truncated
    # lines within a single-line text change nothing
    one = [{"title": "Paris", "text": "The Eiffel Tower is in Paris. It is tall."}]
    assert ContextPacker(tok, 128, "select_lines").pack("Where?", one).input_ids == ContextPacker(tok, 128, "select").pack("Where?", one).input_ids


def test_question_never_truncated(tok):
    long_q = "why " * 100 + "?"
    with pytest.raises(QuestionTooLongError, match="never truncated"):
        ContextPacker(tok, 32).pack(long_q, ["ctx"])
    # question that fits is kept whole even when no context fits
    p = ContextPacker(tok, 32).pack("why " * 28 + "?", LONG)
    assert p.question_tokens == 29 and len(p.input_ids) <= 32


def test_empty_passages_and_batch_padding(tok):
    packer = ContextPacker(tok, 64)
    arrays, packed = packer.pack_batch(["a question?", "another longer question here?"], [[], ["Some context. More."]])
    assert packed[0].passages_kept == 0 and packed[0].context_tokens_total == 0 and packed[0].kept_fraction == 1.0
    assert arrays["input_ids"].dtype.name == "int64" and arrays["input_ids"].shape[0] == 2
    assert arrays["attention_mask"][0].sum() == len(packed[0].input_ids)


def test_bad_inputs_name_the_fix(tok):
    with pytest.raises(ValueError, match="unknown long-context strategy"):
        ContextPacker(tok, 64, "middle")
    with pytest.raises(ValueError, match="non-empty string"):
        ContextPacker(tok, 64).pack("", ["x"])
    with pytest.raises(ValueError, match="passage 1 has no 'text' key"):
        normalise_passages(["ok", {"title": "t"}])
    with pytest.raises(ValueError, match="one list per question"):
        ContextPacker(tok, 64).pack_batch(["a?"], [])


def test_split_sentences():
    assert split_sentences("Dr. Who. It was 1999. \"Yes.\" Done") == ["Dr.", "Who.", "It was 1999.", "\"Yes.\"", "Done"]
    assert split_sentences("   ") == []


def test_select_beats_truncate_on_real_long_items(tok, shared_data_dir):
    """On multi-passage items the selected window holds the gold answer far more often."""
    rows = [json.loads(l) for l in open(shared_data_dir / "items.jsonl")]
    rows = [r for r in rows if r["source"] == "hotpotqa-distractor"][:60]
    hits = {}
    for strat in ("select", "truncate"):
        packer = ContextPacker(tok, 256, strat)
        n = 0
        for r in rows:
            ans = [a.lower() for a in r["gold"]["answers"] if a.lower() not in ("yes", "no")]
            ctx = tok.decode(packer.pack(r["question"], r["passages"]).input_ids)
            n += any(tok.decode(tok.encode(a, add_special_tokens=False).ids) in ctx for a in ans)
        hits[strat] = n
    assert hits["select"] > hits["truncate"] * 1.5, hits


def test_bundle_manifest_accepts_exactly_the_packing_strategies():
    """serving.bundle keeps its own copy (it stays stdlib-only); the two lists must not drift."""
    from suffice.serving.bundle import STRATEGIES as MANIFEST_STRATEGIES
    from suffice.serving.packing import STRATEGIES

    assert MANIFEST_STRATEGIES == STRATEGIES
