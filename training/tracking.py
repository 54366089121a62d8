"""MLflow for training runs: the store, the experiment, params from the resolved config, the registry.

The store is ``sqlite:///<repo>/mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts``
(suffice.training.paths), which is what ``make mlflow-ui`` opens. Every run records the
resolved config (flattened into params, and as ``resolved_config.yaml``), the git commit, the
data hash, per-epoch validation metrics, test metrics per source, plots, the model directory,
and registers a new version of ``suffice-sufficiency`` (or ``suffice-retrieval-gate``) tagged
with the base model, label source, data hash and the headline metrics.

Two things make runs and registered versions comparable in the MLflow UI:

- the evaluated rows (id, source, question, label: no passage text) are logged as MLflow
  datasets with the contexts ``validation`` and ``test`` (:func:`log_evaluation_data`), with
  their digest and rows per source, so two runs evaluated on the same rows show the same digest;
- the few numbers that decide between two models are logged a second time under the
  ``headline/`` prefix (:func:`headline_metrics`), which the UI's chart view shows as one
  section, the runs table shows as columns (the experiment's ``suffice-headline`` view) and registered
  versions carry as tags and in their description (:func:`headline_tags`, :func:`headline_summary`).

Only the main process talks to MLflow; on the others a :class:`RunTracker` does nothing.

>>> tracker = RunTracker(enabled=True, experiment="suffice")  # doctest: +SKIP
>>> tracker.start("lora-r16"); tracker.log_metrics({"val_auroc": 0.9}, step=1); tracker.end()  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Mapping

from suffice.serving.config import config_to_dict, flatten
from suffice.training.paths import REPO_ROOT, default_artifact_location, default_tracking_uri

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
HEADLINE = "headline"  # the metric prefix (the UI groups charts by the part before "/")
HEADLINE_TEST = ("macro_f1", "auroc", "ece")  # overall and per test source
HEADLINE_VALIDATION = ("macro_f1", "auroc", "ece")  # per validation source: every run has them, stage 0 included
# MLflow's UI opens an experiment by its kind: without the tag it may infer "GenAI" and land on traces
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# The runs table as a view saved on the experiment (MLflow's "shared view": the experiment tag
# mlflow.sharedViewState.<key>, opened with ?viewStateShareKey=<key>): the headline metrics as columns.
HEADLINE_VIEW = "suffice-headline"
HEADLINE_COLUMNS = ("val_source_mean_macro_f1", "val_squad2_macro_f1", "val_squad2_auroc", "val_qed_macro_f1",
                    "val_hotpotqa-fullwiki_macro_f1", "val_ece", "val_coverage_at_sufficient", "test_macro_f1", "test_squad2_macro_f1")
# (label, headline key) of the one-line summary a registered version carries as its description
HEADLINE_SUMMARY = (("val source-mean F1", "val_source_mean_macro_f1"), ("squad2 F1", "val_squad2_macro_f1"),
                    ("squad2 AUROC", "val_squad2_auroc"), ("qed F1", "val_qed_macro_f1"),
                    ("hotpotqa F1", "val_hotpotqa-fullwiki_macro_f1"), ("ECE", "val_ece"),
                    ("coverage@0.8", "val_coverage_at_sufficient"), ("test F1", "test_macro_f1"),
                    ("test squad2 F1", "test_squad2_macro_f1"), ("test squad2 AUROC", "test_squad2_auroc"))
# MLflow 3's UI opens experiments in its global "GenAI" mode unless the link names the workflow
UI_WORKFLOW = "workflowType=machine_learning"
EVALUATION_COLUMNS = ("id", "source", "question", "labels", "label_source")  # what a logged dataset row holds


def git_commit(repo: str | Path = REPO_ROOT) -> str | None:
    """HEAD commit of the repository (with ``-dirty`` when the tree has changes), None outside git.

    >>> git_commit("/")  # doctest: +SKIP
    """
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def config_params(cfg: Any) -> dict[str, str]:
    """The resolved config flattened to dotted keys (``lora.r``), values as strings MLflow accepts.

    >>> from dataclasses import dataclass, field
    >>> @dataclass
    ... class C:
    ...     lr: float = 0.1
    ...     tags: list = field(default_factory=lambda: ["a"])
    >>> config_params(C())
    {'lr': '0.1', 'tags': "['a']"}
    """
    flat = flatten(config_to_dict(cfg))
    return {k: str(v)[:MAX_PARAM_CHARS] for k, v in flat.items()}


_NOT_IN_MLFLOW_NAMES = re.compile(r"[^A-Za-z0-9_\-. :/]")


def mlflow_key(name: str) -> str:
    """A metric or tag name MLflow accepts (letters, digits, ``_ - . : /`` and spaces; anything else
    becomes ``_``): source names come from the user's data, and one odd character in them must not fail a
    finished run when it logs its metrics.

    >>> mlflow_key("headline/val_retrieval-gate~typos_macro_f1")
    'headline/val_retrieval-gate_typos_macro_f1'
    """
    return _NOT_IN_MLFLOW_NAMES.sub("_", name)


def headline_metrics(test: Mapping[str, Mapping[str, float]] | None, validation: Mapping[str, Mapping[str, float]] | None,
                     validation_levels: Mapping[str, float] | None = None) -> dict[str, float]:
    """The numbers that decide between two models, under ``headline/``:

    - ``headline/test_macro_f1``, ``_auroc``, ``_ece`` overall, and ``headline/test_<source>_macro_f1``... per test source;
    - ``headline/val_macro_f1``, ``_auroc``, ``_ece`` overall and ``headline/val_<source>_...`` for every validation
      source, calibrated, plus ``headline/val_source_mean_macro_f1`` / ``_auroc`` (the selection metric): every run
      logs these, a stage-0 run without a test split too, so any two runs compare on the same columns;
    - ``headline/val_coverage_at_sufficient`` and ``headline/val_precision_at_sufficient``: how decisive the
      model is at the ``sufficient`` threshold (0.8) on validation; ``headline/test_coverage_at_sufficient`` on test.

    ``test`` / ``validation``: per-source tables (``{"overall": {...}, "squad2": {...}}``);
    ``validation_levels``: the calibration record's ``validation_levels``. Missing or NaN numbers are left out.

    >>> headline_metrics({"overall": {"macro_f1": 0.7, "auroc": 0.8, "ece": 0.05, "share_at_sufficient": 0.1},
    ...                   "squad2": {"macro_f1": 0.6, "auroc": float("nan")}},
    ...                  {"overall": {"macro_f1": 0.8}, "squad2": {"macro_f1": 0.7}, "wiki-synthetic": {"macro_f1": 0.9, "auroc": 0.95}},
    ...                  {"coverage_at_sufficient": 0.2})  # doctest: +NORMALIZE_WHITESPACE
    {'headline/test_macro_f1': 0.7, 'headline/test_auroc': 0.8, 'headline/test_ece': 0.05,
     'headline/test_coverage_at_sufficient': 0.1, 'headline/test_squad2_macro_f1': 0.6,
     'headline/val_macro_f1': 0.8, 'headline/val_squad2_macro_f1': 0.7,
     'headline/val_wiki-synthetic_macro_f1': 0.9, 'headline/val_wiki-synthetic_auroc': 0.95,
     'headline/val_source_mean_macro_f1': 0.8, 'headline/val_source_mean_auroc': 0.95,
     'headline/val_coverage_at_sufficient': 0.2}
    """
    import math

    out: dict[str, Any] = {}
    test, validation = test or {}, validation or {}
    overall = test.get("overall", {})
    out.update({f"test_{k}": overall.get(k) for k in HEADLINE_TEST})
    out["test_coverage_at_sufficient"] = overall.get("share_at_sufficient")
    for src, m in test.items():
        if src != "overall":
            out.update({f"test_{src}_{k}": m.get(k) for k in HEADLINE_TEST})
    out.update({f"val_{k}": validation.get("overall", {}).get(k) for k in HEADLINE_VALIDATION})
    for src, m in validation.items():
        if src != "overall":
            out.update({f"val_{src}_{k}": m.get(k) for k in HEADLINE_VALIDATION})
    for k in ("macro_f1", "auroc"):  # the mean over validation sources: what early stopping selects on
        vals = [m.get(k) for src, m in validation.items() if src != "overall"]
        vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
        out[f"val_source_mean_{k}"] = sum(vals) / len(vals) if vals else None
    levels = validation_levels or {}
    out.update({f"val_{k}": levels.get(k) for k in ("coverage_at_sufficient", "precision_at_sufficient")})
    return {f"{HEADLINE}/{k}": float(v) for k, v in out.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def headline_tags(metrics: Mapping[str, float], keys: tuple[str, ...] = HEADLINE_COLUMNS) -> dict[str, str]:
    """The run's headline metrics in ``keys`` (the runs table's columns) as model-version tags (4 decimals):
    the registry's versions table lists every tag of a version in its row, so a few; the comparison view
    shows every ``headline/`` metric of the two runs.

    >>> headline_tags({"headline/test_macro_f1": 0.71234, "headline/test_qed_ece": 0.1, "test_n": 100.0})
    {'headline/test_macro_f1': '0.7123'}
    """
    wanted = {f"{HEADLINE}/{k}" for k in keys}
    return {k: f"{v:.4f}" for k, v in sorted(metrics.items()) if k in wanted}


def headline_summary(metrics: Mapping[str, float]) -> str:
    """The headline numbers of a run in one line: a registered version's description starts with it,
    so the registry's versions table and the version page show them without opening the run.

    >>> headline_summary({"headline/val_squad2_macro_f1": 0.8123, "headline/test_macro_f1": 0.7, "val_n": 3.0})
    'squad2 F1 0.812 | test F1 0.700'
    """
    return " | ".join(f"{label} {metrics[f'{HEADLINE}/{key}']:.3f}" for label, key in HEADLINE_SUMMARY
                      if f"{HEADLINE}/{key}" in metrics)


def version_description(metrics: Mapping[str, float], description: str | None = None) -> str | None:
    """A registered version's description: :func:`headline_summary` first (the versions table and the
    version page show the description), then ``description``; None when both are empty."""
    return "\n\n".join(x for x in (headline_summary(metrics), description) if x) or None


def ui_base() -> str:
    """Where ``make mlflow-ui`` serves the UI: http://127.0.0.1:$MLFLOW_PORT (5000 by default)."""
    return f"http://127.0.0.1:{os.environ.get('MLFLOW_PORT', '5000')}"


