"""suffice.training.tracking on its own: the headline/ metric names and a dataset record that MLflow refuses.
(The training run's datasets, headline metrics and registered versions: tests/test_train.py.)"""

from __future__ import annotations

import pytest


def test_headline_metrics_name_every_validation_source():
    """Every validation source (wiki-synthetic too: never in test) and the source mean get headline columns, so a
    stage-0 run without a test split compares with the final run on the same names."""
    from suffice.training.tracking import headline_metrics

    got = headline_metrics({"overall": {"macro_f1": 0.6}, "squad2": {"macro_f1": 0.5, "auroc": 0.7, "ece": 0.1}},
                           {"overall": {"macro_f1": 0.7}, "squad2": {"macro_f1": 0.9}, "wiki-synthetic": {"macro_f1": 0.8, "auroc": 0.85}},
                           {"coverage_at_sufficient": 0.25, "precision_at_sufficient": float("nan")})
    assert got == {"headline/test_macro_f1": 0.6, "headline/test_squad2_macro_f1": 0.5, "headline/test_squad2_auroc": 0.7,
                   "headline/test_squad2_ece": 0.1, "headline/val_macro_f1": 0.7, "headline/val_squad2_macro_f1": 0.9,
                   "headline/val_wiki-synthetic_macro_f1": 0.8, "headline/val_wiki-synthetic_auroc": 0.85,
                   "headline/val_source_mean_macro_f1": pytest.approx(0.85), "headline/val_source_mean_auroc": 0.85,
                   "headline/val_coverage_at_sufficient": 0.25}
    stage0 = headline_metrics(None, {"overall": {"macro_f1": 0.7}, "squad2": {"macro_f1": 0.9}})
    assert {k for k in got if k.startswith("headline/val_")} >= set(stage0)  # the same names without a test split


def test_the_experiment_is_marked_for_model_development(tmp_path):
    """The MLflow UI opens a "GenAI" experiment on its traces page; suffice's experiment says what it is."""
    from mlflow.tracking import MlflowClient

    from suffice.training.tracking import EXPERIMENT_KIND, setup

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    old = client.create_experiment("older")  # a store made before the tag existed gets it on the next run
    assert client.get_experiment(old).tags.get("mlflow.experimentKind") is None
    for name in ("suffice", "older"):
        exp_id = setup(uri, name)
        assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == EXPERIMENT_KIND["mlflow.experimentKind"]


def test_the_experiment_carries_the_headline_view_and_the_printed_link_opens_it(tmp_path, monkeypatch):
    """MLflow's UI reads a shared view from the experiment tag mlflow.sharedViewState.<key>: suffice keeps its
    headline columns there (kept current on older stores), and ui_command prints the runs-table link that opens
    it in model-training mode (the UI's GenAI default would land on an empty traces overview)."""
    import json

    from mlflow.tracking import MlflowClient

    from suffice.training.tracking import HEADLINE_COLUMNS, HEADLINE_VIEW, setup, ui_command

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    old = client.create_experiment("suffice", tags={f"mlflow.sharedViewState.{HEADLINE_VIEW}": "{}"})  # a stale view
    assert setup(uri, "suffice") == old
    view = json.loads(client.get_experiment(old).tags[f"mlflow.sharedViewState.{HEADLINE_VIEW}"])
    assert view["selectedColumns"] == ["attributes.`Models`", *(f"metrics.`headline/{c}`" for c in HEADLINE_COLUMNS)]
    assert view["orderByKey"] == "attributes.start_time" and view["orderByAsc"] is False
    monkeypatch.setenv("MLFLOW_PORT", "5001")
    line = ui_command(uri, old)
    assert line.startswith(f"mlflow ui --backend-store-uri {uri}")
    assert line.endswith(f"http://127.0.0.1:5001/#/experiments/{old}/runs?workflowType=machine_learning&viewStateShareKey={HEADLINE_VIEW}")


def test_headline_summary_and_tags_are_the_few_numbers_a_registry_page_can_show():
    from suffice.training.tracking import HEADLINE_COLUMNS, headline_summary, headline_tags

    metrics = {f"headline/{c}": 0.5 for c in HEADLINE_COLUMNS} | {"headline/test_qed_ece": 0.1, "val_loss": 0.6}
    assert set(headline_tags(metrics)) == {f"headline/{c}" for c in HEADLINE_COLUMNS}  # not every headline/ metric
    summary = headline_summary(metrics)
    assert summary.startswith("val source-mean F1 0.500 | squad2 F1 0.500 | squad2 AUROC 0.500") and "test_qed_ece" not in summary
    assert headline_summary({}) == ""


def test_a_failing_dataset_record_does_not_fail_the_run(tmp_path, monkeypatch, capsys):
    """The dataset input is a convenience: when MLflow refuses it, the run goes on and says why."""
    pd = pytest.importorskip("pandas")
    from mlflow.exceptions import MlflowException

    from suffice.training.tracking import RunTracker

    tracker = RunTracker(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    tracker.start("t")

    def refuse(*args, **kwargs):
        raise MlflowException("store is read-only")

    monkeypatch.setattr(tracker.client, "log_inputs", refuse)
    tracker.log_dataset(pd.DataFrame({"id": ["a"], "source": ["squad2"], "label": [1]}), context="test", name="d-test", source="x.jsonl")
    err = capsys.readouterr().err
    assert "could not log the test rows as an MLflow dataset" in err and "store is read-only" in err
    tracker.log_metrics({"headline/test_macro_f1": 0.5})
    assert tracker.client.get_run(tracker.run_id).data.metrics == {"headline/test_macro_f1": 0.5}
    tracker.end()


def test_metric_and_tag_names_from_odd_source_names_are_logged(tmp_path):
    """Per-source metrics are named after the data's sources: a name MLflow refuses ("~" in the retrieval
    gate's styled sources) once crashed a finished run at its last step; now it is logged under a safe name."""
    from suffice.training.tracking import RunTracker

    tracker = RunTracker(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    tracker.start("t")
    tracker.log_metrics({"headline/val_retrieval-gate~typos_macro_f1": 0.9, "val_my source (v2)_auroc": 0.8})
    tracker.set_tags({"source~x": "y"})
    data = tracker.client.get_run(tracker.run_id).data
    assert data.metrics == {"headline/val_retrieval-gate_typos_macro_f1": 0.9, "val_my source _v2__auroc": 0.8}
    assert data.tags["source_x"] == "y"
    tracker.end()
