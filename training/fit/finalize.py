"""Finishing a model, the same way for ``suffice train`` and ``suffice soup``.

:func:`finalize`: calibration (temperature or Platt, pooled or source-balanced) and thresholds
fitted on validation logits, the calibrated validation report, the test report next to the baselines, the ``headline/`` metrics
(:func:`suffice.training.tracking.headline_metrics`), ``suffice_model.json``
(:class:`~suffice.training.fit.meta.ModelMeta`), the model directory, evaluation artifacts, a
(``export: true``) the ONNX bundle, and the registered versions (:func:`save_and_register`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from suffice.serving.jsonl import json_safe
from suffice.serving.bundle import PARTIAL, RETRIEVAL_GATE, SUFFICIENCY, SKIP_THRESHOLD, SUFFICIENT, VALIDATION_LEVELS
from suffice.serving.calibration import Calibration
from suffice.serving.config import dump_yaml
from suffice.training.evaluation import report as ev
from suffice.training.fit.config import TrainConfig
from suffice.training.fit.loop import TrainingRun, TrainState, predict
from suffice.training.fit.meta import ModelMeta
from suffice.training.tracking import headline_metrics


def level_thresholds(cfg: TrainConfig, val_logits: np.ndarray, val_labels: np.ndarray, calibration: Calibration,
                     val_sources: Sequence[str] | None = None):
    """Sufficiency: the configured ``sufficient`` / ``partial`` thresholds (their meaning is fixed:
    calibrated P(sufficient) >= 0.8 answers, >= 0.5 caveats), and how decisive the model is there on
    validation (:func:`suffice.training.fit.calibration.decisiveness`)."""
    from suffice.training.fit.calibration import decisiveness

    p_suff = calibration.scores(val_logits, cfg.positive_index)
    levels = decisiveness(p_suff, (val_labels == cfg.positive_index).astype(int), cfg.calibration.sufficient)
    return {SUFFICIENT: cfg.calibration.sufficient, PARTIAL: cfg.calibration.partial}, {VALIDATION_LEVELS: levels}


def skip_threshold(cfg: TrainConfig, val_logits: np.ndarray, val_labels: np.ndarray, calibration: Calibration,
                   val_sources: Sequence[str] | None = None):
    """Retrieval gate: the lowest SKIP threshold whose validation precision reaches ``skip_min_precision``.

    With styled validation copies (``gate.styles`` + ``gate.style_validation``: sources ``<source>~<style>``)
    :func:`styled_skip_threshold` applies ``gate.style_threshold``. The record keeps each style's threshold."""
    from suffice.training.data.styles import style_of
    from suffice.training.fit.calibration import threshold_for_precision

    p_skip = calibration.scores(val_logits, cfg.positive_index)
    y = (val_labels == cfg.positive_index).astype(int)
    target = cfg.calibration.skip_min_precision
    th, achieved = threshold_for_precision(p_skip, y, target)
    info: dict[str, Any] = {"skip_min_precision": target, "validation_skip_precision": achieved}
    styles = [style_of(s) for s in val_sources] if val_sources is not None else []
    if len(set(styles)) > 1:
        th, per_style = styled_skip_threshold(p_skip, y, styles, target, cfg.gate.style_threshold)
        skipped = p_skip >= th
        info.update(skip_threshold_by_style=per_style, threshold_rule=STYLE_THRESHOLD_RULES[cfg.gate.style_threshold],
                    validation_skip_precision=float(y[skipped].mean()) if skipped.any() else float("nan"))
    return {SKIP_THRESHOLD: th}, info


STYLE_THRESHOLD_RULES = {"max": "max over styles", "pooled": "pooled over styles"}


def styled_skip_threshold(p_skip: np.ndarray, y: np.ndarray, styles: Sequence[str], target: float,
                          rule: str = "max") -> tuple[float, dict[str, float]]:
    """(the SKIP threshold, each style's own threshold) over validation copies in several writing styles.

    ``styles``: each item's style ("" = the writer's own). Each style's threshold is its lowest with
    ``target`` SKIP precision. ``max``: the highest of them (no style below the target on validation; the
    noisiest style's few dozen SKIP threads set it alone); ``pooled``: the lowest threshold
    with ``target`` precision on all copies together (the target holds over an even mix of the styles).

    >>> p = np.array([0.9, 0.8, 0.3, 0.95, 0.6, 0.5]); y = np.array([1, 1, 0, 1, 1, 0])
    >>> st = ["", "", "", "typos", "typos", "typos"]
    >>> styled_skip_threshold(p, y, st, 0.95, "max")
    (0.8, {'own': 0.8, 'typos': 0.6})
    >>> styled_skip_threshold(p, y, st, 0.95, "pooled")[0]
    0.6
    """
    from suffice.training.fit.calibration import threshold_for_precision

    if rule not in STYLE_THRESHOLD_RULES:
        raise ValueError(f"style threshold rule {rule!r} unknown: choose from {list(STYLE_THRESHOLD_RULES)}")
    styles = np.asarray(styles, dtype=object)
    per_style = {(name or "own"): float(threshold_for_precision(p_skip[styles == name], y[styles == name], target)[0])
                 for name in sorted(set(styles.tolist()))}
    if rule == "max":
        return max(per_style.values()), per_style
    return float(threshold_for_precision(p_skip, y, target)[0]), per_style


