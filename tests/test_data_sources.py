"""Shared train sources, per-source caps, the answers column and the stage-0 ``labelled`` kind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from suffice.serving.config import ConfigError
from suffice.training.data.builder import SHARED_SOURCES, DataConfig, answers_by_id, build

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture()
def data_dir(tmp_path) -> Path:
    """The fixture shared data plus the three raw train sources (fixture files in their formats)."""
    root = tmp_path / "shared"
    shutil.copytree(FIX / "shared", root)
    (root / "sources").mkdir()
    shutil.copy(FIX / "squad2.json", root / SHARED_SOURCES["squad2-dev-rest"].path)
    shutil.copy(FIX / "squad2.json", root / SHARED_SOURCES["squad1-train"].path)
    shutil.copy(FIX / "qed.jsonl", root / SHARED_SOURCES["qed-train"].path)
    return root


def _rows(ds) -> dict[str, dict]:
    return {r["id"]: r for split in ds for r in ds[split]}


def test_shared_sources_keep_their_names_go_to_train_and_carry_gold_labels(data_dir):
    ds, m = build(DataConfig(data_dir=str(data_dir), include_variants=False, include_synthetic=False,
                             train_sources=["squad1-train", "qed-train"]), progress=False)
    rows = _rows(ds)
    squad1 = [r for r in rows.values() if r["source"] == "squad1"]
    assert len(squad1) == 4 and {r["split"] for r in squad1} == {"train"}  # never hash-split into validation/test
    assert {r["label_source"] for r in squad1} == {"gold"}  # no teacher label: traceable as gold
    assert rows["squad1:q-blue-1"]["group"] == "squad1:Blue_Lake:0"  # the group the squad1 minimal-pair edits name
    assert rows["qed:101"]["split"] == "train" and rows["qed:101"]["answers"] == ["Neil Armstrong"]
    assert {v["role"] for v in m["inputs"].values()} >= {"shared-source"}
    assert m["counts"]["by_source"]["squad1"]["total"] == 4


def test_squad2_dev_rest_joins_squad2_as_train(data_dir):
    ds, _ = build(DataConfig(data_dir=str(data_dir), include_variants=False, include_synthetic=False,
                             train_sources=["squad2-dev-rest"]), progress=False)
    rest = _rows(ds)["squad2:q-blue-2"]
    assert (rest["source"], rest["split"], rest["label"], rest["label_source"]) == ("squad2", "train", 0, "gold")


def test_cap_keeps_a_seeded_sample_of_one_sources_train_items(data_dir):
    cfg = dict(data_dir=str(data_dir), include_variants=False, include_synthetic=False, train_sources=["squad1-train"])
    ds, m = build(DataConfig(**cfg, max_train_per_source={"squad1": 2}), progress=False)
    kept = sorted(r["id"] for r in ds["train"] if r["source"] == "squad1")
    assert len(kept) == 2 and m["dropped"]["train items over max_train_per_source[squad1]"] == 2
    again, _ = build(DataConfig(**cfg, max_train_per_source={"squad1": 2}), progress=False)
    assert sorted(r["id"] for r in again["train"] if r["source"] == "squad1") == kept
    assert len([r for r in ds["train"] if r["source"] == "squad2"]) == len(
        [r for r in build(DataConfig(**cfg), progress=False)[0]["train"] if r["source"] == "squad2"])  # other sources untouched


def test_validation_articles_move_whole_articles_of_a_train_source_to_validation(data_dir):
    cfg = dict(data_dir=str(data_dir), include_variants=False, include_synthetic=False, train_sources=["squad1-train"])
    ds, m = build(DataConfig(**cfg, validation_articles={"squad1-train": 1}), progress=False)
    moved = m["moved_to_validation"]["squad1-train"]
    squad1 = [r for r in _rows(ds).values() if r["source"] == "squad1"]
    val = [r for r in squad1 if r["split"] == "validation"]
    assert len(moved["articles"]) == 1 and moved["items"] == len(val) > 0
    assert {r["group"].split(":")[1] for r in val} == set(moved["articles"])  # whole articles, nothing else
    assert {r["split"] for r in squad1} <= {"train", "validation"} and {r["label_source"] for r in val} == {"gold"}
    again = build(DataConfig(**cfg, validation_articles={"squad1-train": 1}), progress=False)[1]
    assert again["moved_to_validation"] == m["moved_to_validation"]  # seeded
    with pytest.raises(ConfigError, match="has 2 articles: give at most 2"):
        build(DataConfig(**cfg, validation_articles={"squad1-train": 3}), progress=False)


def test_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="train_sources \\['squad3'\\] unknown: choose from"):
        DataConfig(train_sources=["squad3"])
    with pytest.raises(ConfigError, match="names a source twice"):
        DataConfig(train_sources=["qed-train", "qed-train"])
    with pytest.raises(ConfigError, match="max_train_per_source .*integer >= 1"):
        DataConfig(max_train_per_source={"squad1": 0})
    with pytest.raises(ConfigError, match="validation_articles .*name sources of train_sources"):
        DataConfig(train_sources=["qed-train"], validation_articles={"squad2-dev-rest": 2})
    with pytest.raises(ConfigError, match="extra_split='dev' unknown"):
        DataConfig(extra_split="dev")


def test_extra_file_answers_reach_stage0_and_extra_split_is_kept(data_dir):
    """An extra file's gold answers make stage-0 rows (they used to be read only from items/synthetic files)."""
    cfg = dict(data_dir=str(data_dir), include_variants=False, include_synthetic=False, extra_files=[str(FIX / "qed.jsonl")],
               extra_split="train")
    ds, _ = build(DataConfig(**cfg), progress=False)
    assert {r["split"] for r in ds["train"] if r["source"] == "qed" and r["id"].startswith("qed:10")} == {"train"}
    ds, m = build(DataConfig(**cfg, pretrain=True, pretrain_kinds=["s0_own", "s0_answer_removed"]), progress=False)
    own = [r for r in ds["train"] if r["parent_id"] == "qed:101"]
    assert {r["variant"]: r["label"] for r in own} == {"s0_own": 1, "s0_answer_removed": 0}
    assert answers_by_id(ds["train"])["qed:101#s0_own"] == ["Neil Armstrong"]


