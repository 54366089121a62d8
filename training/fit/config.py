"""The training configuration: one documented dataclass per concern, one YAML drives a run.

``TrainConfig`` holds the model (base encoder, LoRA or full fine-tuning, window and long-context
strategy), the optimisation (batch, learning rates, warm-up, epochs, class weights, early stopping),
calibration, tracking (MLflow) and where the data comes from: the ``data:`` section (a
:class:`suffice.training.data.builder.DataConfig`), ``train_file`` / ``validation_file`` /
``test_file`` (canonical JSONL), or (task ``retrieval_gate``) the ``gate:`` section.

>>> cfg = build_train_config(None, ["--train_file=tests/fixtures/train20.jsonl", "--lora.r=8"])
>>> cfg.lora.r, cfg.effective_batch_size(num_processes=2)
(8, 32)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from suffice.serving.bundle import TASK_SPECS
from suffice.serving.config import ConfigError, build_config, config_from_dict, config_to_dict
# calibration.* lives next to the code that fits it; re-exported here with the other sections
from suffice.training.fit.calibration import CalibrationSettings

REGISTERED_MODEL = {"sufficiency": "suffice-sufficiency", "retrieval_gate": "suffice-retrieval-gate"}
BASELINES = ("keyword_coverage", "answer_in_context", "tfidf_lr")


@dataclass
class LoraSettings:
    """LoRA adapters (peft), used when ``finetune: lora``.

    r / alpha / dropout: adapter rank, scaling numerator (scale = alpha / r) and dropout.
    target_modules: module-name suffixes that get adapters. The default covers every linear layer
        of the BERT encoder (attention projections and both feed-forward layers) but not
        ``pooler.dense``, which is part of the head and trained fully.
    modules_to_save: modules trained fully next to the adapters (the head: pooler + classifier).
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.1
    target_modules: list[str] = field(
        default_factory=lambda: ["query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense"]
    )
    modules_to_save: list[str] = field(default_factory=lambda: ["classifier", "pooler"])

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ConfigError(f"lora.r={self.r} must be >= 1 (typical: 8-32)")
        if self.alpha < 1:
            raise ConfigError(f"lora.alpha={self.alpha} must be >= 1 (typical: 2 x lora.r)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout={self.dropout} must be in [0, 1)")
        if not self.target_modules:
            raise ConfigError("lora.target_modules is empty: name at least one module, e.g. [query, value]")
        if "dense" in self.target_modules and "pooler" in self.modules_to_save:
            raise ConfigError(
                f"lora.target_modules={self.target_modules} includes 'dense', which also matches pooler.dense, while "
                f"lora.modules_to_save={self.modules_to_save} trains the pooler fully: name the encoder layers "
                "('attention.output.dense', 'intermediate.dense', 'output.dense') or drop 'pooler' from modules_to_save"
            )


@dataclass
class TrackingSettings:
    """MLflow tracking. The store defaults to ``sqlite:///<repo>/mlruns/mlflow.db``.

    enabled: log to MLflow at all (tests and quick experiments may switch it off).
    tracking_uri: override the store (default: suffice.training.paths.default_tracking_uri()).
    experiment: experiment name; runs of one experiment compare side by side in the UI.
    run_name: MLflow run name (default: ``<task>-<finetune>-<timestamp>``).
    register: register a new version of ``registered_model`` when the run finishes.
    registered_model: default ``suffice-sufficiency`` / ``suffice-retrieval-gate`` by task.
    log_model_artifacts: log the merged model and adapter as run artifacts (the registered
        version points at them).
    """

    enabled: bool = True
    tracking_uri: str | None = None
    experiment: str = "suffice"
    run_name: str | None = None
    register: bool = True
    registered_model: str | None = None
    log_model_artifacts: bool = True


