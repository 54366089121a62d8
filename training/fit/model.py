"""The cross-encoder: base encoder + classification head, LoRA adapters (peft) or full fine-tuning,
and the trained-model directory that export reads.

``[CLS] question [SEP] context [SEP]`` goes into a BERT-family encoder
(AutoModelForSequenceClassification: pooler + linear classifier on [CLS]). With LoRA, adapters
sit on the encoder's linear layers and the head (pooler + classifier) is trained fully.

Directory contract (written by :func:`save_model_dir`)::

    <model_dir>/config.json, model.safetensors   merged HF model (LoRA merged in)
    <model_dir>/tokenizer.json (+ tokenizer_config.json, vocab.txt, special_tokens_map.json)
    <model_dir>/adapter/                         peft LoRA adapter (absent for full fine-tuning)
    <model_dir>/suffice_model.json               task, labels, window, calibration, thresholds, run

>>> model = build_model("minilm-l6", id2label={0: "insufficient", 1: "sufficient"})  # doctest: +SKIP
>>> meta = read_model_meta("models/demo")  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Mapping

from suffice.training.fit.config import LoraSettings
from suffice.training.fit.meta import MODEL_META, ModelMeta, read_model_meta, write_model_meta

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
HEAD_MODULES = ("classifier", "pooler")


def resolve_base_dir(base_model: str) -> Path | str:
    """A local directory (or, online, a hub id) for ``base_model``; names the fix when missing."""
    from suffice.training.paths import resolve_base_model

    return resolve_base_model(base_model)


def load_tokenizer(model_dir: str | Path):
    """The fast tokenizer (``tokenizers.Tokenizer``) from ``<model_dir>/tokenizer.json``.

    >>> tok = load_tokenizer(resolve_base_dir("minilm-l6"))  # doctest: +SKIP
    """
    from tokenizers import Tokenizer

    p = Path(model_dir) / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(
            f"{p} does not exist: suffice encodes with the fast tokenizer file; give a model directory that has tokenizer.json"
        )
    return Tokenizer.from_file(str(p))


def build_model(
    base_model: str | Path,
    *,
    id2label: Mapping[int, str],
    finetune: str = "lora",
    lora: LoraSettings | None = None,
    freeze_layers: int = 0,
    encoder_layers: int = 0,
):
    """Base encoder + fresh classification head (one logit per ``id2label`` entry), wrapped with LoRA
    adapters (``lora``: :class:`~suffice.training.fit.config.LoraSettings`, default its defaults) when ``finetune='lora'``.

    ``base_model`` is a short name, a local directory or (online) a hub id. ``encoder_layers`` > 0
    keeps only the lowest N transformer layers (a shallower, faster model; 0 = all).

    >>> m = build_model(tiny_dir, id2label={0: "no", 1: "yes"}, lora=LoraSettings(r=4, alpha=8))  # doctest: +SKIP
    >>> trainable_parameters(m)[0] < trainable_parameters(m)[1]  # doctest: +SKIP
    True
    """
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    src = base_model if isinstance(base_model, Path) else resolve_base_dir(str(base_model))
    id2label = {int(k): str(v) for k, v in id2label.items()}
    num_labels = len(id2label)
    lora = lora or LoraSettings()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "classifier weights newly initialized" is the point, not news
    extra = {}
    saved_cfg = Path(src) / "config.json"  # absent for a hub id
    if saved_cfg.is_file():
        # a trained model directory as the base (e.g. a weak-supervision stage): its head transfers
        # when the label count matches; otherwise only the encoder does and the head starts fresh
        saved = json.loads(saved_cfg.read_text())
        has_head = any("ForSequenceClassification" in a for a in saved.get("architectures") or [])
        have_labels = len(saved.get("id2label") or {})
        if has_head and have_labels and have_labels != len(id2label):
            import logging

            logging.getLogger(__name__).warning(
                "%s has a %d-label head and this run needs %d labels: the classifier head is re-initialised", src, have_labels, len(id2label))
            extra["ignore_mismatched_sizes"] = True
    if encoder_layers:
        from transformers import AutoConfig

        have = AutoConfig.from_pretrained(src).num_hidden_layers
        if encoder_layers > have:
            raise ValueError(f"encoder_layers={encoder_layers} but {src} has {have} layers: choose 1..{have} (0 = all)")
        extra["num_hidden_layers"] = encoder_layers  # the lowest N layers' weights load; the rest are dropped
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            src, num_labels=num_labels, id2label=id2label, label2id={v: k for k, v in id2label.items()}, **extra,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    model.config.problem_type = "single_label_classification"
    if finetune == "full":
        if freeze_layers:
            _freeze_lower_layers(model, freeze_layers)
        return model
    if finetune != "lora":
        raise ValueError(f"finetune={finetune!r}: choose 'lora' or 'full'")
    from peft import LoraConfig, get_peft_model

    names = {n.split(".")[-1] for n, _ in model.named_modules()}
    full_names = [n for n, _ in model.named_modules()]
    unmatched = [t for t in lora.target_modules if not any(n == t or n.endswith("." + t) for n in full_names)]
    if unmatched:
        raise ValueError(
            f"lora.target_modules {unmatched} match no module of {type(model).__name__}; linear layers here end with "
            f"{sorted(n for n in names if n in ('query', 'key', 'value', 'dense'))} (e.g. 'output.dense', 'intermediate.dense')"
        )
    cfg = LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules),
        modules_to_save=list(lora.modules_to_save), bias="none",
    )
    return get_peft_model(model, cfg)


def _freeze_lower_layers(model, n: int) -> None:
    base = getattr(model, model.base_model_prefix)
    layers = base.encoder.layer
    if n > len(layers):
        raise ValueError(f"freeze_layers={n} but the encoder has {len(layers)} layers: choose 0..{len(layers)}")
    for p in base.embeddings.parameters():
        p.requires_grad_(False)
    for layer in layers[:n]:
        for p in layer.parameters():
            p.requires_grad_(False)


def is_head_parameter(name: str) -> bool:
    """Parameters of the head (pooler + classifier), which get ``head_learning_rate``."""
    return any(f"{m}." in name or name.startswith(m) for m in HEAD_MODULES)


def trainable_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


def optimizer_groups(model, learning_rate: float, head_learning_rate: float, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: encoder vs head learning rate, no decay on biases and LayerNorm."""
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name
        groups.setdefault((is_head_parameter(name), no_decay), []).append(p)
    out = []
    for (head, no_decay), params in sorted(groups.items()):
        out.append({"params": params, "lr": head_learning_rate if head else learning_rate,
                    "weight_decay": 0.0 if no_decay else weight_decay, "name": f"{'head' if head else 'encoder'}{'-nodecay' if no_decay else ''}"})
    return out


