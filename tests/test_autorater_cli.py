"""`suffice label` end to end: the cached teacher, the lexical baseline, agreement tables, MLflow
logging without secrets, and a labelling process killed with SIGKILL mid-batch then resumed."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llm_server import FakeLLMServer, Reply
from test_autorater_http import KEY_ENV, SECRET, expected_label, judge, make_items

from suffice.training.autorater.agreement import cohen_kappa, compare
from suffice.training.autorater.cli import main
from suffice.training.data.loaders import gold_label, load_items, read_autorater_labels
from store_support import store_rows

REPO = Path(__file__).resolve().parent.parent
FIXTURE_ITEMS = REPO / "tests" / "fixtures" / "shared" / "items.jsonl"
FIXTURE_LABELS = REPO / "tests" / "fixtures" / "shared" / "autorater-labels.jsonl"


def write_items(path: Path, items) -> Path:
    with path.open("w") as f:
        for it in items:
            f.write(json.dumps({"id": it.id, "source": it.source, "question": it.question,
                                "passages": [p.to_dict() for p in it.passages]}) + "\n")
    return path


def test_cached_rater_labels_items_and_import_is_idempotent(tmp_path, capsys):
    store = tmp_path / "labels.sqlite"
    common = ["--store", str(store), f"--cached_path={FIXTURE_LABELS}", "--mlflow=false"]
    assert main(["--input", str(FIXTURE_ITEMS), "--rater", "cached", "--no-progress", *common]) == 0
    out = capsys.readouterr().out
    teacher = read_autorater_labels(FIXTURE_LABELS)
    items = load_items(FIXTURE_ITEMS)
    covered = [it.id for it in items if it.id in teacher]
    rows = {r["item_id"]: r for r in store_rows(store)}
    assert set(rows) == set(covered)
    assert all(rows[i]["label"] == teacher[i]["label"] and rows[i]["level"] == teacher[i]["level"] for i in covered)
    assert {r["rater"] for r in rows.values()} == {"llm-autorater-v1"}
    assert f"{len(covered)} labelled" in out and f"{len(items) - len(covered)} failed" in out and "not_in_cache" in out
    # import brings in every shipped label (also those without an item here) and only once.
    assert main(["import", *common]) == 0
    assert len(store_rows(store)) == len(teacher)
    assert main(["import", *common]) == 0
    assert len(store_rows(store)) == len(teacher)
    assert f"0 new, {len(teacher)} already" in capsys.readouterr().out


def test_cached_teacher_imports_all_shipped_labels(shared_data_dir, tmp_path, capsys):
    store = tmp_path / "labels.sqlite"
    assert main(["import", "--store", str(store)]) == 0
    shipped = read_autorater_labels(shared_data_dir / "autorater-labels.jsonl")
    n_lines = sum(1 for line in (shared_data_dir / "autorater-labels.jsonl").open() if line.strip())
    rows = {r["item_id"]: r for r in store_rows(store)}
    assert len(rows) == len(shipped) == n_lines
    assert all(rows[k]["label"] == v["label"] and rows[k]["level"] == v["level"] for k, v in shipped.items())
    assert main(["list", "--store", str(store)]) == 0
    assert f"llm-autorater-v1@shipped" in capsys.readouterr().out


def test_shipped_teacher_agrees_with_gold_per_source(shared_data_dir, tmp_path, capsys):
    out_json = tmp_path / "agreement.json"
    assert main(["agreement", "--a", "cached", "--b", "gold", "--store", str(tmp_path / "none.sqlite"),
                 "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    rows = {r["source"]: r for r in json.loads(out_json.read_text())["rows"]}
    assert set(rows) == {"squad2", "qed", "hotpotqa-fullwiki", "all"}  # the teacher covers these three
    assert rows["squad2"]["accuracy"] > 0.9 and rows["squad2"]["kappa"] > 0.8
    assert 0.7 < rows["hotpotqa-fullwiki"]["accuracy"] < 0.9
    assert sum(rows[s]["n"] for s in ("squad2", "qed", "hotpotqa-fullwiki")) == rows["all"]["n"]
    assert "llm-autorater-v1 (autorater-labels.jsonl)" in printed and "kappa" in printed


def test_lexical_rater_and_agreement_table_on_fixture(tmp_path, capsys):
    store = tmp_path / "labels.sqlite"
    common = ["--store", str(store), "--mlflow=false"]
    assert main(["--input", str(FIXTURE_ITEMS), "--rater", "lexical", "--no-progress", *common]) == 0
    assert main(["--input", str(FIXTURE_ITEMS), "--rater", "cached", "--no-progress", f"--cached_path={FIXTURE_LABELS}", *common]) == 0
    capsys.readouterr()
    out_json = tmp_path / "agree.json"
    assert main(["agreement", "--a", "lexical-coverage", "--b", "gold", "--items", str(FIXTURE_ITEMS),
                 "--json", str(out_json), *common]) == 0
    printed = capsys.readouterr().out
    items = load_items(FIXTURE_ITEMS)
    lexical = {r["item_id"]: r["label"] for r in store_rows(store) if r["rater"] == "lexical-coverage"}
    gold = {it.id: gold_label(it) for it in items if gold_label(it) is not None}
    expected = {r.source: r for r in compare(lexical, gold, {it.id: it.source for it in items})}
    got = {r["source"]: r for r in json.loads(out_json.read_text())["rows"]}
    assert set(got) == set(expected)
    for src, r in expected.items():
        assert got[src]["n"] == r.n and got[src]["accuracy"] == pytest.approx(r.accuracy, abs=1e-4)
        assert sum(c["count"] for c in got[src]["confusion"]) == r.n
    assert "squad2" in printed and "a=1/b=0" in printed
    # rater vs rater, and three levels
    assert main(["agreement", "--a", "lexical-coverage", "--b", "cached", "--levels", *common]) == 0
    assert "rows = a (lexical-coverage@coverage-0.8-0.5)" in capsys.readouterr().out
    assert main(["agreement", "--a", "nobody", "--b", "gold", *common]) == 2
    assert "no labels in the store" in capsys.readouterr().err


def test_kappa_matches_sklearn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    a = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1, "partial", "partial"]
    b = [1, 0, 0, 1, 0, 1, 1, 0, 1, 0, "partial", 0]
    assert cohen_kappa(a, b) == pytest.approx(sklearn_metrics.cohen_kappa_score([str(x) for x in a], [str(x) for x in b]))


def test_cli_errors_name_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert main(["--input", str(FIXTURE_ITEMS), "--rater", "lexical", "--concurency=3"]) == 2
    assert "unknown config key" in capsys.readouterr().err
    assert main(["--input", str(FIXTURE_ITEMS), "--rater", "openai-compatible", "--model=m", f"--api_key_env={KEY_ENV}"]) == 2
    assert f"{KEY_ENV} is not set" in capsys.readouterr().err
    assert main(["--input", str(tmp_path / "missing.jsonl"), "--rater", "lexical"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--input", str(FIXTURE_ITEMS), "--rater", "openai-compatible", "--model=m", "--api_key_env=sk-abc-123"]) == 2
    assert "NAME of an environment variable" in capsys.readouterr().err


def test_openai_run_logs_to_mlflow_and_never_the_key(tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    items = write_items(tmp_path / "items.jsonl", make_items(10))
    store = tmp_path / "labels.sqlite"
    caplog.set_level(logging.DEBUG)
    with FakeLLMServer(default=judge) as server:
        server.on("ITEM-3?", Reply.error(429, retry_after=0, body={"error": f"slow down, Bearer {SECRET}"}))
        server.on("ITEM-4?", Reply.text(f"key {SECRET}"), Reply.text("no"))
        rc = main(["--input", str(items), "--rater", "openai-compatible", "--concurrency", "3", "--store", str(store),
                   f"--base_url={server.base_url}", "--model=fake-llm", f"--api_key_env={KEY_ENV}", "--backoff_base_s=0.01",
                   "--price_per_1k_input=0.001", "-v", "--json", str(tmp_path / "acc.json")])
        assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    out, err = capsys.readouterr()
    assert rc == 0
    assert "9 labelled, 1 unparsed" in out and "http_429 1" in out and "cost est." in out and "MLflow run" in out
    assert "label llm:fake-llm" in err  # the progress bar

    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("labeling")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.metrics["stored_ok"] == 9 and run.data.metrics["stored_unparsed"] == 1
    assert run.data.metrics["failures.http_429"] == 1 and run.data.metrics["labels.1"] + run.data.metrics["labels.0"] == 9
    assert run.data.metrics["cost_usd"] > 0 and "latency_p95_s" in run.data.metrics
    assert run.data.params["model"] == "fake-llm" and run.data.params["api_key_env"] == KEY_ENV
    assert run.data.tags["prompt_version"].startswith("binary-")
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"accounting.json", "label_distribution.json", "prompt.md"} <= artifacts
    local = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, tracking_uri=os.environ["MLFLOW_TRACKING_URI"],
                                                     dst_path=str(tmp_path / "dl")))
    texts = {"stdout": out, "stderr": err, "log": caplog.text, "accounting": (tmp_path / "acc.json").read_text(),
             "store": "\n".join(sqlite3.connect(store).iterdump()),
             "mlflow db": Path(os.environ["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///")).read_bytes().decode("latin-1"),
             "mlflow artifacts": "\n".join(p.read_text() for p in local.rglob("*") if p.is_file())}
    assert "retry" in texts["log"]  # -v logged the retries...
    for where, text in texts.items():
        assert SECRET not in text, f"API key leaked into the {where}"  # ...and never the key


def test_killed_mid_batch_then_resumed_labels_every_item_exactly_once(tmp_path, monkeypatch):
    n = 60
    items = write_items(tmp_path / "items.jsonl", make_items(n))
    store = tmp_path / "labels.sqlite"
    env = {**os.environ, KEY_ENV: SECRET, "PYTHONUNBUFFERED": "1"}

    def command(url: str) -> list[str]:
        return [sys.executable, "-m", "suffice.training.cli", "label", "--input", str(items), "--rater", "openai-compatible",
                "--concurrency", "4", "--store", str(store), "--no-progress", f"--base_url={url}", "--model=fake-llm",
                f"--api_key_env={KEY_ENV}", "--mlflow=false", "--timeout_s=10"]

    def count() -> int:
        if not store.exists():
            return 0
        try:
            return len(store_rows(store))
        except sqlite3.OperationalError:  # the schema is being created right now
            return 0

    with FakeLLMServer(default=lambda body: Reply(**{**judge(body).__dict__, "delay_s": 0.15})) as server:
        proc = subprocess.Popen(command(server.base_url), env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while count() < 8:
            assert proc.poll() is None, f"the labeller ended before it could be killed: {proc.communicate()}"
            assert time.monotonic() < deadline, "the labeller stored nothing within 60 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        at_kill = count()
        assert 8 <= at_kill < n, "the kill must land mid-batch"
        time.sleep(0.3)  # requests the killed process left in flight finish on the server side
        server.default = judge
        server.reset_counters()
        done = subprocess.run(command(server.base_url), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert server.n_requests == n - at_kill  # finished labels were not asked for again
    rows = store_rows(store)
    assert len(rows) == n and len({r["item_id"] for r in rows}) == n
    assert {r["item_id"]: r["label"] for r in rows} == {f"test:{i}": expected_label(i) for i in range(n)}
    assert f"{at_kill} already stored (skipped)" in done.stdout


def test_limit_labels_the_first_k_items_and_reruns_skip_them(tmp_path, capsys):
    common = ["--input", str(FIXTURE_ITEMS), "--rater", "lexical", "--no-progress", "--store", str(tmp_path / "s.sqlite"),
              "--mlflow=false"]
    assert main([*common, "--limit", "5"]) == 0
    first5 = [it.id for it in load_items(FIXTURE_ITEMS)[:5]]
    assert sorted(r["item_id"] for r in store_rows(tmp_path / "s.sqlite")) == sorted(first5)
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "5 already stored (skipped)" in out
    assert len(store_rows(tmp_path / "s.sqlite")) == len(load_items(FIXTURE_ITEMS))


def test_labeling_yaml_documents_every_field():
    import dataclasses

    import yaml

    from suffice.training.autorater.labeling_config import DEFAULT_CONFIG, LabelingConfig
    from suffice.serving.config import build_config

    keys = set(yaml.safe_load(DEFAULT_CONFIG.read_text()))
    assert keys == {f.name for f in dataclasses.fields(LabelingConfig)}
    cfg = build_config(LabelingConfig, DEFAULT_CONFIG)
    assert cfg.rater == "cached" and cfg.experiment == "labeling" and cfg.store is None
    assert cfg.store_path().name == "labels.sqlite"


@pytest.mark.parametrize("overrides, message", [
    (["--concurrency=0"], "concurrency=0"),
    (["--rater=openai-compatible"], "needs a model name"),
    (["--lexical_partial=0.9"], "lexical_partial <= lexical_sufficient"),
    (["--extra_body={temperature: 1}"], "temperature is always 0"),
])
def test_config_checks(overrides, message):
    from suffice.training.autorater.labeling_config import LabelingConfig
    from suffice.serving.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=message):
        build_config(LabelingConfig, None, overrides)
