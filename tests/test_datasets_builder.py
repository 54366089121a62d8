"""DataConfig, build/prepare/load_prepared, the manifest, split-leak checks and the `suffice data` CLI."""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from suffice.serving.config import ConfigError, build_config
from suffice.training.data.cli import main as data_main
from suffice.training.data.builder import COLUMNS, DataConfig, build, load_prepared, prepare
from suffice.training.data.labels import cohen_kappa
from suffice.training.data.loaders import sha256_file
from suffice.training.paths import prepared_dir

FIX = Path(__file__).parent / "fixtures"
SHARED = FIX / "shared"


def _cfg(**kw) -> DataConfig:
    return DataConfig(**{"data_dir": str(SHARED), **kw})


def _rows(ds) -> dict[str, dict]:
    return {r["id"]: r for split in ds for r in ds[split]}


def test_columns_labels_and_fallback():
    ds, m = build(_cfg(include_variants=False, include_synthetic=False), progress=False)
    assert sorted(ds) == ["test", "train", "validation"] and list(ds["train"].column_names) == list(COLUMNS)
    rows = _rows(ds)
    assert len(rows) == 14
    a2 = rows["squad2:a2"]
    assert (a2["label"], a2["level"], a2["label_source"], a2["gold_label"]) == (0, "partial", "autorater", 0)
    assert a2["passages"] == [{"title": "Alpha", "text": "The alpha stone is green. It was found in 1901."}]
    m1 = rows["musique:m1"]  # no autorater label: falls back to gold, recorded per row
    assert (m1["label"], m1["level"], m1["label_source"]) == (1, "sufficient", "gold")
    assert (rows["squad2:b2"]["label"], rows["squad2:b2"]["gold_label"]) == (0, 1)  # teacher and gold disagree
    assert m["label_policy"]["rows_by_label_source"] == {"autorater": 13, "gold": 1}

    ds, m = build(_cfg(include_variants=False, include_synthetic=False, fallback="unlabelled"), progress=False)
    assert _rows(ds)["musique:m1"]["label"] == -1 and _rows(ds)["musique:m1"]["label_source"] == ""
    ds, m = build(_cfg(include_variants=False, include_synthetic=False, fallback="drop"), progress=False)
    assert "musique:m1" not in _rows(ds) and m["dropped"] == {"no autorater label (fallback=drop)": 1}
    ds, m = build(_cfg(include_variants=False, include_synthetic=False, label_source="gold"), progress=False)
    rows = _rows(ds)
    assert (rows["squad2:b2"]["label"], rows["squad2:b2"]["label_source"]) == (1, "gold")
    assert (rows["hotpotqa-fullwiki:f2"]["level"], rows["hotpotqa-fullwiki:f3"]["level"]) == ("partial", "insufficient")


def test_synthetic_kind_generator_and_train_only():
    ds, m = build(_cfg(include_variants=False), progress=False)
    rows = _rows(ds)
    s1 = rows["squad2-synth:s1"]
    assert (s1["label_source"], s1["kind"], s1["generator"], s1["split"], s1["label"]) == ("synthetic", "direct", "llm-generator-v1", "train", 1)
    assert "squad2-synth:s3" not in rows  # its passage group is a test paragraph
    assert m["dropped"] == {"synthetic outside train/validation or across a split": 1}


def test_several_synthetic_files_keep_their_train_and_validation_splits():
    synth = SHARED / "synthetic"
    ds, m = build(_cfg(include_variants=False, synthetic_paths=[str(synth / "squad2-questions.jsonl"), str(synth / "wiki-questions.jsonl")]),
                  progress=False)
    rows = _rows(ds)
    assert rows["wiki-synth:w1"]["split"] == "train" and rows["wiki-synth:w3"]["split"] == "validation"
    assert rows["wiki-synth:w3"]["source"] == "wiki-synthetic" and rows["wiki-synth:w3"]["label_source"] == "synthetic"
    assert "wiki-synth:w4" not in rows and "squad2-synth:s3" not in rows  # never a synthetic test item, never across a split
    assert m["dropped"] == {"synthetic outside train/validation or across a split": 2}
    with pytest.raises(ConfigError, match="not both"):
        _cfg(synthetic_path="a.jsonl", synthetic_paths=["b.jsonl"])


def test_retrieval_like_copies_keep_label_and_split():
    synth = SHARED / "synthetic"
    ds, _ = build(_cfg(include_variants=False, retrieval_like_fraction=1.0,
                       synthetic_paths=[str(synth / "squad2-questions.jsonl"), str(synth / "wiki-questions.jsonl")]), progress=False)
    rows = _rows(ds)
    copies = {i: r for i, r in rows.items() if r["variant"] == "retrieval_like"}
    assert copies and all(r["split"] == "train" for r in copies.values())
    for cid, r in copies.items():
        parent = rows[r["parent_id"]]
        assert (r["label"], r["level"], r["group"], r["label_source"]) == (parent["label"], parent["level"], parent["group"], parent["label_source"])
        assert parent["passages"][0] in r["passages"] and len(r["passages"]) >= 3
        assert len({p["title"] for p in r["passages"]}) == len(r["passages"])  # other titles only
    assert "wiki-synth:w1#retrieval_like" in copies
    with pytest.raises(ConfigError, match="retrieval_like_fraction"):
        _cfg(retrieval_like_fraction=1.5)


