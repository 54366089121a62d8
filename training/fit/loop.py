"""The training loop, its state and checkpoints, and prediction.

Shaped like accelerate's ``examples/by_feature``: ``accelerator.accumulate`` does gradient
accumulation, ``gather_for_metrics`` collects evaluation outputs from every process,
``save_state``/``load_state`` checkpoint and resume. Only the main process writes files.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from suffice.training.fit.config import TrainConfig
from suffice.training.fit.encode import Loaders
from suffice.training.fit.features import TrainingFeature, needs_hidden_states

STATE_FILE = "trainer_state.json"
BEST_FILE = "best-trainable.safetensors"
BUDGET_PROBE_STEPS = 20
"""Optimiser steps timed before a run with ``max_train_minutes`` fits its plan to the budget (:func:`fit_to_budget`)."""
EVAL_COST = 1 / 3
"""A validation example's cost relative to a training example's (a forward pass of the three a step makes)."""


def predict(accelerator, model, dataloader) -> tuple[np.ndarray, np.ndarray]:
    """Logits for every row of a prepared evaluation loader, gathered from all processes and
    returned in row order: ``(logits (n, k) float64, row indices (n,))``."""
    import torch

    model.eval()
    logits_all, rows_all = [], []
    with torch.no_grad():
        for batch in dataloader:
            out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"])
            logits, rows = accelerator.gather_for_metrics((out.logits.float(), batch["row"]))
            logits_all.append(logits.cpu().numpy())
            rows_all.append(rows.cpu().numpy())
    if not logits_all:
        return np.zeros((0, 0)), np.zeros(0, dtype=np.int64)
    logits = np.concatenate(logits_all).astype(np.float64)
    rows = np.concatenate(rows_all)
    order = np.argsort(rows, kind="stable")
    return logits[order], rows[order]


@dataclass
class TrainState:
    """Where a run is (saved as JSON next to every checkpoint; resume reads it back)."""

    run_name: str
    epoch: int = 0
    batch_in_epoch: int = 0
    global_step: int = 0
    best_metric: float | None = None
    best_epoch: int | None = None
    bad_epochs: int = 0
    stopped_early: bool = False
    history: list[dict[str, float]] = field(default_factory=list)
    mlflow_run_id: str | None = None
    planned_steps: int | None = None  # the step count fitted to max_train_minutes (None: not fitted yet, or no budget)

    @classmethod
    def load(cls, path: Path) -> "TrainState":
        return cls(**json.loads(path.read_text()))


class Checkpoints:
    """``<output_dir>/checkpoints/step-NNNNNNN`` written with ``accelerator.save_state``.

    A checkpoint counts only once its ``trainer_state.json`` exists (written last), so a run
    killed while saving resumes from the previous one.
    """

    def __init__(self, root: Path, total_limit: int):
        self.root = root
        self.total_limit = total_limit

    def complete(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted((p for p in self.root.glob("step-*") if (p / STATE_FILE).is_file()), key=lambda p: int(p.name.split("-")[1]))

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, accelerator, state: TrainState) -> Path:
        path = self.root / f"step-{state.global_step:07d}"
        accelerator.wait_for_everyone()
        accelerator.save_state(str(path))
        if accelerator.is_main_process:
            (path / STATE_FILE).write_text(json.dumps(dataclasses.asdict(state), indent=1))
            for old in self.complete()[: -self.total_limit]:
                shutil.rmtree(old, ignore_errors=True)
        accelerator.wait_for_everyone()
        return path

    @property
    def best_path(self) -> Path:
        return self.root / BEST_FILE


@dataclass
class TrainingRun:
    """One run's state, built once by :func:`suffice.training.fit.run.run` (setfit's ``Trainer``):
    every step reads what it needs from here instead of taking it as arguments.

    ``suffice soup`` builds one without the training parts (``optimizer``, ``scheduler``,
    ``checkpoints``, a train loader) to :func:`~suffice.training.fit.finalize.finalize` its soup.

    cfg / accelerator / model: the config, the Accelerator and the (prepared) model.
    state: where the run is (:class:`TrainState`); tracker: its MLflow run (``RunTracker``).
    encoded / loaders: the encoded splits (``train``, ``validation``, ``test``) and their (prepared) loaders.
    out_dir / base_dir: the trained-model directory and the base model's local directory.
    splits: the loaded :class:`~suffice.training.fit.splits.Splits` (label source, data hash, manifest).
    weights: the class weights of the loss; features: the optional training features.
    total_steps / num_epochs / steps_per_epoch: the schedule; n_params: (trainable, total) parameters.
    resumed: continued from a checkpoint (``--resume``); commit: the code's git commit.
    """

    cfg: TrainConfig
    accelerator: Any
    model: Any
    state: TrainState
    tracker: Any
    encoded: dict[str, Any]
    loaders: Loaders
    out_dir: Path
    base_dir: Path
    splits: Any = None
    optimizer: Any = None
    scheduler: Any = None
    checkpoints: Checkpoints | None = None
    weights: np.ndarray | None = None
    features: Sequence[TrainingFeature] = ()
    total_steps: int = 0
    num_epochs: int = 0
    steps_per_epoch: int = 0
    n_params: tuple[int, int] = (0, 0)
    resumed: bool = False
    commit: str | None = None
    clock: tuple[float, int] | None = None  # (time, global step) when this process started training: the budget's probe


def fit_schedule(scheduler, total_steps: int, warmup_ratio: float, num_processes: int = 1) -> None:
    """Point the learning-rate schedule's horizon at ``total_steps`` optimiser steps (warm-up:
    ``warmup_ratio`` of them), keeping where it is. transformers' schedules are ``LambdaLR`` over
    ``functools.partial`` lambdas with ``num_training_steps``; a constant schedule has no horizon.
    The prepared scheduler steps once per process, as in :func:`suffice.training.fit.run.model_and_optimizer`."""
    inner = getattr(scheduler, "scheduler", scheduler)
    n = total_steps * num_processes
    inner.lr_lambdas = [
        partial(lam.func, **{**lam.keywords, "num_training_steps": n, "num_warmup_steps": int(warmup_ratio * n)})
        if isinstance(lam, partial) and "num_training_steps" in lam.keywords else lam
        for lam in inner.lr_lambdas]


def budget_steps(budget_s: float, elapsed_s: float, step_s: float, global_step: int, eval_rows: int, examples_per_step: int) -> int:
    """The optimiser steps a run can take in all: those done plus what the rest of ``budget_s`` buys at
    ``step_s`` seconds a step, after the validation passes still to come (``eval_rows`` rows in all,
    each :data:`EVAL_COST` of a training example).

    >>> budget_steps(600, elapsed_s=30, step_s=1.5, global_step=20, eval_rows=320, examples_per_step=32)
    396
    """
    eval_s = eval_rows * EVAL_COST * step_s / max(examples_per_step, 1)
    return global_step + max(int((budget_s - elapsed_s - eval_s) / step_s), 1)


def fit_to_budget(run: TrainingRun, progress=None) -> None:
    """With ``max_train_minutes``: once :data:`BUDGET_PROBE_STEPS` steps are timed, plan the steps that
    fit the budget and, if fewer than planned, stop there with the schedule fitted to them; the plan is
    kept in the state (and so in every checkpoint). A resumed run keeps its plan. Should the steps slow
    down after the plan (a busy machine), training still stops when the budget is spent."""
    if not run.cfg.max_train_minutes or run.clock is None:
        return
    if run.state.planned_steps is None:
        plan_to_budget(run, progress)
    else:
        stop_when_spent(run, progress)


def stop_when_spent(run: TrainingRun, progress=None) -> None:
    """After the plan: end training at this step when the budget is spent (checked every
    :data:`BUDGET_PROBE_STEPS` steps, where every process checks; the main process's clock decides)."""
    cfg, state = run.cfg, run.state
    if state.global_step >= run.total_steps or state.global_step % BUDGET_PROBE_STEPS:
        return
    (over,) = main_process_values(run, time.perf_counter() - run.clock[0] > cfg.max_train_minutes * 60)
    if not over:
        return
    state.planned_steps = state.global_step
    apply_plan(run)
    run.tracker.log_metrics({"budget_fitted_steps": float(state.global_step)}, step=state.global_step)
    if progress is not None and run.accelerator.is_main_process:
        progress.write(f"time budget {cfg.max_train_minutes:g} min spent at step {state.global_step}: training stops here")


def plan_to_budget(run: TrainingRun, progress=None) -> None:
    """Once :data:`BUDGET_PROBE_STEPS` steps are timed: the steps that fit the budget become the plan."""
    cfg, state = run.cfg, run.state
    t0, step0 = run.clock
    done = state.global_step - step0
    if done < min(BUDGET_PROBE_STEPS, run.total_steps):
        return
    elapsed = time.perf_counter() - t0
    step_s = elapsed / done
    val_rows = len(run.encoded["validation"]) if run.encoded.get("validation") is not None else 0
    fits = budget_steps(cfg.max_train_minutes * 60, elapsed, step_s, state.global_step, (run.num_epochs - state.epoch) * val_rows,
                        cfg.effective_batch_size(run.accelerator.num_processes))
    planned = run.total_steps
    fits, step_s = main_process_values(run, fits, step_s)  # one plan for every process (each timed its own steps)
    state.planned_steps = min(planned, fits)
    if state.planned_steps < planned:
        apply_plan(run)
    run.tracker.log_metrics({"budget_planned_steps": float(planned), "budget_fitted_steps": float(state.planned_steps),
                             "budget_seconds_per_step": step_s}, step=state.global_step)
    if progress is not None and run.accelerator.is_main_process:
        examples = state.planned_steps * cfg.effective_batch_size(run.accelerator.num_processes)
        progress.write(f"time budget {cfg.max_train_minutes:g} min at {step_s:.2f} s/step: "
                       + (f"{state.planned_steps} of the {planned} planned steps fit (~{examples:,} examples); "
                          "the learning-rate schedule now ends there" if state.planned_steps < planned
                          else f"all {planned} planned steps fit"))
        if state.planned_steps < planned:
            progress.total = state.planned_steps
            progress.refresh()


def main_process_values(run: TrainingRun, *values: Any) -> list[Any]:
    """``values`` as the main process has them, on every process (each process calls this at the same step)."""
    if run.accelerator.num_processes == 1:
        return list(values)
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list(list(values))


def apply_plan(run: TrainingRun) -> None:
    """Train ``run.state.planned_steps`` steps (a budget's plan, fitted or restored on resume)."""
    steps = run.state.planned_steps
    if steps is None or steps >= run.total_steps:
        return
    run.total_steps = steps
    run.num_epochs = math.ceil(steps / run.steps_per_epoch)
    fit_schedule(run.scheduler, steps, run.cfg.warmup_ratio, run.accelerator.num_processes)


def improved(cfg: TrainConfig, value: float, best: float | None) -> bool:
    if value is None or not math.isfinite(value):
        return False
    if best is None:
        return True
    return value < best if cfg.early_stopping_metric == "loss" else value > best


def validation_metrics(accelerator, model, val_dl, val_ds, cfg: TrainConfig, weights) -> tuple[dict[str, float], np.ndarray]:
    """Validation loss, accuracy, macro-F1, AUROC and ECE (uncalibrated) on the whole split, the
    means over sources of macro-F1 and AUROC (``source_macro_f1``, ``source_auroc``), and the logits."""
    from suffice.serving.calibration import softmax
    from suffice.training.evaluation.metrics import per_source_metrics, source_means

    logits, rows = predict(accelerator, model, val_dl)
    labels = np.asarray(val_ds["labels"])[rows]
    probs = softmax(logits)
    sources = np.asarray(val_ds["source"])[rows] if "source" in val_ds.column_names else np.full(len(labels), "all", dtype=object)
    table = per_source_metrics(probs, labels, sources, label_names=list(cfg.id2label.values()), positive_index=cfg.positive_index,
                               ece_bins=cfg.calibration.ece_bins)
    m = {**table["overall"], **source_means(table)}
    w = np.asarray(weights)[labels]
    logp = np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, 1.0))
    m["loss"] = float(-(w * logp).sum() / w.sum())  # the training objective (class-weighted)
    keep = {k: v for k, v in m.items()
            if k in ("loss", "accuracy", "macro_f1", "auroc", "ece", "nll", "binary_macro_f1", "source_macro_f1", "source_auroc")
            or k.startswith("f1_")}
    return keep, logits



