"""TrainConfig: the shipped YAMLs resolve, overrides type-check, cross-field mistakes are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from suffice.serving.config import ConfigError
from suffice.training.fit.encode import LengthGroupedSampler, class_weights
from suffice.training.train import main
from suffice.training.fit.config import TrainConfig, build_train_config

REPO = Path(__file__).resolve().parent.parent
FIXTURE = str(REPO / "tests" / "fixtures" / "train20.jsonl")


@pytest.mark.parametrize("name", ["sufficiency", "sufficiency-full", "retrieval-gate"])
def test_shipped_configs_resolve(name):
    cfg = build_train_config(REPO / "configs" / f"{name}.yaml")
    assert cfg.registered_model == ("suffice-retrieval-gate" if name == "retrieval-gate" else "suffice-sufficiency")
    if name == "retrieval-gate":
        assert cfg.long_context_strategy == "select_lines" and cfg.resolved_baselines() == ["tfidf_lr"]
        assert cfg.id2label == {0: "RETRIEVE", 1: "SKIP"} and cfg.positive_index == 1
    else:
        assert cfg.data_config().label_source == "autorater"


def test_overrides_are_typed_and_nested():
    cfg = build_train_config(REPO / "configs" / "sufficiency.yaml", ["--lora.r=8", "--learning_rate=1e-3", "--data.sources=[squad2]", "--resume"])
    assert cfg.lora.r == 8 and cfg.learning_rate == 1e-3 and cfg.resume is True
    assert cfg.data_config().sources == ["squad2"]


@pytest.mark.parametrize("override, message", [
    (["--lora.rank=8"], r"unknown config key\(s\) \['lora.rank'\]"),
    (["--learning_rate=fast"], "learning_rate must be a number"),
    (["--label_scheme=five_level"], "five_level"),
    (["--task=retrieval_gate", "--label_scheme=three_level", "--long_context_strategy=recent"], "retrieval gate is binary"),
    (["--task=retrieval_gate", "--long_context_strategy=truncate"], "use --long_context_strategy=select_lines"),
    (["--calibration.partial=0.9"], "partial is the lower threshold"),
    (["--lora.target_modules=[query,dense]"], "also matches pooler.dense"),
    (["--freeze_layers=2"], "LoRA already freezes the encoder"),
    (["--max_length=1024"], r"max_length=1024 must be in \[32, 512\]"),
    (["--baselines=[bm25]"], r"unknown baseline\(s\) \['bm25'\]"),
    (["--data.sources=[squad2]"], "both train_file"),
])
def test_mistakes_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        build_train_config(None, [f"--train_file={FIXTURE}"] + override)


def test_missing_data_file_names_the_fix():
    with pytest.raises(ConfigError, match="does not exist"):
        build_train_config(None, ["--train_file=/nonexistent.jsonl"])


def test_derived_numbers():
    cfg = TrainConfig(train_file=FIXTURE, per_device_train_batch_size=8, gradient_accumulation_steps=4)
    assert cfg.effective_batch_size(num_processes=2) == 64
    assert cfg.resolved_head_learning_rate() == pytest.approx(cfg.learning_rate * 10)
    assert TrainConfig(train_file=FIXTURE, finetune="full", learning_rate=3e-5).resolved_head_learning_rate() == 3e-5


def test_cli_print_config_and_bad_override(capsys):
    assert main(["--config", str(REPO / "configs" / "retrieval-gate.yaml"), "--print-config", "--lora.r=4"]) == 0
    assert "r: 4" in capsys.readouterr().out
    assert main([f"--train_file={FIXTURE}", "--lora.rank=4", "--print-config"]) == 2
    assert "lora.rank" in capsys.readouterr().err


def test_length_grouped_sampler_is_a_seeded_permutation_of_similar_length_batches():
    lengths = [i % 97 + 10 for i in range(1000)]
    s = LengthGroupedSampler(lengths, batch_size=10, seed=3)
    first = list(s)
    assert sorted(first) == list(range(1000)) and list(s) == first
    s.set_epoch(1)
    assert list(s) != first
    batches = [first[i : i + 10] for i in range(0, 1000, 10)]
    spread = sum(max(lengths[j] for j in b) - min(lengths[j] for j in b) for b in batches) / len(batches)
    assert spread < 10  # random batches would spread ~80 tokens


def test_balanced_class_weights():
    w = class_weights([0, 0, 0, 1, 2, 2], 3, "balanced")
    assert w.tolist() == pytest.approx([2 / 3, 2.0, 1.0])
    assert class_weights([0, 1], 2, "none").tolist() == [1.0, 1.0]


def test_a_saved_config_with_a_retired_key_still_loads(tmp_path):
    """Model directories trained before the answer-span head was removed keep loading (evaluate, soup)."""
    import warnings

    from suffice.training.fit.config import build_train_config

    old = tmp_path / "train_config.yaml"
    old.write_text("task: sufficiency\nanswer_span_weight: 0.0\nmax_length: 128\n")
    assert build_train_config(old, ["--train_file=tests/fixtures/train20.jsonl"]).max_length == 128
    old.write_text("task: sufficiency\nanswer_span_weight: 0.5\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_train_config(old, ["--train_file=tests/fixtures/train20.jsonl"])
    assert any("answer_span_weight is ignored" in str(w.message) for w in caught)
    with pytest.raises(Exception, match="answer_span_weight"):
        build_train_config(None, ["--answer_span_weight=0.5", "--train_file=tests/fixtures/train20.jsonl"])  # not on the command line