def test_variants_in_dataset_and_no_split_leak():
    ds, m = build(_cfg(variant_parent_fraction=1.0, variants_per_item=3, variant_splits=["train", "validation", "test"]), progress=False)
    rows = list(_rows(ds).values())
    variants = [r for r in rows if r["variant"]]
    assert {r["variant"] for r in variants} == {"drop_supporting", "other_paragraph", "remove_answer_sentence"}
    assert all(r["label_source"] == "constructed" and r["label"] == 0 and r["parent_id"] for r in variants)
    by_id = {r["id"]: r for r in rows}
    assert all(by_id[r["parent_id"]]["split"] == r["split"] for r in variants)
    group_splits, text_splits = defaultdict(set), defaultdict(set)
    for r in rows:
        group_splits[r["group"]].add(r["split"])
        for p in r["passages"]:
            text_splits[p["text"]].add(r["split"])
    assert all(len(s) == 1 for s in group_splits.values())
    assert all(len(s) == 1 for s in text_splits.values())  # no test/validation paragraph appears in train
    assert m["counts"]["by_split"]["test"]["variant"].get("other_paragraph") == 2  # Beta pairs within test
    assert m["rows_sharing_passage_text_across_splits"] == {}


def test_manifest_contents_and_prepare_roundtrip():
    cfg = _cfg(name="fx")
    ds, m = prepare(cfg, progress=False)
    out = prepared_dir() / "fx"
    assert (out / "manifest.json").is_file() and str(out).startswith(str(prepared_dir()))
    saved = json.loads((out / "manifest.json").read_text())
    assert saved["data_hash"] == m["data_hash"] and len(m["data_hash"]) == 64
    assert saved["inputs"][str(SHARED.resolve() / "items.jsonl")]["sha256"] == sha256_file(SHARED / "items.jsonl")
    assert {v["role"] for v in saved["inputs"].values()} == {"items", "autorater", "synthetic"}
    c = saved["counts"]
    assert c["total"] == sum(len(ds[s]) for s in ds) == sum(c["by_split"][s]["total"] for s in ("train", "validation", "test"))
    assert c["by_split"]["test"]["source"] == {"hotpotqa-fullwiki": 1, "squad2": 3}
    assert c["by_source"]["squad2-synthetic"]["label"] == {"0": 1, "1": 1}
    assert set(c["by_split"]["train"]) == {"total", "source", "label", "level", "label_source", "variant"}
    assert saved["empty_passages"] == {"total": 1, "by_source": {"hotpotqa-fullwiki": 1}}
    assert saved["config"]["name"] == "fx" and saved["config"]["data_dir"] == str(SHARED.resolve())
    assert saved["agreement"]["squad2"] == {"n": 8, "accuracy": 0.875, "kappa": 0.6, "teacher_sufficient": 0.75, "gold_sufficient": 0.875}
    assert saved["autorater_labels_without_item"] == 1
    assert [ld["kept"] for ld in saved["loads"]] == [14, 3]

    ds2, m2 = load_prepared("fx")
    assert m2["data_hash"] == m["data_hash"] and ds2["train"][0] == ds["train"][0]
    assert load_prepared(out)[1]["data_hash"] == m["data_hash"]
    # deterministic, and sensitive to the config
    assert build(cfg, progress=False)[1]["data_hash"] == m["data_hash"]
    assert build(_cfg(name="fx", seed=14, variant_parent_fraction=0.5), progress=False)[1]["data_hash"] != m["data_hash"]
    # prepare again replaces the folder cleanly
    prepare(_cfg(name="fx", include_synthetic=False), progress=False)
    assert load_prepared("fx")[1]["counts"]["by_source"].get("squad2-synthetic") is None


def test_load_prepared_errors():
    with pytest.raises(FileNotFoundError, match="no prepared dataset 'nope'.*suffice data prepare"):
        load_prepared("nope")
    _, m = prepare(_cfg(name="fx2", include_variants=False), progress=False)
    man = prepared_dir() / "fx2" / "manifest.json"
    data = json.loads(man.read_text())
    data["counts"]["by_split"]["train"]["total"] += 1
    man.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="split train has .* rows but the manifest says"):
        load_prepared("fx2")
    (prepared_dir() / "notmine").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="not a prepared dataset"):
        prepare(_cfg(name="notmine"), progress=False)


