"""``suffice soup``: average the weights of models fine-tuned from the same base into one model.

A "model soup" (Wortsman et al., ICML 2022) averages the weights of several fine-tuned models
that share their pre-trained start: one model, served at the cost of one, that often keeps what
each ingredient learnt better than any of them alone. Here, for instance, the demo model
(strongest on squad2) and the weak-supervision model (strongest on qed and hotpotqa) average into
one that keeps squad2 and gains on the other two (benchmarks/results/2026-11-25/model-soups.md).

    suffice soup --models models/a models/b models/c --output_dir models/soup
    suffice soup --models models:/suffice-sufficiency-model/2 models/b --method uniform --output_dir models/soup
    suffice soup --models models/a models/b --output_dir models/soup --export=true   # any TrainConfig key

Methods:

- ``greedy`` (default, the paper's greedy soup): the ingredients are ranked by their own
  validation score (``--metric``, default the config's early-stopping metric); starting from the
  best, each next one joins when the average with it scores at least as well on validation. It
  never returns a soup that is worse on validation than the best single ingredient; when no
  average beats that ingredient alone, it says so and writes nothing.
- ``uniform``: the plain average of all ingredients.

Ingredients must be trained-model directories written by ``suffice train`` (or registry versions
pointing at them) with the same task, labels, window, packing strategy, tokenizer and parameter
shapes; what differs is named in the error. The soup is calibrated (temperature on validation),
evaluated on test next to the baselines, saved as a trained-model directory (merged weights; no
adapter, since an average of merged models has none), logged as an MLflow run with the
ingredients and their scores, and registered like a trained model, so ``suffice evaluate``,
``suffice export`` and the registry take it as they take any other. Data and settings come from the
first ingredient's ``train_config.yaml`` unless ``--config`` or ``--key=value`` say otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from suffice.serving.config import not_overrides
from suffice.serving.jsonl import json_safe
from suffice.training.fit.finalize import finalize
from suffice.training.fit.config import normalise_argv
from suffice.training.fit.meta import REQUIRED
from suffice.training.tracking import RunTracker, git_commit, log_evaluation_data, ui_command

MUST_MATCH = ("task", "label_scheme", "id2label", "positive_label", "max_length", "long_context_strategy")
METHODS = ("greedy", "uniform")
METRICS = ("source_macro_f1", "source_auroc", "macro_f1", "auroc", "accuracy", "loss")


class SoupError(ValueError):
    """Ingredients that cannot be averaged, or bad soup settings; the message names the fix."""


@dataclass
class Ingredient:
    name: str  # as given on the command line
    path: Path
    meta: dict[str, Any]
    validation: dict[str, float] | None = None


def resolve_ingredient(spec: str) -> Ingredient:
    """A trained-model directory (or a registry URI resolving to one) with its metadata."""
    from suffice.training.evaluation.evaluate import resolve_model
    from suffice.serving.bundle import MANIFEST_NAME
    from suffice.training.fit.meta import MODEL_META, read_model_meta

    path = resolve_model(spec)
    if (path / MANIFEST_NAME).is_file() and not (path / MODEL_META).is_file():
        raise SoupError(f"{spec} is an exported bundle (ONNX weights): soup the trained-model directories that `suffice train` "
                        "writes (registered versions of suffice-sufficiency-model point at them)")
    if not (path / MODEL_META).is_file() or not (path / "model.safetensors").is_file():
        raise SoupError(f"{spec}: {path} has no {MODEL_META} and model.safetensors; give a trained-model directory written by `suffice train`")
    return Ingredient(spec, path, read_model_meta(path))


def check_compatible(ingredients: Sequence[Ingredient]) -> None:
    """Raise :class:`SoupError` naming the first setting or tokenizer in which two ingredients differ."""
    from suffice.serving.bundle import sha256_file

    if len(ingredients) < 2:
        raise SoupError("a soup needs at least two models: pass two or more --models")
    paths = [i.path.resolve() for i in ingredients]
    if len(set(paths)) != len(paths):
        raise SoupError(f"--models names the same directory twice ({[str(p) for p in paths]}): give each ingredient once")
    first = ingredients[0]
    for other in ingredients[1:]:
        for key in MUST_MATCH:
            a, b = first.meta.get(key), other.meta.get(key)
            if a != b:
                raise SoupError(f"{first.name} and {other.name} differ in {key} ({a!r} vs {b!r}): a soup is one model with one "
                                f"{key}; leave one of them out or retrain it with the other's setting")
        if sha256_file(first.path / "tokenizer.json") != sha256_file(other.path / "tokenizer.json"):
            raise SoupError(f"{first.name} and {other.name} use different tokenizers: only models fine-tuned from the same base can be averaged")


def check_same_parameters(ingredients: Sequence[Ingredient], states: Sequence[Mapping[str, Any]]) -> None:
    """Raise :class:`SoupError` naming the first parameter that is missing in, or shaped differently by, an ingredient."""
    first, shapes0 = ingredients[0], {k: tuple(v.shape) for k, v in states[0].items()}
    for ing, state in zip(ingredients[1:], states[1:]):
        missing = sorted(set(shapes0) ^ set(state))
        if missing:
            raise SoupError(f"{first.name} and {ing.name} have different parameters (e.g. {missing[0]}): they are not the same "
                            "architecture (different --encoder_layers?); only models fine-tuned from the same base can be averaged")
        diff = next((k for k in shapes0 if shapes0[k] != tuple(state[k].shape)), None)
        if diff:
            raise SoupError(f"{first.name} and {ing.name} differ in the shape of {diff} ({shapes0[diff]} vs {tuple(state[diff].shape)}): "
                            "only models fine-tuned from the same base can be averaged")


def load_weights(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def average(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The element-wise mean of state dicts (in float32; integer buffers such as position ids are copied)."""
    import torch

    out = {}
    for k, v in states[0].items():
        if torch.is_floating_point(v):
            out[k] = (sum(s[k].float() for s in states) / len(states)).to(v.dtype)
        else:
            out[k] = v.clone()
    return out


