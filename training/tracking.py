"""MLflow for training runs: the store, the experiment, params from the resolved config, the registry.

The store is ``sqlite:///<repo>/mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts``
(suffice.training.paths), which is what ``make mlflow-ui`` opens. Every run records the
resolved config (flattened into params, and as ``resolved_config.yaml``), the git commit, the
data hash, per-epoch validation metrics, test metrics per source, plots, the model directory,
and registers a new version of ``suffice-sufficiency`` (or ``suffice-retrieval-gate``) tagged
with the base model, label source, data hash and test macro-F1.

Only the main process talks to MLflow; on the others a :class:`RunTracker` does nothing.

>>> tracker = RunTracker(enabled=True, experiment="suffice")  # doctest: +SKIP
>>> tracker.start("lora-r16"); tracker.log_metrics({"val_auroc": 0.9}, step=1); tracker.end()  # doctest: +SKIP
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Mapping

from suffice.serving.config import config_to_dict, flatten
from suffice.training.paths import REPO_ROOT, default_artifact_location, default_tracking_uri

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value


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
        return exp.experiment_id
    location = default_artifact_location() if uri.startswith("sqlite:") else None
    return client.create_experiment(experiment, artifact_location=location)


class RunTracker:
    """One MLflow run of a training job; every method is a no-op when disabled or not main process."""

    def __init__(self, enabled: bool = True, tracking_uri: str | None = None, experiment: str = "suffice", is_main: bool = True):
        self.enabled = bool(enabled and is_main)
        self.tracking_uri = tracking_uri or (default_tracking_uri() if self.enabled else None)
        self.experiment = experiment
        self.run_id: str | None = None
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
        exp_id = setup(self.tracking_uri, self.experiment)
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
                self.client.set_tag(self.run_id, k, str(v))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self.enabled or not metrics:
            return
        import math
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, step or 0) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)]
        for i in range(0, len(ms), 1000):
            self.client.log_batch(self.run_id, metrics=ms[i : i + 1000])

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
        mv = self.client.create_model_version(
            name, source=self.artifact_uri(artifact_path), run_id=self.run_id,
            tags={k: str(v) for k, v in tags.items() if v is not None}, description=description or None,
        )
        return str(mv.version)

    def end(self, status: str = "FINISHED") -> None:
        if self.enabled and self.run_id:
            self.client.set_terminated(self.run_id, status=status)


def ui_command(tracking_uri: str | None = None) -> str:
    """The command that opens the MLflow UI on this store (what ``make mlflow-ui`` runs)."""
    uri = tracking_uri or default_tracking_uri()
    if os.environ.get("SUFFICE_MLRUNS_DIR") or not uri.startswith("sqlite:"):
        return f"mlflow ui --backend-store-uri {uri}"
    return "make mlflow-ui   (http://127.0.0.1:5000)"
