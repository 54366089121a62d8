"""The ``referenced_turn`` packing strategy: the turn a follow-up refers to survives a long thread, and
training and serving hand the packer the same thread (one owner: ``serving.gates.retrieval.thread_input``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from suffice.serving.packing import ContextPacker, referenced_tiers

REPO = Path(__file__).resolve().parent.parent

# earlier exchanges that share every word of the new message: select_lines fills the window with them
EARLIER = [
    {"title": "user", "text": "How much does express delivery cost for large orders?"},
    {"title": "assistant", "text": "\n".join(f"Express delivery for large orders in zone {i} costs ${i}.99 per order." for i in range(6))},
    {"title": "user", "text": "And is express delivery cost for large orders lower on weekdays?"},
]
LAST_REPLY = "Yes: on weekdays it is half price.\nThe discount ends at 6 pm."
QUESTION = "so express delivery cost for large orders on a weekday is half?"


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))


def context(tok, p) -> str:
    return tok.decode(p.input_ids[p.question_tokens + 2:-1])


def test_the_latest_reply_survives_a_long_thread_whole(tok):
    turns = [*EARLIER, {"title": "assistant", "text": LAST_REPLY}]
    ref = ContextPacker(tok, 64, "referenced_turn").pack(QUESTION, turns)
    lines = ContextPacker(tok, 64, "select_lines").pack(QUESTION, turns)
    assert ref.truncated and lines.truncated and len(ref.input_ids) <= 64 and ref.strategy == "referenced_turn"
    reply = tok.decode(tok.encode(LAST_REPLY, add_special_tokens=False).ids)
    assert reply in context(tok, ref)
    # the user turn it answered comes next, whole (it fits after the reply)
    assert "and is express delivery cost for large orders lower on weekdays?" in context(tok, ref)
    # select_lines spends the window on the earlier exchange that repeats the message's words
    assert "the discount ends at 6 pm" not in context(tok, lines)


def test_a_reply_longer_than_the_window_keeps_its_relevant_lines_first(tok):
    reply = "Fees by order size:\n" + "".join(f"| Band {i} | ${i}.99 |\n" for i in range(30)) + "| $75 and up | Free |"
    turns = [*EARLIER, {"title": "assistant", "text": reply}]
    q = "is delivery free for $75 and up?"
    ref = ContextPacker(tok, 64, "referenced_turn").pack(q, turns)
    text = context(tok, ref)
    assert len(ref.input_ids) <= 64 and "75 and up | free" in text
    # the whole window goes to the reply: nothing of the earlier turns, not even the user turn it answered
    assert ref.passages_kept == 1 and text.startswith("assistant :")


def test_short_threads_pack_as_select_lines_and_select(tok):
    turns = [{"title": "user", "text": "What fruit do you have?"}, {"title": "assistant", "text": "| Bananas | $0.69 |\n| Grapes | $3.29 |"}]
    packs = [ContextPacker(tok, 128, s).pack("Sort that by price", turns) for s in ("referenced_turn", "select_lines")]
    assert not packs[0].truncated and packs[0].input_ids == packs[1].input_ids


def test_referenced_tiers_name_the_latest_reply_and_its_question():
    assert referenced_tiers(["system", "user", "assistant", "user", "assistant"]) == [2, 2, 2, 1, 0]
    assert referenced_tiers(["user", "assistant", "user"]) == [1, 0, 2]  # a user message after the reply (sent twice): the reply still leads
    assert referenced_tiers(["assistant"]) == [0] and referenced_tiers([]) == []
    assert referenced_tiers(["Paris", "London"]) == [2, 0]  # no chat roles: the last passage
    assert referenced_tiers(["system", "user", "assistant", "user", "assistant"], question_first=True) == [2, 2, 2, 0, 1]


def test_referenced_exchange_keeps_the_question_then_the_reply(tok):
    turns = [*EARLIER, {"title": "assistant", "text": "\n".join(f"Line {i} of the reply about nothing much at all." for i in range(20))}]
    exch = ContextPacker(tok, 64, "referenced_exchange").pack(QUESTION, turns)
    turn = ContextPacker(tok, 64, "referenced_turn").pack(QUESTION, turns)
    asked = "and is express delivery cost for large orders lower on weekdays?"
    assert context(tok, exch).startswith("user : " + asked + " assistant : line 0") and asked not in context(tok, turn)


def _long_threads(path: Path) -> list[dict]:
    """Threads past the serving window of 6 earlier turns, with an empty turn and a reply longer than 64 tokens."""
    threads = []
    for k in range(4):
        messages = []
        for t in range(4 + k):
            messages.append({"role": "user", "content": f"Question {t} about plan {k}: what does the annual plan include?"})
            messages.append({"role": "assistant", "content": "" if t == 1 else "\n".join(
                f"- plan {k} feature {f}: storage tier {f} with {f * 10} GB" for f in range(3 + t))})
        messages.append({"role": "user", "content": "which of those has the most storage?" if k % 2 else "what about the monthly plan?"})
        threads.append({"id": f"t{k}", "messages": messages, "label": "SKIP" if k % 2 else "RETRIEVE"})
    path.write_text("".join(json.dumps(t) + "\n" for t in threads))
    return threads


@pytest.fixture(scope="module")
def referenced_gate_bundle(tiny_bert_dir, tmp_path_factory):
    pytest.importorskip("optimum")
    from serving_support import make_model_dir
    from suffice.training.export import export_bundle

    root = tmp_path_factory.mktemp("refgate")
    md = make_model_dir(tiny_bert_dir, root / "model", task="retrieval_gate", lora=False, max_length=64, strategy="referenced_turn")
    items = [{"question": "Sort that?", "passages": [{"title": "assistant", "text": "Refunds within 30 days."}]}] * 10
    return md, export_bundle(md, root / "bundle", items)


def test_training_and_serving_pack_a_thread_identically(referenced_gate_bundle, tmp_path):
    """The rows training encodes (gate_training_rows -> its ContextPacker) and what RetrievalGate.decide packs
    (build_input -> the bundle's packer) are the same token ids, for threads longer than the window and than
    serving's 6 earlier turns."""
    from suffice.serving import RetrievalGate
    from suffice.training.data.threads import gate_training_rows
    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.run import base_and_packer

    model_dir, bundle = referenced_gate_bundle
    threads = _long_threads(tmp_path / "threads.jsonl")
    cfg = build_train_config(REPO / "configs" / "retrieval-gate.yaml", [
        f"--gate.path={tmp_path / 'threads.jsonl'}", "--gate.split=opening_message", f"--base_model={model_dir}",
        "--max_length=64", "--long_context_strategy=referenced_turn"])
    _, train_packer = base_and_packer(cfg)
    gate = RetrievalGate.load(bundle)
    assert gate._packer.strategy == train_packer.strategy == "referenced_turn"
    rows = {r["id"]: r for r in gate_training_rows(cfg.gate.path)}
    cut = 0
    for t in threads:
        trained = train_packer.pack(rows[t["id"]]["question"], rows[t["id"]]["passages"])
        served = gate._packer.pack(*gate.build_input(t["messages"]))
        assert trained.input_ids == served.input_ids and trained.token_type_ids == served.token_type_ids
        cut += trained.truncated
        # the latest reply (longer than the window) leads it: its opening line is in, the earlier turns are not
        first = t["messages"][-2]["content"].splitlines()[0]
        text = context(gate._model.tokenizer, served)
        assert text.startswith("assistant :") and served.passages_kept == 1
        assert gate._model.tokenizer.decode(gate._model.tokenizer.encode(first, add_special_tokens=False).ids) in text
    assert cut == len(threads)
    assert max(len(r["passages"]) for r in rows.values()) == 6  # the 6-turn window applies to training rows too


def test_packing_report_counts_the_latest_reply_kept(tok):
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_gate_packing import packing_report

    rows = [{"question": QUESTION, "passages": [*EARLIER, {"title": "assistant", "text": LAST_REPLY}], "label": 1},
            {"question": "Thanks!", "passages": [{"title": "user", "text": "Hi?"}, {"title": "assistant", "text": "Hello."}], "label": 1}]
    r = packing_report(rows, tok, 64, ["select_lines", "referenced_turn"])
    assert r["n"] == 2 and r["packed_differently"] == 1
    assert r["referenced_turn"]["reply_whole"] == 1.0 and r["select_lines"]["reply_whole"] == 0.5
    assert r["select_lines"]["truncated"] == 0.5 and r["select_lines"]["reply_cut_skip_threads"] == 1