def better_or_equal(metric: str, value: float, best: float) -> bool:
    return value <= best if metric == "loss" else value >= best


def greedy_soup(order: Sequence[int], states: Sequence[Mapping[str, Any]], score, metric: str,
                first_score: float) -> tuple[list[int], float, list[dict[str, Any]]]:
    """Wortsman et al.'s greedy soup over ``order`` (ingredients best first): ``score(state)`` is the
    validation metric of a state dict. Returns (kept indices, soup score, the trace of every try)."""
    kept, best = [order[0]], first_score
    trace = [{"ingredient": order[0], "kept": True, "score": first_score}]
    for i in order[1:]:
        value = score(average([states[j] for j in kept + [i]]))
        keep = better_or_equal(metric, value, best)
        trace.append({"ingredient": i, "kept": keep, "score": value})
        if keep:
            kept.append(i)
            best = value
    return kept, best, trace


def load_ingredients(specs: Sequence[str], out_dir: Path, overwrite: bool) -> tuple[list[Ingredient], list[dict[str, Any]]]:
    """The checked ingredients and their weights; clears a non-empty ``out_dir`` only with ``overwrite``."""
    ingredients = [resolve_ingredient(s) for s in specs]
    check_compatible(ingredients)
    states = [load_weights(i.path) for i in ingredients]
    check_same_parameters(ingredients, states)  # before --overwrite clears anything
    if any(out_dir.resolve() == i.path.resolve() for i in ingredients):
        raise SoupError(f"--output_dir {out_dir} is one of the ingredients: write the soup to a new directory")
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise SoupError(f"--output_dir {out_dir} exists and is not empty: choose a new directory or pass --overwrite")
        shutil.rmtree(out_dir)  # a stale adapter/ or bundle/ from an earlier model must not survive next to the soup
    return ingredients, states


