"""The export steps, one public function each: read_model -> merge -> to_onnx -> optimise -> quantise -> quantise_openvino -> write_probe.

(:mod:`.parity` checks the result, :mod:`.manifest` describes it; :func:`.bundle.export_bundle` runs them in order.)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from suffice.serving.bundle import TOKENIZER
from suffice.training.export.errors import ExportError, ParityConfig
from suffice.training.fit.meta import ModelMeta, ModelMetaError

log = logging.getLogger("suffice.export")


def read_model(model_dir: Path) -> ModelMeta:
    """The checked metadata of a trained-model directory that also holds its tokenizer."""
    try:
        meta = ModelMeta.read(model_dir)
    except ModelMetaError as e:
        raise ExportError(str(e)) from e
    if not (model_dir / TOKENIZER).is_file():
        raise ExportError(f"{model_dir} has no {TOKENIZER}: the bundle needs the fast tokenizer the model was trained with")
    return meta


def merge(model_dir: Path, meta: ModelMeta, work: Path) -> Path:
    """A directory holding a merged HF sequence-classification model (merging the LoRA adapter if needed)."""
    if (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file():
        return model_dir
    adapter = model_dir / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        raise ExportError(f"{model_dir} has neither config.json + model.safetensors (merged model) nor adapter/ (LoRA): nothing to export")
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from suffice.training.paths import resolve_base_model

    base = resolve_base_model(str(meta.base_model or json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]))
    id2label = meta.labels
    model = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=len(id2label), id2label=id2label, label2id={v: k for k, v in id2label.items()}, torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    out = work / "merged"
    model.save_pretrained(out, safe_serialization=True)
    for name in (TOKENIZER, "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, out / name)
    return out


def to_onnx(merged: Path, work: Path) -> Path:
    """Plain optimum export (dynamic batch and sequence axes), validation done by our parity step."""
    from optimum.exporters.onnx import main_export

    out = work / "onnx"
    main_export(str(merged), output=str(out), task="text-classification", do_validation=False, local_files_only=True)
    path = out / "model.onnx"
    if not path.is_file():
        raise ExportError(f"optimum wrote no model.onnx in {out} (files: {sorted(os.listdir(out))})")
    return path


def optimise(onnx_dir: Path, work: Path) -> tuple[Path, str]:
    """onnxruntime transformer fusions (Attention, SkipLayerNorm, BiasGelu) at level 2, no approximations.

    Returns (path, description). Models the optimiser does not know keep the plain graph
    (onnxruntime still applies its generic optimisations when the session starts).
    """
    from optimum.onnxruntime import ORTOptimizer
    from optimum.onnxruntime.configuration import OptimizationConfig

    try:
        opt = ORTOptimizer.from_pretrained(str(onnx_dir))
        opt.optimize(OptimizationConfig(optimization_level=2, enable_gelu_approximation=False), save_dir=str(work / "opt"))
    except (KeyError, NotImplementedError, ValueError) as e:
        log.warning("ORT transformer optimisation not available for this model (%s); keeping the plain export", e)
        return onnx_dir / "model.onnx", f"none ({type(e).__name__}: {e})"
    return work / "opt" / "model_optimized.onnx", "ort-transformers-level2"


# The second ONNX Runtime int8 recipe export tries when the first (everything quantised) fails the int8 rule:
# node names matching these stay fp32: the output projections of every block (attention output and FFN
# output dense MatMuls, 12 in MiniLM-L6). On a demo model refused at a mean score shift of 0.0140 (AVX2,
# reduce_range) this passes at 0.0097, 1.2x slower than the first recipe and 1.1x faster than fp32; the FFN
# outputs alone give 0.0101, the attention outputs alone 0.0149 (benchmarks/results/2026-12-03/int8-exclusions-avx2.md).
ORT_INT8_KEEP_FP32 = (r"/output/dense/MatMul",)


def quantise(src: Path, dst: Path, reduce_range: bool | None = None, weight_type: str = "QInt8",
             op_types: Sequence[str] = ("MatMul", "Attention", "Gather"), exclude: Sequence[str] = (),
             per_channel: bool = True) -> str:
    """Dynamic int8: per-channel s8 weights / u8 activations (the VNNI fast path).

    Without VNNI, ONNX Runtime's u8s8 kernels multiply with VPMADDUBSW, whose 16-bit
    intermediate sums saturate on full-range 8-bit weights (a systematic shift of every score).
    ``reduce_range`` (7-bit weights) avoids it;
    by default it is on exactly when the exporting CPU lacks VNNI, and the manifest says which.
    ``exclude``: regular expressions; nodes whose name matches one stay fp32.

    Fused Attention nodes become QAttention. ``DefaultTensorType`` lets the quantiser handle
    tensors the optimiser left without shape inference (the "Unable to find data type for
    weight_name=...MatMul_output_0" failure seen when quantising ORTOptimizer output).
    """
    import re

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if reduce_range is None:
        from suffice.serving.cpu import detect

        reduce_range = not detect().vnni
    names = [n.name for n in onnx.load(str(src), load_external_data=False).graph.node] if exclude else []
    skipped = [n for n in names if any(re.search(p, n) for p in exclude)]
    quantize_dynamic(str(src), str(dst), op_types_to_quantize=list(op_types), per_channel=per_channel,
                     reduce_range=reduce_range, weight_type=getattr(QuantType, weight_type), nodes_to_exclude=skipped,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    rr = ", reduce_range (7-bit weights: no VNNI on the exporting CPU)" if reduce_range else ""
    ex = f", fp32 kept for {len(skipped)} nodes matching {list(exclude)}" if exclude else ""
    w = "s8" if weight_type == "QInt8" else "u8"
    return f"dynamic-int8 {'per-channel' if per_channel else 'per-tensor'} {w} weights/u8 activations QOperator ({', '.join(op_types)}){rr}{ex}"


def write_probe(bundle: Path, packed: Sequence[Any], fp32_logits: np.ndarray, meta: ModelMeta, pc: ParityConfig,
                pad_id: int, n_items: int = 32, variants: Sequence[Any] = ()) -> str:
    """Store ``n_items`` packed inputs (spread over the parity items) with their fp32 calibrated positive scores
    as the bundle's parity probe; returns its file name. Serving checks every variant against it at load.

    ``variants``: the shipped variants export's int8 rule passed (:class:`suffice.serving.backends.Variant`
    of files in ``bundle``); each scores the probe here with the serving engine and the probe stores those
    scores, which serving then expects that variant to reproduce on its CPU (see :mod:`suffice.serving.probe`).
    """
    from suffice.serving.backends import open_engine
    from suffice.serving.packing import pad_packed
    from suffice.serving.probe import PROBE_FILE, ParityProbe

    cal, pos = meta.calibrator, meta.positive_index
    n = min(len(packed), len(fp32_logits))
    rows = np.unique(np.linspace(0, n - 1, num=min(n_items, n)).round().astype(int))
    scores = cal.scores(fp32_logits[rows], pos)
    probe = ParityProbe.from_rows(pad_packed([packed[i] for i in rows], pad_id), scores,
                                  max_mean_score_shift=pc.max_mean_score_shift, confident_margin=pc.confident_margin)
    measured = {}
    for variant in variants:
        engine = open_engine(bundle, variant)
        measured[variant.name] = probe.scores_of(engine.run, cal, pos)
        del engine
    probe.with_variant_scores(measured).write(bundle / PROBE_FILE)
    return PROBE_FILE


# Left in float by the OpenVINO int8 recipe: the pooler and the classifier (two small Gemms whose int8 error lands
# directly on the logits).
OPENVINO_INT8_FLOAT = (".*pooler.*", ".*classifier.*")


def nncf_missing() -> str | None:
    """Why the OpenVINO int8 model cannot be made here (None when openvino and nncf are installed)."""
    import importlib.util

    missing = [m for m in ("openvino", "nncf") if importlib.util.find_spec(m) is None]
    return (f"{' and '.join(missing)} not installed: pip install 'suffice[openvino]' to add the OpenVINO int8 model"
            if missing else None)


def quantise_openvino(src: Path, dst: Path, calibration: Sequence[dict[str, np.ndarray]], *, preset: str = "mixed",
                      transformer: bool = True, fast_bias_correction: bool = False, subset_size: int = 300,
                      ignore: Sequence[str] = OPENVINO_INT8_FLOAT) -> str:
    """OpenVINO int8 by NNCF post-training quantisation of the fp32 ONNX graph, calibrated on ``calibration``
    (packed validation inputs, one item per feed); writes ``dst`` (IR ``.xml``) and its ``.bin`` weights.

    ``ignore``: regular expressions of node names NNCF leaves in float (default: the pooler and classifier).
    The default recipe (preset ``mixed``: symmetric weights, asymmetric activations; ``model_type=TRANSFORMER``,
    NNCF's scheme for transformers; full bias correction; pooler and classifier in float) is the recipe that
    kept a ``make demo`` model within the int8 rule where the others and every ONNX Runtime recipe failed
    (benchmarks/results/2026-11-28/int8-export.md and int8_recipes.json).
    Raises :class:`ExportError` when nncf/openvino are missing (see :func:`nncf_missing`).
    """
    why = nncf_missing()
    if why:
        raise ExportError(f"cannot make the OpenVINO int8 model: {why}")
    import logging as _logging

    import nncf
    import openvino as ov

    _logging.getLogger("nncf").setLevel(_logging.WARNING)
    model = ov.Core().read_model(str(src))
    names = [i.get_any_name() for i in model.inputs]
    n = min(subset_size, len(calibration))
    if n < 1:
        raise ExportError("cannot calibrate the OpenVINO int8 model without validation items: give --validation-data")
    kw: dict[str, Any] = {"preset": getattr(nncf.QuantizationPreset, preset.upper()), "subset_size": n,
                          "fast_bias_correction": fast_bias_correction}
    if transformer:
        kw["model_type"] = nncf.ModelType.TRANSFORMER
    if ignore:
        kw["ignored_scope"] = nncf.IgnoredScope(patterns=list(ignore), validate=False)
    quantized = nncf.quantize(model, nncf.Dataset(list(calibration[:n]), lambda f: {k: f[k] for k in names}), **kw)
    ov.save_model(quantized, str(dst), compress_to_fp16=False)
    return (f"nncf {nncf.__version__} post-training int8 (preset {preset}, {'transformer' if transformer else 'default'} model type, "
            f"{'fast ' if fast_bias_correction else ''}bias correction, {n} calibration items"
            + (f", float kept for {list(ignore)}" if ignore else "") + f"), openvino {ov.__version__}")
