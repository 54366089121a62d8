"""Helpers for the serving/export tests: a tiny trained-model directory and inline items."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ITEMS = [
    ("Where is the Eiffel Tower?", [{"title": "Paris", "text": "The Eiffel Tower is a lattice tower in Paris, France."}], 1),
    ("When did Chopin leave Warsaw?", ["Chopin left Warsaw in 1830, shortly before the November Uprising."], 1),
    ("Who founded the city of Lima?", ["Lima is the capital of Peru.", "It lies on the Pacific coast."], 0),
    ("Which river flows through Vienna?", ["Vienna is known for its music and coffee houses."], 0),
    ("How many moons does Mars have?", [{"title": "Mars", "text": "Mars has two small moons, Phobos and Deimos."}], 1),
    ("Who painted the Mona Lisa?", ["The Louvre is the world's most visited museum."], 0),
    ("What year did the Berlin Wall fall?", ["The Berlin Wall fell on 9 November 1989. " * 40], 1),
    ("What is the population of Warsaw?", [{"title": "Warsaw", "text": "Warsaw is the capital of Poland. It has about 1.8 million inhabitants."}, "Kraków is older."], 1),
    ("Who wrote the novel Dracula?", ["Bram Stoker was an Irish author.", "Whitby appears in a famous novel."], 0),
    ("What is the tallest mountain in Africa?", ["Kilimanjaro, at 5,895 metres, is the highest mountain in Africa."], 1),
]


def rewrite_manifest(bundle: Path, data: dict) -> None:
    """Write an edited ``suffice.json`` the way export does (fresh field digests): for tests that need
    a bundle with other manifest values, where a hand edit would be refused."""
    from suffice.serving.bundle import BundleManifest, write_manifest

    write_manifest(bundle, BundleManifest.from_dict({k: v for k, v in data.items() if k != "field_digests"}))


def validation_items(n: int = 40) -> list[dict]:
    out = []
    for i in range(n):
        q, ps, lab = ITEMS[i % len(ITEMS)]
        out.append({"question": q if i < len(ITEMS) else f"{q} (variant {i})", "passages": ps, "label": lab})
    return out


def make_model_dir(tiny_bert_dir: Path, out: Path, task: str = "sufficiency", lora: bool = True, head_scale: float = 40.0,
                   max_length: int = 128, strategy: str | None = None, temperature: float = 1.5, run_id: str | None = None) -> Path:
    """A trained-model directory (BRIEF contract) from the tiny random BERT: classifier head scaled
    so logits are decisive, as a trained model's are; LoRA wrapped and merged when ``lora``."""
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(1)
    id2label = {0: "RETRIEVE", 1: "SKIP"} if task == "retrieval_gate" else {0: "insufficient", 1: "sufficient"}
    model = BertForSequenceClassification.from_pretrained(tiny_bert_dir, num_labels=2, id2label=id2label,
                                                          label2id={v: k for k, v in id2label.items()})
    with torch.no_grad():
        model.classifier.weight.mul_(head_scale)
    if lora:
        from peft import LoraConfig, get_peft_model

        peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"]))
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
        peft_model.save_pretrained(out / "adapter")
        model = peft_model.merge_and_unload()
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(tiny_bert_dir / name, out / name)
    meta = {
        "task": task, "label_scheme": "binary", "id2label": {str(k): v for k, v in id2label.items()},
        "positive_label": "SKIP" if task == "retrieval_gate" else "sufficient", "max_length": max_length,
        "long_context_strategy": strategy or ("recent" if task == "retrieval_gate" else "select"),
        "calibration": {"method": "temperature", "temperature": temperature},
        "thresholds": {"skip": 0.5} if task == "retrieval_gate" else {"sufficient": 0.8, "partial": 0.5},
        "base_model": str(tiny_bert_dir), "label_source": "autorater", "data_hash": "test",
        "mlflow": {"run_id": run_id, "registered_model": None, "version": None}, "metrics": {"f1": 0.5},
    }
    (out / "suffice_model.json").write_text(json.dumps(meta, indent=2))
    return out


def torch_scores(model_dir: Path, items, temperature: float) -> "list[float]":
    """P(positive) from the PyTorch model on inputs packed exactly like serving packs them."""
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    from suffice.serving.packing import ContextPacker

    meta = json.loads((model_dir / "suffice_model.json").read_text())
    packer = ContextPacker(Tokenizer.from_file(str(model_dir / "tokenizer.json")), meta["max_length"], meta["long_context_strategy"])
    feeds, _ = packer.pack_batch([q for q, _ in items], [p for _, p in items])
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.inference_mode():
        logits = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy().astype(np.float64)
    z = logits / temperature
    z -= z.max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    return p[:, 1].tolist()
