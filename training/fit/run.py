"""``suffice train``: one run, as an outline of named steps.

    accelerate launch -m suffice.training.train --config configs/sufficiency.yaml [--key=value ...]
    suffice train --config configs/sufficiency.yaml --lora.r=8 --num_train_epochs=3
    suffice train --config configs/sufficiency.yaml --output_dir=models/x --resume   # continue a killed run

:func:`run` reads like setfit's ``Trainer.train``: accelerator, splits, loaders, model and
optimiser, the loop, finalize. Each step is a public function that tests, ``suffice soup`` and
the benchmarks call directly. Nothing assumes a single process: only the main process writes
files or talks to MLflow.

>>> run(build_train_config("configs/sufficiency.yaml", ["--num_train_epochs=1"]))["registered"]  # doctest: +SKIP
'models:/suffice-sufficiency/4'
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from suffice.serving.config import ConfigError, dump_yaml
from suffice.training.fit.config import TrainConfig
from suffice.training.fit.encode import Loaders, class_weights, get_dataloaders, packing_stats
from suffice.training.fit.features import TrainingFeature
from suffice.training.fit.finalize import finalize
from suffice.training.fit.loop import STATE_FILE, Checkpoints, TrainingRun, TrainState, predict, train
from suffice.training.fit.splits import load_splits


def features_for(cfg) -> list[TrainingFeature]:
    """The training features ``cfg`` switches on: the contrasts of :mod:`suffice.training.fit.pairs`
    (:class:`~suffice.training.fit.pairs.GatePairs` for a retrieval gate with ``gate.pair_batches`` /
    ``gate.pair_loss_weight``, :class:`~suffice.training.fit.pairs.PassageContrast` for sufficiency
    with ``contrast.unit_size``; the config refuses contrast for the gate) and the answer span of
    :mod:`suffice.training.fit.spans` (``span.loss_weight > 0``, sufficiency only)."""
    from suffice.training.fit.pairs import GatePairs, PassageContrast

    if cfg.task == "retrieval_gate":  # gate.pair_loss_weight > 0 needs gate.pair_batches (the config says so)
        return [GatePairs(cfg.gate.pair_batches, cfg.gate.pair_loss_weight, cfg.positive_index)] if cfg.gate.pair_batches else []
    out: list[TrainingFeature] = []
    if cfg.contrast.unit_size:
        out.append(PassageContrast(cfg.contrast.unit_size, cfg.contrast.loss_weight, cfg.positive_index, cfg.seed))
    if cfg.span.loss_weight > 0:
        from suffice.serving.bundle import INSUFFICIENT
        from suffice.training.fit.model import resolve_base_dir
        from suffice.training.fit.spans import AnswerSpan

        negative = next(i for i, name in cfg.id2label.items() if name == INSUFFICIENT)
        out.append(AnswerSpan(cfg.span.loss_weight, cfg.positive_index, negative, resolve_base_dir(cfg.base_model)))
    return out


def run(cfg: TrainConfig, features: Sequence[TrainingFeature] = ()) -> dict[str, Any]:
    """Train, calibrate, evaluate, save, track and register one model; returns a summary dict.

    ``features``: optional training features (see :mod:`suffice.training.fit.features`), next to
    the ones the config switches on (:func:`features_for`).
    """
    from suffice.serving.bundle import sha256_file
    from suffice.training.tracking import RunTracker, git_commit

    wall0 = time.perf_counter()
    features = [*features, *features_for(cfg)]
    accelerator = make_accelerator(cfg)
    run_name, out_dir, resume_state = run_dir(cfg, accelerator)
    base_dir, packer = base_and_packer(cfg)
    with accelerator.main_process_first():
        splits = load_splits(cfg, accelerator.is_main_process)
    encoded, loaders = get_dataloaders(accelerator, cfg, splits, packer, sha256_file(base_dir / "tokenizer.json"), features)
    weights = class_weights(encoded["train"]["labels"], cfg.num_labels, cfg.class_weighting)
    model, optimizer, scheduler, n_params = model_and_optimizer(cfg, accelerator, base_dir, len(loaders.train), features)
    model, optimizer, train_dl, val_dl, scheduler = accelerator.prepare(model, optimizer, loaders.train, loaders.validation, scheduler)
    for feature in features:  # after the model: the checkpoint's model files keep their order
        feature.prepare(accelerator)
    steps_per_epoch, total_steps, num_epochs = schedule(cfg, len(train_dl))
    tr = TrainingRun(cfg, accelerator, model, state=resume_state or TrainState(run_name=run_name),
                     tracker=RunTracker(cfg.tracking.enabled, cfg.tracking.tracking_uri, cfg.tracking.experiment, accelerator.is_main_process),
                     encoded=encoded, loaders=Loaders(train_dl, val_dl, accelerator.prepare(loaders.test) if loaders.test is not None else None),
                     out_dir=out_dir, base_dir=base_dir, splits=splits, optimizer=optimizer, scheduler=scheduler,
                     checkpoints=Checkpoints(out_dir / "checkpoints", cfg.checkpoints_total_limit), weights=weights, features=features,
                     total_steps=total_steps, num_epochs=num_epochs, steps_per_epoch=steps_per_epoch, n_params=n_params,
                     resumed=resume_state is not None, commit=git_commit())
    start_tracking(tr, describe(tr))
    try:
        resume(tr)
        train_t0 = time.perf_counter()
        val_logits = train(tr)
        train_seconds = time.perf_counter() - train_t0
        done = finalize(tr, restore_best(tr, val_logits), provenance={
            "base_model": cfg.base_model, "finetune": cfg.finetune, "label_source": splits.label_source,
            "data_hash": splits.data_hash, "git_commit": tr.commit, "train_seconds": round(train_seconds, 1)},
                        extra_metrics={"best_epoch": tr.state.best_epoch})
        summary = run_summary(tr, done, train_seconds, wall0)
    except BaseException as e:
        tr.tracker.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    tr.tracker.end("FINISHED")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


# ------------------------------------------------------------------------------------------
# the steps
# ------------------------------------------------------------------------------------------
def make_accelerator(cfg: TrainConfig):
    """The Accelerator (mixed precision, accumulation), CPU threads, seeds; quiet dataset progress bars."""
    import datasets
    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    accelerator = Accelerator(
        mixed_precision=resolve_mixed_precision(cfg.mixed_precision),
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        project_config=ProjectConfiguration(automatic_checkpoint_naming=False),
    )
    if accelerator.device.type == "cpu":
        torch.set_num_threads(cpu_threads(cfg))
    set_seed(cfg.seed)
    datasets.disable_progress_bars()
    return accelerator


def base_and_packer(cfg: TrainConfig):
    """(local base-model directory, the ContextPacker serving will use with its tokenizer)."""
    from suffice.serving.packing import ContextPacker
    from suffice.training.fit.model import load_tokenizer, resolve_base_dir

    base_dir = resolve_base_dir(cfg.base_model)
    if not isinstance(base_dir, Path):
        from huggingface_hub import snapshot_download

        base_dir = Path(snapshot_download(str(base_dir)))
    return base_dir, ContextPacker(load_tokenizer(base_dir), max_length=cfg.max_length, strategy=cfg.long_context_strategy)


def model_and_optimizer(cfg: TrainConfig, accelerator, base_dir: Path, train_batches: int, features: Sequence[TrainingFeature] = ()):
    """(model, AdamW, LR schedule, (trainable, total) parameter counts); not yet prepared.

    The layers ``features`` add beside the model train at the head learning rate (they are heads)."""
    import torch
    from transformers import get_scheduler

    from suffice.training.fit.features import feature_modules
    from suffice.training.fit.model import build_model, optimizer_groups, trainable_parameters

    model = build_model(base_dir, id2label=cfg.id2label, finetune=cfg.finetune, lora=cfg.lora, freeze_layers=cfg.freeze_layers,
                        encoder_layers=cfg.encoder_layers)
    n_params = trainable_parameters(model)
    groups = optimizer_groups(model, cfg.learning_rate, cfg.resolved_head_learning_rate(), cfg.weight_decay)
    extra = [p for m in feature_modules(features, model) for p in m.parameters()]
    if extra:
        groups.append({"params": extra, "lr": cfg.resolved_head_learning_rate(), "weight_decay": cfg.weight_decay, "name": "feature-heads"})
    optimizer = torch.optim.AdamW(groups)
    # the schedule counts steps on the unsharded loader: accelerate steps it once per process
    sched_total = (cfg.max_steps * accelerator.num_processes if cfg.max_steps
                   else math.ceil(train_batches / cfg.gradient_accumulation_steps) * cfg.num_train_epochs)
    scheduler = get_scheduler(cfg.lr_scheduler if cfg.lr_scheduler != "constant" else "constant_with_warmup", optimizer,
                              num_warmup_steps=int(cfg.warmup_ratio * sched_total), num_training_steps=sched_total)
    return model, optimizer, scheduler, n_params


def schedule(cfg: TrainConfig, train_batches: int) -> tuple[int, int, int]:
    """(optimiser steps per epoch, total steps, epochs) for the prepared (sharded) train loader."""
    steps_per_epoch = math.ceil(train_batches / cfg.gradient_accumulation_steps)
    total_steps = cfg.max_steps or steps_per_epoch * cfg.num_train_epochs
    return steps_per_epoch, total_steps, math.ceil(total_steps / steps_per_epoch)


def resume(run: TrainingRun) -> None:
    """With ``--resume``: load the newest checkpoint's model, optimiser, scheduler and RNG states."""
    if not run.resumed:
        return
    latest = run.checkpoints.latest()
    state = run.state
    run.accelerator.print(f"resuming from {latest} (epoch {state.epoch + 1}, batch {state.batch_in_epoch}, step {state.global_step})")
    run.accelerator.load_state(str(latest))


