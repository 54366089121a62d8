"""Training cost on this CPU: examples/s and wall time per 1,000 examples, LoRA vs full fine-tuning.

Both models are built with the project's own ``build_model`` / ``optimizer_groups`` from the
same training config, fed the same packed training rows in the same length-grouped batches
(``LengthGroupedSampler`` + ``make_collate``, as ``suffice.training.fit`` does), and timed in
alternating rounds (LoRA, full, LoRA, full...) so drift on a shared machine hits both alike.
A step is forward + class-weighted cross-entropy + backward + gradient clipping + AdamW step.

>>> training_cost(cfg, base_dir, train_ds, pad_id=0, steps=8, rounds=2)["ratio_full_over_lora_s_per_1k"]  # doctest: +SKIP
1.6
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def _batches(train_ds, pad_id: int, batch_size: int, n_batches: int, seed: int, grouping: bool) -> list[dict[str, Any]]:
    from suffice.training.fit.encode import EVAL_COLUMNS, LengthGroupedSampler, make_collate

    rng = np.random.default_rng(seed)
    n = min(len(train_ds), batch_size * n_batches)
    rows = train_ds.select(sorted(rng.choice(len(train_ds), size=n, replace=False).tolist())).select_columns(list(EVAL_COLUMNS) + ["length"])
    order = list(LengthGroupedSampler(rows["length"], batch_size, seed, grouping))
    collate = make_collate(pad_id)
    out = [collate([rows[i] for i in order[k : k + batch_size]]) for k in range(0, len(order), batch_size)]
    return [b for b in out if len(b["labels"]) == batch_size][:n_batches] or out[:n_batches]


def training_cost(cfg, base_dir, train_ds, pad_id: int, steps: int = 12, rounds: int = 2, warmup: int = 2, threads: int = 2,
                  precisions: tuple[str, ...] = ("fp32",)) -> dict[str, Any]:
    """Time ``rounds`` x ``steps`` optimiser steps for LoRA and full fine-tuning, interleaved.

    ``precisions``: ``fp32`` and/or ``bf16`` (CPU autocast, what ``mixed_precision: bf16`` runs);
    results are keyed ``lora`` / ``full`` for fp32 and ``lora-bf16`` / ``full-bf16`` for bf16."""
    import torch
    import torch.nn.functional as F

    from suffice.training.fit.model import build_model, optimizer_groups, trainable_parameters
    from suffice.training.fit.encode import class_weights

    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    bs = cfg.per_device_train_batch_size
    batches = _batches(train_ds, pad_id, bs, warmup + steps * rounds, cfg.seed, cfg.length_grouping)
    weights = torch.tensor(class_weights(train_ds["labels"], cfg.num_labels, cfg.class_weighting), dtype=torch.float32)
    setups: dict[str, dict[str, Any]] = {}
    for mode, prec in ((m, p) for m in ("lora", "full") for p in precisions):
        torch.manual_seed(cfg.seed)
        model = build_model(base_dir, id2label=cfg.id2label, finetune=mode, lora=cfg.lora,
                            freeze_layers=cfg.freeze_layers if mode == "full" else 0)
        model.train()
        opt = torch.optim.AdamW(optimizer_groups(model, cfg.learning_rate, cfg.resolved_head_learning_rate(), cfg.weight_decay))
        key = mode if prec == "fp32" else f"{mode}-{prec}"
        setups[key] = {"model": model, "opt": opt, "params": trainable_parameters(model), "seconds": 0.0, "examples": 0, "tokens": 0,
                       "bf16": prec == "bf16"}

    def step(s: dict[str, Any], batch: dict[str, Any]) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=s["bf16"]):
            out = s["model"](input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"])
        loss = F.cross_entropy(out.logits.float(), batch["labels"], weight=weights)
        loss.backward()
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(s["model"].parameters(), cfg.max_grad_norm)
        s["opt"].step()
        s["opt"].zero_grad()

    for s in setups.values():  # warm-up: first-call allocations and optimiser state
        for b in batches[:warmup]:
            step(s, b)
    timed = batches[warmup:]
    for r in range(rounds):
        for mode, s in setups.items():
            chunk = timed[r * steps : (r + 1) * steps]
            t0 = time.perf_counter()
            for b in chunk:
                step(s, b)
            s["seconds"] += time.perf_counter() - t0
            s["examples"] += sum(len(b["labels"]) for b in chunk)
            s["tokens"] += int(sum(int(b["attention_mask"].sum()) for b in chunk))
    result: dict[str, Any] = {"batch_size": bs, "steps_per_round": steps, "rounds": rounds, "threads": threads,
                              "max_length": cfg.max_length, "base_model": str(cfg.base_model)}
    for mode, s in setups.items():
        eps = s["examples"] / s["seconds"] if s["seconds"] else float("nan")
        result[mode] = {"examples": s["examples"], "seconds": round(s["seconds"], 3), "examples_per_s": eps,
                        "seconds_per_1k_examples": 1000.0 / eps if eps else float("nan"),
                        "mean_tokens_per_example": s["tokens"] / max(s["examples"], 1),
                        "trainable_params": s["params"][0], "total_params": s["params"][1]}
    if "lora" in result and "full" in result:
        result["ratio_full_over_lora_s_per_1k"] = result["full"]["seconds_per_1k_examples"] / result["lora"]["seconds_per_1k_examples"]
    for mode in ("lora", "full"):
        if mode in result and f"{mode}-bf16" in result:
            result[f"speedup_bf16_{mode}"] = result[f"{mode}-bf16"]["examples_per_s"] / result[mode]["examples_per_s"]
    return result
