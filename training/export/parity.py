"""Parity: the exported model against its reference, within a tolerance, or a typed error.

* fp32 ONNX vs PyTorch logits: max |diff| <= ``atol`` on up to ``parity_items`` items;
* int8 vs fp32 decisions agree on >= ``min_agreement`` of the items, and F1 (where items carry
  labels) drops by <= ``max_f1_drop``;
* the written bundle loads with the serving code and reproduces the fp32 logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from suffice.serving.bundle import MODEL_FP32, MODEL_INT8
from suffice.training.export.errors import ParityConfig, ParityError
from suffice.training.fit.meta import ModelMeta


def session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def onnx_logits(session, feeds_list: Iterable[dict[str, np.ndarray]]) -> np.ndarray:
    names = [i.name for i in session.get_inputs()]
    outs = [session.run(None, {n: f[n] for n in names})[0] for f in feeds_list]
    return np.concatenate(outs, axis=0) if outs else np.zeros((0, 0), np.float32)




def check_parity(merged: Path, bundle: Path, packed: Sequence[Any], pad_id: int, labels: Sequence[int | None], meta: ModelMeta,
                 pc: ParityConfig, *, quantized: bool, graph_optimization: str, quantization: str | None) -> tuple[dict[str, Any], np.ndarray]:
    """Check fp32 ONNX against PyTorch and int8 against fp32; returns (the parity report, the fp32 logits of the parity items).

    Raises :class:`ParityError` naming the check and the largest difference.
    """
    import torch
    from transformers import AutoModelForSequenceClassification

    from suffice.serving.packing import pad_packed

    batches = [pad_packed(packed[i : i + pc.batch_size], pad_id) for i in range(0, len(packed), pc.batch_size)]
    n_par = min(pc.parity_items, len(packed))
    par_batches = [pad_packed(packed[i : min(i + pc.batch_size, n_par)], pad_id) for i in range(0, n_par, pc.batch_size)]

    # 1. fp32 ONNX vs PyTorch
    torch_model = AutoModelForSequenceClassification.from_pretrained(merged, torch_dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = np.concatenate([torch_model(**{k: torch.from_numpy(v) for k, v in b.items()}).logits.numpy() for b in par_batches])
    del torch_model
    fp32_sess = session(bundle / MODEL_FP32)
    fp32_par = onnx_logits(fp32_sess, par_batches)
    diff = float(np.abs(fp32_par - ref).max())
    if diff > pc.atol:
        raise ParityError(f"fp32 ONNX logits differ from PyTorch by up to {diff:.3g} on {n_par} items (tolerance {pc.atol:g}): "
                          "the export or graph optimisation changed the model; try --no-optimize",
                          check="fp32_vs_torch", largest_difference=diff, tolerance=pc.atol)
    report: dict[str, Any] = {"fp32_vs_torch_max_abs_diff": diff, "fp32_vs_torch_items": n_par,
                              "graph_optimization": graph_optimization, "quantization": quantization}

    # 2. int8 vs fp32 on all validation items
    fp32_all = onnx_logits(fp32_sess, batches)
    if quantized:
        int8_all = onnx_logits(session(bundle / MODEL_INT8), batches)
        d32, d8 = fp32_all.argmax(1), int8_all.argmax(1)
        agreement = float((d32 == d8).mean())
        report.update(int8_items=len(packed), int8_agreement=agreement,
                      int8_max_abs_logit_diff=float(np.abs(int8_all - fp32_all).max()))
        if agreement < pc.min_agreement:
            raise ParityError(f"int8 decisions agree with fp32 on {agreement:.2%} of {len(packed)} items (needs >= {pc.min_agreement:.0%}); "
                              f"largest logit difference {report['int8_max_abs_logit_diff']:.3g}: ship fp32 only with --no-quantize",
                              check="int8_agreement", largest_difference=pc.min_agreement - agreement, tolerance=1 - pc.min_agreement)
        if all(lab is not None for lab in labels) and len(meta.id2label) == 2:
            pos = meta.positive_index
            gold = np.array(labels)
            f1_32, f1_8 = binary_f1((d32 == pos).astype(int), gold), binary_f1((d8 == pos).astype(int), gold)
            report.update(f1_fp32=f1_32, f1_int8=f1_8)
            if f1_32 - f1_8 > pc.max_f1_drop:
                raise ParityError(f"int8 F1 {f1_8:.4f} is {100 * (f1_32 - f1_8):.2f} points below fp32 {f1_32:.4f} (allowed {100 * pc.max_f1_drop:.2f}): "
                                  "ship fp32 only with --no-quantize", check="int8_f1", largest_difference=f1_32 - f1_8, tolerance=pc.max_f1_drop)
    return report, fp32_par


def check_roundtrip(bundle: Path, packed: Sequence[Any], fp32_par: np.ndarray, pc: ParityConfig) -> float:
    """Load the written bundle with the serving code and compare its logits with the checked fp32 model's."""
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    n_par = min(pc.parity_items, len(packed))
    served = OnnxClassifier(bundle, RuntimeConfig(precision="fp32"))
    back = np.concatenate([served.predict_packed(packed[i : min(i + pc.batch_size, n_par)])[0] for i in range(0, n_par, pc.batch_size)])
    rt = float(np.abs(back - fp32_par).max())
    if rt > pc.atol:
        raise ParityError(f"the written bundle's logits differ from the checked fp32 model by {rt:.3g}",
                          check="bundle_roundtrip", largest_difference=rt, tolerance=pc.atol)
    return rt


def binary_f1(pred: np.ndarray, gold: np.ndarray) -> float:
    tp = float(((pred == 1) & (gold == 1)).sum())
    fp = float(((pred == 1) & (gold == 0)).sum())
    fn = float(((pred == 0) & (gold == 1)).sum())
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)