def trainable_state_dict(model) -> dict[str, Any]:
    """The trainable tensors (LoRA adapters + head, or everything unfrozen), detached on CPU."""
    keep = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in keep}


def load_trainable_state_dict(model, state: Mapping[str, Any]) -> None:
    """Load what :func:`trainable_state_dict` saved; every saved tensor must find its parameter."""
    missing_in_model = sorted(set(state) - set(model.state_dict()))
    if missing_in_model:
        raise KeyError(f"saved weights {missing_in_model[:5]} have no parameter in this model: the checkpoint is from another config")
    model.load_state_dict(dict(state), strict=False)


def save_model_dir(model, out_dir: str | Path, tokenizer_src: str | Path, meta: ModelMeta | Mapping[str, Any]) -> Path:
    """Write the trained-model directory: merged model, adapter (LoRA), tokenizer files, metadata.

    ``model`` is the (unwrapped) peft or plain HF model; it is not modified (merging works on a copy).

    >>> save_model_dir(model, "models/run1", base_dir, {"task": "sufficiency", ...})  # doctest: +SKIP
    PosixPath('models/run1')
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    merged = model
    if hasattr(model, "peft_config"):
        adapter_dir = out / "adapter"
        model.save_pretrained(adapter_dir, safe_serialization=True)
        merged = copy.deepcopy(model).merge_and_unload()
    merged.config.architectures = [type(merged).__name__]
    merged.save_pretrained(out, safe_serialization=True)
    src = Path(tokenizer_src)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    if not (out / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{src} has no tokenizer.json: the model directory needs the tokenizer it was trained with")
    write_model_meta(out, meta)
    return out


def load_model_dir(model_dir: str | Path):
    """(merged HF model in eval mode, metadata) from a trained-model directory."""
    from transformers import AutoModelForSequenceClassification

    meta = read_model_meta(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir))
    model.eval()
    return model, meta
