"""The bundle's manifest (``suffice.json``): what the exported folder says about itself."""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from suffice.serving.bundle import DEFAULT_THRESHOLDS, MODEL_INT8, BundleManifest, ParityReport, sha256_file
from suffice.training.fit.meta import ModelMeta


def build_manifest(bundle: Path, meta: ModelMeta, parity: ParityReport, *, quantized: bool,
                   probe_file: str | None = None, openvino_int8_file: str | None = None, registered_model: str | None = None,
                   model_version: str | None = None) -> BundleManifest:
    """The manifest of ``bundle``: its files (checksums), the model (labels, window, calibration, thresholds)
    and its parity report; :func:`suffice.serving.bundle.write_manifest` writes it as ``suffice.json``.

    >>> build_manifest(Path("/tmp/work/bundle"), ModelMeta.read("models/demo"), ParityReport(), quantized=True)  # doctest: +SKIP
    """
    ml = meta.mlflow or {}
    files = {name: sha256_file(bundle / name) for name in sorted(os.listdir(bundle))}
    version = model_version or ml.get("version")
    cal = meta.calibrator
    # temperature scaling keeps the manifest every older suffice reads; Platt adds its record (older readers refuse it)
    record = None if cal.method == "temperature" else {k: v for k, v in cal.to_record().items() if k != "temperature"}
    return BundleManifest(
        task=meta.task, id2label=meta.labels, positive_label=str(meta.positive_label), max_length=int(meta.max_length),
        long_context_strategy=str(meta.long_context_strategy),
        temperature=float(cal.temperature), calibration=record,
        thresholds={**DEFAULT_THRESHOLDS.get(meta.task, {}), **(meta.thresholds or {})},
        base_model=str(meta.base_model or "unknown"), files=files, label_scheme=str(meta.label_scheme),
        int8_model_file=MODEL_INT8 if quantized else None, openvino_int8_model_file=openvino_int8_file, probe_file=probe_file, mlflow_run_id=ml.get("run_id"),
        registered_model=registered_model or ml.get("registered_model"),
        model_version=None if version is None else str(version),
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        parity=parity, metrics=dict(meta.metrics or {}),
    )