def test_extra_files_split_by_article_and_sources_filter():
    ds, m = build(_cfg(include_variants=False, include_synthetic=False, extra_files=[str(FIX / "squad2.json"), str(FIX / "qed.jsonl")],
                       sources=["squad2", "qed", "musique"]), progress=False)
    rows = _rows(ds)
    assert "hotpotqa-fullwiki:f1" not in rows and m["dropped"]["filtered out by sources"] == 3
    blue = {rows[i]["split"] for i in ("squad2:q-blue-1", "squad2:q-blue-2", "squad2:q-blue-3")}
    assert len(blue) == 1  # one article, one split
    assert rows["qed:101"]["label_source"] == "gold" and rows["qed:101"]["label"] == 1
    with pytest.raises(ValueError, match="sources \\['wiki'\\] match no item"):
        build(_cfg(sources=["wiki"]), progress=False)


def test_dataconfig_checks_and_yaml(tmp_path):
    with pytest.raises(ConfigError, match="variant_rules \\['shuffle'\\] unknown"):
        DataConfig(variant_rules=["shuffle"])
    with pytest.raises(ConfigError, match="name='../x'"):
        DataConfig(name="../x")
    with pytest.raises(ConfigError, match="label_source='teacher' is not allowed"):
        build_config(DataConfig, overrides=["--label_source=teacher"])
    with pytest.raises(ConfigError, match="extra_split_fractions"):
        DataConfig(extra_split_fractions=[0.5, 0.5, 0.5])
    repo_yaml = Path(__file__).resolve().parent.parent / "configs" / "data.yaml"
    assert build_config(DataConfig, repo_yaml) == DataConfig()  # the shipped YAML is the documented default


def test_cohen_kappa():
    assert cohen_kappa([1, 1, 0, 0], [1, 1, 0, 0]) == 1.0
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == -1.0
    assert cohen_kappa([1, 1], [1, 1]) is None and cohen_kappa([], []) is None


def test_cli_prepare_and_stats(capsys):
    assert data_main(["prepare", "--quiet", f"--data_dir={SHARED}", "--name=cli"]) == 0
    out = capsys.readouterr().out
    assert "Items per split and source" in out and "Teacher (autorater) vs gold" in out and "saved at" in out
    assert (prepared_dir() / "cli" / "manifest.json").is_file()
    assert data_main(["stats", "--prepared", "cli"]) == 0
    out = capsys.readouterr().out
    assert "squad2" in out and "87.5%" in out and "Empty-passage items: 1" in out and "synthetic outside train/validation or across a split: 1" in out
    assert data_main(["stats", "--quiet", f"--data_dir={SHARED}", "--name=mem", "--include_synthetic=false"]) == 0
    assert not (prepared_dir() / "mem").exists()  # stats builds in memory


def test_cli_errors(capsys, tmp_path):
    assert data_main(["prepare", "--quiet", "--nmae=x"]) == 2
    assert "unknown config key(s) ['nmae']" in capsys.readouterr().err
    assert data_main(["stats", "stray"]) == 2
    bad = tmp_path / "shared"
    shutil.copytree(SHARED, bad)
    with (bad / "items.jsonl").open("a") as f:
        f.write('{"id": "x:1", "question": "Q", "passages": "oops"}\n')
    assert data_main(["prepare", "--quiet", f"--data_dir={bad}"]) == 2
    err = capsys.readouterr().err
    assert "items.jsonl, line 15, field 'passages'" in err


def test_builder_imports_no_torch():
    import subprocess

    code = ("import sys; import suffice.training.data.cli, suffice.training.data.builder; "
            "print(any(m in sys.modules for m in ('torch', 'transformers', 'mlflow')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr


def test_real_shared_data(shared_data_dir):
    ds, m = build(DataConfig(data_dir=str(shared_data_dir)), progress=False)
    real = {s: n for s, n in m["counts"]["by_source"].items() if s != "squad2-synthetic"}
    assert sum(v["label_source"].get("autorater", 0) + v["label_source"].get("gold", 0) for v in real.values()) == 8133
    assert set(real) == {"squad2", "qed", "hotpotqa-fullwiki", "hotpotqa-distractor", "musique"}
    assert m["counts"]["by_source"]["squad2-synthetic"]["total"] == 4500 and not m["dropped"]
    assert m["empty_passages"] == {"total": 2, "by_source": {"hotpotqa-fullwiki": 2}}
    ag = m["agreement"]
    assert set(ag) == {"squad2", "qed", "hotpotqa-fullwiki"}  # the teacher covers these three
    assert 0.94 < ag["squad2"]["accuracy"] < 0.98 and 0.75 < ag["hotpotqa-fullwiki"]["accuracy"] < 0.83
    assert 0.85 < ag["qed"]["accuracy"] < 0.95
    assert {r for r in m["counts"]["by_split"]["test"]["variant"]} == {""}  # variants only in train by default
    group_splits = defaultdict(set)
    for s in ds:
        for g in ds[s]["group"]:
            group_splits[g].add(s)
    assert all(len(v) == 1 for v in group_splits.values())
    assert Counter(ds["test"]["source"])["squad2"] == 1321
