"""Which int8 recipe passes the export's parity rule? ONNX Runtime dynamic/static and OpenVINO (NNCF) recipes of one model.

For each recipe this quantises the bundle's fp32 ``model.onnx`` and checks it with the rule
``suffice export`` applies (``training/export/parity.int8_parity``: >= 99% decision agreement on
items whose fp32 score is >= 0.1 from every threshold, mean |score change| <= 0.01, macro-F1 and
AUROC within 0.5 point) on the first ``--parity-items`` validation items (what export checks; the
NNCF and static recipes are calibrated on them), reports the same numbers on the held-out rest of
the validation split (does calibration carry over?), the file size and the p50 latency at 256
tokens, batch 1 (every recipe timed in this run, on this CPU, with the CPU model and ISA class).
Inputs are packed exactly as the scorer packs them.

    python benchmarks/bench_quantization.py --bundle B --data demo --out quant.json [--recipes ort-dyn ov-nncf]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scorer import synthetic_feeds, timed  # noqa: E402

FFN_OUT = r"layer\.\d+/output/dense/MatMul$"  # the feed-forward output projection (its input: GELU outputs with outliers)
FFN_OUT_OV = r".*layer\.\d+/output/dense/MatMul.*"
HEAD = (".*pooler.*", ".*classifier.*")
FAST = {"fast_bias_correction": True, "ignore": ()}
FIRST_LAST = r"layer\.0/|layer\.5/|Attention_0$|Attention_5$"  # MiniLM-L6's first and last layer
# name: (kind, options). ort-dyn: training.export.steps.quantise; ort-static: QDQ with calibration;
# ov-nncf: training.export.steps.quantise_openvino, timed with OpenVINO INFERENCE_PRECISION_HINT f32 and bf16.
RECIPES: dict[str, tuple[str, dict[str, Any]]] = {
    "ort-dyn s8 per-channel (MatMul, Attention, Gather)": ("ort-dyn", {}),
    "ort-dyn reduce_range": ("ort-dyn", {"reduce_range": True}),
    "ort-dyn u8 weights": ("ort-dyn", {"weight_type": "QUInt8"}),
    "ort-dyn per-tensor": ("ort-dyn", {"per_channel": False}),
    "ort-dyn fp32 embeddings (no Gather)": ("ort-dyn", {"op_types": ("MatMul", "Attention")}),
    "ort-dyn fp32 first+last layer": ("ort-dyn", {"exclude": (FIRST_LAST,)}),
    "ort-dyn fp32 FFN output": ("ort-dyn", {"exclude": (FFN_OUT,)}),
    "ort-dyn fp32 FFN output + first layer": ("ort-dyn", {"exclude": (FFN_OUT, r"layer\.0/|Attention_0$")}),
    "ort-static QDQ MinMax per-channel (MatMul)": ("ort-static", {"method": "MinMax"}),
    # fast bias correction, nothing left in float unless said (the export default is the last-but-two recipe)
    "ov-nncf mixed transformer": ("ov-nncf", {**FAST}),
    "ov-nncf performance transformer": ("ov-nncf", {**FAST, "preset": "performance"}),
    "ov-nncf mixed transformer, pooler+classifier float": ("ov-nncf", {**FAST, "ignore": HEAD}),
    "ov-nncf mixed transformer, full bias correction": ("ov-nncf", {**FAST, "fast_bias_correction": False}),
    "ov-nncf mixed transformer, 64 calibration items": ("ov-nncf", {**FAST, "subset_size": 64}),
    "ov-nncf mixed, default model type": ("ov-nncf", {**FAST, "transformer": False}),
    "ov-nncf mixed transformer, pooler+classifier float, full bias correction (export default)": (
        "ov-nncf", {"ignore": HEAD, "fast_bias_correction": False}),
    "ov-nncf performance transformer, pooler+classifier float, full bias correction": (
        "ov-nncf", {"preset": "performance", "ignore": HEAD, "fast_bias_correction": False}),
    "ov-nncf mixed transformer, pooler+classifier+FFN output float": ("ov-nncf", {**FAST, "ignore": HEAD + (FFN_OUT_OV,)}),
    "ov-nncf mixed transformer, pooler+classifier+first layer float": ("ov-nncf", {**FAST, "ignore": HEAD + (r".*layer\.0/.*",)}),
}


def ort_runner(path: Path, threads: int) -> Callable[[dict], np.ndarray]:
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.intra_op_num_threads, o.inter_op_num_threads, o.log_severity_level = threads, 1, 3
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda f: sess.run(None, {n: f[n] for n in names})[0]


def ov_runner(path: Path, threads: int, hint: str) -> Callable[[dict], np.ndarray]:
    import openvino as ov

    core = ov.Core()
    c = core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY",
                                                                "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": threads})
    req, names = c.create_infer_request(), [i.get_any_name() for i in c.inputs]

    def run(f):
        req.infer({n: f[n] for n in names})
        return np.array(req.get_output_tensor(0).data, dtype=np.float32, copy=True)
    return run


def static_qdq(src: Path, dst: Path, calibration: list[dict], method: str) -> None:
    """ONNX Runtime static QDQ int8 (per-channel s8 weights, u8 activations, MatMul) calibrated on ``calibration``."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    names = [i.name for i in onnx.load(str(src), load_external_data=False).graph.input]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{n: f[n] for n in names} for f in calibration])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"], per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=getattr(CalibrationMethod, method),
                    extra_options={"CalibPercentile": 99.99} if method == "Percentile" else {})