def headline_view_state(columns: tuple[str, ...] = HEADLINE_COLUMNS) -> dict[str, Any]:
    """The runs table MLflow's UI opens with ``?viewStateShareKey=suffice-headline``: newest first, every run
    shown, the ``Models`` column and the ``headline/`` metrics in ``columns`` as columns (a run without one
    shows "-"). The UI reads it as JSON from the experiment tag ``mlflow.sharedViewState.suffice-headline``;
    the keys are its search facets and table state (what its "Share" button saves)."""
    metric_cols = [f"metrics.`{HEADLINE}/{c}`" for c in columns]
    return {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False, "startTime": "ALL",
            "lifecycleFilter": "Active", "modelVersionFilter": "All Runs", "datasetsFilter": [],
            "selectedColumns": ["attributes.`Models`", *metric_cols], "columnOrder": ["attributes.`Models`", *metric_cols],
            "columnWidths": {c: 190 for c in metric_cols}, "runsExpanded": {}, "runsPinned": [], "runsHidden": [],
            "runsVisibilityMap": {}, "runsHiddenMode": "SHOW_ALL", "viewMaximized": False, "runListHidden": False,
            "isAccordionReordered": False, "useGroupedValuesInCharts": True, "hideEmptyCharts": True, "groupBy": None,
            "groupsExpanded": {}, "autoRefreshEnabled": True}