@dataclass
class RetrievalGateData:
    """Where the retrieval-gate threads come from and how they are split (``suffice.training.data.threads``).

    path: JSONL of chat threads ({id, messages, label RETRIEVE|SKIP, category}); default ``<data>/retrieval-gate/train.jsonl``.
    split: ``opening_message`` (threads sharing their opening message are one group) or ``domains``
        (``path`` + ``pairs_path``, default ``<data>/retrieval-gate/pairs.jsonl``: whole domains held out,
        ``path``'s threads all train). validation_fraction / test_fraction: the held-out shares.
    pair_batches: keep both threads of a contrastive pair (rows sharing ``pair``) in one training
        batch, side by side (no effect on threads without a ``pair``).
    pair_loss_weight: weight of the pair ranking loss (:mod:`suffice.training.fit.pairs`): within a
        batch, the SKIP thread of a pair must score P(SKIP) above its RETRIEVE partner; 0 = off.
        Needs ``pair_batches``.
    extra_paths: more thread JSONL files in the same format, each by another writer (e.g. ``data/gate-writers/*.jsonl``:
        contrastive pairs with ``domain`` and ``pair``); they join the split, each split by its own domains under
        ``domains`` (so ``path`` + ``pairs_path`` keep their split and every writer has held-out domains), by opening
        message under ``opening_message``. Relative paths are read from the working directory.
    styles: writing styles (:data:`suffice.training.data.styles.STYLES`: of the user's new message, or of
        the earlier turns) that training adds as styled copies of its train threads (same label: the styles
        change how a thread is written, not what it asks or holds); [] = the writer's own style only.
    style_copies: styled copies per train thread (styles drawn per pair, both threads alike).
    style_validation: validation also holds one copy of each validation thread per style, and the SKIP
        threshold comes from those copies by ``style_threshold``: ``max`` = the most conservative of the
        per-style thresholds (each style's lowest with ``calibration.skip_min_precision``), ``pooled`` =
        the lowest with that precision on all copies together
        (:func:`suffice.training.fit.finalize.styled_skip_threshold`).
    """

    path: str | None = None
    split: Literal["opening_message", "domains"] = "opening_message"
    pairs_path: str | None = None
    extra_paths: list[str] = field(default_factory=list)
    validation_fraction: float = 0.15
    test_fraction: float = 0.15
    pair_batches: bool = True
    pair_loss_weight: float = 0.0
    styles: list[str] = field(default_factory=list)
    style_copies: int = 1
    style_validation: bool = True
    style_threshold: Literal["max", "pooled"] = "max"

    def __post_init__(self) -> None:
        from suffice.training.data.styles import check_styles

        try:
            self.styles = check_styles(list(self.styles))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if isinstance(self.extra_paths, str) or not all(isinstance(x, str) and x for x in self.extra_paths):
            raise ConfigError(f"gate.extra_paths={self.extra_paths!r}: give a list of thread JSONL paths, e.g. [data/gate-writers/a.jsonl]")
        self.extra_paths = list(self.extra_paths)
        if self.style_threshold not in ("max", "pooled"):
            raise ConfigError(f"gate.style_threshold={self.style_threshold!r}: choose 'max' or 'pooled'")
        if not isinstance(self.style_copies, int) or self.style_copies < 0:
            raise ConfigError(f"gate.style_copies={self.style_copies!r} must be an integer >= 0 (0 = no styled copies)")
        if not (0 < self.validation_fraction < 0.5 and 0 < self.test_fraction < 0.5):
            raise ConfigError(
                f"gate.validation_fraction={self.validation_fraction} and gate.test_fraction={self.test_fraction} "
                "must each be in (0, 0.5)"
            )
        if self.pair_loss_weight < 0:
            raise ConfigError(f"gate.pair_loss_weight={self.pair_loss_weight} must be >= 0 (0 = off)")
        if self.pair_loss_weight > 0 and not self.pair_batches:
            raise ConfigError(f"gate.pair_loss_weight={self.pair_loss_weight} needs gate.pair_batches=true: the loss "
                              "compares the two threads of a pair inside one batch")


@dataclass
class ContrastSettings:
    """Questions over one passage side by side (task ``sufficiency``): :mod:`suffice.training.fit.pairs`.

    A SQuAD paragraph carries answerable questions and near-miss ones written to look answerable;
    the passage cannot tell them apart, only a careful reading of the question against it can.
    With ``unit_size`` >= 2 the train rows of one ``group`` (items sharing a passage set, their
    constructed variants and the synthetic questions over the same paragraph) travel in units of
    ``unit_size`` rows, sufficient and not alternating, inside one batch.
    loss_weight: weight of the group ranking loss: within a unit, every sufficient row must score
        P(sufficient) above every insufficient one (a logistic pairwise loss); 0 = off. Needs ``unit_size``.
    """

    unit_size: int = 0
    loss_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.unit_size < 0 or self.unit_size == 1:
            raise ConfigError(f"contrast.unit_size={self.unit_size} must be 0 (off) or >= 2 (rows of one passage per unit)")
        if self.loss_weight < 0:
            raise ConfigError(f"contrast.loss_weight={self.loss_weight} must be >= 0 (0 = off)")
        if self.loss_weight > 0 and not self.unit_size:
            raise ConfigError(f"contrast.loss_weight={self.loss_weight} needs contrast.unit_size >= 2 (4 is usual): the loss "
                              "compares rows of one passage inside one batch")