def train(run: TrainingRun) -> np.ndarray | None:
    """The loop: accumulate, step, log; validate each epoch; keep the best weights; early-stop; checkpoint.

    Each of ``run.features`` adds its loss to the classification loss (:func:`batch_loss`).
    Advances ``run.state``; returns the best epoch's validation logits (None if that epoch ran
    before a resume), which temperature scaling then uses without another pass.
    """
    import torch
    from tqdm.auto import tqdm

    cfg, accelerator, state, train_dl = run.cfg, run.accelerator, run.state, run.loaders.train
    weight_t = torch.tensor(run.weights, dtype=torch.float32, device=accelerator.device)
    progress = tqdm(total=run.total_steps, initial=state.global_step, disable=not accelerator.is_local_main_process, desc="train",
                    dynamic_ncols=True)
    resumed_mid_epoch = state.batch_in_epoch > 0
    best_logits = None
    run.clock = (time.perf_counter(), state.global_step)
    apply_plan(run)  # a resumed run keeps the plan it fitted to its time budget
    for epoch in range(state.epoch, run.num_epochs):
        run.model.train()
        train_dl.set_epoch(epoch)
        skip = state.batch_in_epoch if (resumed_mid_epoch and epoch == state.epoch) else 0
        loader = accelerator.skip_first_batches(train_dl, skip) if skip else train_dl
        if not skip:
            state.batch_in_epoch = 0
        seen, t0 = train_epoch(run, loader, weight_t, epoch, progress)
        resumed_mid_epoch = False
        stop, val_logits = end_epoch(run, epoch, seen, t0, progress)
        if val_logits is not None:
            best_logits = val_logits
        if stop or state.global_step >= run.total_steps:
            if state.stopped_early and accelerator.is_main_process:
                progress.write(f"early stopping: no {cfg.early_stopping_metric} improvement for {state.bad_epochs} epoch(s)")
            break
    progress.close()
    return best_logits


