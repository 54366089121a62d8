"""Baselines: each rule does what it says, fits on train only, and skips what it cannot score."""

from __future__ import annotations

import json

import numpy as np
import pytest

from suffice.training.evaluation.baselines import (
    AnswerInContextBaseline,
    KeywordCoverageBaseline,
    TfidfLogisticBaseline,
    best_threshold,
    context_text,
    load_gold_answers,
    normalise_answer,
    run_baselines,
)


def P(text, title=""):
    return [{"title": title, "text": text}]


def test_normalise_answer_is_squad_style():
    assert normalise_answer("The Eiffel Tower!") == "eiffel tower"
    assert normalise_answer("  an   Apple, a day ") == "apple day"


def test_context_text_keeps_titles():
    assert context_text([{"title": "Paris", "text": "Big."}, "Plain."]) == "Paris: Big.\nPlain."


def test_answer_in_context_matches_normalised_substrings_only():
    b = AnswerInContextBaseline()
    s = b.score(["q"] * 3, [P("Built in 1911 by the city."), P("Built by the city."), P("Anything")],
                answers=[["1911"], ["1911"], []])
    assert s.tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="needs the gold answers"):
        b.score(["q"], [P("x")])


def test_keyword_coverage_threshold_is_fitted_on_train_labels():
    qs = ["When did Chopin move to Paris?", "When did Chopin move to Vienna?"] * 3
    ps = [P("Chopin moved to Paris in 1831.")] * 6
    b = KeywordCoverageBaseline().fit(qs, ps, np.array([1, 0] * 3))
    scores = b.score(qs, ps)
    assert scores[0] == 1.0 and scores[1] < 1.0
    assert b.predict(scores).tolist() == [1, 0] * 3


def test_best_threshold_maximises_macro_f1():
    assert best_threshold(np.array([0.2, 0.3, 0.7, 0.8]), np.array([0, 0, 1, 1])) == 0.7


def test_tfidf_lr_learns_a_separable_signal_and_needs_fitting():
    qs = [f"what is the date of event {i}" for i in range(20)]
    ps = [P("the event happened on a date" if i % 2 else "unrelated gardening text about roses") for i in range(20)]
    y = np.array([i % 2 for i in range(20)])
    with pytest.raises(RuntimeError, match="not fitted"):
        TfidfLogisticBaseline().score(qs, ps)
    b = TfidfLogisticBaseline().fit(qs, ps, y)
    assert (b.predict(b.score(qs, ps)) == y).mean() == 1.0
    with pytest.raises(ValueError, match="both classes"):
        TfidfLogisticBaseline().fit(qs, ps, np.zeros(20, dtype=int))


def test_run_baselines_skips_answer_in_context_without_answers_and_rejects_unknown_names():
    tr = {"question": ["Who won?", "Who lost?"] * 4, "passages": [P("Ann won the race."), P("Nothing here.")] * 4, "label": [1, 0] * 4}
    out = run_baselines(["keyword_coverage", "answer_in_context", "tfidf_lr"], tr, tr)
    assert sorted(out) == ["keyword_coverage", "tfidf_lr"]
    assert out["tfidf_lr"].scores.shape == (8,)
    with pytest.raises(ValueError, match="unknown baseline 'bm25'"):
        run_baselines(["bm25"], tr, tr)
    with_answers = dict(tr, answers=[["Ann"], []] * 4)
    out = run_baselines(["answer_in_context"], with_answers, with_answers)
    assert out["answer_in_context"].predictions.tolist() == [1, 0] * 4


def test_load_gold_answers_reads_canonical_items(tmp_path):
    p = tmp_path / "items.jsonl"
    p.write_text("\n".join(json.dumps(d) for d in [
        {"id": "a", "gold": {"answers": ["France"]}}, {"id": "b", "gold": {"answers": []}}, {"id": "c", "gold": {}}]) + "\n")
    assert load_gold_answers(p) == {"a": ["France"], "b": []}
    p.write_text("{not json\n")
    with pytest.raises(ValueError, match="line 1"):
        load_gold_answers(p)
