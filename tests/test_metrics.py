"""Metrics, calibration and plots: known values, edge cases, files written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from suffice.serving.calibration import softmax
from suffice.serving.jsonl import json_safe
from suffice.training.fit.calibration import fit_temperature, nll, threshold_for_precision
from suffice.training.evaluation.metrics import (
    classification_metrics,
    cohen_kappa,
    expected_calibration_error,
    flat_metrics,
    format_table,
    per_source_metrics,
    plot_confusion_matrix,
    plot_precision_recall,
    plot_reliability,
    plot_selective_accuracy,
    reliability_bins,
    selective_accuracy,
)

NAMES = ["insufficient", "sufficient"]


def test_ece_perfectly_calibrated_bins_is_zero_and_overconfident_is_not():
    scores = np.array([0.25] * 4 + [0.75] * 4)
    outcomes = np.array([1, 0, 0, 0, 1, 1, 1, 0])
    assert expected_calibration_error(scores, outcomes, bins=10) == pytest.approx(0.0)
    assert expected_calibration_error(np.array([0.99] * 4), np.array([1, 0, 1, 0]), bins=10) == pytest.approx(0.49)


def test_reliability_bins_count_every_item():
    s = np.random.default_rng(0).random(100)
    bins = reliability_bins(s, (s > 0.5).astype(int), bins=5)
    assert sum(b["count"] for b in bins) == 100 and len(bins) == 5


def test_binary_metrics_match_hand_computed_values():
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    labels = np.array([0, 1, 1, 0])
    m = classification_metrics(probs, labels, label_names=NAMES, positive_index=1,
                               gold_labels=np.array([0, 1, -1, 1]))
    assert m["accuracy"] == 0.5
    # both classes: one right, one wrong -> F1 0.5 each
    assert m["f1_sufficient"] == pytest.approx(0.5) and m["macro_f1"] == pytest.approx(0.5)
    assert m["auroc"] == pytest.approx(0.75)
    assert m["n_gold"] == 3
    assert m["kappa_gold"] == pytest.approx(cohen_kappa(np.array([0, 1, 1]), np.array([0, 1, 1])))


def test_three_level_metrics_add_the_binary_view():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.7, 0.2], [0.1, 0.2, 0.7], [0.2, 0.5, 0.3]])
    labels = np.array([0, 1, 2, 2])
    m = classification_metrics(probs, labels, label_names=["insufficient", "partial", "sufficient"], positive_index=2)
    assert m["accuracy"] == 0.75
    assert m["binary_accuracy"] == 0.75  # item 4 is sufficient, predicted partial
    assert 0 < m["binary_macro_f1"] < 1 and "ece_top_label" in m


def test_auroc_is_nan_with_one_class_not_a_made_up_number():
    m = classification_metrics(np.array([[0.4, 0.6], [0.3, 0.7]]), np.array([1, 1]), label_names=NAMES, positive_index=1)
    assert math.isnan(m["auroc"])


def test_shape_mismatch_names_the_shapes():
    with pytest.raises(ValueError, match=r"probs \(2, 3\)"):
        classification_metrics(np.ones((2, 3)) / 3, np.array([0, 1]), label_names=NAMES, positive_index=1)


def test_per_source_table_and_flat_names():
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.1, 0.9]])
    table = per_source_metrics(probs, np.array([0, 1, 1, 1]), ["squad2", "squad2", "qed", "qed"], label_names=NAMES,
                               positive_index=1, autorater_mask=np.array([True, True, False, True]))
    assert set(table) == {"squad2", "qed", "overall"}
    assert table["squad2"]["accuracy"] == 1.0 and table["qed"]["accuracy"] == 0.5
    flat = flat_metrics(table, "test")
    assert flat["test_accuracy"] == 0.75 and flat["test_qed_accuracy"] == 0.5
    assert all(math.isfinite(v) for v in flat.values())
    text = format_table({f"model / {k}": v for k, v in table.items()})
    assert "model / overall" in text and "kappa_autorater" in text


def test_selective_accuracy_rises_when_confidence_is_informative():
    rng = np.random.default_rng(1)
    conf = rng.random(500)
    correct = (rng.random(500) < conf).astype(int)
    cov, acc = selective_accuracy(conf, correct, points=10)
    assert cov[-1] == 1.0 and acc[0] > acc[-1] + 0.2


def test_cohen_kappa_edge_cases():
    assert cohen_kappa(np.array([1, 0, 1]), np.array([1, 0, 1])) == 1.0
    assert math.isnan(cohen_kappa(np.array([]), np.array([])))
    assert cohen_kappa(np.array([1, 1]), np.array([1, 1])) == 1.0


def test_json_safe_makes_strict_json():
    out = json.dumps(json_safe({"a": [float("inf"), np.float32(0.5)], "b": float("nan")}), allow_nan=False)
    assert json.loads(out) == {"a": [None, 0.5], "b": None}


# -- calibration -----------------------------------------------------------------------------
def test_fit_temperature_recovers_the_true_temperature():
    rng = np.random.default_rng(0)
    true_t = 2.5
    logits = rng.normal(0, 4, size=(4000, 2))
    p = softmax(logits, true_t)[:, 1]
    labels = (rng.random(4000) < p).astype(int)
    t = fit_temperature(logits, labels)
    assert t == pytest.approx(true_t, rel=0.15)
    assert nll(logits, labels, t) < nll(logits, labels, 1.0)


def test_fit_temperature_keeps_one_with_a_single_class():
    assert fit_temperature(np.array([[1.0, 0.0], [2.0, 0.0]]), np.array([0, 0])) == 1.0


def test_temperature_preserves_the_argmax():
    logits = np.random.default_rng(2).normal(size=(50, 3))
    assert (softmax(logits, 3.0).argmax(1) == logits.argmax(1)).all()


def test_threshold_for_precision_takes_the_lowest_threshold_meeting_it():
    scores = np.array([0.1, 0.3, 0.55, 0.6, 0.8, 0.9, 0.95])
    skip = np.array([0, 0, 0, 1, 1, 1, 1])
    t, prec = threshold_for_precision(scores, skip, 0.95)
    assert t == 0.6 and prec == 1.0
    t, prec = threshold_for_precision(np.array([0.9, 0.8]), np.array([0, 0]), 0.95)
    assert t == 1.0 and prec == 0.0  # never reached: the gate (almost) never skips


# -- plots -----------------------------------------------------------------------------------
def test_plots_are_png_files(tmp_path):
    rng = np.random.default_rng(3)
    s = rng.random(60)
    y = (rng.random(60) < s).astype(int)
    paths = [
        plot_confusion_matrix(y, (s > 0.5).astype(int), NAMES, tmp_path / "cm.png"),
        plot_reliability(s, y, tmp_path / "rel.png"),
        plot_precision_recall(s, y, tmp_path / "pr.png", thresholds={"sufficient": 0.8, "partial": 0.5}),
        plot_selective_accuracy({"model": selective_accuracy(np.abs(s - 0.5), ((s > 0.5) == y).astype(int))}, tmp_path / "sel.png"),
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000


def test_paired_auroc_orders_only_items_over_one_passage():
    from suffice.training.evaluation.metrics import classification_metrics, paired_auroc

    # across groups the scores are perfectly separated; within each group they are reversed
    scores = np.array([0.30, 0.40, 0.80, 0.90])
    y = np.array([1, 0, 1, 0])
    assert classification_metrics(np.c_[1 - scores, scores], y, label_names=["no", "yes"], positive_index=1,
                                  groups=["a", "a", "b", "b"])["paired_auroc"] == 0.0
    assert paired_auroc(scores, y, ["a", "b", "b", "a"]) == 0.5  # a: 0.30 < 0.90 lost; b: 0.80 > 0.40 won
    assert np.isnan(paired_auroc(scores, y, ["a", "b", "a", "b"]))  # no group holds both classes
    assert np.isnan(paired_auroc(scores, y, ["", "", "", ""]))  # no groups at all
    assert paired_auroc(np.array([0.5, 0.5]), np.array([1, 0]), ["g", "g"]) == 0.5  # ties count half
    assert "paired_auroc" not in classification_metrics(np.c_[1 - scores, scores], y, label_names=["no", "yes"], positive_index=1)
