"""ContextGate, SafetyGate and SelectiveAnswerer: the documented examples and every reason."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from suffice.serving import (
    ContextGate,
    ContextGateConfig,
    RejectionReason,
    SafetyGate,
    SafetyThresholds,
    SelectiveAnswerer,
)
from suffice.serving.lexical import keyword_coverage


@dataclass
class _R:
    score: float
    level: str
    missing_aspects: tuple = ()


class LexicalScorer:
    """A stand-in scorer: the lexical coverage as the 'model' score (deterministic)."""

    def __init__(self, fixed_level: str | None = None):
        self.fixed_level = fixed_level

    def score_batch(self, questions, passages_list):
        return [self.score(q, p) for q, p in zip(questions, passages_list)]

    def score(self, q, passages):
        s = keyword_coverage(q, [p if isinstance(p, str) else p["text"] for p in passages]).score
        return _R(s, self.fixed_level or ("sufficient" if s >= 0.8 else "partial" if s >= 0.5 else "insufficient"))


ARTIFACTS = [
    {"id": "sys", "kind": "system", "authority": 3, "content": "You are a careful travel assistant. Answer only from the documents below, and say so when they do not cover the question."},
    {"id": "task", "kind": "task", "authority": 2, "content": "Answer the user question in at most two sentences and cite every document you use as [id]."},
    {"id": "q", "kind": "message", "authority": 1, "content": "What is the capital of France and what river runs through it?"},
    {"id": "paris-1", "kind": "document", "content": "Paris is the capital and largest city of France."},
    {"id": "promo", "kind": "document", "content": "Limited offer: save 20% on premium luggage with code TRAVEL20 today!"},
    {"id": "paris-2", "kind": "document", "content": "The Seine river runs through Paris, the capital of France."},
]


@pytest.mark.parametrize("scorer", [None, LexicalScorer()], ids=["lexical", "scorer"])
def test_context_gate_classic_example(scorer):
    gate = ContextGate(scorer, ContextGateConfig(doc_cap=3))
    sel = gate.select(ARTIFACTS, budget_tokens=120)
    assert [a.id for a in sel.admitted] == ["sys", "task", "q", "paris-2", "paris-1"]
    assert sel.reasons() == {"promo": "out_of_scope"}
    assert sel.tokens_used <= 120
    assert sel.context.startswith("[system:sys]\n") and "[document:paris-2]\nThe Seine" in sel.context
    assert "TRAVEL20" not in sel.context
    tight = gate.select(ARTIFACTS, budget_tokens=60)
    assert [a.id for a in tight.admitted] == ["sys", "task"]
    assert tight.reasons() == {"promo": "out_of_scope", "q": "budget", "paris-2": "budget", "paris-1": "budget"}


def test_context_gate_doc_cap_empty_and_threshold():
    arts = ARTIFACTS + [{"id": "blank", "kind": "document", "content": "  "}]
    sel = ContextGate(None).select(arts, budget_tokens=500, doc_cap=1)
    assert sel.reasons() == {"blank": "empty", "promo": "out_of_scope", "paris-1": "doc_cap"}
    everything = ContextGate(None, ContextGateConfig(relevance_threshold=0.0)).select(arts, budget_tokens=500, doc_cap=5)
    assert "promo" in [a.id for a in everything.admitted]
    with pytest.raises(ValueError, match="unknown key"):
        ContextGate(None).select([{"id": "x", "kind": "document", "content": "a", "prio": 1}])
    with pytest.raises(ValueError, match="kind"):
        ContextGate(None).select([{"id": "x", "kind": "memo", "content": "a"}])


def test_context_gate_orders_by_authority_then_kind_then_priority():
    arts = [
        {"id": "d-low", "kind": "document", "priority": 0, "content": "Paris is the capital of France."},
        {"id": "d-high", "kind": "document", "priority": 5, "content": "France's capital is Paris."},
        {"id": "m", "kind": "message", "content": "What is the capital of France?"},
        {"id": "trusted-doc", "kind": "document", "authority": 9, "content": "Paris: capital of France."},
    ]
    sel = ContextGate(None).select(arts, budget_tokens=500)
    assert [a.id for a in sel.admitted] == ["trusted-doc", "m", "d-high", "d-low"]


CHUNKS = [
    {"text": "Paris is the capital and most populous city of France, with about 2.1 million residents.", "score": 0.82},
    {"text": "The Seine river flows through Paris before reaching the English Channel at Le Havre.", "score": 0.75},
]
Q = "What is the capital of France?"


def test_safety_gate_accepts_a_grounded_cited_answer():
    r = SafetyGate(LexicalScorer()).check(Q, CHUNKS, answer="The capital of France is Paris [1]. Paris is also the most populous city of France [1].")
    assert not r.should_reject and r.rejection_reason is None and r.failed_checks == []
    assert set(r.passed_checks) == {"retrieval_confidence", "context_sufficiency", "relevance", "citation_coverage", "citation_validity", "grounding"}
    assert 0.5 < r.confidence <= 1.0 and r.explanation.startswith("answer:")


@pytest.mark.parametrize("case,chunks,answer,reason", [
    ("low retrieval scores", [{**c, "score": 0.3} for c in CHUNKS], None, RejectionReason.LOW_CONFIDENCE),
    ("no chunks", [], None, RejectionReason.INSUFFICIENT_CONTEXT),
    ("too little text", [{"text": "Paris is the capital of France.", "score": 0.9}], None, RejectionReason.INSUFFICIENT_CONTEXT),
    ("off topic", [{"text": "Our premium luggage is on sale this week with free shipping on all orders over fifty dollars.", "score": 0.9}] * 2,
     None, RejectionReason.OFF_TOPIC),
    ("uncited sentence", CHUNKS, "The capital of France is Paris [1]. Paris is the most populous city of France [1]. "
     "The Seine flows through Paris [2]. It reaches the Channel at Le Havre.", RejectionReason.MISSING_CITATIONS),
    ("citation to nothing", CHUNKS, "The capital of France is Paris [1]. Paris is the most populous city of France [1, 7].", RejectionReason.INVALID_CITATIONS),
    ("unsupported claims", CHUNKS, "The capital of France is Paris [1]. Paris hosted the Olympic Games in 1924 and 2024 [2].", RejectionReason.LOW_GROUNDING),
])
def test_safety_gate_rejection_reasons(case, chunks, answer, reason):
    r = SafetyGate().check(Q, chunks, answer=answer)
    assert r.should_reject and r.rejection_reason == reason, (case, r.failed_checks, r.explanation)
    assert r.explanation.startswith("I don't know:")


def test_safety_gate_off_topic_and_scorer_insufficient_alone():
    off = [{"text": "Our premium luggage is on sale this week with free shipping on all orders over fifty dollars and more.", "score": 0.9}]
    r = SafetyGate(thresholds=SafetyThresholds()).check(Q, off)
    assert r.rejection_reason == RejectionReason.OFF_TOPIC and r.failed_checks == ["relevance"]
    r = SafetyGate(LexicalScorer(fixed_level="insufficient")).check(Q, CHUNKS)
    assert r.rejection_reason == RejectionReason.INSUFFICIENT_CONTEXT
    assert r.diagnostics["sufficiency_level"] == "insufficient"


def test_safety_gate_multiple_issues_lists_them():
    r = SafetyGate().check(Q, [{**c, "score": 0.1} for c in CHUNKS], answer="Paris is lovely in spring.")
    assert r.rejection_reason == RejectionReason.MULTIPLE_ISSUES
    assert {"retrieval_confidence", "citation_coverage", "grounding"} <= set(r.failed_checks)
    assert all(k in r.diagnostics["checks"] for k in r.failed_checks)
    with pytest.raises(ValueError, match="min_grounding"):
        SafetyThresholds(min_grounding=7)


def test_selective_answerer_fit_save_load_and_coverage(tmp_path):
    rng = np.random.default_rng(0)
    n = 400
    suff = rng.uniform(size=n)
    conf = rng.uniform(size=n)
    correct = (rng.uniform(size=n) < 0.15 + 0.5 * suff + 0.3 * conf).astype(int)
    m = SelectiveAnswerer.fit(suff, conf, correct, coverage=0.6)
    assert abs(m.metrics["achieved_coverage"] - 0.6) < 0.02
    assert m.metrics["selective_accuracy"] > m.metrics["base_accuracy"]
    assert m.weights[0] > 0 and m.weights[1] > 0
    path = m.save(tmp_path / "sel.json")
    assert json.loads(path.read_text())["format"] == "suffice-selective/1"
    back = SelectiveAnswerer.load(path)
    assert back == m
    assert back.decide(0.99, 0.99).abstain is False and back.decide(0.01, 0.01).abstain is True
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a suffice selective model"):
        SelectiveAnswerer.load(tmp_path / "bad.json")


def test_fit_selective_cli_writes_model_and_plot(tmp_path):
    from suffice.training.evaluation.selective_fit import main

    rng = np.random.default_rng(1)
    rows = [{"sufficiency": float(s), "confidence": float(c), "correct": int(rng.uniform() < 0.2 + 0.6 * s)}
            for s, c in rng.uniform(size=(200, 2))]
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    assert main(["--data", str(data), "--out", str(tmp_path / "m.json"), "--coverage", "0.7", "--plot", str(tmp_path / "c.png")]) == 0
    assert SelectiveAnswerer.load(tmp_path / "m.json").coverage == 0.7
    assert (tmp_path / "c.png").stat().st_size > 1000
    data.write_text(json.dumps({"confidence": 0.5}))
    assert main(["--data", str(data), "--out", str(tmp_path / "m2.json")]) == 2
