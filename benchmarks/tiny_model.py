"""A tiny random model for ``benchmarks/run.py --smoke``: every part runs in seconds, no real model needed.

The same recipe as the test suite (tests/conftest.py ``tiny_bert_dir`` and
tests/serving_support.py ``make_model_dir``): all-MiniLM-L6-v2's tokenizer with a 2-layer,
32-wide random BERT, a decisive classification head, a trained-model directory with
``suffice_model.json`` and a ``train_config.yaml`` pointing at tests/fixtures/train20.jsonl,
and for the sufficiency model an exported fp32 bundle. The numbers it yields say only
that the code paths work.

>>> dirs = build_smoke_models(Path("/tmp/smoke"))  # doctest: +SKIP
>>> sorted(dirs)  # doctest: +SKIP
['bundle', 'gate_model_dir', 'model_dir']
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMOKE_ITEMS = REPO / "tests" / "fixtures" / "train20.jsonl"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def _tiny_model_dir(out: Path, task: str, max_length: int, config_overrides: list[str]) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from suffice.serving.config import dump_yaml
    from suffice.training.paths import resolve_base_model
    from suffice.training.fit.config import build_train_config

    torch.manual_seed(0)
    base = Path(resolve_base_model("minilm-l6"))
    id2label = {0: "RETRIEVE", 1: "SKIP"} if task == "retrieval_gate" else {0: "insufficient", 1: "sufficient"}
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=512, type_vocab_size=2, num_labels=2, id2label=id2label,
                     label2id={v: k for k, v in id2label.items()})
    model = BertForSequenceClassification(cfg)
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)  # decisive logits, as a trained model's are
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy(base / name, out / name)
    strategy = "recent" if task == "retrieval_gate" else "select"
    meta = {
        "task": task, "label_scheme": "binary", "id2label": {str(k): v for k, v in id2label.items()},
        "positive_label": id2label[1], "max_length": max_length, "long_context_strategy": strategy,
        "calibration": {"method": "temperature", "temperature": 1.5},
        "thresholds": {"skip": 0.5} if task == "retrieval_gate" else {"sufficient": 0.8, "partial": 0.5},
        "base_model": "tiny-random-bert", "label_source": "autorater", "data_hash": None,
        "mlflow": {"run_id": None, "registered_model": None, "version": None}, "metrics": {},
    }
    (out / "suffice_model.json").write_text(json.dumps(meta, indent=2))
    train_cfg = build_train_config(None, [f"--task={task}", f"--max_length={max_length}", f"--long_context_strategy={strategy}",
                                          *config_overrides])
    (out / "train_config.yaml").write_text(dump_yaml(train_cfg))
    return out


def build_smoke_models(root: Path) -> dict[str, Path]:
    """A tiny sufficiency model directory + its exported bundle, and a tiny retrieval-gate model directory
    (with its fp32 bundle under ``bundle/``, for the service-path part of the gate benchmark)."""
    from suffice.training.export import export_bundle

    model_dir = _tiny_model_dir(root / "model", "sufficiency", 128, [f"--train_file={SMOKE_ITEMS}", "--per_device_train_batch_size=4"])
    # fp32 only, like a bundle whose int8 model failed the parity check: the smoke run then covers the
    # benchmark's own int8 quantisation (run.with_int8) too
    bundle = export_bundle(model_dir, root / "model" / "bundle", overwrite=True, quantize=False)
    threads = write_smoke_threads(root / "gate-threads.jsonl")
    gate_dir = _tiny_model_dir(root / "gate-model", "retrieval_gate", 64, [f"--gate.path={threads}"])
    export_bundle(gate_dir, gate_dir / "bundle", overwrite=True, quantize=False)
    return {"model_dir": model_dir, "bundle": bundle, "gate_model_dir": gate_dir}


def write_smoke_threads(path: Path, n: int = 60) -> Path:
    """``n`` short chat threads (RETRIEVE / SKIP alternating, distinct openings) in the gate's JSONL format."""
    topics = ["delivery", "refunds", "opening hours", "the warranty", "gift cards", "returns", "the loyalty card", "parking"]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            topic = topics[i % len(topics)]
            follow = ("can you put that in a bullet list?", "SKIP") if i % 2 else (f"and what about {topics[(i + 3) % len(topics)]}?", "RETRIEVE")
            msgs = [{"role": "user", "content": f"question {i}: what is your policy on {topic}?"},
                    {"role": "assistant", "content": f"Our policy on {topic} is described on page {i}."},
                    {"role": "user", "content": follow[0]}]
            f.write(json.dumps({"id": f"smoke-{i}", "messages": msgs, "label": follow[1], "category": "smoke"}) + "\n")
    return path
