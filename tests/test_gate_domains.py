"""Leave-domains-out evaluation of the retrieval gate: the pair/domain reader, the split, the bench's tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from suffice.training.data.schema import DataFormatError
from suffice.training.data.threads import (domain_splits, gate_domain_rows, gate_training_rows, load_retrieval_threads,
                                           split_by_domain)

REPO = Path(__file__).resolve().parent.parent


def _pair(domain: str, k: int, skip: str = "sort those by price", retrieve: str = "what about gift cards?") -> list[dict]:
    prefix = [{"role": "user", "content": f"what do {domain} plans cost? ({k})"},
              {"role": "assistant", "content": f"Basic is ${k}, Pro is ${k + 10}."}]
    pid = f"{domain}-{k}"
    return json.loads(json.dumps([{"id": f"{pid}-s", "messages": [*prefix, {"role": "user", "content": skip}], "label": "SKIP",
             "category": "sort_filter_existing", "domain": domain, "pair": pid},
            {"id": f"{pid}-r", "messages": [*prefix, {"role": "user", "content": retrieve}], "label": "RETRIEVE",
             "category": "new_entity", "domain": domain, "pair": pid}]))  # a deep copy: tests edit one thread


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _pairs_file(tmp_path: Path, n_domains: int = 10, per_domain: int = 2) -> Path:
    return _write(tmp_path / "pairs.jsonl", [r for d in range(n_domains) for k in range(per_domain) for r in _pair(f"dom{d}", k)])


def _plain_file(tmp_path: Path) -> Path:
    records = [{k: v for k, v in r.items() if k not in ("domain", "pair")} | {"id": f"plain-{r['id']}"}
               for k in range(3) for r in _pair("shop", k)]
    return _write(tmp_path / "train.jsonl", records)


# ---------------------------------------------------------------- reader


def test_reader_keeps_domain_and_pair_and_training_rows_are_unchanged(tmp_path):
    pairs = _pairs_file(tmp_path, 2, 1)
    threads = load_retrieval_threads(pairs)
    assert [(t.domain, t.pair, t.label) for t in threads[:2]] == [("dom0", "dom0-0", "SKIP"), ("dom0", "dom0-0", "RETRIEVE")]
    # training rows carry no domain/pair columns: the rows training reads stay what they were
    plain = gate_training_rows(pairs)
    assert all("domain" not in r and "pair" not in r for r in plain)
    rows = gate_domain_rows(pairs)
    assert [{k: v for k, v in r.items() if k not in ("domain", "pair", "origin")} for r in rows] == plain
    assert rows[0]["domain"] == "dom0" and rows[0]["pair"] == "dom0-0" and rows[0]["kind"] == "sort_filter_existing"
    assert {r["origin"] for r in rows} == {"pairs.jsonl"}  # the file each row came from


def test_rows_from_two_files_and_plain_threads_have_empty_domain(tmp_path):
    rows = gate_domain_rows(_plain_file(tmp_path), _pairs_file(tmp_path, 2, 1))
    assert [r["domain"] for r in rows[:6]] == [""] * 6 and rows[6]["domain"] == "dom0"
    with pytest.raises(ValueError, match="in both .*train.jsonl and .*train.jsonl"):
        gate_domain_rows(tmp_path / "train.jsonl", tmp_path / "train.jsonl")


@pytest.mark.parametrize("edit, match", [
    (lambda rs: rs[1].update(label="SKIP"), r"line 2, field 'label': pair 'dom0-0' has two SKIP threads .*line 1"),
    (lambda rs: rs[1].update(domain="elsewhere"), r"line 2, field 'domain': pair 'dom0-0' spans two domains"),
    (lambda rs: rs[1]["messages"][1].update(content="Basic is $99."), r"line 2, field 'messages\[1\]': .*share every message except the last"),
    (lambda rs: rs[1]["messages"].insert(0, {"role": "system", "content": "be nice"}), r"line 2, field 'messages\[0\]'"),
    (lambda rs: rs[1]["messages"][-1].update(content="sort those by price"), r"line 2, field 'messages\[2\]': .*end in different user messages"),
    (lambda rs: rs.pop(1), r"line 1, field 'pair': pair 'dom0-0' has only this SKIP thread: add its RETRIEVE partner"),
    (lambda rs: rs[2].update(pair="dom0-0"), r"line 3, field 'pair': pair 'dom0-0' already has two threads \(lines 1, 2\)"),
    (lambda rs: rs[0].update(pair=7), r"line 1, field 'pair': 'pair' must be str, got int"),
    (lambda rs: rs[0].update(domain="  "), r"line 1, field 'domain': 'domain' is empty"),
])
def test_pair_errors_name_file_line_field_and_fix(tmp_path, edit, match):
    records = _pair("dom0", 0) + _pair("dom1", 1)
    edit(records)
    path = _write(tmp_path / "bad.jsonl", records)
    with pytest.raises(DataFormatError, match=match) as e:
        load_retrieval_threads(path)
    assert str(e.value).startswith(str(path))


# ---------------------------------------------------------------- split


def test_split_keeps_domains_and_pairs_whole_and_plain_threads_train(tmp_path):
    rows = gate_domain_rows(_plain_file(tmp_path), _pairs_file(tmp_path, 20, 3))
    s = split_by_domain(rows, 42, 0.2, 0.1)
    assert sum(len(v) for v in s.values()) == len(rows)
    where_domain, where_pair = {}, {}
    for name, part in s.items():
        for r in part:
            assert where_domain.setdefault(r["domain"], name) == name, r["domain"]
            assert where_pair.setdefault(r["pair"], name) == name, r["pair"]
    assert where_domain[""] == "train"  # threads without a domain (train.jsonl) always train
    n_domains = {name: len({r["domain"] for r in part if r["domain"]}) for name, part in s.items()}
    assert n_domains == {"train": 14, "validation": 2, "test": 4}  # exact counts: 20 * 0.2, 20 * 0.1
    assert [r["id"] for r in s["test"]] == [r["id"] for r in rows if r in s["test"]]  # file order kept


def test_split_is_deterministic_per_seed_and_changes_with_it(tmp_path):
    rows = gate_domain_rows(_pairs_file(tmp_path, 20, 1))
    ids = lambda s: {k: [r["id"] for r in v] for k, v in s.items()}  # noqa: E731
    assert ids(split_by_domain(rows, 3, 0.2, 0.2)) == ids(split_by_domain(list(rows), 3, 0.2, 0.2))
    tests = {tuple(sorted({r["domain"] for r in split_by_domain(rows, seed, 0.2, 0.2)["test"]})) for seed in range(5)}
    assert len(tests) > 1
    assert domain_splits(["a", "b"], 0, 0.0, 0.0) == {"a": "train", "b": "train"}
    with pytest.raises(ValueError, match="three non-negative numbers"):
        domain_splits(["a"], 0, 0.8, 0.4)


def test_extra_writer_files_keep_the_base_split_and_hold_out_their_own_domains(tmp_path):
    """gate.extra_paths: each further writer's file is split by its own domains; the base files keep their split."""
    from suffice.training.data.threads import gate_splits

    plain, pairs = _plain_file(tmp_path), _pairs_file(tmp_path, 20, 2)
    (tmp_path / "w").mkdir()
    extra = _write(tmp_path / "w" / "writer-x.jsonl", [r | {"id": f"x-{r['id']}", "pair": f"x-{r['pair']}"}
                                                      for d in range(10) for r in _pair(f"xdom{d}", 0)])
    ids = lambda s: {k: [r["id"] for r in v] for k, v in s.items()}  # noqa: E731
    base = gate_splits(plain, "domains", 42, 0.2, 0.1, pairs)
    both = gate_splits(plain, "domains", 42, 0.2, 0.1, pairs, [extra])
    for k in base:  # the base rows land where they did without the extra file
        assert [i for i in ids(both)[k] if not i.startswith("x-")] == ids(base)[k]
    held = {k: {r["domain"] for r in v if r["origin"] == "writer-x.jsonl"} for k, v in both.items()}
    assert (len(held["train"]), len(held["validation"]), len(held["test"])) == (7, 1, 2)  # the writer's own 10 domains
    flat = gate_splits(plain, "opening_message", 42, 0.2, 0.1, None, [extra])
    assert sum(len(v) for v in flat.values()) == 6 + 20
    with pytest.raises(ValueError, match="its own file name"):
        gate_splits(plain, "domains", 42, 0.2, 0.1, pairs, [_write(tmp_path / "w" / "pairs.jsonl", [])])