def batch_loss(model, batch, weight_t, features: Sequence[TrainingFeature] = ()):
    """Class-weighted cross-entropy of one batch, plus each feature's loss."""
    import torch.nn.functional as F

    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"],
                output_hidden_states=needs_hidden_states(features))
    loss = F.cross_entropy(out.logits.float(), batch["labels"], weight=weight_t)
    for feature in features:
        extra = feature.loss(out, batch)
        if extra is not None:
            loss = loss + extra
    return loss


def batch_seed(seed: int, epoch: int, batch: int, process: int = 0) -> int:
    """The torch seed of one training batch (its dropout masks), from where it sits in the run.

    >>> batch_seed(42, 0, 0) != batch_seed(42, 0, 1) != batch_seed(42, 1, 0)
    True
    """
    return (((seed * 1_000_003 + epoch) * 1_000_003 + batch) * 1_009 + process) % (2**63 - 1)


def train_epoch(run: TrainingRun, loader, weight_t, epoch: int, progress) -> tuple[int, float]:
    """One pass over ``loader`` (stopping at ``run.total_steps``); returns (examples seen, start time)."""
    import torch

    cfg, accelerator, model, state = run.cfg, run.accelerator, run.model, run.state
    optimizer, scheduler, batches_per_epoch = run.optimizer, run.scheduler, len(run.loaders.train)
    run_loss, run_n, seen, t0 = 0.0, 0, 0, time.perf_counter()
    for batch in loader:
        # dropout draws from a seed of this batch's place, not from wherever the RNG stream got to: a run
        # resumed mid-epoch (whose loaders and validation drew differently) trains the same steps
        torch.manual_seed(batch_seed(cfg.seed, epoch, state.batch_in_epoch, accelerator.process_index))
        with accelerator.accumulate(model):
            loss = batch_loss(model, batch, weight_t, run.features)
            accelerator.backward(loss)
            if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        state.batch_in_epoch += 1
        run_loss += float(loss.detach())
        run_n += 1
        seen += len(batch["labels"]) * accelerator.num_processes
        if not accelerator.sync_gradients:
            continue
        state.global_step += 1
        fit_to_budget(run, progress)
        rate = seen / max(time.perf_counter() - t0, 1e-9)
        progress.update(1)
        progress.set_postfix(epoch=epoch + 1, loss=f"{run_loss / run_n:.4f}", ex_s=f"{rate:.1f}")
        if state.global_step % cfg.log_every_steps == 0 or state.global_step == run.total_steps:
            mean_loss = float(accelerator.reduce(torch.tensor(run_loss / run_n, device=accelerator.device), "mean"))
            run.tracker.log_metrics({"train_loss": mean_loss, "train_examples_per_s": rate,
                                     "lr_encoder": scheduler.get_last_lr()[0], "epoch_progress": epoch + state.batch_in_epoch / batches_per_epoch},
                                    step=state.global_step)
            run_loss, run_n = 0.0, 0
        if cfg.checkpoint_every_steps and state.global_step % cfg.checkpoint_every_steps == 0:
            run.checkpoints.save(accelerator, state)
        if state.global_step >= run.total_steps:
            break
    return seen, t0