THRESHOLD_RULES = {SUFFICIENCY.name: level_thresholds, RETRIEVAL_GATE.name: skip_threshold}


def calibration_and_thresholds(cfg: TrainConfig, val_logits: np.ndarray, val_labels: np.ndarray,
                               val_sources: Sequence[str] | None = None) -> tuple[Calibration, dict[str, float], dict[str, Any]]:
    """(calibration fitted on validation as ``cfg.calibration`` says, thresholds, the calibration record for
    ``suffice_model.json``: method, parameters, pool and threshold info).

    ``val_sources``: each validation item's source, weighed by ``calibration.pool: source_balanced``.
    The thresholds are read on the unweighted validation items (see ``CalibrationSettings.pool``).
    """
    from suffice.training.fit.calibration import T_MAX, fit_calibration

    cal = fit_calibration(cfg.calibration, val_logits, val_labels, val_sources, cfg.positive_index)
    flatness = cal.temperature if cal.method == "temperature" else 1.0 / cal.a  # Platt's slope a is 1 / T
    if flatness >= 0.99 * T_MAX:
        print(f"warning: the fitted calibration ({cal.describe()}) sits at its bound: the validation logits carry almost no signal, "
              "so calibration flattens every score towards the base rate (train longer or check the data)", file=sys.stderr)
    thresholds, info = THRESHOLD_RULES[cfg.task](cfg, val_logits, val_labels, cal, val_sources)
    return cal, thresholds, {**cal.to_record(), "pool": cfg.calibration.pool, **info}


def test_report(run: TrainingRun, calibration: Calibration, thresholds: Mapping[str, float]) -> dict[str, Any] | None:
    """The calibrated test report next to the baselines (printed), on the main process; None without a test split."""
    cfg, accelerator, encoded = run.cfg, run.accelerator, run.encoded
    if not (cfg.evaluate_test and run.loaders.test is not None):
        return None
    test_logits, _ = predict(accelerator, run.model, run.loaders.test)
    if not accelerator.is_main_process:
        return None
    report = ev.full_report(calibration.probabilities(test_logits, cfg.positive_index), encoded["test"], train_ds=encoded["train"],
                            id2label=cfg.id2label, positive_index=cfg.positive_index, ece_bins=cfg.calibration.ece_bins,
                            thresholds=thresholds, baselines=cfg.resolved_baselines(), split="test")
    accelerator.print(ev.render_report(report))
    return report


