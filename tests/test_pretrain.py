"""Stage 0 (``suffice.training.data.pretrain``): each kind's row and label, train-only and
deterministic rows, the ``data.pretrain`` build, configs/pretrain.yaml, and a tiny stage 0 ->
stage 1 (sufficiency and retrieval gate) run with the stage-0 directory as ``base_model``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suffice.serving.config import ConfigError
from suffice.training.data.builder import DataConfig, build
from suffice.training.data.pretrain import DEFAULT_KINDS, KINDS, LABEL, holds_answer, stage0_rows

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO / "tests" / "fixtures" / "shared"


def _row(i, question, text, title="Chopin", split="train", gold_label=1, variant=""):
    return {"id": f"s:{i}", "question": question, "passages": [{"title": title, "text": text}], "split": split,
            "source": "squad2", "group": f"g{i}", "variant": variant, "gold_label": gold_label}


ROWS = [
    _row(1, "When did Chopin leave Warsaw?", "Chopin was born in 1810. He left Warsaw in 1830. He never returned. Paris became his home."),
    _row(2, "Who taught Chopin?", "Chopin studied with Jozef Elsner. Elsner ran the conservatory."),
    _row(3, "What did Liszt play?", "Liszt played the piano in Weimar.", title="Liszt"),
    _row(4, "Where did Chopin die?", "Chopin died in Paris.", split="validation"),
    _row(5, "Why is tea popular?", "Tea is a drink. It is grown in India.", title="Tea", gold_label=0),  # QED: answer kept, not explained
    _row(6, "When did Chopin leave Warsaw?", "He left Warsaw in 1830.", variant="remove_answer_sentence"),
]
ANSWERS = {"s:1": ["1830"], "s:2": ["Jozef Elsner"], "s:3": ["the piano"], "s:4": ["Paris"], "s:5": ["Tea"], "s:6": ["1830"]}


def test_each_kind_has_its_label_and_passage():
    rows = stage0_rows(ROWS, ANSWERS, seed=1)
    by = {(r["parent_id"], r["variant"]): r for r in rows}
    assert {p for p, _ in by} == {"s:1", "s:2", "s:3"}  # train, no variant, gold label not 0, answer in the passage
    for r in rows:
        assert r["label"] == LABEL[r["variant"]] and r["split"] == "train" and r["label_source"] == "pretrain"
        assert r["group"] == f"g{r['parent_id'][2:]}" and r["id"] == f"{r['parent_id']}#{r['variant']}"
        text = r["passages"][0]["text"]
        assert holds_answer(text, ANSWERS[r["parent_id"]]) == bool(r["label"])
    own, ev = by[("s:1", "s0_own")], by[("s:1", "s0_evidence")]
    assert own["passages"] == ROWS[0]["passages"]
    assert ev["passages"][0]["text"] == "Chopin was born in 1810. He left Warsaw in 1830. He never returned."
    assert by[("s:1", "s0_answer_removed")]["passages"][0]["text"] == "Chopin was born in 1810. He never returned. Paris became his home."
    # another paragraph of the same article, never a validation/test paragraph when told which those are
    assert by[("s:1", "s0_other_paragraph")]["passages"][0]["text"] == ROWS[1]["passages"][0]["text"]
    assert ("s:3", "s0_evidence") not in by  # one sentence: the evidence would be the whole passage
    held = stage0_rows(ROWS, ANSWERS, seed=1, held_out_texts=[ROWS[1]["passages"][0]["text"]])
    other = {r["parent_id"]: r for r in held if r["variant"] == "s0_other_paragraph"}
    assert other["s:1"]["passages"][0]["title"] == "Liszt"  # the same article's only paragraph is held out


def test_rows_are_deterministic_and_kinds_selectable():
    assert stage0_rows(ROWS, ANSWERS, seed=3) == stage0_rows(ROWS, ANSWERS, seed=3)
    only = stage0_rows(ROWS, ANSWERS, kinds=["s0_own", "s0_answer_removed"])
    assert {r["variant"] for r in only} == {"s0_own", "s0_answer_removed"}
    with pytest.raises(ConfigError, match="choose one or more of"):
        stage0_rows(ROWS, ANSWERS, kinds=["paraphrase"])
    with pytest.raises(ConfigError, match="pretrain_kinds"):
        DataConfig(pretrain=True, pretrain_kinds=[])
    assert holds_answer("in 1830.", ["1830"]) and not holds_answer("in 18301", ["1830"])


def _build(**kw):
    return build(DataConfig(data_dir=str(SHARED), include_variants=False, **kw), progress=False)


def test_pretrain_build_replaces_only_the_train_split(tmp_path):
    plain, _ = _build()
    ds, m = _build(pretrain=True)
    for split in ("validation", "test"):
        assert ds[split].to_list() == plain[split].to_list()  # the real rows every run is scored on
    train = ds["train"].to_list()
    assert train and {r["label_source"] for r in train} == {"pretrain"} and {r["variant"] for r in train} <= set(KINDS)
    held = {r["id"] for s in ("validation", "test") for r in ds[s]} | {r["group"] for s in ("validation", "test") for r in ds[s]}
    assert not {r["parent_id"] for r in train} & held and not {r["group"] for r in train} & held
    assert m["pretrain"]["rows_by_kind"] == m["counts"]["by_split"]["train"]["variant"]
    assert m["pretrain"]["parents"] == len({r["parent_id"] for r in train}) and {0, 1} == {r["label"] for r in train}
    assert _build(pretrain=True)[1]["data_hash"] == m["data_hash"]

    weak = tmp_path / "weak.jsonl"
    test_group = ds["test"][0]["group"]
    weak.write_text("\n".join(json.dumps(r) for r in [
        {"id": "w1", "question": "When did Zed fall?", "passages": [{"title": "T", "text": "Zed rose."}], "label": 0, "split": "train",
         "source": "squad2", "group": "squad2:Alpha:0", "variant": "swap_entity", "label_source": "weak", "parent_id": "squad2:a1"},
        {"id": "w2", "question": "q?", "passages": [{"title": "T", "text": "x."}], "label": 1, "split": "train", "source": "squad2",
         "group": test_group, "variant": "drop_other_sentence", "label_source": "weak", "parent_id": "p"},
        {"id": "p1", "question": "q?", "passages": [], "label": 1, "split": "train", "source": "squad2", "group": "g", "label_source": "autorater"},
    ]) + "\n")
    ds, m = _build(pretrain=True, pretrain_weak_file=str(weak))
    assert "w1" in ds["train"]["id"] and "w2" not in ds["train"]["id"] and "p1" not in ds["train"]["id"]
    assert m["pretrain"]["weak_rows_dropped_held_out_group"] == 1 and m["inputs"][str(weak)]["role"] == "weak"
    with pytest.raises(FileNotFoundError, match="suffice weak"):
        _build(pretrain=True, pretrain_weak_file=str(tmp_path / "missing.jsonl"))


def test_the_config_loads_and_the_cli_prints_the_kinds(capsys):
    from suffice.training.data.cli import main as data_main
    from suffice.training.fit.config import build_train_config

    cfg = build_train_config(REPO / "configs" / "pretrain.yaml")
    d = cfg.data_config()
    assert d.pretrain and list(d.pretrain_kinds) == list(DEFAULT_KINDS) and d.include_variants is False
    assert (cfg.output_dir, cfg.tracking.register, cfg.export, cfg.mixed_precision) == ("models/pretrain", False, False, "auto")
    assert data_main(["stats", "--quiet", f"--data_dir={SHARED}", "--pretrain=true", "--include_variants=false"]) == 0
    assert "Stage-0 train rows from" in capsys.readouterr().out


def test_stage0_then_sufficiency_and_gate_from_its_directory(tiny_bert, tmp_path):
    import torch

    from tests.test_train import tiny_config

    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.config import LoraSettings
    from suffice.training.fit.model import build_model
    from suffice.training.fit.run import run

    stage0 = tmp_path / "stage0"
    common = ["--tracking.enabled=false", "--baselines=[]", "--num_train_epochs=1", "--max_length=64", "--torch_threads=1",
              "--per_device_train_batch_size=4", "--lora.r=4", "--lora.alpha=8"]
    run(build_train_config(REPO / "configs" / "pretrain.yaml", [
        f"--base_model={tiny_bert}", f"--output_dir={stage0}", f"--data.data_dir={SHARED}", "--data.name=pytest-pretrain",
        "--max_train_items=0", *common]))
    meta = json.loads((stage0 / "suffice_model.json").read_text())
    assert meta["task"] == "sufficiency" and (stage0 / "model.safetensors").is_file()

    # the next stage keeps the stage-0 head (same two labels): LoRA goes onto the merged stage-0 weights
    saved = build_model(stage0, id2label={0: "insufficient", 1: "sufficient"}, finetune="full")
    fresh = build_model(tiny_bert, id2label={0: "insufficient", 1: "sufficient"}, finetune="full")
    again = build_model(stage0, id2label={0: "RETRIEVE", 1: "SKIP"}, finetune="lora", lora=LoraSettings(r=4, alpha=8))
    w = saved.classifier.weight
    assert not torch.equal(w, fresh.classifier.weight)
    assert torch.equal(w, again.base_model.model.classifier.modules_to_save["default"].weight)

    stage1 = tmp_path / "stage1"
    run(tiny_config(stage0, stage1, *common))
    assert json.loads((stage1 / "suffice_model.json").read_text())["base_model"] == str(stage0)

    threads = tmp_path / "gate.jsonl"
    threads.write_text("\n".join(json.dumps({"id": f"t{i}", "label": "SKIP" if i % 2 else "RETRIEVE", "category": "x", "messages": [
        {"role": "user", "content": f"how do refunds work for order type {i % 8}?"}, {"role": "assistant", "content": "Refunds take 5 days."},
        {"role": "user", "content": "thanks!" if i % 2 else "what about shipping to Norway?"}]}) for i in range(40)) + "\n")
    gate = tmp_path / "gate"
    run(build_train_config(REPO / "configs" / "retrieval-gate.yaml", [
        f"--base_model={stage0}", f"--output_dir={gate}", f"--gate.path={threads}", "--gate.split=opening_message", "--gate.validation_fraction=0.25",
        "--gate.test_fraction=0.25", *common]))
    assert json.loads((gate / "suffice_model.json").read_text())["id2label"] == {"0": "RETRIEVE", "1": "SKIP"}


def test_short_passage_kinds_are_one_sentence_each():
    """s0_answer_sentence / s0_other_sentence (opt-in): the answer sentence alone (1) and the passage's closest
    answerless sentence (0), so sentence length does not tell the label (the reading run's length cue)."""
    row = {"id": "m1", "question": "How many moons does Mars have?", "split": "train", "source": "squad1", "group": "g",
           "variant": "", "passages": [{"title": "Mars", "text": "Mars is the fourth planet. Mars has two small moons, Phobos and Deimos. "
                                        "The moons of Mars were found in 1877. It is red."}]}
    out = stage0_rows([row], {"m1": ["two"]}, seed=13, kinds=["s0_answer_sentence", "s0_other_sentence"])
    by = {r["variant"]: r for r in out}
    assert by["s0_answer_sentence"]["passages"][0]["text"] == "Mars has two small moons, Phobos and Deimos."
    assert by["s0_answer_sentence"]["label"] == 1 and by["s0_other_sentence"]["label"] == 0
    assert by["s0_other_sentence"]["passages"][0]["text"] == "The moons of Mars were found in 1877."  # most terms shared with the question
    assert stage0_rows([row], {"m1": ["two"]}, seed=13) and {r["variant"] for r in stage0_rows([row], {"m1": ["two"]}, seed=13)} <= set(DEFAULT_KINDS)


def test_kind_share_thins_the_named_kinds_and_is_checked():
    from suffice.training.data.builder import DataConfig
    from suffice.training.data.pretrain import kept_share

    rows = [{"id": f"r{i}", "variant": v, "label_source": src} for i in range(400)
            for v, src in (("s0_own", "pretrain"), ("", "synthetic"))]
    kept = kept_share(rows, {"s0_own": 0.25}, 13)
    assert sum(r["variant"] == "" for r in kept) == 400  # labelled rows untouched unless named
    assert 60 < sum(r["variant"] == "s0_own" for r in kept) < 140 and kept == kept_share(rows, {"s0_own": 0.25}, 13)
    assert 150 < sum(r["variant"] == "" for r in kept_share(rows, {"labelled": 0.5}, 13)) < 250
    with pytest.raises(ConfigError, match="pretrain_kind_share"):
        DataConfig(pretrain=True, pretrain_kinds=["s0_own"], pretrain_kind_share={"s0_evidence": 0.5})
    with pytest.raises(ConfigError, match="pretrain_kind_share"):
        DataConfig(pretrain=True, pretrain_kinds=["s0_own"], pretrain_kind_share={"s0_own": 0})