def experiment_tags() -> dict[str, str]:
    """The tags suffice keeps on its experiments: the kind (so the UI opens the runs table, not GenAI
    traces) and the headline view (:func:`headline_view_state`)."""
    return {**EXPERIMENT_KIND, f"mlflow.sharedViewState.{HEADLINE_VIEW}": json.dumps(headline_view_state())}


def runs_table_url(experiment_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """The experiment's runs table with the headline columns, in MLflow's model-training mode.

    >>> runs_table_url("1")
    'http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning&viewStateShareKey=suffice-headline'
    """
    return f"{base}/#/experiments/{experiment_id}/runs?{UI_WORKFLOW}&viewStateShareKey={HEADLINE_VIEW}"


def compare_versions_url(name: str, runs: Mapping[str, str], base: str = "http://127.0.0.1:5000") -> str:
    """MLflow's side-by-side comparison of registered versions (``runs``: {version: run id}).

    >>> compare_versions_url("m", {"1": "a", "2": "b"})
    'http://127.0.0.1:5000/#/compare-model-versions?name=%22m%22&runs=%7B%221%22%3A+%22a%22%2C+%222%22%3A+%22b%22%7D'
    """
    import urllib.parse

    query = urllib.parse.urlencode({"name": json.dumps(name), "runs": json.dumps(dict(runs))})
    return f"{base}/#/compare-model-versions?{query}"


def evaluation_frame(ds):
    """The evaluated rows of an encoded split as a pandas DataFrame: id, source, question, label (and
    label_source when present); no passages, whose text would make the record large."""
    import pandas as pd

    cols = [c for c in EVALUATION_COLUMNS if c in ds.column_names]
    return pd.DataFrame({("label" if c == "labels" else c): list(ds[c]) for c in cols})


def log_evaluation_data(tracker: "RunTracker", encoded: Mapping[str, Any], data_hash: str, manifest: Mapping[str, Any] | None = None,
                        contexts: tuple[str, ...] = ("validation", "test")) -> None:
    """Log the evaluated rows of each split in ``contexts`` as an MLflow dataset input of the run.

    Each dataset is named ``<data name>-<split>`` with MLflow's digest of its rows, its source the
    prepared data folder (or the JSONL files), and the tags ``suffice.data_hash`` and
    ``suffice.rows_by_source`` (JSON). The run page lists them under "Datasets", the runs table
    can filter by them, and two runs scored on the same rows show the same digest.
    """
    if not tracker.enabled:
        return
    manifest = manifest or {}
    source = str(manifest.get("path") or ",".join(map(str, manifest.get("files") or [])) or "unknown")
    name = str(manifest.get("name") or "data")
    for split in contexts:
        ds = encoded.get(split)
        if ds is None or len(ds) == 0:
            continue
        df = evaluation_frame(ds)
        counts = df["source"].value_counts().sort_index().to_dict() if "source" in df else {"all": len(df)}
        tracker.log_dataset(df, context=split, name=f"{name}-{split}", source=source,
                            tags={"suffice.data_hash": data_hash, "suffice.rows_by_source": json.dumps(counts)})


def setup(tracking_uri: str | None = None, experiment: str = "suffice") -> str:
    """Point MLflow at the store and return the experiment id (created with suffice's artifact root)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        for k, v in experiment_tags().items():
            if exp.tags.get(k) != v:  # stores made before suffice set the kind or changed the view
                client.set_experiment_tag(exp.experiment_id, k, v)
        return exp.experiment_id
    location = default_artifact_location() if uri.startswith("sqlite:") else None
    return client.create_experiment(experiment, artifact_location=location, tags=experiment_tags())


class RunTracker:
    """One MLflow run of a training job; every method is a no-op when disabled or not main process."""

    def __init__(self, enabled: bool = True, tracking_uri: str | None = None, experiment: str = "suffice", is_main: bool = True):
        self.enabled = bool(enabled and is_main)
        self.tracking_uri = tracking_uri or (default_tracking_uri() if self.enabled else None)
        self.experiment = experiment
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        return self._client

    def start(self, run_name: str, run_id: str | None = None, tags: Mapping[str, str] | None = None) -> str | None:
        """Start a run (or continue ``run_id`` after ``--resume``)."""
        if not self.enabled:
            return None
        exp_id = self.experiment_id = setup(self.tracking_uri, self.experiment)
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
        else:
            self.run_id = self.client.create_run(exp_id, run_name=run_name, tags=dict(tags or {})).info.run_id
        return self.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        fresh = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in params.items() if k not in existing]
        for i in range(0, len(fresh), 100):  # MLflow accepts at most 100 params per batch
            self.client.log_batch(self.run_id, params=fresh[i : i + 100])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        for k, v in tags.items():
            if v is not None:
                self.client.set_tag(self.run_id, mlflow_key(k), str(v))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self.enabled or not metrics:
            return
        import math
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(mlflow_key(k), float(v), ts, step or 0) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)]
        for i in range(0, len(ms), 1000):
            self.client.log_batch(self.run_id, metrics=ms[i : i + 1000])

    def log_dataset(self, df, context: str, name: str, source: str, tags: Mapping[str, str] | None = None) -> None:
        """Log ``df`` as an MLflow dataset input (``mlflow.data.from_pandas``) with ``context`` (``validation``,
        ``test``). Only the schema, the digest and the row count are stored, not the rows. A failure is
        reported and the run goes on: the dataset record is a convenience, not the result."""
        if not self.enabled:
            return
        import mlflow.data
        from mlflow.entities import Dataset, DatasetInput, InputTag
        from mlflow.exceptions import MlflowException

        try:
            with warnings.catch_warnings():  # MLflow's hints about model-schema inference and its twice-registered local source
                warnings.simplefilter("ignore", UserWarning)
                dataset = mlflow.data.from_pandas(df, source=source, name=name, targets="label" if "label" in df else None)
                record = dataset.to_dict()  # name, digest, source, source_type, schema, profile (what mlflow.log_input sends)
            input_tags = [InputTag("mlflow.data.context", context), *(InputTag(k, str(v)) for k, v in (tags or {}).items())]
            entity = Dataset(name=record["name"], digest=record["digest"], source_type=record["source_type"], source=record["source"],
                             schema=record.get("schema"), profile=record.get("profile"))
            self.client.log_inputs(self.run_id, datasets=[DatasetInput(entity, tags=input_tags)])
        except (MlflowException, ValueError, TypeError, OSError) as e:
            print(f"warning: could not log the {context} rows as an MLflow dataset ({type(e).__name__}: {e}); "
                  "the run goes on without it", file=sys.stderr)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.enabled:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        if self.enabled:
            self.client.log_artifacts(self.run_id, str(directory), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        if self.enabled:
            self.client.log_text(self.run_id, text, artifact_file)

    def artifact_uri(self, artifact_path: str = "") -> str | None:
        if not self.enabled:
            return None
        base = self.client.get_run(self.run_id).info.artifact_uri.rstrip("/")
        return f"{base}/{artifact_path}" if artifact_path else base

    def register(self, name: str, artifact_path: str, tags: Mapping[str, Any], description: str = "") -> str | None:
        """Register ``<run artifacts>/<artifact_path>`` as a new version of ``name``; returns the version."""
        if not self.enabled:
            return None
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(
                name, description="suffice trained-model directories (merged model, adapter, suffice_model.json); "
                                  "export one with `suffice export --model models:/NAME/N`")
        metrics = self.client.get_run(self.run_id).data.metrics
        mv = self.client.create_model_version(
            name, source=self.artifact_uri(artifact_path), run_id=self.run_id,
            tags={**headline_tags(metrics), **{k: str(v) for k, v in tags.items() if v is not None}},
            description=version_description(metrics, description),
        )
        return str(mv.version)

    def end(self, status: str = "FINISHED") -> None:
        if self.enabled and self.run_id:
            self.client.set_terminated(self.run_id, status=status)


def ui_command(tracking_uri: str | None = None, experiment_id: str | None = None) -> str:
    """The command that opens the MLflow UI on this store (what ``make mlflow-ui`` runs), and with
    ``experiment_id`` the link to its runs table with the headline columns (:func:`runs_table_url`).

    >>> ui_command("sqlite:////tmp/x/mlflow.db", "3")  # doctest: +ELLIPSIS
    'mlflow ui --backend-store-uri sqlite:////tmp/x/mlflow.db, then open http://127.0.0.1:5000/#/experiments/3/runs?...'
    """
    uri = tracking_uri or default_tracking_uri()
    link = f", then open {runs_table_url(experiment_id, ui_base())}" if experiment_id else ""
    if os.environ.get("SUFFICE_MLRUNS_DIR") or not uri.startswith("sqlite:") or uri != default_tracking_uri():
        return f"mlflow ui --backend-store-uri {uri}{link}"
    return f"make mlflow-ui{link or f'   ({ui_base()})'}"
