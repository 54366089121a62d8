"""Training examples/s on this CPU: LoRA vs full fine-tuning, fp32 vs bf16 autocast (the issue's item 3).

    python benchmarks/bench_training_precision.py > training_precision.json

400 packed train rows of configs/sufficiency.yaml's data at its 256-token window, batch 16, 2
threads, 2 warm-up + 12 timed optimiser steps per setup, setups interleaved (``bench_training``).
"""
import json, sys, time
sys.path.insert(0, "benchmarks")
from bench_training import training_cost
from tokenizers import Tokenizer
from suffice.serving.packing import ContextPacker
from suffice.serving.cpu import detect
from suffice.training.fit.config import build_train_config
from suffice.training.fit.model import resolve_base_dir
from suffice.training.fit.splits import load_splits
from suffice.training.fit.encode import encode_split

cfg = build_train_config("configs/sufficiency.yaml", ["--max_train_items=400", "--tracking.enabled=false"])
splits = load_splits(cfg)
base = resolve_base_dir(cfg.base_model)
tok = Tokenizer.from_file(str(base / "tokenizer.json"))
packer = ContextPacker(tok, max_length=cfg.max_length, strategy=cfg.long_context_strategy)
train = encode_split(splits.train.shuffle(seed=1).select(range(400)), packer, cfg, "bench")
t0 = time.time()
r = training_cost(cfg, base, train, pad_id=packer.pad_id, steps=6, rounds=2, threads=2, precisions=("fp32", "bf16"))
r["machine"] = detect().as_dict(); r["wall_s"] = time.time() - t0
print(json.dumps({k: v for k, v in r.items()}, indent=1, default=str))