def end_epoch(run: TrainingRun, epoch: int, seen: int, t0: float, progress) -> tuple[bool, np.ndarray | None]:
    """Validate, keep the best weights, count epochs without improvement, checkpoint.

    ``seen`` / ``t0``: examples trained on this epoch and when it started (the logged throughput).
    Returns (stop early?, this epoch's validation logits when it is the new best, else None)."""
    cfg, accelerator, state, checkpoints = run.cfg, run.accelerator, run.state, run.checkpoints
    val, val_logits = validation_metrics(accelerator, run.model, run.loaders.validation, run.encoded["validation"], cfg, run.weights)
    epoch_rate = seen / max(time.perf_counter() - t0, 1e-9)
    run.tracker.log_metrics({f"val_{k}": v for k, v in val.items()} | {"epoch_train_examples_per_s": epoch_rate}, step=epoch + 1)
    val["epoch"], val["train_examples_per_s"] = epoch + 1, epoch_rate
    state.history.append(val)
    if accelerator.is_main_process:  # tqdm.write keeps the line off the progress bar
        progress.write(
            f"epoch {epoch + 1}/{run.num_epochs}: val loss {val['loss']:.4f} acc {val.get('accuracy', float('nan')):.3f} "
            f"macro-F1 {val.get('macro_f1', float('nan')):.3f} AUROC {val.get('auroc', float('nan')):.3f} "
            f"ECE {val.get('ece', float('nan')):.3f}; per-source mean macro-F1 {val.get('source_macro_f1', float('nan')):.3f} "
            f"AUROC {val.get('source_auroc', float('nan')):.3f} ({val['train_examples_per_s']:.1f} train ex/s)"
        )
    best_logits = None
    if improved(cfg, val.get(cfg.early_stopping_metric), state.best_metric):
        state.best_metric, state.best_epoch, state.bad_epochs = float(val[cfg.early_stopping_metric]), epoch + 1, 0
        best_logits = val_logits
        if accelerator.is_main_process:
            from safetensors.torch import save_file

            from suffice.training.fit.model import trainable_state_dict

            checkpoints.root.mkdir(parents=True, exist_ok=True)
            save_file(trainable_state_dict(accelerator.unwrap_model(run.model)), str(checkpoints.best_path))
    else:
        state.bad_epochs += 1
    state.epoch, state.batch_in_epoch = epoch + 1, 0
    stop = cfg.early_stopping_patience > 0 and state.bad_epochs >= cfg.early_stopping_patience
    state.stopped_early = stop and epoch + 1 < run.num_epochs
    checkpoints.save(accelerator, state)
    return stop, best_logits