def test_extra_paths_config_is_checked(tmp_path):
    from suffice.serving.config import ConfigError
    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.splits import load_gate_splits

    with pytest.raises(ConfigError, match="extra_paths"):
        build_train_config(str(REPO / "configs" / "retrieval-gate.yaml"), ["--gate.extra_paths=['']"])
    one = build_train_config(str(REPO / "configs" / "retrieval-gate.yaml"), ["--gate.extra_paths=data/x.jsonl"])
    assert one.gate.extra_paths == ["data/x.jsonl"]  # a single path is a list of one
    cfg = build_train_config(str(REPO / "configs" / "retrieval-gate.yaml"),
                             [f"--gate.path={_plain_file(tmp_path)}", f"--gate.pairs_path={_pairs_file(tmp_path)}",
                              f"--gate.extra_paths=[{tmp_path / 'missing.jsonl'}]", "--gate.styles=[]"])
    with pytest.raises(ConfigError, match="do not exist"):
        load_gate_splits(cfg)


def test_split_rejects_a_pair_across_domains():
    rows = [{"domain": "a", "pair": "p"}, {"domain": "b", "pair": "p"}]
    with pytest.raises(ValueError, match="pair 'p' spans domains 'a' and 'b'"):
        split_by_domain(rows, 0, 0.5, 0.0)


# ---------------------------------------------------------------- bench tables


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_retrieval_gate
    finally:
        sys.path.pop(0)
    return bench_retrieval_gate


