"""RetrievalGate in serving: first turn, fail-open, packing of previous turns, thresholds."""

from __future__ import annotations

import json
import shutil

import pytest

from serving_support import make_model_dir, rewrite_manifest

pytest.importorskip("optimum")

THREAD = [
    {"role": "system", "content": "You are the support assistant."},
    {"role": "user", "content": "What is the refund policy for annual plans?"},
    {"role": "assistant", "content": "Annual plans can be refunded within 30 days of purchase."},
    {"role": "user", "content": "Thanks! Can you put that in a bullet list?"},
]


@pytest.fixture(scope="module")
def gate_bundle(tiny_bert_dir, tmp_path_factory):
    from suffice.training.export import export_bundle

    root = tmp_path_factory.mktemp("gate")
    md = make_model_dir(tiny_bert_dir, root / "model", task="retrieval_gate", lora=False, max_length=64)
    items = [{"question": m["content"], "passages": [{"title": "assistant", "text": "Refunds within 30 days."}]} for m in THREAD[1::2]]
    return export_bundle(md, root / "bundle", items * 5)


def test_manifest_and_decisions(gate_bundle):
    from suffice.serving import RetrievalGate, RetrievalGateConfig

    gate = RetrievalGate.load(gate_bundle)
    assert gate._model.manifest.task == "retrieval_gate" and gate._model.manifest.id2label == {0: "RETRIEVE", 1: "SKIP"}
    d = gate.decide(THREAD)
    assert d.decision in ("RETRIEVE", "SKIP") and 0.0 <= d.score <= 1.0 and d.latency_ms > 0 and "P(SKIP)" in d.reason
    always_skip = RetrievalGate.load(gate_bundle, RetrievalGateConfig(skip_threshold=0.0)).decide(THREAD)
    never_skip = RetrievalGate.load(gate_bundle, RetrievalGateConfig(skip_threshold=1.0)).decide(THREAD)
    assert always_skip.decision == "SKIP" and never_skip.decision == "RETRIEVE"
    assert always_skip.score == pytest.approx(d.score)


def test_first_user_message_retrieves_without_the_model(gate_bundle):
    from suffice.serving import RetrievalGate

    gate = RetrievalGate.load(gate_bundle)
    gate._model = None  # would raise if the model were touched
    d = gate.decide(THREAD[:2])
    assert d.decision == "RETRIEVE" and d.score is None and d.reason.startswith("first_turn")


@pytest.mark.parametrize("bad", [None, "hello", [], [{"role": "user"}], [{"role": "assistant", "content": "hi"}],
                                 [{"role": "user", "content": "a"}, {"role": "user", "content": "  "}], [42]])
def test_malformed_input_fails_open(gate_bundle, bad):
    from suffice.serving import RetrievalGate

    d = RetrievalGate.load(gate_bundle).decide(bad)
    assert d.decision == "RETRIEVE" and d.reason.startswith("malformed_input")


def test_errors_fail_open_and_long_questions_are_never_truncated(gate_bundle):
    from suffice.serving import RetrievalGate

    from suffice.serving import RetrievalGateConfig

    long_q = "please explain " + "the refund policy " * 40
    d = RetrievalGate.load(gate_bundle, RetrievalGateConfig(ood_guard=False)).decide(THREAD[:3] + [{"role": "user", "content": long_q}])
    assert d.decision == "RETRIEVE" and "QuestionTooLongError" in d.reason
    gate = RetrievalGate.load(gate_bundle)  # with the guard (the default) a message that long never reaches the model
    d = gate.decide(THREAD[:3] + [{"role": "user", "content": long_q}])
    assert d.decision == "RETRIEVE" and d.score is None and d.reason.startswith("out_of_distribution") and "60 words" in d.reason

    class Broken:
        def __getattr__(self, name):
            raise RuntimeError("session crashed")

    gate._model = Broken()
    d = gate.decide(THREAD)
    assert d.decision == "RETRIEVE" and "session crashed" in d.reason


@pytest.mark.parametrize("message,why", [("А сколько стоит годовой план?", "Latin script"),
                                         ("¿Y cuánto cuesta el plan anual para dos personas?", "not in English"),
                                         ("Und wie viel kostet das für ein Team?", "not in English")])
def test_out_of_distribution_messages_retrieve_without_the_model(gate_bundle, message, why):
    """SKIP claims the conversation answers the message; for a script or language the gate never saw it fails open."""
    from suffice.serving import RetrievalGate, RetrievalGateConfig

    always = RetrievalGateConfig(skip_threshold=0.0)  # every message the model reads would be SKIP
    thread = THREAD[:3] + [{"role": "user", "content": message}]
    gate = RetrievalGate.load(gate_bundle, always)
    gate._model = None  # would raise if the model were touched
    d = gate.decide(thread)
    assert d.decision == "RETRIEVE" and d.score is None and d.reason.startswith("out_of_distribution") and why in d.reason
    off = RetrievalGate.load(gate_bundle, RetrievalGateConfig(skip_threshold=0.0, ood_guard=False)).decide(thread)
    assert off.decision == "SKIP" and off.score is not None
    assert RetrievalGate.load(gate_bundle, always).decide(THREAD).decision == "SKIP"  # English passes the guard