def restore_best(run: TrainingRun, val_logits):
    """Load the best epoch's weights; score validation again when that epoch ran before a resume."""
    from suffice.training.fit.model import load_trainable_state_dict

    run.accelerator.wait_for_everyone()
    if run.checkpoints.best_path.is_file():
        from safetensors.torch import load_file

        load_trainable_state_dict(run.accelerator.unwrap_model(run.model), load_file(str(run.checkpoints.best_path)))
    if val_logits is None:  # the best epoch ran before a resume: score validation again
        val_logits, _ = predict(run.accelerator, run.model, run.loaders.validation)
    return val_logits


def run_summary(run: TrainingRun, done: dict[str, Any], train_seconds: float, wall0: float) -> dict[str, Any]:
    """The summary :func:`run` returns; the main process also logs timings and prints where things went."""
    from suffice.training.tracking import ui_command

    cfg, accelerator, tracker, state, out_dir = run.cfg, run.accelerator, run.tracker, run.state, run.out_dir
    run_name = state.run_name
    summary: dict[str, Any] = {"run_name": run_name, "output_dir": str(out_dir), "temperature": done["temperature"],
                               "thresholds": done["thresholds"], "train_seconds": train_seconds, "best_epoch": state.best_epoch,
                               "history": state.history, "mlflow_run_id": state.mlflow_run_id}
    if not accelerator.is_main_process:
        return summary
    summary.update({k: v for k, v in done.items() if k not in ("temperature", "thresholds", "val_report", "test_report", "test")})
    summary["test"] = done["test"]
    total = time.perf_counter() - wall0
    tracker.log_metrics({"train_seconds": train_seconds, "wall_seconds": total, "best_epoch": float(state.best_epoch or 0)},
                        step=state.epoch)
    tracker.set_tags({"stopped_early": state.stopped_early, "output_dir": str(out_dir)})
    accelerator.print(
        f"\nmodel: {out_dir}" + (f" (registered as {summary['registered_model_dir']})" if summary.get("registered_model_dir") else "")
        + (f"\nregistered: {summary['registered']} (the bundle: serve, score, pyfunc)" if summary.get("registered") else "")
        + (f"\nbundle: {summary['bundle']}" if summary.get("bundle") else "")
        + (f"\nMLflow run {state.mlflow_run_id}: {ui_command(cfg.tracking.tracking_uri, tracker.experiment_id)}" if tracker.enabled else "")
        + f"\nwall time {total:.0f} s (training {train_seconds:.0f} s)"
    )
    return summary