@dataclass
class SoupBench:
    """What scoring candidate soups on validation needs: the config, data, packer and one model to load weights into."""

    cfg: Any
    config_used: str
    info: dict[str, Any]
    accelerator: Any
    splits: Any
    encoded: dict[str, Any]
    pad_id: int
    model: Any
    val_dl: Any
    weights: np.ndarray

    def evaluate(self, state: Mapping[str, Any]) -> tuple[dict[str, float], np.ndarray]:
        """Validation metrics and logits of the model holding ``state``."""
        from suffice.training.fit.loop import validation_metrics

        self.accelerator.unwrap_model(self.model).load_state_dict(state, strict=True)
        return validation_metrics(self.accelerator, self.model, self.val_dl, self.encoded["validation"], self.cfg, self.weights)


def soup_bench(first: Ingredient, config: str | None, overrides: Sequence[str]) -> SoupBench:
    """The first ingredient's config (or ``config``), its splits encoded with its window, and its model, prepared."""
    from accelerate import Accelerator

    from suffice.serving.bundle import sha256_file
    from suffice.serving.packing import ContextPacker
    from suffice.training.evaluation.evaluate import eval_config, model_info
    from suffice.training.fit.encode import class_weights, encode_split, eval_dataloader
    from suffice.training.fit.model import load_model_dir, load_tokenizer
    from suffice.training.fit.splits import load_splits

    info = model_info(first.path)
    cfg, config_used = eval_config(info, first.path, config, overrides)
    accelerator = Accelerator()
    if accelerator.num_processes > 1:
        raise SoupError("suffice soup runs in one process: start it with `suffice soup`, not a multi-process `accelerate launch`")
    splits = load_splits(cfg)
    if splits["validation"] is None or len(splits["validation"]) == 0:
        raise SoupError(f"the validation split of {config_used} is empty: a soup is chosen and calibrated on validation; "
                        "give --config with a validation split")
    packer = ContextPacker(load_tokenizer(first.path), max_length=info["max_length"], strategy=info["strategy"])
    tok_hash = sha256_file(first.path / "tokenizer.json")
    encoded = {name: (encode_split(splits[name], packer, cfg, tok_hash) if splits[name] is not None and len(splits[name]) else None)
               for name in ("train", "validation", "test")}
    weights = class_weights(encoded["train"]["labels"], cfg.num_labels, cfg.class_weighting)
    model, _ = load_model_dir(first.path)
    model, val_dl = accelerator.prepare(model, eval_dataloader(encoded["validation"], cfg.per_device_eval_batch_size, packer.pad_id))
    return SoupBench(cfg, config_used, info, accelerator, splits, encoded, packer.pad_id, model, val_dl, weights)


def choose(ingredients: Sequence[Ingredient], states: Sequence[Mapping[str, Any]], bench: SoupBench, method: str,
           metric: str) -> tuple[list[int], list[dict[str, Any]]]:
    """Score every ingredient on validation, then pick the ingredients (all, or the greedy soup); returns (kept, trace)."""
    print(f"suffice soup: {len(ingredients)} ingredients, method {method}, metric validation {metric} "
          f"({len(bench.encoded['validation'])} items)")
    for i, (ing, state) in enumerate(zip(ingredients, states)):
        ing.validation, _ = bench.evaluate(state)
        print(f"  [{i}] {ing.name}: {metric} {ing.validation[metric]:.4f} (macro-F1 {ing.validation['macro_f1']:.4f}, "
              f"AUROC {ing.validation['auroc']:.4f})")
    sign = 1 if metric == "loss" else -1
    order = sorted(range(len(ingredients)), key=lambda i: (sign * ingredients[i].validation[metric], i))
    if method != "greedy":
        return list(range(len(ingredients))), []
    kept, _, trace = greedy_soup(order, states, lambda s: bench.evaluate(s)[0][metric], metric, ingredients[order[0]].validation[metric])
    for t in trace[1:]:
        print(f"  try [{t['ingredient']}]: soup {metric} {t['score']:.4f} -> {'kept' if t['kept'] else 'left out'}")
    return sorted(kept), trace