@pytest.mark.parametrize("message", ["Now find me all fruits under $2", "can you look up the opening hours?",
                                     "Are there any others?", "what else do you have?", "any more options for two people"])
def test_search_requests_retrieve_without_the_model(gate_bundle, message):
    """A message that asks for a search, or for more than the conversation showed, is new knowledge by request."""
    from suffice.serving import RetrievalGate, RetrievalGateConfig

    always = RetrievalGateConfig(skip_threshold=0.0)  # every message the model reads would be SKIP
    thread = THREAD[:3] + [{"role": "user", "content": message}]
    gate = RetrievalGate.load(gate_bundle, always)
    gate._model = None  # would raise if the model were touched
    d = gate.decide(thread)
    assert d.decision == "RETRIEVE" and d.score is None and d.reason.startswith("search_request")
    off = RetrievalGate.load(gate_bundle, RetrievalGateConfig(skip_threshold=0.0, search_guard=False)).decide(thread)
    assert off.decision == "SKIP" and off.score is not None


@pytest.mark.parametrize("message", ["Which of those are under $2?", "I find that confusing, say it simpler",
                                     "Sort that by price", "Thanks, that is all I needed"])
def test_follow_ups_on_what_was_shown_are_not_search_requests(message):
    from suffice.serving.gates.retrieval import search_request

    assert not search_request(message)


def test_previous_turns_packed_recent_first(gate_bundle):
    from suffice.serving import RetrievalGate, RetrievalGateConfig

    gate = RetrievalGate.load(gate_bundle, RetrievalGateConfig(context_turns=2))
    old = [{"role": "user", "content": f"Old question number {i} about invoices?"} for i in range(5)]
    thread = old + [{"role": "assistant", "content": "Invoices are emailed monthly."}, {"role": "user", "content": "Shorter please."}]
    q, passages = gate.build_input(thread)
    assert q == "Shorter please." and [p["title"] for p in passages] == ["user", "assistant"]
    assert passages[-1]["text"] == "Invoices are emailed monthly."
    wide = RetrievalGate.load(gate_bundle, RetrievalGateConfig(context_turns=20))
    q, passages = wide.build_input(thread)
    packed = wide._packer.pack(q, passages)
    assert packed.strategy == "recent" and packed.truncated
    ids = packed.input_ids
    tail = wide._model.tokenizer.encode("Invoices are emailed monthly.", add_special_tokens=False).ids
    assert ids[-1 - len(tail):-1] == tail  # the most recent turn survives; the oldest were trimmed
    with pytest.raises(ValueError, match="exceeds the model's window"):
        RetrievalGate.load(gate_bundle, RetrievalGateConfig(max_tokens=4096))


def test_gate_packs_with_the_bundle_strategy(gate_bundle, tmp_path):
    """A select_lines bundle is packed with select_lines (as it was trained); truncate is refused."""
    from suffice.serving import RetrievalGate

    m = json.loads((gate_bundle / "suffice.json").read_text())
    for strategy in ("select_lines", "truncate"):
        other = tmp_path / strategy
        shutil.copytree(gate_bundle, other)
        rewrite_manifest(other, {**m, "long_context_strategy": strategy})
        if strategy == "truncate":
            with pytest.raises(ValueError, match="retrain it with long_context_strategy select_lines"):
                RetrievalGate.load(other)
            continue
        gate = RetrievalGate.load(other)
        table = "Fees:\n" + "".join(f"| plan {i} | ${i}.99 |\n" for i in range(30)) + "| annual plan | $99 |"
        thread = [{"role": "user", "content": "What do plans cost?"}, {"role": "assistant", "content": table},
                  {"role": "user", "content": "Is the annual plan $99?"}]
        packed = gate._packer.pack(*gate.build_input(thread))
        assert packed.strategy == "select_lines" and packed.truncated
        assert "annual plan | $ 99" in gate._model.tokenizer.decode(packed.input_ids[packed.question_tokens + 2:])
        assert gate.decide(thread).score is not None


def test_sufficiency_bundle_is_refused(tiny_bert_dir, tmp_path, gate_bundle):
    from suffice.serving import BundleError, RetrievalGate

    m = json.loads((gate_bundle / "suffice.json").read_text())
    other = tmp_path / "b"
    shutil.copytree(gate_bundle, other)
    rewrite_manifest(other, {**m, "task": "sufficiency", "id2label": {"0": "insufficient", "1": "sufficient"},
                             "positive_label": "sufficient", "thresholds": {"sufficient": 0.8, "partial": 0.5}})
    with pytest.raises(BundleError, match="SufficiencyScorer.load"):
        RetrievalGate.load(other)