# ------------------------------------------------------------------------------------------
# run set-up and description
# ------------------------------------------------------------------------------------------
def resolve_mixed_precision(setting: str, cpu=None) -> str | None:
    """The accelerate ``mixed_precision`` for ``setting``; ``auto`` picks bf16/fp16 on a GPU that has
    it, bf16 on a CPU with bf16 units (AMX or AVX512-BF16: ``suffice.serving.cpu``), else fp32,
    unless ``accelerate launch --mixed_precision`` / ``accelerate config`` already chose bf16 or fp16
    (None: keep that choice). Accelerate exports ``ACCELERATE_MIXED_PRECISION=no`` whenever it was not
    told otherwise, so ``no`` there is its default, not a choice: ``auto`` still resolves. To train in
    fp32 on purpose, set the config's own ``mixed_precision: "no"`` (``--mixed_precision=no``).

    >>> from suffice.serving.cpu import CpuInfo
    >>> resolve_mixed_precision("auto", CpuInfo.from_flags("x", {"avx2"}))  # doctest: +SKIP
    'no'
    """
    if setting != "auto":
        return setting
    if os.environ.get("ACCELERATE_MIXED_PRECISION", "no") != "no":
        return None  # bf16 / fp16 chosen with `accelerate config` / `accelerate launch --mixed_precision`
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    from suffice.serving.cpu import detect

    return "bf16" if (cpu or detect()).bf16 else "no"