def test_labelled_kind_keeps_the_rows_stage0_does_not_rebuild(data_dir):
    cfg = dict(data_dir=str(data_dir), include_variants=False, include_synthetic=False, train_sources=["squad2-dev-rest"],
               pretrain=True)
    ds, m = build(DataConfig(**cfg, pretrain_kinds=["s0_own", "labelled"]), progress=False)
    train = {r["id"]: r for r in ds["train"]}
    assert train["squad2:q-blue-2"]["label"] == 0 and train["squad2:q-blue-2"]["label_source"] == "gold"  # a real unanswerable
    assert "squad2:q-blue-1" not in train and train["squad2:q-blue-1#s0_own"]["label"] == 1  # a parent appears once, rebuilt
    assert m["pretrain"]["rows_by_kind"][""] == sum(1 for r in train.values() if r["variant"] == "")
    only, _ = build(DataConfig(**cfg, pretrain_kinds=["labelled"]), progress=False)
    assert {r["variant"] for r in only["train"]} == {""}
    with pytest.raises(ConfigError, match="choose one or more of"):
        DataConfig(pretrain=True, pretrain_kinds=["s0_everything"])


def test_answers_column_is_the_items_gold_answers_not_the_plausible_ones(data_dir):
    ds, _ = build(DataConfig(data_dir=str(data_dir), include_variants=False), progress=False)
    rows = _rows(ds)
    assert rows["squad2:a1"]["answers"] == ["green"] and rows["squad2:a2"]["answers"] == []
    synth = next(r for r in rows.values() if r["label_source"] == "synthetic" and r["label"] == 1)
    line = next(json.loads(x) for x in (data_dir / "synthetic" / "squad2-questions.jsonl").read_text().splitlines()
                if json.loads(x)["id"] == synth["id"])
    assert synth["answers"] == [line["answer"]]