def test_category_table_and_pair_accuracy(bench):
    rows = [{"kind": "thanks_greeting", "pair": "p1"}, {"kind": "new_topic", "pair": "p1"},
            {"kind": "thanks_greeting", "pair": "p2"}, {"kind": "new_topic", "pair": "p2"}, {"kind": "", "pair": ""}]
    y = np.array([1, 0, 1, 0, 1])
    table = bench.category_table(rows, y, {"gate@stored": np.array([1, 0, 0, 0, 1]), "gate@0.5": np.array([1, 1, 1, 0, 0])})
    assert list(table) == ["?", "thanks_greeting", "new_topic"]  # SKIP categories first
    assert table["thanks_greeting"] == {"label": "SKIP", "n": 2, "gate@stored": 0.5, "gate@0.5": 1.0}
    assert table["new_topic"] == {"label": "RETRIEVE", "n": 2, "gate@stored": 1.0, "gate@0.5": 0.5}
    assert table["?"]["gate@0.5"] == 0.0
    mixed = bench.category_table([{"kind": "x"}, {"kind": "x"}], np.array([1, 0]), {"a": np.array([1, 1])})
    assert mixed["x"]["label"] == "mixed" and mixed["x"]["a"] == 0.5
    assert bench.pair_accuracy(rows, y, np.array([1, 0, 0, 0, 1])) == 0.5
    assert np.isnan(bench.pair_accuracy([{"pair": ""}], np.array([1]), np.array([1])))


def test_evaluate_split_with_a_stub_gate(bench, tmp_path):
    """evaluate_split on a domains split: both operating points, TF-IDF + LR at 0.5 and at its validation
    threshold, per-category and pair accuracy, margins, goals; a keyword stub stands in for the ONNX gate."""
    from types import SimpleNamespace

    class StubGate:
        skip_threshold = 0.7

        def decide(self, messages):
            p = 0.9 if "sort" in messages[-1]["content"] else 0.1
            return SimpleNamespace(decision="SKIP" if p >= self.skip_threshold else "RETRIEVE", score=p)

    rows = gate_domain_rows(_plain_file(tmp_path), _pairs_file(tmp_path, 10, 2))
    split = split_by_domain(rows, 0, 0.3, 0.2)
    r = bench.evaluate_split({"fp32": StubGate()}, split, 0.95)
    assert r["n_test"] == 12 and len(r["test_domains"]) == 3
    assert r["fp32"]["macro_f1"] == 1.0 and r["fp32"]["skip_precision"] == 1.0 and r["fp32"]["auroc"] == 1.0
    assert r["by_category"]["sort_filter_existing"]["fp32@stored"] == 1.0
    assert set(r["by_category"]["new_entity"]) == {"label", "n", "fp32@stored", "fp32@0.5", "tfidf_lr@0.5", "tfidf_lr@threshold"}
    assert r["pair_accuracy"]["fp32@stored"] == 1.0
    assert r["f1_points_over_tfidf"] == pytest.approx(100 * (r["fp32"]["at_0.5"]["macro_f1"] - r["tfidf_lr"]["macro_f1"]))
    latency = {"full_window_p50_ms": 1.0}
    issue7, issue21 = bench.split_goals(r, "fp32", latency, [{"ok": True}])
    assert issue21["macro_f1@stored>=0.90"] and issue21["skip_precision>=0.95"] and issue21["skip_rate>=0.30"]
    assert not issue7["p50_128_int8<=10ms"]  # fp32 is not the int8 goal
    r["splits"] = {"domains": {**r, "goals": issue7, "goals_issue21": issue21}}
    text = bench.format_report({**r, "bundle": "stub", "hardware": bench.hardware(1), "headline_precision": "fp32", "split": "domains",
                                "latency_128": {"mean_tokens": 1, "p50_ms": 1, "p95_ms": 1, "p99_ms": 1, "full_window_p50_ms": 1,
                                                "full_window_n": 1}, "acceptance": []})
    assert "== split domains" in text and "sort_filter_existing" in text and "goals (issue 21)" in text


def test_training_reads_the_domains_split_the_benchmark_measures(shared_data_dir):
    """gate.split=domains: training's splits are the benchmark's (same rows, same held-out domains)."""
    from suffice.training.data.threads import gate_splits
    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.splits import load_splits

    cfg = build_train_config(REPO / "configs" / "retrieval-gate.yaml", ["--gate.split=domains"])
    splits = load_splits(cfg)
    ours = gate_splits(shared_data_dir / "retrieval-gate" / "train.jsonl", "domains", cfg.seed, cfg.gate.test_fraction,
                       cfg.gate.validation_fraction)
    assert [r["id"] for r in splits.test.to_list()] == [r["id"] for r in ours["test"]]
    test_domains = {r["domain"] for r in ours["test"]}
    assert test_domains and not test_domains & {r["domain"] for r in ours["train"]}
    assert splits.manifest["split"] == "domains" and len(splits.manifest["files"]) == 2