def finalize(run: TrainingRun, val_logits: np.ndarray, provenance: Mapping[str, Any],
             extra_metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Calibrate, report, describe, save and register a trained (or averaged) model.

    ``run``: the run (model, splits, loaders, tracker, directories); ``val_logits``: the model's validation logits.
    ``provenance``: the metadata fields that say where the model came from (``base_model``,
    ``finetune``, ``label_source``, ``data_hash``, ``git_commit``, ``train_seconds``, ``soup``...).
    ``extra_metrics``: more entries for the metadata's ``metrics`` (``best_epoch``).
    Returns temperature, calibration (its record), thresholds, the reports and (main process) what :func:`save_and_register` wrote.
    """
    cfg, accelerator, state, tracker = run.cfg, run.accelerator, run.state, run.tracker
    val_ds = run.encoded["validation"]
    calibration, thresholds, calibration_record = calibration_and_thresholds(cfg, val_logits, np.asarray(val_ds["labels"]),
                                                                             ev.column(val_ds, "source", "all"))
    val_report = ev.classification_report(calibration.probabilities(val_logits, cfg.positive_index), val_ds,
                                          label_names=list(cfg.id2label.values()), positive_index=cfg.positive_index,
                                          ece_bins=cfg.calibration.ece_bins)
    platt = {f"val_platt_{k}": v for k, v in (calibration.to_record().get("platt") or {}).items()}
    tracker.log_metrics({"val_temperature": calibration.temperature, **platt,
                         **{f"val_calibrated_{k}": v for k, v in val_report["overall"].items()
                            if k in ("ece", "nll", "macro_f1", "auroc", "accuracy")}}, step=state.epoch)
    report = test_report(run, calibration, thresholds)
    out: dict[str, Any] = {"temperature": calibration.temperature, "calibration": calibration.to_record(), "thresholds": thresholds,
                           "val_report": val_report, "test_report": report}
    if not accelerator.is_main_process:
        return out
    test_overall = (report or {}).get("model", {}).get("overall", {})
    # logged before registration, which copies them onto the registered versions as tags
    out["headline"] = headline_metrics((report or {}).get("model"), val_report, calibration_record.get(VALIDATION_LEVELS))
    tracker.log_metrics(out["headline"], step=state.epoch)
    meta = ModelMeta.from_dict({
        "task": cfg.task, "label_scheme": cfg.label_scheme, "id2label": {str(k): v for k, v in cfg.id2label.items()},
        "positive_label": cfg.positive_label, "max_length": cfg.max_length, "long_context_strategy": cfg.long_context_strategy,
        "calibration": calibration_record, "thresholds": thresholds,
        **provenance,
        "mlflow": {"run_id": state.mlflow_run_id, "registered_model": None, "version": None},
        "metrics": json_safe({"test": test_overall, "validation": val_report["overall"],
                              **({VALIDATION_LEVELS: calibration_record[VALIDATION_LEVELS]} if VALIDATION_LEVELS in calibration_record else {}),
                              **(extra_metrics or {})}),
    })
    out.update(save_and_register(run, meta, report))
    out["test"] = test_overall
    return out


def save_and_register(run: TrainingRun, meta: ModelMeta, test_report) -> dict[str, Any]:
    """Main process: model directory, evaluation artifacts, bundle, registered versions, model artifacts.

    What is registered (``tracking.register``), so that every version of ``registered_model``
    (``suffice-sufficiency``) is a servable bundle:

    - ``export: true``: the exported bundle, as an MLflow pyfunc model, under ``registered_model``
      (:func:`suffice.training.export.registry.register_bundle`);
    - always: the trained-model folder (merged model, adapter, ``suffice_model.json``) under
      ``registered_model + "-model"`` (``suffice-sufficiency-model``), which ``suffice export``,
      ``evaluate`` and ``soup`` read; it is never served.
    """
    from suffice.training.fit.model import save_model_dir

    cfg, tracker, state, out_dir = run.cfg, run.tracker, run.state, run.out_dir
    out: dict[str, Any] = {}
    save_model_dir(run.accelerator.unwrap_model(run.model), out_dir, run.base_dir, meta)
    (out_dir / "train_config.yaml").write_text(dump_yaml(cfg))
    if test_report is not None:
        ev_dir = out_dir / "evaluation"
        out["plots"] = [str(p) for p in ev.save_plots(test_report, ev_dir)]
        (ev_dir / "test_metrics.json").write_text(json.dumps(ev.report_json(test_report), indent=2))
        (ev_dir / "test_table.txt").write_text(ev.render_report(test_report) + "\n")
        tracker.log_metrics(ev.report_metrics(test_report, "test"), step=state.epoch)
        tracker.log_artifacts(ev_dir, "evaluation")
    out["bundle"] = maybe_export(cfg, out_dir, run.encoded["validation"], meta, tracker)
    if cfg.tracking.register and tracker.enabled:
        out.update(register_versions(cfg, out_dir, meta, out["bundle"], tracker, state))
    if out["bundle"] and not out.get("registered"):
        tracker.log_artifacts(out["bundle"], "bundle")  # unregistered (or registration failed): still a run artifact
    if cfg.tracking.log_model_artifacts:
        log_model_dir(tracker, out_dir)
    return out


def trained_model_name(cfg: TrainConfig) -> str:
    """The registered name of trained-model folders: ``suffice-sufficiency-model`` for ``suffice-sufficiency``."""
    return f"{cfg.registered_model}-model"


def register_versions(cfg: TrainConfig, out_dir: Path, meta: ModelMeta, bundle: str | None, tracker, state: TrainState) -> dict[str, Any]:
    """Register the bundle (when there is one) and the trained-model folder; write the versions into ``suffice_model.json``.

    Returns ``registered`` (the bundle's ``models:/`` URI, absent when nothing servable was
    registered) and ``registered_model_dir``.
    """
    from suffice.training.export.registry import RegistryError, register_bundle

    test = meta.metrics.get("test") or {}
    finetune = meta.finetune or cfg.finetune  # "soup" for an averaged model (suffice soup)
    tags = {"task": cfg.task, "base_model": cfg.base_model, "label_source": meta.label_source, "data_hash": meta.data_hash,
            "finetune": finetune, "label_scheme": cfg.label_scheme,
            "test_macro_f1": f"{test['macro_f1']:.4f}" if test.get("macro_f1") is not None else "n/a",
            "test_auroc": f"{test['auroc']:.4f}" if test.get("auroc") is not None else "n/a"}
    description = f"{state.run_name}: {finetune} on {cfg.base_model}, {meta.label_source} labels, data {meta.data_hash}"
    out: dict[str, Any] = {}
    model_name = trained_model_name(cfg)
    model_version = tracker.register(model_name, "model", tags=tags, description=description)
    meta.mlflow = {"run_id": state.mlflow_run_id, "registered_model": model_name, "version": model_version}
    out["registered_model_dir"] = f"models:/{model_name}/{model_version}"
    if bundle is None:
        why = "export: false" if not cfg.export else "the export failed (see above)"
        print(f"registered the trained model as {out['registered_model_dir']}; nothing servable was registered under "
              f"{cfg.registered_model} ({why}): export and register a bundle with "
              f"`suffice export --model {out['registered_model_dir']} --out bundles/{state.run_name} --register`", file=sys.stderr)
    else:
        try:
            name, version = register_bundle(bundle, run_id=state.mlflow_run_id, name=cfg.registered_model, client=tracker.client,
                                            tags={**tags, "model_dir": out["registered_model_dir"]}, description=description)
        except RegistryError as e:
            print(f"could not register the bundle {bundle}: {e}\nregister it later with `suffice export --model "
                  f"{out['registered_model_dir']} --out {bundle} --register`", file=sys.stderr)
            tracker.set_tags({"register_error": str(e)[:500]})
        else:
            out["registered"] = f"models:/{name}/{version}"
            meta.mlflow["bundle"] = out["registered"]
    meta.write(out_dir)
    return out


def log_model_dir(tracker, out_dir: Path) -> None:
    """Log the model directory as the ``model`` artifact, without checkpoints/evaluation/bundle, and
    without a nested model folder (the demo's ``stage0/``: its own run logged it, checkpoints and all)."""
    for p in sorted(out_dir.iterdir()):
        if p.name in ("checkpoints", "evaluation", "bundle") or (p.is_dir() and (p / "suffice_model.json").is_file()):
            continue
        if p.is_dir():
            tracker.log_artifacts(p, f"model/{p.name}")
        else:
            tracker.log_artifact(p, "model")


def maybe_export(cfg: TrainConfig, out_dir: Path, val_ds, meta: ModelMeta, tracker) -> str | None:
    """``export: true``: write the ONNX bundle with :mod:`suffice.training.export`.

    A failed export (a parity check, say) is reported and tagged on the run, but the trained
    model stays: export can be re-run later with ``suffice export --model DIR``. The bundle is
    logged and registered by :func:`save_and_register`.
    """
    if not cfg.export:
        return None
    from suffice.training.export.bundle import export_shipping_what_passes
    from suffice.training.export.errors import ExportError

    bundle_dir = Path(cfg.export_dir) if cfg.export_dir else out_dir / "bundle"
    pos = meta.positive_index
    n = min(200, len(val_ds))
    items = [{"question": q, "passages": p, "label": int(lab == pos)}
             for q, p, lab in zip(val_ds["question"][:n], val_ds["passages"][:n], val_ds["labels"][:n])]
    try:
        # registration (after this) writes name and version into the manifest; a refused ONNX Runtime
        # int8 leaves fp32 and the OpenVINO int8 model (checked on its own), and is tagged on the run
        path, refused = export_shipping_what_passes(out_dir, bundle_dir, items, overwrite=True)
        if refused:
            print(f"ONNX Runtime int8 refused by its parity check ({refused}); writing the bundle without it", file=sys.stderr)
            tracker.set_tags({"export_int8_refused": refused[:500]})
    except ExportError as e:
        print(f"export failed: {e}\nthe model directory {out_dir} is complete; retry with `suffice export --model {out_dir}`", file=sys.stderr)
        tracker.set_tags({"export_error": str(e)[:500]})
        return None
    return str(path)
