"""The extractive-QA objective (``span``): targets from the packed window, the config checks, and a
tiny end-to-end run whose span layer trains, is checkpointed, and leaves the exported model alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from suffice.serving.config import ConfigError
from suffice.training.fit.config import build_train_config
from suffice.training.fit.run import features_for
from suffice.training.fit.spans import AnswerSpan, find_answer_span, span_targets

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "train20.jsonl"


def test_targets_point_at_the_answer_in_the_context_cls_for_insufficient_none_otherwise():
    # [CLS] q [SEP] ctx... [SEP]; the answer token 7 also sits in the question, which does not count
    ids, types = [101, 7, 102, 5, 7, 8, 102], [0, 0, 0, 1, 1, 1, 1]
    assert find_answer_span(ids, types, [[7, 8]]) == (4, 5)
    assert find_answer_span(ids, types, [[8, 102]]) == (-1, -1)  # the closing [SEP] is not context
    assert find_answer_span(ids, [0] * 7, [[7]]) == (-1, -1)  # no context segment
    rows = {"input_ids": [ids] * 4, "token_type_ids": [types] * 4, "labels": [1, 0, 1, 2], "answers": [["b c"], ["b c"], [], ["b c"]]}
    starts, ends = span_targets(rows, {"b c": [7, 8]}.get, positive_id=1, negative_id=0)
    # sufficient with its answer; insufficient -> [CLS]; sufficient without an answer and a third class -> no target
    assert (starts, ends) == ([4, 0, -1, -1], [5, 0, -1, -1])


def test_span_loss_is_the_mean_start_end_cross_entropy_over_rows_with_a_target():
    from types import SimpleNamespace

    feature = AnswerSpan(2.0, positive_id=1, negative_id=0, tokenizer_dir=None)
    head = feature.modules(SimpleNamespace(config=SimpleNamespace(hidden_size=4)))[0]
    hidden = torch.randn(3, 5, 4, requires_grad=True)
    batch = {"span_start": torch.tensor([2, 0, -1]), "span_end": torch.tensor([3, 0, -1]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])}
    value = feature.loss(SimpleNamespace(hidden_states=(hidden,)), batch)
    logits = head(hidden[:2]).masked_fill(batch["attention_mask"][:2].unsqueeze(-1) == 0, torch.finfo(torch.float32).min)
    expected = 2.0 * 0.5 * (torch.nn.functional.cross_entropy(logits[..., 0], torch.tensor([2, 0]))
                            + torch.nn.functional.cross_entropy(logits[..., 1], torch.tensor([3, 0])))
    assert torch.isclose(value, expected)
    value.backward()
    assert hidden.grad[2].abs().sum() == 0 and hidden.grad[0].abs().sum() > 0  # the row without a target adds nothing
    none = {**batch, "span_start": torch.tensor([-1, -1, -1]), "span_end": torch.tensor([-1, -1, -1])}
    assert float(feature.loss(SimpleNamespace(hidden_states=(hidden,)), none).detach()) == 0.0


def test_config_switches_the_span_objective_on_for_sufficiency_only():
    assert [type(f).__name__ for f in features_for(build_train_config(REPO / "configs" / "reading.yaml", ["--span.loss_weight=0.5"]))] == [
        "PassageContrast", "AnswerSpan"]
    assert "AnswerSpan" not in [type(f).__name__ for f in features_for(build_train_config(REPO / "configs" / "reading.yaml", []))]
    with pytest.raises(ConfigError, match="must be a finite number >= 0"):
        build_train_config(None, [f"--train_file={FIXTURE}", "--span.loss_weight=-1"])
    with pytest.raises(ConfigError, match="applies to task=sufficiency"):
        build_train_config(REPO / "configs" / "retrieval-gate.yaml", ["--span.loss_weight=0.5"])


def test_tiny_run_trains_the_span_layer_checkpoints_it_and_exports_the_classifier_alone(tiny_bert, tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    from suffice.training.fit import loop
    from suffice.training.fit.run import run

    seen = []
    original = loop.batch_loss

    def spy(model, batch, weight_t, features=()):
        seen.append((batch["span_start"].tolist(), batch["labels"].tolist()))
        return original(model, batch, weight_t, features)

    monkeypatch.setattr(loop, "batch_loss", spy)
    out = tmp_path / "m"
    cfg = build_train_config(None, [
        f"--train_file={FIXTURE}", f"--base_model={tiny_bert}", f"--output_dir={out}", "--max_length=64", "--finetune=full",
        "--per_device_train_batch_size=4", "--num_train_epochs=1", "--torch_threads=1", "--tracking.enabled=false",
        "--evaluate_test=false", "--baselines=[]", "--early_stopping_patience=0", "--span.loss_weight=1.0",
    ])
    run(cfg)
    printed = capsys.readouterr().out
    assert "answer span (weight 1)" in printed
    starts = [s for batch_starts, _ in seen for s in batch_starts]
    labels = [y for _, batch_labels in seen for y in batch_labels]
    assert any(s > 0 for s in starts), printed  # the fixture's gold answers are found in their windows
    assert all(s == 0 for s, y in zip(starts, labels) if y == 0)
    # the span layer is checkpointed beside the model (exact resume) but not saved with it
    ckpt = sorted((out / "checkpoints").glob("step-*"))[-1]
    assert any(p.name.startswith("model_1") for p in ckpt.iterdir())
    head = load_file(str(ckpt / "model_1.safetensors"))
    assert sorted(head) == ["bias", "weight"] and tuple(head["weight"].shape) == (2, 32)  # hidden 32 -> start, end
    from transformers import AutoModelForSequenceClassification

    plain = AutoModelForSequenceClassification.from_pretrained(out)  # the saved model is the classifier alone
    assert set(load_file(str(out / "model.safetensors"))) <= set(plain.state_dict())
