"""Which int8 recipe keeps the fp32 decisions? Dynamic quantisation variants of one fp32 bundle.

For each recipe (weight type, reduce_range, which op types are quantised) this quantises the
bundle's fp32 ``model.onnx`` and reports, on validation items packed exactly as the scorer packs
them: decision agreement with fp32 (argmax, the export parity criterion, >= 99% required),
the largest and mean change of the calibrated score, macro-F1 against the labels for both, the
file size and the p50 latency at 256 tokens, batch 1 (all variants timed in this run, on this
CPU). It answers whether some recipe passes the parity check on a CPU without VNNI.

    python benchmarks/bench_quantization.py --bundle /tmp/fp32-bundle --data demo --items 300 --out quant.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scorer import stats, synthetic_feeds, timed  # noqa: E402

RECIPES = {
    # name: (weight type, reduce_range, op types)
    "s8-reduce_range (export default without VNNI)": ("QInt8", True, ["MatMul", "Attention", "Gather"]),
    "s8-full-range": ("QInt8", False, ["MatMul", "Attention", "Gather"]),
    "u8u8 (no VPMADDUBSW saturation)": ("QUInt8", False, ["MatMul", "Attention", "Gather"]),
    "s8 MatMul+Attention (fp32 embeddings)": ("QInt8", False, ["MatMul", "Attention"]),
    "s8 MatMul only (fp32 attention)": ("QInt8", False, ["MatMul"]),
    "s8 Attention only (fp32 feed-forward)": ("QInt8", False, ["Attention"]),
}


def _session(path: Path, threads: int):
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.log_severity_level = 3
    return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])


def _logits(sess, batches) -> np.ndarray:
    names = [x.name for x in sess.get_inputs()]
    return np.concatenate([sess.run(None, {n: f[n] for n in names})[0] for f in batches])


def macro_f1(labels: np.ndarray, pred: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(labels, pred, average="macro"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="a bundle with an fp32 model.onnx (suffice export --no-quantize)")
    ap.add_argument("--data", default="demo", help="prepared dataset name or path (its validation split is used)")
    ap.add_argument("--items", type=int, default=300, help="validation items, evenly spaced")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=3.0, help="seconds of timing per variant")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from suffice.serving.packing import pad_packed
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig, softmax
    from suffice.training.data.builder import load_prepared
    from suffice.training.export import quantise

    clf = OnnxClassifier(args.bundle, RuntimeConfig(precision="fp32", intra_op_threads=args.threads))
    val = load_prepared(args.data)[0]["validation"]
    step = max(1, len(val) // args.items)
    rows = [val[i] for i in range(0, len(val), step)][: args.items]
    labels = np.array([r["label"] for r in rows])
    packed = [clf.packer.pack(r["question"], r["passages"]) for r in rows]
    batches = [pad_packed(packed[i:i + 32], clf.packer.pad_id) for i in range(0, len(packed), 32)]
    feeds256 = synthetic_feeds(256, 1)
    temp = clf.manifest.temperature

    def run_one(name: str, sess, size_mb: float, ref: np.ndarray | None) -> dict:
        lg = _logits(sess, batches)
        p = softmax(lg, temp)[:, -1]
        names = [x.name for x in sess.get_inputs()]
        lat = stats(timed(lambda: sess.run(None, {n: feeds256[n] for n in names}), 10, 400, args.budget_s), 1)
        out = {"recipe": name, "macro_f1": round(macro_f1(labels, lg.argmax(1)), 4), "size_mb": round(size_mb, 1),
               "p50_ms_256": lat["p50_ms"], "p95_ms_256": lat["p95_ms"]}
        if ref is not None:
            pref = softmax(ref, temp)[:, -1]
            out.update({"agreement": round(float(np.mean(lg.argmax(1) == ref.argmax(1))), 4),
                        "max_abs_score_change": round(float(np.abs(p - pref).max()), 4),
                        "mean_score_change": round(float((p - pref).mean()), 4)})
        print(json.dumps(out), flush=True)
        return out, lg

    model = Path(args.bundle) / clf.manifest.model_file
    base, ref = run_one("fp32", clf.session, model.stat().st_size / 1e6, None)
    results = [base]
    with tempfile.TemporaryDirectory() as tmp:
        for name, (wtype, rr, ops) in RECIPES.items():
            dst = Path(tmp) / "q.onnx"
            quantise(model, dst, reduce_range=rr, weight_type=wtype, op_types=ops)
            res, _ = run_one(name, _session(dst, args.threads), dst.stat().st_size / 1e6, ref)
            results.append(res)
    margins = np.abs(softmax(ref, temp)[:, -1] - 0.5)
    report = {"bundle": args.bundle, "items": len(rows), "threads": args.threads, "cpu": platform.processor() or platform.machine(),
              "cpu_flags_vnni": any(f in Path("/proc/cpuinfo").read_text().split() for f in ("avx512_vnni", "avx_vnni"))
              if Path("/proc/cpuinfo").is_file() else None,
              "fp32_items_within_0.05_of_the_decision": round(float(np.mean(margins < 0.05)), 4), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}: {report['fp32_items_within_0.05_of_the_decision']:.1%} of fp32 scores lie within 0.05 of the decision")
    return 0


if __name__ == "__main__":
    sys.exit(main())