def cpu_threads(cfg: TrainConfig) -> int:
    """``torch_threads``, else this process's share of the usable cores (one share per local process)."""
    from suffice.serving.cpu import usable_cores

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return cfg.torch_threads or max(1, usable_cores() // max(local, 1))


def find_resume_dir(cfg: TrainConfig) -> Path:
    """``--output_dir``, else the newest run under ``models/`` that has a complete checkpoint."""
    from suffice.training.paths import REPO_ROOT

    if cfg.output_dir:
        return Path(cfg.output_dir)
    candidates = sorted((REPO_ROOT / "models").glob(f"{cfg.task}-*/checkpoints/step-*/{STATE_FILE}"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise ConfigError("--resume found no checkpoint under models/: give --output_dir=DIR of the run to continue")
    return candidates[-1].parents[2]


def run_dir(cfg: TrainConfig, accelerator) -> tuple[str, Path, TrainState | None]:
    """Run name, output directory and (with ``--resume``) the state of the newest checkpoint.

    The name carries a timestamp, so the main process picks it and the others receive it.
    """
    from accelerate.utils import broadcast_object_list

    if cfg.resume:
        out_dir = find_resume_dir(cfg)
        latest = Checkpoints(out_dir / "checkpoints", cfg.checkpoints_total_limit).latest()
        if latest is None:
            raise ConfigError(f"--resume: {out_dir}/checkpoints holds no complete checkpoint; start without --resume")
        state = TrainState.load(latest / STATE_FILE)
        return state.run_name, out_dir, state
    # the prepared data's name tells runs apart in the MLflow table (stage 0 "pretrain" vs the demo's "demo")
    what = "-".join(p for p in (cfg.task, str(cfg.data.get("name") or ""), cfg.finetune) if p)
    run_name = cfg.tracking.run_name or f"{what}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_name = broadcast_object_list([run_name])[0]
    out_dir = cfg.resolved_output_dir(run_name)
    ckpt = out_dir / "checkpoints"
    if accelerator.is_main_process and ckpt.exists():
        accelerator.print(f"note: clearing old checkpoints in {ckpt} (a fresh run; pass --resume to continue one)")
        shutil.rmtree(ckpt)
    accelerator.wait_for_everyone()
    return run_name, out_dir, None


def machine_params() -> dict[str, Any]:
    """Where the run ran: the CPU (model, ISA class, bf16/VNNI units) and the GPU if any, for the run's params."""
    import torch

    from suffice.serving.cpu import detect

    out = {f"machine.{k}": v for k, v in detect().as_dict().items()}
    out["machine.gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return out


def describe(run: TrainingRun) -> dict[str, Any]:
    """Print the derived numbers of the run (nanoGPT-style) and return them for tracking."""
    import torch

    from suffice.serving.cpu import detect as detect_cpu

    cfg, accelerator, encoded, weights = run.cfg, run.accelerator, run.encoded, run.weights
    steps_per_epoch, total_steps, num_epochs = run.steps_per_epoch, run.total_steps, run.num_epochs
    stats = {name: packing_stats(encoded[name]) for name in ("train", "validation", "test")}
    counts = {name: (0 if encoded[name] is None else len(encoded[name])) for name in ("train", "validation", "test")}
    balance = np.bincount(np.asarray(encoded["train"]["labels"]), minlength=cfg.num_labels).tolist()
    n_trainable, n_total = run.n_params
    accelerator.print(
        f"suffice train: {run.state.run_name}\n"
        f"  task {cfg.task} / {cfg.label_scheme}, base {cfg.base_model}, {cfg.finetune}"
        + (f" (r={cfg.lora.r}, alpha={cfg.lora.alpha})" if cfg.finetune == "lora" else "") + "\n"
        f"  items train/validation/test {counts['train']}/{counts['validation']}/{counts['test']}; train classes "
        f"{dict(zip(cfg.id2label.values(), balance))}; class weights {np.round(weights, 3).tolist()}\n"
        f"  window {cfg.max_length} tokens, strategy {cfg.long_context_strategy}: mean tokens/example "
        f"{stats['train'].get('mean_tokens', 0):.0f}, contexts cut {stats['train'].get('truncated_share', 0):.1%} (train)\n"
        f"  machine {detect_cpu().describe()}\n"
        f"  processes {accelerator.num_processes} on {accelerator.device} (mixed precision {accelerator.mixed_precision}, "
        f"{torch.get_num_threads()} threads); effective batch {cfg.effective_batch_size(accelerator.num_processes)}; "
        f"{steps_per_epoch} steps/epoch, {total_steps} steps over {num_epochs} epoch(s), warm-up {int(cfg.warmup_ratio * total_steps)}\n"
        f"  trainable parameters {n_trainable:,} of {n_total:,} ({n_trainable / n_total:.1%}); lr {cfg.learning_rate:g}, "
        f"head lr {cfg.resolved_head_learning_rate():g}\n"
        f"  output {run.out_dir}"
    )
    return {"stats": stats, "counts": counts}


def start_tracking(run: TrainingRun, derived: dict[str, Any]) -> None:
    """Open (or, resumed, reopen) the MLflow run; a fresh run logs params, data stats (``derived``:
    what :func:`describe` returns), the resolved config and the evaluated rows as MLflow datasets."""
    from suffice.serving.config import config_to_dict, flatten
    from suffice.training.tracking import config_params, log_evaluation_data

    cfg, accelerator, tracker, state, splits, commit = run.cfg, run.accelerator, run.tracker, run.state, run.splits, run.commit
    state.mlflow_run_id = tracker.start(state.run_name, run_id=state.mlflow_run_id, tags={
        "task": cfg.task, "base_model": cfg.base_model, "finetune": cfg.finetune, "label_source": splits.label_source,
        "data_hash": splits.data_hash, "mlflow.source.git.commit": commit or "unknown"})
    if run.resumed:
        return
    params = config_params(cfg)
    if cfg.task == "sufficiency" and not cfg.train_file:  # the data section with its defaults filled in
        params.update({f"data.{k}": str(v) for k, v in flatten(config_to_dict(cfg.data_config())).items()})
    tracker.log_params({**params, "git_commit": commit or "unknown", "data_hash": splits.data_hash,
                        "label_source": splits.label_source, "num_processes": accelerator.num_processes,
                        "effective_batch_size": cfg.effective_batch_size(accelerator.num_processes),
                        "total_steps": run.total_steps, "trainable_parameters": run.n_params[0],
                        "mixed_precision_resolved": str(accelerator.mixed_precision), **machine_params(),
                        **{f"items_{k}": v for k, v in derived["counts"].items()}})
    tracker.log_metrics({f"data_{s}_{k}": v for s, m in derived["stats"].items() for k, v in m.items()}
                        | {f"data_train_{k}": v for f in run.features for k, v in f.metrics().items()}, step=0)
    tracker.log_text(dump_yaml(cfg), "resolved_config.yaml")
    log_evaluation_data(tracker, run.encoded, splits.data_hash, splits.manifest)
    if splits.manifest:
        tracker.log_text(json.dumps(splits.manifest, indent=2, default=str), "data_manifest.json")