@dataclass
class SpanSettings:
    """The extractive-QA objective in the SQuAD 2.0 manner (task ``sufficiency``): :mod:`suffice.training.fit.spans`.

    A start / end pointer over the packed window, trained beside the sufficiency head on the rows
    whose gold answer is known: the answer's tokens for a sufficient row, ``[CLS]`` ("no answer")
    for an insufficient one. Training-only: the exported model is the classifier alone.
    loss_weight: weight of the span loss (mean of the start and end cross-entropies) added to the
        classification loss; 0 = off.
    """

    loss_weight: float = 0.0

    def __post_init__(self) -> None:
        if not (self.loss_weight >= 0 and math.isfinite(self.loss_weight)):
            raise ConfigError(f"span.loss_weight={self.loss_weight} must be a finite number >= 0 (0 = off; 0.5-1 is usual)")


@dataclass
class TrainConfig:
    """Everything one training run needs. Built from YAML + ``--key=value`` overrides.

    task: ``sufficiency`` (is the context enough?) or ``retrieval_gate`` (RETRIEVE vs SKIP).
    label_scheme: ``binary`` (sufficient vs not, the paper's criterion) or ``three_level``
        (sufficient / partial / insufficient; items without a level are left out of the loss).
    base_model: short name (``minilm-l6``), local HF directory, or hub id (online only).
    finetune: ``lora`` (adapters + fully trained head) or ``full`` (every weight).
    max_length: encoder window in tokens; the question is never truncated.
    long_context_strategy: how context beyond the window is handled (serving.packing):
        ``select`` (question-aware sentence selection), ``select_lines`` (the same with line breaks
        ending units), ``referenced_turn`` / ``_exchange`` (the latest reply first), ``truncate``, ``recent``.
    data: the DataConfig section (see suffice.training.data.builder.DataConfig).
    train_file / validation_file / test_file: canonical JSONL instead of ``data`` (fixtures, smoke runs).
    gate: retrieval-gate data (task ``retrieval_gate`` only).
    contrast: questions over one passage in one batch, with a ranking loss (task ``sufficiency``
        only): :class:`ContrastSettings`.
    span: the extractive-QA objective beside the classifier (task ``sufficiency`` only): :class:`SpanSettings`.
    max_train_items / max_eval_items: a seeded random sample of N items per split (0 = all).
    output_dir: the trained-model directory (default ``models/<run name>``); checkpoints go to
        ``<output_dir>/checkpoints``.
    per_device_train_batch_size / per_device_eval_batch_size / gradient_accumulation_steps:
        effective batch = per_device_train_batch_size x processes x gradient_accumulation_steps.
    learning_rate: for the encoder weights (LoRA adapters, or all weights in full fine-tuning).
    head_learning_rate: for the head (pooler + classifier); a larger rate gets the randomly
        initialised head moving in the first steps (default: 10 x learning_rate for LoRA, else equal).
    weight_decay / warmup_ratio / lr_scheduler / max_grad_norm: the usual.
    num_train_epochs / max_steps: optimiser steps = max_steps if > 0, else epochs x steps per epoch.
    max_train_minutes: a wall-clock budget for the training steps and their validation passes (0 =
        none). After the first steps the loop measures the seconds per step and, when the planned steps
        would not fit, plans fewer and fits the learning-rate schedule to them (the rate still decays
        to its end value at the last step): the same config finishes in time on a slow CPU and trains
        fully on a fast one; steps that slow down after the plan (a busy machine) still stop when the
        budget is spent. Data preparation, calibration, test and export come on top. The plan is
        stored with the checkpoints, so ``--resume`` keeps it.
    class_weighting: ``balanced`` weights each example's loss by N / (K x n_class), ``none`` does not.
    early_stopping_metric / early_stopping_patience: validation metric checked after every
        epoch; training stops after ``patience`` epochs without improvement and the best
        epoch's weights are kept (patience 0 = never stop early, still keep the best).
        ``source_macro_f1`` / ``source_auroc`` are means over the validation sources: a pooled
        score also rewards learning which source an item comes from.
    freeze_layers: full fine-tuning only: freeze the embeddings and the lowest N encoder layers.
    encoder_layers: keep only the lowest N transformer layers of the base encoder (0 = all): a
        shallower model is proportionally faster to train and to serve; the exported bundle
        simply has fewer layers. For tasks a few layers solve (the retrieval gate).
    length_grouping: batch examples of similar length together (shuffled mega-batches sorted
        by length) so dynamic padding wastes little; ``false`` = plain shuffling.
    checkpoint_every_steps: also ``save_state`` every N optimiser steps (0 = once per epoch).
    checkpoints_total_limit: keep only the newest N checkpoints.
    resume: continue from the newest checkpoint in ``<output_dir>/checkpoints`` (``--resume``).
    seed: Python/NumPy/torch seeds and the data order.
    mixed_precision: ``auto`` (bf16/fp16 on a GPU that has it, bf16 on a CPU with bf16 units: AMX or
        AVX512-BF16, detected by ``suffice.serving.cpu``; else fp32; ``accelerate launch
        --mixed_precision`` wins when given), or ``no`` / ``fp16`` / ``bf16``. The run records the
        resolved precision and the machine (CPU model, ISA class) in its params.
    torch_threads: intra-op CPU threads per process (0 = cores / local processes). On a CPU
        shared with other jobs use 1: OpenMP threads waiting on a busy core make every matmul slow.
    log_every_steps: log train loss, throughput and learning rate to MLflow every N steps.
    evaluate_test: score the test split at the end (per source and overall) and log it.
    baselines: baselines scored on the same test items and logged beside the model (default: all
        three for sufficiency, ``[tfidf_lr]`` for the retrieval gate; ``[]`` for none).
    export: at the end, call suffice.training.export.export_bundle if that module exists.
    export_dir: where the bundle goes (default ``<output_dir>/bundle``).
    calibration: how scores are calibrated on validation (method, pool) and the stored thresholds:
        :class:`suffice.training.fit.calibration.CalibrationSettings`.
    """

    task: Literal["sufficiency", "retrieval_gate"] = "sufficiency"
    label_scheme: Literal["binary", "three_level"] = "binary"
    base_model: str = "minilm-l6"
    finetune: Literal["lora", "full"] = "lora"
    lora: LoraSettings = field(default_factory=LoraSettings)
    max_length: int = 256
    long_context_strategy: Literal["select", "truncate", "recent", "select_lines", "referenced_turn", "referenced_exchange"] = "select"

    data: dict[str, Any] = field(default_factory=dict)
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    gate: RetrievalGateData = field(default_factory=RetrievalGateData)
    contrast: ContrastSettings = field(default_factory=ContrastSettings)
    span: SpanSettings = field(default_factory=SpanSettings)
    max_train_items: int = 0
    max_eval_items: int = 0

    output_dir: str | None = None
    per_device_train_batch_size: int = 16
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    learning_rate: float = 2e-4
    head_learning_rate: float | None = None
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    lr_scheduler: Literal["linear", "cosine", "constant"] = "linear"
    max_grad_norm: float = 1.0
    num_train_epochs: int = 2
    max_steps: int = 0
    max_train_minutes: float = 0.0
    class_weighting: Literal["balanced", "none"] = "balanced"
    early_stopping_metric: Literal["macro_f1", "auroc", "loss", "source_macro_f1", "source_auroc"] = "macro_f1"
    early_stopping_patience: int = 2
    freeze_layers: int = 0
    encoder_layers: int = 0
    length_grouping: bool = True
    checkpoint_every_steps: int = 0
    checkpoints_total_limit: int = 2
    resume: bool = False
    seed: int = 42
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = "auto"
    torch_threads: int = 0
    log_every_steps: int = 10

    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    evaluate_test: bool = True
    baselines: list[str] | None = None
    export: bool = False
    export_dir: str | None = None

    def __post_init__(self) -> None:
        if self.label_scheme not in TASK_SPECS[self.task].label_schemes:
            raise ConfigError(
                f"label_scheme={self.label_scheme!r} does not apply to task={self.task!r}: the retrieval gate is binary "
                "(RETRIEVE/SKIP); use --label_scheme=binary"
            )
        if not 32 <= self.max_length <= 512:
            raise ConfigError(f"max_length={self.max_length} must be in [32, 512] (BERT-family windows end at 512)")
        if self.task == "retrieval_gate" and self.long_context_strategy == "truncate":
            raise ConfigError(
                "long_context_strategy='truncate' for the retrieval gate would keep the oldest chat turns and drop "
                "the newest; use --long_context_strategy=select_lines (relevant lines) or recent (newest turns)"
            )
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        if self.learning_rate <= 0 or (self.head_learning_rate is not None and self.head_learning_rate <= 0):
            raise ConfigError(
                f"learning_rate={self.learning_rate} and head_learning_rate={self.head_learning_rate} must be > 0"
            )
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio={self.warmup_ratio} must be in [0, 1) (0.06 is usual)")
        if not (math.isfinite(self.max_train_minutes) and self.max_train_minutes >= 0):
            raise ConfigError(f"max_train_minutes={self.max_train_minutes} must be a finite number of minutes >= 0 (0 = no budget)")
        if self.num_train_epochs < 1 and self.max_steps < 1:
            raise ConfigError(
                f"num_train_epochs={self.num_train_epochs} and max_steps={self.max_steps}: give at least one epoch or a step count"
            )
        if self.early_stopping_patience < 0:
            raise ConfigError(f"early_stopping_patience={self.early_stopping_patience} must be >= 0 (0 = never stop early)")
        if self.encoder_layers < 0:
            raise ConfigError(f"encoder_layers={self.encoder_layers} must be >= 0 (0 = every layer of the base encoder)")
        if self.freeze_layers and self.encoder_layers and self.freeze_layers > self.encoder_layers:
            raise ConfigError(f"freeze_layers={self.freeze_layers} > encoder_layers={self.encoder_layers}: freeze at most the layers kept")
        if self.freeze_layers < 0:
            raise ConfigError(f"freeze_layers={self.freeze_layers} must be >= 0")
        if self.freeze_layers and self.finetune == "lora":
            raise ConfigError(
                f"freeze_layers={self.freeze_layers} with finetune=lora: LoRA already freezes the encoder; "
                "restrict adapters with lora.target_modules, or use --finetune=full"
            )
        if self.checkpoint_every_steps < 0 or self.checkpoints_total_limit < 1:
            raise ConfigError(
                f"checkpoint_every_steps={self.checkpoint_every_steps} must be >= 0 and "
                f"checkpoints_total_limit={self.checkpoints_total_limit} >= 1"
            )
        if self.max_train_items < 0 or self.max_eval_items < 0:
            raise ConfigError("max_train_items and max_eval_items must be >= 0 (0 = all)")
        if self.log_every_steps < 1:
            raise ConfigError(f"log_every_steps={self.log_every_steps} must be >= 1")
        if self.torch_threads < 0:
            raise ConfigError(f"torch_threads={self.torch_threads} must be >= 0 (0 = cores / processes)")
        unknown = sorted(set(self.resolved_baselines()) - set(BASELINES))
        if unknown:
            raise ConfigError(f"unknown baseline(s) {unknown}: choose from {list(BASELINES)}")
        if self.task == "retrieval_gate" and set(self.resolved_baselines()) - {"tfidf_lr"}:
            raise ConfigError(
                f"baselines={self.baselines} for the retrieval gate: only tfidf_lr applies (the others read "
                "retrieved passages and gold answers); use --baselines=tfidf_lr"
            )
        files = (self.train_file, self.validation_file, self.test_file)
        if (self.validation_file or self.test_file) and not self.train_file:
            raise ConfigError("validation_file/test_file given without train_file: give --train_file=PATH too")
        for f in files:
            if f and not Path(f).is_file():
                raise ConfigError(f"data file {f} does not exist: give a canonical JSONL path (see tests/fixtures/train20.jsonl)")
        if self.train_file and self.data:
            raise ConfigError(
                f"both train_file={self.train_file!r} and a data: section {sorted(self.data)} were given: "
                "use one source of training data"
            )
        if self.contrast.unit_size and self.task != "sufficiency":
            raise ConfigError(f"contrast.unit_size={self.contrast.unit_size} applies to task=sufficiency; the retrieval gate "
                              "keeps its contrastive pairs together with gate.pair_batches / gate.pair_loss_weight")
        if self.span.loss_weight and self.task != "sufficiency":
            raise ConfigError(f"span.loss_weight={self.span.loss_weight} applies to task=sufficiency (answers in passages); "
                              "the retrieval gate has none: set --span.loss_weight=0")
        if self.contrast.loss_weight and self.label_scheme != "binary":
            raise ConfigError(f"contrast.loss_weight={self.contrast.loss_weight} ranks sufficient above not sufficient "
                              "(binary heads); use --label_scheme=binary or --contrast.loss_weight=0")
        if self.contrast.unit_size > self.per_device_train_batch_size:
            raise ConfigError(f"contrast.unit_size={self.contrast.unit_size} > per_device_train_batch_size="
                              f"{self.per_device_train_batch_size}: a unit must fit one batch; lower contrast.unit_size")
        self.calibration.check_label_scheme(self.label_scheme)
        if self.task == "sufficiency" and not self.train_file:
            checked = self.data_config()  # validate the data section now, not an hour into the run
            # keep the keys given, typed as checked: --data.max_train_per_source={qed: 4000} is saved (and
            # printed) as a mapping, not as the string the command line held
            typed, aliases = config_to_dict(checked), getattr(type(checked), "CONFIG_KEY_ALIASES", {})
            self.data = {aliases.get(k, k): typed[aliases.get(k, k)] for k in self.data}

    # -- derived ---------------------------------------------------------------------------
    @property
    def id2label(self) -> dict[int, str]:
        return TASK_SPECS[self.task].id2label(self.label_scheme)

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @property
    def positive_label(self) -> str:
        return TASK_SPECS[self.task].positive_label

    @property
    def positive_index(self) -> int:
        return next(i for i, n in self.id2label.items() if n == self.positive_label)

    @property
    def registered_model(self) -> str:
        return self.tracking.registered_model or REGISTERED_MODEL[self.task]

    def resolved_baselines(self) -> list[str]:
        if self.baselines is not None:
            return list(self.baselines)
        return ["tfidf_lr"] if self.task == "retrieval_gate" else list(BASELINES)

    def resolved_head_learning_rate(self) -> float:
        if self.head_learning_rate is not None:
            return self.head_learning_rate
        return self.learning_rate * 10 if self.finetune == "lora" else self.learning_rate

    def effective_batch_size(self, num_processes: int = 1) -> int:
        return self.per_device_train_batch_size * num_processes * self.gradient_accumulation_steps

    def data_config(self):
        """The ``data:`` section as a checked DataConfig (sufficiency task, no train_file).

        >>> TrainConfig(data={"sources": ["squad2"]}).data_config()  # doctest: +SKIP
        DataConfig(...)
        """
        try:
            from suffice.training.data.builder import DataConfig
        except ModuleNotFoundError as e:
            raise ConfigError(
                f"the data: section needs suffice.training.data.builder ({e}); give --train_file=PATH "
                "(canonical JSONL) instead"
            ) from e
        try:
            return config_from_dict(DataConfig, dict(self.data))
        except ConfigError as e:
            raise ConfigError(f"in the data: section: {e}") from e

    def resolved_output_dir(self, run_name: str) -> Path:
        from suffice.training.paths import REPO_ROOT

        return Path(self.output_dir) if self.output_dir else REPO_ROOT / "models" / run_name


def normalise_argv(argv: Sequence[str]) -> list[str]:
    """Let bare boolean flags read naturally: ``--resume`` -> ``--resume=true``."""
    return [f"{a}=true" if a in ("--resume", "--export") else a for a in argv]


# Keys older versions wrote into a model directory's train_config.yaml: such a file still loads.
RETIRED_KEYS = {"answer_span_weight": "the LoRA-era answer-span head (it lost 11-30 macro-F1 points in both measured runs); "
                                      "its successor is span.loss_weight"}


def build_train_config(yaml_path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Defaults <- YAML <- ``--key=value`` overrides, checked.

    >>> build_train_config(None, ["--finetune=full", "--learning_rate=3e-5", "--train_file=tests/fixtures/train20.jsonl"]).finetune
    'full'
    """
    return build_config(TrainConfig, yaml_path, normalise_argv(overrides), retired=RETIRED_KEYS)