def rule(ref: np.ndarray, got: np.ndarray, labels: list[int], meta: Any) -> dict[str, Any]:
    """The export's int8 verdict and its numbers (the same function export calls)."""
    from suffice.training.export.errors import ParityConfig, ParityError
    from suffice.training.export.parity import int8_parity

    try:
        int8_parity(ref, got, labels, meta, ParityConfig())
        verdict: dict[str, Any] = {"passes": True}
    except ParityError as e:
        verdict = {"passes": False, "fails": e.check}
    loose = ParityConfig(min_confident_agreement=0.0, max_mean_score_shift=1.0, max_metric_drop=1.0)
    numbers = int8_parity(ref, got, labels, meta, loose)
    keep = ("int8_mean_abs_score_change", "int8_max_abs_score_change", "int8_confident_agreement", "int8_agreement",
            "macro_f1_fp32", "macro_f1_int8", "auroc_fp32", "auroc_int8")
    return {**verdict, **{k.replace("int8_", "", 1) if k.startswith("int8_") else k: round(numbers[k], 4) for k in keep if k in numbers}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="a bundle whose fp32 model.onnx is quantised")
    ap.add_argument("--model-meta", help="the trained-model dir (suffice_model.json: thresholds, calibration); default: the bundle's parent")
    ap.add_argument("--data", default="demo", help="prepared dataset name or path (its validation split is used)")
    ap.add_argument("--parity-items", type=int, default=200, help="the first N validation items: export's check and the calibration set")
    ap.add_argument("--items", type=int, default=0, help="use only the first N validation items (0 = all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=3.0, help="seconds of timing per recipe")
    ap.add_argument("--recipes", nargs="*", default=[], help="only recipes whose name contains one of these strings")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer

    from suffice.serving.bundle import read_manifest
    from suffice.serving.cpu import detect
    from suffice.serving.packing import ContextPacker, pad_packed
    from suffice.training.data.builder import load_prepared
    from suffice.training.export.steps import quantise, quantise_openvino
    from suffice.training.fit.meta import ModelMeta

    bundle = Path(args.bundle)
    manifest = read_manifest(bundle)
    meta = ModelMeta.read(Path(args.model_meta) if args.model_meta else bundle.parent)
    packer = ContextPacker(Tokenizer.from_file(str(bundle / manifest.tokenizer_file)), max_length=manifest.max_length,
                           strategy=manifest.long_context_strategy)
    val = load_prepared(args.data)[0]["validation"]
    val = val.select(range(min(args.items, len(val)))) if args.items else val
    packed = [packer.pack(q, p) for q, p in zip(val["question"], val["passages"])]
    labels = [int(x == manifest.positive_index) for x in val["label"]]
    batches = [pad_packed(packed[i:i + 16], packer.pad_id) for i in range(0, len(packed), 16)]
    n = args.parity_items
    calibration = [pad_packed([p], packer.pad_id) for p in packed[:n]]
    fp32 = bundle / manifest.model_file
    feeds256 = synthetic_feeds(256, 1)
    ref = np.concatenate([ort_runner(fp32, args.threads)(b) for b in batches])
    cpu = detect()
    report: dict[str, Any] = {"bundle": str(bundle), "data": args.data, "validation_items": len(packed), "parity_items": n,
                              "threads": args.threads, **cpu.as_dict(), "cpu": cpu.describe(),
                              "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "results": []}

    def record(name: str, run: Callable, size_mb: float, **extra: Any) -> None:
        got = np.concatenate([run(b) for b in batches])
        ms = timed(lambda: run(feeds256), 10, 400, args.budget_s)
        row = {"recipe": name, **extra, "size_mb": round(size_mb, 1), "p50_ms_256": round(float(np.percentile(ms, 50)), 2),
               "parity_items": rule(ref[:n], got[:n], labels[:n], meta), "held_out": rule(ref[n:], got[n:], labels[n:], meta)}
        report["results"].append(row)
        print(json.dumps(row), flush=True)

    record("fp32 (ONNX Runtime)", ort_runner(fp32, args.threads), fp32.stat().st_size / 1e6)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (kind, opts) in RECIPES.items():
            if args.recipes and not any(r in name for r in args.recipes):
                continue
            if kind == "ort-dyn":
                dst = Path(tmp) / "dyn.onnx"
                desc = quantise(fp32, dst, **{"reduce_range": False, **opts})
                record(name, ort_runner(dst, args.threads), dst.stat().st_size / 1e6, description=desc)
            elif kind == "ort-static":
                dst = Path(tmp) / "static.onnx"
                static_qdq(fp32, dst, calibration, opts["method"])
                record(name, ort_runner(dst, args.threads), dst.stat().st_size / 1e6)
            else:
                dst = Path(tmp) / f"ov{len(report['results'])}.xml"
                desc = quantise_openvino(fp32, dst, calibration, **opts)
                size = (dst.stat().st_size + dst.with_suffix(".bin").stat().st_size) / 1e6
                for hint in ("f32", "bf16") if cpu.bf16 else ("f32",):
                    record(f"{name} [{hint}]", ov_runner(dst, args.threads, hint), size, description=desc)
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for r in report["results"]:
        p = r["parity_items"]
        print(f"{r['recipe'][:62]:<62} {'PASS' if p['passes'] else 'fail'} mean|d| {p['mean_abs_score_change']:.4f} "
              f"held-out {r['held_out']['mean_abs_score_change']:.4f} p50 {r['p50_ms_256']:.1f} ms {r['size_mb']} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
