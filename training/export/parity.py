"""Parity: the exported model against its reference, within a tolerance, or a typed error.

* fp32 ONNX vs PyTorch logits: max |diff| <= ``atol`` on up to ``parity_items`` items;
* int8 vs fp32 (binary models), on the calibrated score serving decides on: decisions agree on
  >= 99% of the items whose fp32 score is >= 0.1 from every threshold, the mean |score change| is
  <= 0.01, and macro-F1 / AUROC (where items carry labels) drop by <= 0.5 point; full agreement is
  reported (see :class:`ParityConfig`);
* the written bundle loads with the serving code and reproduces the fp32 logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from suffice.serving.bundle import MODEL_FP32, MODEL_INT8
from suffice.training.export.errors import ParityConfig, ParityError
from suffice.training.fit.meta import ModelMeta

ORT_INT8_REMEDY = "leave ONNX Runtime int8 out with --no-quantize"


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
                 pc: ParityConfig, *, quantized: bool, graph_optimization: str, quantization: str | None,
                 openvino_int8: str | None = None, int8_optional: bool = False,
                 requantise: Callable[[], str] | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """Check fp32 ONNX against PyTorch and int8 against fp32; returns (the parity report, the fp32 logits of the parity items).

    ``int8_optional``: a failed ONNX Runtime int8 rule does not raise; its reason goes in
    ``report["int8_refused"]`` (export then leaves that model out and ships what passed).

    ``requantise``: when the ONNX Runtime int8 model fails the rule, called once to write the next recipe's
    model over it (returning that recipe's description), which is then checked by the same rule; the first
    recipe's numbers and refusal stay in ``report["int8_first_recipe"]``. (Export owns the recipes.)

    ``openvino_int8``: the bundle's OpenVINO int8 IR, checked by the same rule; its verdict goes in
    ``report["openvino_int8"]`` (``passed`` False with the reason: export then leaves it out).
    Raises :class:`ParityError` naming the check and the largest difference (fp32, ONNX Runtime int8).
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
        numbers, refused = ort_int8_rule(bundle / MODEL_INT8, batches, fp32_all, labels, meta, pc)
        if refused is not None and requantise is not None:
            first = {**numbers, "quantization": quantization, "refused": f"{refused.check}: {refused}"}
            report["quantization"] = requantise()
            numbers, refused = ort_int8_rule(bundle / MODEL_INT8, batches, fp32_all, labels, meta, pc)
            numbers["first_recipe"] = first
        report.update({f"int8_{k}": v for k, v in numbers.items()})
        if refused is not None:
            if not int8_optional:
                raise refused
            first = numbers.get("first_recipe")
            report["int8_refused"] = f"{refused.check}: {refused}" + (f" (and the first recipe's {first['refused']})" if first else "")
    if openvino_int8:
        report["openvino_int8"] = openvino_int8_parity(bundle / openvino_int8, batches, fp32_all, labels, meta, pc)
    return report, fp32_par


def ort_int8_rule(path: Path, batches: Sequence[dict[str, np.ndarray]], fp32_all: np.ndarray, labels: Sequence[int | None],
                  meta: ModelMeta, pc: ParityConfig) -> tuple[dict[str, Any], ParityError | None]:
    """:func:`int8_rule` for the ONNX Runtime int8 model at ``path``, run on the batches ``fp32_all`` was scored on."""
    return int8_rule(fp32_all, onnx_logits(session(path), batches), labels, meta, pc)


def int8_rule(fp32_all: np.ndarray, int8_all: np.ndarray, labels: Sequence[int | None], meta: ModelMeta, pc: ParityConfig,
              remedy: str = ORT_INT8_REMEDY) -> tuple[dict[str, Any], ParityError | None]:
    """The int8 rule for any int8 variant's logits against fp32's: (its numbers without the ``int8_`` prefix,
    measured whether it passes or not; the :class:`ParityError` that refuses it, or None). Binary models:
    :func:`int8_numbers` and :func:`int8_verdict`; more labels: argmax agreement >= ``min_agreement``."""
    numbers: dict[str, Any] = {"items": int(len(int8_all)), "max_abs_logit_diff": float(np.abs(int8_all - fp32_all).max())}
    if len(meta.id2label) == 2:
        rep = int8_numbers(fp32_all, int8_all, labels, meta, pc)
        refused = int8_verdict(rep, pc, remedy)
    else:
        rep = {"int8_agreement": float((fp32_all.argmax(1) == int8_all.argmax(1)).mean())}
        refused = None if rep["int8_agreement"] >= pc.min_agreement else ParityError(
            f"int8 decisions agree with fp32 on {rep['int8_agreement']:.2%} of {len(int8_all)} items (needs >= {pc.min_agreement:.0%}); "
            f"largest logit difference {numbers['max_abs_logit_diff']:.3g}: {remedy}",
            check="int8_agreement", largest_difference=pc.min_agreement - rep["int8_agreement"], tolerance=1 - pc.min_agreement)
    numbers.update({k[len("int8_"):] if k.startswith("int8_") else k: v for k, v in rep.items()})
    return numbers, refused


def openvino_int8_parity(path: Path, batches: Sequence[dict[str, np.ndarray]], fp32_all: np.ndarray, labels: Sequence[int | None],
                         meta: ModelMeta, pc: ParityConfig) -> dict[str, Any]:
    """The int8 rule for the OpenVINO int8 model, run by the serving engine: a dict with ``passed`` and, when it
    fails, ``refused`` (the reason); never raises for a parity failure (the bundle then ships without it).

    When it passes and this CPU has bf16 units, the same rule is applied to the IR run with OpenVINO's bf16
    hint around its int8 layers; the verdict goes in ``bf16_hint`` and serving tries ``openvino-int8-bf16``
    only where it passed (a CPU without bf16 units records why it was not checked).
    """
    from suffice.serving.cpu import detect

    out = _openvino_rule(path, None, batches, fp32_all, labels, meta, pc)
    if out["passed"]:
        cpu = detect()
        out["bf16_hint"] = (_openvino_rule(path, "bf16", batches, fp32_all, labels, meta, pc) if cpu.bf16 else
                            {"passed": False, "refused": f"not checked: the exporting CPU ({cpu.describe()}) has no bf16 units"})
    return out


def _openvino_rule(path: Path, hint: str | None, batches: Sequence[dict[str, np.ndarray]], fp32_all: np.ndarray,
                   labels: Sequence[int | None], meta: ModelMeta, pc: ParityConfig) -> dict[str, Any]:
    from suffice.serving.backends import OpenVinoEngine

    engine = OpenVinoEngine(path, "int8", hint=hint)
    numbers, refused = int8_rule(fp32_all, np.concatenate([engine.run(b) for b in batches]), labels, meta, pc,
                                 remedy="not used by serving" if hint else "left out of the bundle")
    return {**numbers, "passed": refused is None, **({"refused": f"{refused.check}: {refused}"} if refused is not None else {})}


def check_roundtrip(bundle: Path, packed: Sequence[Any], fp32_par: np.ndarray, pc: ParityConfig) -> float:
    """Load the written bundle with the serving code and compare its logits with the checked fp32 model's."""
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    n_par = min(pc.parity_items, len(packed))
    served = OnnxClassifier(bundle, RuntimeConfig(precision="fp32", backend="onnxruntime"))
    back = np.concatenate([served.predict_packed(packed[i : min(i + pc.batch_size, n_par)])[0] for i in range(0, n_par, pc.batch_size)])
    rt = float(np.abs(back - fp32_par).max())
    if rt > pc.atol:
        raise ParityError(f"the written bundle's logits differ from the checked fp32 model by {rt:.3g}",
                          check="bundle_roundtrip", largest_difference=rt, tolerance=pc.atol)
    return rt


def decision_thresholds(meta: ModelMeta) -> list[float]:
    """The thresholds a binary model's calibrated score is read against: the stored ones and the 0.5 decision."""
    values = {0.5, *(float(v) for v in (meta.thresholds or {}).values() if isinstance(v, (int, float)) and 0 < float(v) < 1)}
    return sorted(values)


def int8_parity(fp32_logits: np.ndarray, int8_logits: np.ndarray, labels: Sequence[int | None], meta: ModelMeta,
                pc: ParityConfig, remedy: str = ORT_INT8_REMEDY) -> dict[str, Any]:
    """The quality-preserving int8 check of a binary model (see :class:`ParityConfig`); raises :class:`ParityError`
    whose message ends with ``remedy`` (what happens to, or what to do about, the refused int8 model).
    Returns the numbers (:func:`int8_numbers`) when the model passes.
    """
    out = int8_numbers(fp32_logits, int8_logits, labels, meta, pc)
    refused = int8_verdict(out, pc, remedy)
    if refused is not None:
        raise refused
    return out


def int8_numbers(fp32_logits: np.ndarray, int8_logits: np.ndarray, labels: Sequence[int | None], meta: ModelMeta,
                 pc: ParityConfig) -> dict[str, Any]:
    """What the int8 rule of a binary model reads (``int8_*`` keys): decision agreement (all items and those
    ``confident_margin`` from every threshold), mean / largest |calibrated score change| and, on labelled
    items, macro-F1 / AUROC of both models (whether the rule enforces them: ``int8_metric_check``)."""
    cal, pos = meta.calibrator, meta.positive_index  # the calibration serving applies (temperature or Platt)
    s32, s8 = cal.scores(fp32_logits, pos), cal.scores(int8_logits, pos)
    ths = np.asarray(decision_thresholds(meta))
    side32, side8 = (s32[:, None] >= ths), (s8[:, None] >= ths)
    same = (side32 == side8).all(axis=1)
    confident = (np.abs(s32[:, None] - ths) >= pc.confident_margin).all(axis=1)
    shift = np.abs(s8 - s32)
    out: dict[str, Any] = {
        "int8_rule": f"confident agreement >= {pc.min_confident_agreement:g} (margin {pc.confident_margin:g} from {ths.tolist()}), "
                     f"mean |score change| <= {pc.max_mean_score_shift:g}, macro-F1 and AUROC drop <= {pc.max_metric_drop:g}",
        "int8_agreement": float(same.mean()), "int8_confident_items": int(confident.sum()),
        "int8_confident_agreement": float(same[confident].mean()) if confident.any() else 1.0,
        "int8_mean_abs_score_change": float(shift.mean()), "int8_max_abs_score_change": float(shift.max()),
    }
    if labels and all(lab is not None for lab in labels):
        from suffice.training.evaluation.metrics import auroc

        gold = np.asarray(labels, dtype=int)
        enforce = len(gold) >= pc.min_metric_items and len(set(gold.tolist())) == 2
        out["int8_metric_check"] = "enforced" if enforce else f"reported only (needs >= {pc.min_metric_items} labelled items of both classes)"
        for name, f in (("macro_f1", lambda s: macro_f1((s >= 0.5).astype(int), gold)), ("auroc", lambda s: auroc(s, gold))):
            out[f"{name}_fp32"], out[f"{name}_int8"] = float(f(s32)), float(f(s8))
    return out


def int8_verdict(out: dict[str, Any], pc: ParityConfig, remedy: str = ORT_INT8_REMEDY) -> ParityError | None:
    """The first part of the int8 rule that the numbers of :func:`int8_numbers` fail (None: the model passes),
    checked in order: confident agreement, mean score change, macro-F1 / AUROC drop (where enforced)."""
    if out["int8_confident_agreement"] < pc.min_confident_agreement:
        return ParityError(f"int8 decisions agree with fp32 on {out['int8_confident_agreement']:.2%} of the {out['int8_confident_items']} items "
                           f"whose fp32 score is >= {pc.confident_margin:g} from every threshold (needs >= {pc.min_confident_agreement:.0%}): "
                           f"int8 changes clear decisions; {remedy}",
                           check="int8_confident_agreement", largest_difference=pc.min_confident_agreement - out["int8_confident_agreement"],
                           tolerance=1 - pc.min_confident_agreement)
    if out["int8_mean_abs_score_change"] > pc.max_mean_score_shift:
        return ParityError(f"int8 moves the calibrated score by {out['int8_mean_abs_score_change']:.4f} on average (allowed {pc.max_mean_score_shift:g}; "
                           f"largest {out['int8_max_abs_score_change']:.3f}): {remedy}",
                           check="int8_score_shift", largest_difference=out["int8_mean_abs_score_change"], tolerance=pc.max_mean_score_shift)
    if out.get("int8_metric_check") == "enforced":
        for name in ("macro_f1", "auroc"):
            v32, v8 = out[f"{name}_fp32"], out[f"{name}_int8"]
            if np.isfinite(v32) and np.isfinite(v8) and v32 - v8 > pc.max_metric_drop:
                return ParityError(f"int8 {name} {v8:.4f} is {100 * (v32 - v8):.2f} points below fp32 {v32:.4f} (allowed "
                                   f"{100 * pc.max_metric_drop:.2f}): {remedy}", check=f"int8_{name}", largest_difference=v32 - v8,
                                   tolerance=pc.max_metric_drop)
    return None


def macro_f1(pred: np.ndarray, gold: np.ndarray) -> float:
    """Mean F1 of the two classes (0 for a class never predicted correctly)."""
    scores = []
    for c in (0, 1):
        tp = float(((pred == c) & (gold == c)).sum())
        fp = float(((pred == c) & (gold != c)).sum())
        fn = float(((pred != c) & (gold == c)).sum())
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))
