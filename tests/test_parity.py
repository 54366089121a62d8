"""The int8 rule measures what matters: clear decisions kept, scores barely moved, quality kept."""

import numpy as np
import pytest

from suffice.training.export.errors import ParityConfig, ParityError
from suffice.training.export.parity import decision_thresholds, int8_parity
from suffice.training.fit.meta import ModelMeta

META = ModelMeta(task="sufficiency", label_scheme="binary", id2label={"0": "insufficient", "1": "sufficient"},
                 positive_label="sufficient", max_length=128, long_context_strategy="select",
                 calibration={"method": "temperature", "temperature": 1.0}, thresholds={"sufficient": 0.8, "partial": 0.5})


def logits_for(scores):
    """Binary logits whose softmax (T = 1) gives P(sufficient) = scores."""
    s = np.clip(np.asarray(scores, dtype=np.float64), 1e-6, 1 - 1e-6)
    return np.stack([np.zeros_like(s), np.log(s / (1 - s))], axis=1)


def test_thresholds_are_the_stored_ones_and_the_decision():
    assert decision_thresholds(META) == [0.5, 0.8]


def test_flips_near_a_threshold_pass_and_are_reported():
    rng = np.random.default_rng(0)
    s32 = rng.uniform(0, 1, 400)
    near = np.abs(s32 - 0.5) < 0.01
    s8 = np.where(near, 1.0 - s32, s32)  # only items within 0.01 of 0.5 cross it
    out = int8_parity(logits_for(s32), logits_for(s8), [None] * 400, META, ParityConfig())
    assert out["int8_agreement"] < 1.0 and out["int8_confident_agreement"] == 1.0
    assert out["int8_confident_items"] < 400


def test_a_clear_decision_that_flips_is_refused():
    s32 = np.linspace(0.02, 0.98, 200)
    s8 = s32.copy()
    s8[[0, 1, 2]] = 0.97  # three items far below every threshold jump to "sufficient"
    with pytest.raises(ParityError) as e:
        int8_parity(logits_for(s32), logits_for(s8), [None] * 200, META, ParityConfig())
    assert e.value.check == "int8_confident_agreement"


def test_a_score_shift_is_refused_even_without_flips():
    s32 = np.full(100, 0.2)
    with pytest.raises(ParityError) as e:
        int8_parity(logits_for(s32), logits_for(s32 + 0.05), [None] * 100, META, ParityConfig())
    assert e.value.check == "int8_score_shift" and e.value.largest_difference == pytest.approx(0.05, abs=1e-6)


def test_a_quality_drop_is_refused_where_items_carry_labels():
    gold = np.array([0, 1] * 100)
    s32 = np.where(gold == 1, 0.55, 0.45)  # perfect at 0.5, all near the threshold
    s8 = np.where(gold == 1, 0.45, 0.55)   # int8 flips every near-threshold item: no confident item changes
    cfg = ParityConfig(max_mean_score_shift=1.0)
    with pytest.raises(ParityError) as e:
        int8_parity(logits_for(s32), logits_for(s8), list(gold), META, cfg)
    assert e.value.check == "int8_macro_f1"
    ok = int8_parity(logits_for(s32), logits_for(s32), list(gold), META, cfg)
    assert ok["macro_f1_fp32"] == ok["macro_f1_int8"] == 1.0 and ok["auroc_int8"] == 1.0 and ok["int8_metric_check"] == "enforced"


def test_few_labelled_items_report_the_metrics_without_enforcing_them():
    gold = np.array([0, 1] * 10)
    s32 = np.where(gold == 1, 0.55, 0.45)
    out = int8_parity(logits_for(s32), logits_for(1 - s32), list(gold), META, ParityConfig(max_mean_score_shift=1.0))
    assert out["macro_f1_int8"] == 0.0 and out["int8_metric_check"].startswith("reported only")