def test_gate_benchmark_measures_the_bundle_on_held_out_threads(gate_bundle, tiny_bert_dir, tmp_path):
    """benchmarks/bench_retrieval_gate.py on a tiny bundle and a 40-thread file: every number is finite."""
    import math
    import sys

    from conftest import REPO

    threads = tmp_path / "threads.jsonl"
    with threads.open("w") as f:
        for i in range(40):
            follow = "Thanks, put that in a table" if i % 2 else f"What about plan number {i}?"
            msgs = [{"role": "user", "content": f"What does plan {i} cost?"},
                    {"role": "assistant", "content": f"Plan {i} costs ${i}.99 a month."},
                    {"role": "user", "content": follow}]
            f.write(json.dumps({"id": f"t{i}", "messages": msgs, "label": "SKIP" if i % 2 else "RETRIEVE", "category": "x"}) + "\n")
    from suffice.training.data.styles import STYLES
    from suffice.training.export import export_bundle

    md = make_model_dir(tiny_bert_dir, tmp_path / "suff-model", lora=False, max_length=64)
    suff_bundle = export_bundle(md, tmp_path / "suff-bundle", [{"question": "What does plan 1 cost?", "passages": ["Plan 1 costs $1."]}] * 4)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_retrieval_gate as bench
    finally:
        sys.path.pop(0)
    # the shipped config trains on styled copies; gate.styles=[] measures every style as held out
    lines = threads.read_text().splitlines()
    writers = [tmp_path / "writer-a.jsonl", tmp_path / "writer-b.jsonl"]  # threads by other writers (issue 33)
    writers[0].write_text("\n".join(lines[:10]) + "\n")
    writers[1].write_text("\n".join(lines[10:16]) + "\n")
    r = bench.run(gate_bundle, str(REPO / "configs" / "retrieval-gate.yaml"), [f"--gate.path={threads}", "--gate.test_fraction=0.3", "--gate.styles=[]"],
                  threads=1, other_writers=writers)
    ow = r["other_writers"]
    assert ow["n"] == {"writer-a": 10, "writer-b": 6} and set(ow["sets"]) == {"writer-a", "writer-b", "pooled"}
    assert ow["sets"]["pooled"]["stored"]["n"] == 16 and set(ow["goals"]) == {"skip_precision>=0.95", "skip_rate>=0.30", "macro_f1>=0.90"}
    assert sum(c["n"] for c in ow["by_category"].values()) == 16 and "== threads by other writers" in bench.format_report(r)
    assert r["n_test"] > 0 and r["n_train"] + r["n_test"] <= 40
    for k in ("int8", "fp32", "tfidf_lr"):
        assert 0.0 <= r[k]["macro_f1"] <= 1.0 and 0.0 <= r[k]["skip_rate"] <= 1.0
    assert r["int8"]["fail_open_count"] == 0
    for k in ("int8", "fp32"):  # the classifier's own decision beside the stored precision-first threshold
        assert 0.0 <= r[k]["at_0.5"]["macro_f1"] <= 1.0 and 0.0 <= r[k]["auroc"] <= 1.0
    assert r["f1_points_over_tfidf"] == pytest.approx(100 * (r["int8"]["at_0.5"]["macro_f1"] - r["tfidf_lr"]["macro_f1"]))
    assert math.isfinite(r["latency_128"]["p50_ms"]) and r["latency_128"]["p50_ms"] > 0
    assert 0 < r["latency_128"]["mean_tokens"] <= 64  # this bundle's window is 64 tokens
    assert len(r["acceptance"]) == 7 and r["acceptance"][-1]["decision"] == "RETRIEVE"  # the first message never runs the model
    assert set(r["goals"]) >= {"macro_f1>=0.90", "acceptance_examples"}
    assert "retrieval gate on" in bench.format_report(r)
    # issue 33: the test threads in the styles training did not use, each with the combinations
    sr = r["styles"]
    assert sr["trained_styles"] == [] and set(sr["held_out_styles"]) == set(STYLES)
    assert sr["split"] == "opening_message" and set(sr["sets"]) == {"own", "held_out_pooled", *STYLES}
    n = r["n_test"]
    assert sr["sets"]["held_out_pooled"]["stored"]["n"] == n * len(STYLES)
    for e in sr["sets"].values():
        assert set(e["combinations"]) == {"model", "model+ood", "model+ood+search", "model+ood+referent"} and 0.0 <= e["ood_rate"] <= 1.0
        assert 0.0 <= e["search_request_rate"] <= 1.0
        assert e["combinations"]["model+ood+referent"]["skip_rate"] <= e["combinations"]["model"]["skip_rate"]
    assert "== styles" in bench.format_report(r)
    scored = bench.run(gate_bundle, str(REPO / "configs" / "retrieval-gate.yaml"), [f"--gate.path={threads}", "--gate.test_fraction=0.3", "--gate.styles=[]"],
                       threads=1, styles=["typos"], scorer=suff_bundle, suff_threshold=0.0, other_writers=[])
    assert "other_writers" not in scored
    combos = scored["styles"]["sets"]["typos"]["combinations"]
    # the second opinion at threshold 0 always agrees: the same decisions as without it
    assert combos["model+ood+sufficiency"] == combos["model+ood"]
    assert set(scored["styles"]["sets"]) == {"own", "typos", "held_out_pooled"}
    assert scored["styles"]["second_opinion_ms"]["p50"] > 0
