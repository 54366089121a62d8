"""Experiment: which ONNX Runtime int8 recipe is fastest on this CPU, and where the time goes.

    python benchmarks/avx2_int8_levers.py BUNDLE [--tokens 256] [--threads 2] [--budget-s 3] [--profile]

Quantises the bundle's optimised fp32 graph (model.onnx) with several dynamic int8 recipes
(op types, per-channel or per-tensor weights, reduce_range, s8 or u8 weights) through export's own
``quantise`` step, and times each beside fp32 with the serving engine (batch 1, one input of
``--tokens`` tokens, ``--threads`` intra-op threads). ``--profile`` adds onnxruntime's per-op-type
time share for fp32 and the fastest int8. Prints one JSON line per variant and writes nothing in the bundle.
Speed does not depend on the weights: any bundle of the shipped architecture will do.
"""
from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def feeds(tokens: int, names: list[str]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    d = {"input_ids": rng.integers(1000, 20000, (1, tokens), dtype=np.int64),
         "attention_mask": np.ones((1, tokens), dtype=np.int64), "token_type_ids": np.zeros((1, tokens), dtype=np.int64)}
    return {k: d[k] for k in names}


def p50(session, f, budget_s: float) -> tuple[float, int]:
    for _ in range(3):
        session.run(None, f)
    times, t_end = [], time.perf_counter() + budget_s
    while time.perf_counter() < t_end or len(times) < 10:
        t = time.perf_counter()
        session.run(None, f)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000), len(times)


def session(path: Path, threads: int, profile: Path | None = None, spin: bool = True):
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.intra_op_num_threads, o.inter_op_num_threads = threads, 1
    o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.log_severity_level = 3
    if not spin:
        o.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile:
        o.enable_profiling = True
        o.profile_file_prefix = str(profile / path.stem)  # never inside the bundle
    return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])


def op_shares(s, f, n: int = 30) -> dict[str, float]:
    for _ in range(n):
        s.run(None, f)
    prof = json.load(open(s.end_profiling()))
    by = collections.Counter()
    for e in prof:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            by[e["args"]["op_name"]] += e["dur"]
    total = sum(by.values())
    return {k: round(v / total, 3) for k, v in by.most_common(8)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=3.0)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    from suffice.serving.cpu import detect
    from suffice.training.export.steps import quantise

    cpu = detect()
    src = a.bundle / "model.onnx"
    work = Path(tempfile.mkdtemp(prefix="suffice-int8-levers-"))
    recipes = {
        "int8 shipped (MatMul+Attention+Gather, per-channel, reduce_range)": dict(),
        "int8 MatMul+Attention, per-channel, reduce_range": dict(op_types=("MatMul", "Attention")),
        "int8 MatMul only, per-channel, reduce_range": dict(op_types=("MatMul",)),
        "int8 per-tensor, reduce_range": dict(per_channel=False),
        "int8 per-tensor, MatMul only, reduce_range": dict(per_channel=False, op_types=("MatMul",)),
        "int8 per-channel, full range": dict(reduce_range=False),
        "int8 u8 weights, per-tensor, full range": dict(weight_type="QUInt8", per_channel=False, reduce_range=False),
    }
    paths = {"fp32": src}
    for i, (name, kw) in enumerate(recipes.items()):
        dst = work / f"int8_{i}.onnx"
        t = time.perf_counter()
        quantise(src, dst, **kw)
        paths[name] = dst
        print(f"# quantised {name} in {time.perf_counter() - t:.0f} s", flush=True)
    names = [i.name for i in session(src, a.threads).get_inputs()]
    f = feeds(a.tokens, names)
    ref = session(src, a.threads).run(None, f)[0]
    results = {}
    for name, path in paths.items():
        s = session(path, a.threads)
        ms, n = p50(s, f, a.budget_s)
        diff = float(np.abs(s.run(None, f)[0] - ref).max())
        results[name] = ms
        print(json.dumps({"variant": name, "p50_ms": round(ms, 2), "runs": n, "max_abs_logit_diff_vs_fp32": round(diff, 4),
                          "tokens": a.tokens, "threads": a.threads, "cpu": cpu.model, "isa": cpu.isa_class}), flush=True)
    s = session(src, a.threads, spin=False)
    print(json.dumps({"variant": "fp32, no intra-op spinning", "p50_ms": round(p50(s, f, a.budget_s)[0], 2)}), flush=True)
    if a.profile:
        fastest = min((k for k in results if k != "fp32"), key=results.get)
        for name in ("fp32", fastest):
            print(json.dumps({"profile": name, "op_time_share": op_shares(session(paths[name], a.threads, profile=work), f)}), flush=True)


if __name__ == "__main__":
    main()