@dataclass(frozen=True)
class SoupRecipe:
    """How the ingredients are chosen: ``method`` (``greedy`` or ``uniform``) and the validation ``metric``
    (None: the config's ``early_stopping_metric``); bad values fail before any data is read.

    >>> SoupRecipe("uniform", "auroc")
    SoupRecipe(method='uniform', metric='auroc')
    """

    method: str = "greedy"
    metric: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SoupError(f"--method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.metric is not None and self.metric not in METRICS:
            raise SoupError(f"--metric {self.metric!r}: choose one of {', '.join(METRICS)}")


@dataclass
class ChosenSoup:
    """The chosen ingredients (``kept``: indices), the soup's validation metrics and logits, and the
    record of how it was chosen (``info``: method, metric, ingredients, trace)."""

    kept: list[int]
    validation: Mapping[str, float]
    val_logits: np.ndarray
    info: dict[str, Any]


def soup(specs: Sequence[str], output_dir: str | Path, recipe: SoupRecipe = SoupRecipe(), *, config: str | None = None,
         overrides: Sequence[str] = (), overwrite: bool = False) -> dict[str, Any]:
    """Make, calibrate, evaluate, save, log and register a soup of ``specs``; returns a summary."""
    wall0 = time.perf_counter()
    out_dir = Path(output_dir)
    ingredients, states = load_ingredients(specs, out_dir, overwrite)
    bench = soup_bench(ingredients[0], config, overrides)
    method = recipe.method
    metric = recipe.metric or bench.cfg.early_stopping_metric
    if metric not in METRICS:
        raise SoupError(f"--metric {metric!r}: choose one of {', '.join(METRICS)}")
    kept, trace = choose(ingredients, states, bench, method, metric)
    if len(kept) == 1:
        # the soup would be a copy of one ingredient: say so instead of registering a duplicate
        print(f"  no average of the ingredients scores as well on validation {metric} as {ingredients[kept[0]].name} alone: "
              f"use that model (nothing written)")
        return {"output_dir": None, "kept": [ingredients[kept[0]].name], "validation": ingredients[kept[0]].validation,
                "trace": trace}
    val, val_logits = bench.evaluate(average([states[i] for i in kept]))
    print(f"  soup of {[ingredients[i].name for i in kept]}: {metric} {val[metric]:.4f} (macro-F1 {val['macro_f1']:.4f}, AUROC {val['auroc']:.4f})")
    soup_info = {"method": method, "metric": metric,
                 "ingredients": [{"model": ing.name, "path": str(ing.path), "run_id": (ing.meta.get("mlflow") or {}).get("run_id"),
                                  f"validation_{metric}": ing.validation[metric], "kept": i in kept} for i, ing in enumerate(ingredients)],
                 "trace": [{**t, "model": ingredients[t["ingredient"]].name} for t in trace]}
    return finish(bench, ingredients, ChosenSoup(kept, val, val_logits, soup_info), out_dir, wall0)


def finish(bench: SoupBench, ingredients: Sequence[Ingredient], chosen: ChosenSoup, out_dir: Path, wall0: float) -> dict[str, Any]:
    """Log the soup as an MLflow run, then :func:`~suffice.training.fit.finalize.finalize` it like a trained model."""
    from suffice.training.fit.encode import Loaders, eval_dataloader
    from suffice.training.fit.loop import TrainingRun, TrainState

    kept, val, val_logits, soup_info = chosen.kept, chosen.validation, chosen.val_logits, chosen.info
    cfg, splits, info, first, method, metric = bench.cfg, bench.splits, bench.info, ingredients[0], soup_info["method"], soup_info["metric"]
    run_name = cfg.tracking.run_name or f"{cfg.task}-soup-{time.strftime('%Y%m%d-%H%M%S')}"
    tracker = RunTracker(cfg.tracking.enabled, cfg.tracking.tracking_uri, cfg.tracking.experiment, True)
    commit = git_commit()
    state = TrainState(run_name=run_name)
    state.mlflow_run_id = tracker.start(run_name, tags={
        "task": cfg.task, "base_model": str(first.meta.get("base_model", cfg.base_model)), "finetune": "soup", "soup_method": method,
        "label_source": splits.label_source, "data_hash": splits.data_hash, "mlflow.source.git.commit": commit or "unknown"})
    try:
        tracker.log_params({"method": method, "metric": metric, "config": bench.config_used, "ingredients": len(ingredients),
                            "kept": ",".join(ingredients[i].name for i in kept), "git_commit": commit or "unknown",
                            "data_hash": splits.data_hash, "max_length": info["max_length"], "long_context_strategy": info["strategy"],
                            **{f"ingredient_{i}": ing.name for i, ing in enumerate(ingredients)}})
        tracker.log_metrics({f"ingredient_{i}_val_{k}": v for i, ing in enumerate(ingredients) for k, v in ing.validation.items()}
                            | {f"val_{k}": v for k, v in val.items()} | {"soup_size": float(len(kept))})
        tracker.log_text(json.dumps(json_safe(soup_info), indent=2), "soup.json")
        log_evaluation_data(tracker, bench.encoded, splits.data_hash, splits.manifest)
        test_dl = None
        if cfg.evaluate_test and bench.encoded["test"] is not None:
            test_dl = bench.accelerator.prepare(eval_dataloader(bench.encoded["test"], cfg.per_device_eval_batch_size, bench.pad_id))
        # the first ingredient's provenance, except what this soup redoes (calibration, metrics, run)
        provenance = {k: v for k, v in first.meta.items() if k not in (*REQUIRED, "thresholds", "train_seconds", "metrics", "mlflow")}
        provenance.update({"finetune": "soup", "label_source": splits.label_source, "data_hash": splits.data_hash,
                           "git_commit": commit, "soup": json_safe(soup_info)})
        soup_run = TrainingRun(cfg, bench.accelerator, bench.model, state=state, tracker=tracker, encoded=bench.encoded,
                               loaders=Loaders(None, bench.val_dl, test_dl), out_dir=out_dir, base_dir=first.path, splits=splits,
                               weights=bench.weights, commit=commit)
        done = finalize(soup_run, val_logits, provenance)
        summary = {k: v for k, v in done.items() if k not in ("temperature", "thresholds", "val_report", "test_report", "test")}
        total = time.perf_counter() - wall0
        tracker.log_metrics({"wall_seconds": total})
        tracker.set_tags({"output_dir": str(out_dir)})
    except BaseException as e:
        tracker.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    tracker.end("FINISHED")
    print(f"\nmodel: {out_dir}" + (f"\nregistered: {summary['registered']}" if summary.get("registered") else "")
          + (f"\nbundle: {summary['bundle']}" if summary.get("bundle") else "")
          + (f"\nMLflow run {state.mlflow_run_id}: {ui_command(cfg.tracking.tracking_uri, tracker.experiment_id)}" if tracker.enabled else "")
          + f"\nwall time {total:.0f} s")
    return {"output_dir": str(out_dir), "kept": [ingredients[i].name for i in kept], "validation": val, "temperature": done["temperature"],
            "test": done["test"], "mlflow_run_id": state.mlflow_run_id, **summary}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="suffice soup", description=__doc__.split("\n\n")[0],
                                 epilog="Other --key=value options override the TrainConfig the data and tracking come from "
                                        "(e.g. --export=true, --tracking.register=false).")
    ap.add_argument("--models", nargs="+", required=True, help="two or more trained-model directories or models:/NAME/N URIs")
    ap.add_argument("--output_dir", "--output-dir", required=True, help="where the soup's model directory goes (new or empty)")
    ap.add_argument("--method", default="greedy", choices=METHODS)
    ap.add_argument("--metric", default=None, help=f"validation metric for greedy selection ({', '.join(METRICS)}); "
                                                    "default: the config's early_stopping_metric")
    ap.add_argument("--config", default=None, help="training config for data and tracking (default: the first model's train_config.yaml)")
    ap.add_argument("--overwrite", action="store_true", help="replace a non-empty --output_dir")
    return ap


def main(argv: list[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(argv)
    bad = not_overrides(normalise_argv(rest))  # bare --export / --resume read as =true, as in suffice train
    if bad:
        print(f"suffice soup: unexpected arguments {bad}: options are --key=value", file=sys.stderr)
        return 2
    try:
        soup(args.models, args.output_dir, SoupRecipe(args.method, args.metric), config=args.config, overrides=rest,
             overwrite=args.overwrite)
    except (SoupError, FileNotFoundError) as e:
        print(f"suffice soup: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
