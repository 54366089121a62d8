"""Weak supervision (``suffice weak``): each rule's edit, labels and flags, determinism, the stage-1
file that training reads, and stage 2 starting from the stage-1 model directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suffice.training.data.weak import RULES, WeakConfig, WeakConfigError, build_weak_file, make_weak_pairs, main

REPO = Path(__file__).resolve().parent.parent


def _row(i, question, text, answers, source="squad2", title="T"):
    return {"id": f"{source}:{i}", "question": question, "passages": [{"title": title, "text": text}], "label": 1,
            "level": "sufficient", "label_source": "autorater", "split": "train", "source": source, "group": f"g{i}",
            "variant": "", "parent_id": "", "gold_label": 1, "kind": "", "generator": "", "answers": answers}


PARENTS = [
    _row(1, "When did Frederic Chopin leave Warsaw?",
         "Frederic Chopin left Warsaw in 1830. He was twenty years old. The city was tense before the uprising. "
         "Bakeries on the square sold rolls.", ["1830"]),
    _row(2, "Who founded the Paris Conservatoire in 1795?",
         "The Paris Conservatoire was founded in 1795 by Bernard Sarrette. It trained musicians for the army bands. "
         "Gardens surrounded the building.", ["Bernard Sarrette"]),
    _row(3, "How many pianos did Pleyel build in 1834?",
         "Pleyel built 1000 pianos in 1834 at his workshop in Lyon. Workers polished the cases by hand.", ["1000"]),
]


def _ctx(row):
    return " ".join(p["text"] for p in row["passages"]).lower()


def test_each_rule_makes_the_pair_it_promises():
    pairs = make_weak_pairs(PARENTS, WeakConfig(per_parent=4))
    by_rule = {}
    for p in pairs:
        by_rule.setdefault(p["variant"], []).append(p)
    assert set(by_rule) == set(RULES)
    parents = {r["id"]: r for r in PARENTS}
    for p in pairs:
        parent = parents[p["parent_id"]]
        assert p["id"] == f"{parent['id']}#weak-{p['variant']}" and p["group"] == parent["group"] and p["split"] == "train"
        assert p["label_source"] == "weak" and p["source"] == parent["source"]
        edit = p["meta"]["weak_edit"]
        if p["variant"] == "drop_other_sentence":
            assert p["label"] == 1 and p["level"] == "sufficient" and p["question"] == parent["question"]
            assert edit["dropped_sentence"].lower() not in _ctx(p) and all(a.lower() in _ctx(p) for a in parent["answers"])
        else:
            assert p["label"] == 0 and p["level"] == "insufficient" and p["passages"] == parent["passages"]
            assert edit["from"] in parent["question"] and edit["to"] in p["question"] and edit["from"] not in p["question"]
            assert edit["to"].lower() not in _ctx(parent)  # the edited question names something the context lacks
    years = [p for p in by_rule["swap_number"] if p["meta"]["weak_edit"]["from"] in ("1830", "1795", "1834")]
    assert years and all(abs(int(p["meta"]["weak_edit"]["to"]) - int(p["meta"]["weak_edit"]["from"])) <= 30 for p in years)


def test_pairs_are_deterministic_and_capped():
    a = make_weak_pairs(PARENTS, WeakConfig(seed=1))
    assert a == make_weak_pairs(PARENTS, WeakConfig(seed=1))
    assert len(make_weak_pairs(PARENTS, WeakConfig(per_parent=1))) == len(PARENTS)
    assert len(make_weak_pairs(PARENTS, WeakConfig(max_pairs=2))) == 2
    only = make_weak_pairs(PARENTS, WeakConfig(rules=["swap_number"]))
    assert {p["variant"] for p in only} == {"swap_number"}


def test_a_rule_that_cannot_apply_makes_nothing():
    no_answer = dict(PARENTS[0], answers=[])  # drop_other_sentence needs to know where the answer is
    assert make_weak_pairs([no_answer], WeakConfig(rules=["drop_other_sentence"])) == []
    yes_no = dict(PARENTS[0], answers=["yes"])
    assert make_weak_pairs([yes_no], WeakConfig(rules=["drop_other_sentence"])) == []


@pytest.mark.parametrize("kwargs, needle", [
    ({"rules": ["paraphrase"]}, "choose one or more of"), ({"rules": []}, "choose one or more of"),
    ({"per_parent": 0}, "per_parent=0"), ({"max_pairs": -1}, "max_pairs=-1"),
])
def test_bad_settings_name_the_fix(kwargs, needle):
    with pytest.raises(WeakConfigError, match=needle):
        WeakConfig(**kwargs)


def _dsd(tmp_rows):
    import datasets

    return datasets.DatasetDict({s: datasets.Dataset.from_list(rows) for s, rows in tmp_rows.items()})


def _splits_rows():
    val = dict(_row(7, "Where was Liszt born?", "Liszt was born in Raiding.", ["Raiding"]), split="validation", group="gv")
    test = dict(_row(8, "Where did Liszt die?", "Liszt died in Bayreuth.", ["Bayreuth"]), split="test", group="gt", label=0,
                level="partial")
    neg = dict(_row(9, "Who built the organ?", "The hall has an organ.", []), label=0, level="partial")
    return {"train": PARENTS + [neg], "validation": [val], "test": [test]}


def test_the_stage1_file_is_what_training_reads(tmp_path):
    from suffice.training.fit.splits import load_splits
    from suffice.training.fit.config import build_train_config

    out = tmp_path / "weak" / "w.jsonl"
    manifest = build_weak_file(_dsd(_splits_rows()), out, WeakConfig(), {"squad2:1": ["1830"]}, {"data_hash": "abc", "name": "t"})
    assert manifest["parents"] == 3 and manifest["pairs"] == sum(manifest["pairs_by_rule"].values()) > 0
    assert manifest["rows_by_split"] == {"test": 1, "train": manifest["pairs"] + 3, "validation": 1}
    assert json.loads(Path(f"{out}.manifest.json").read_text())["source_data_hash"] == "abc"
    assert not list(out.parent.glob(".*tmp"))

    splits = load_splits(build_train_config(None, [f"--train_file={out}"]))
    assert len(splits.train) == manifest["pairs"] + 3 and "squad2:9" not in splits.train["id"]  # parents are sufficient rows only
    assert splits.validation["id"] == ["squad2:7"] and splits.test["id"] == ["squad2:8"] and splits.test["label"] == [0]
    assert set(splits.train["label_source"]) == {"weak", "autorater"}
    assert set(splits.train["parent_id"]) - {""} <= {"squad2:1", "squad2:2", "squad2:3"}


def test_no_sufficient_parent_is_an_error(tmp_path):
    rows = _splits_rows()
    rows["train"] = [dict(r, label=0) for r in rows["train"]]
    with pytest.raises(WeakConfigError, match="no train row is labelled sufficient"):
        build_weak_file(_dsd(rows), tmp_path / "w.jsonl", WeakConfig(), {})


def test_stage2_starts_from_the_stage1_model(tiny_bert, tmp_path):
    from tests.test_train import tiny_config

    from suffice.training.fit.run import run

    out = tmp_path / "w.jsonl"
    build_weak_file(_dsd(_splits_rows()), out, WeakConfig(), {})
    stage1 = tmp_path / "stage1"
    run(tiny_config(tiny_bert, stage1, f"--train_file={out}", "--tracking.enabled=false", "--baselines=[]", "--num_train_epochs=1"))
    stage2 = tmp_path / "stage2"
    run(tiny_config(stage1, stage2, "--tracking.enabled=false", "--baselines=[]", "--num_train_epochs=1"))
    meta = json.loads((stage2 / "suffice_model.json").read_text())
    assert meta["base_model"] == str(stage1) and (stage2 / "model.safetensors").is_file()


def test_cli_on_the_shared_data(shared_data_dir, tmp_path, capsys):
    out = tmp_path / "qed-weak.jsonl"
    rc = main(["--config", str(REPO / "configs" / "sufficiency.yaml"), "--out", str(out), "--max-pairs", "50",
               "--data.name=pytest-weak", "--data.sources=[qed]", "--data.include_variants=false"])
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    weak = [r for r in rows if r["label_source"] == "weak"]
    assert len(weak) == 50 and {r["source"] for r in rows} == {"qed"}
    assert {r["split"] for r in rows} == {"train", "validation", "test"}
    assert "weak pairs from" in capsys.readouterr().out
    assert main(["--config", str(REPO / "configs" / "sufficiency.yaml"), "--out", str(out), "--rules", "nope"]) == 2


def test_a_base_model_with_another_label_count_keeps_the_encoder(tiny_bert, tmp_path, caplog):
    from tests.test_train import tiny_config

    from suffice.training.fit.run import run

    binary = tmp_path / "binary"
    run(tiny_config(tiny_bert, binary, "--tracking.enabled=false", "--baselines=[]", "--num_train_epochs=1"))
    three = tmp_path / "three"
    with caplog.at_level("WARNING"):
        run(tiny_config(binary, three, "--tracking.enabled=false", "--baselines=[]", "--num_train_epochs=1",
                        "--label_scheme=three_level"))
    assert "2-label head and this run needs 3 labels" in caplog.text
    assert json.loads((three / "config.json").read_text())["id2label"] == {"0": "insufficient", "1": "partial", "2": "sufficient"}
