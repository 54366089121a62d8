"""Latency and throughput of the scorer: int8 ONNX vs fp32 ONNX vs PyTorch eager fp32 vs lexical.

Side by side in one run (timings on a shared machine are noisy; compare within a run):
p50/p95/p99 latency and throughput at 128/256/512 tokens and batch 1/8/32, the end-to-end
``scorer.score`` latency (packing included), model file sizes and the resident memory of a
fresh process holding one scorer. Writes JSON to ``--out``.

    python benchmarks/bench_scorer.py --bundle /tmp/minilm-bundle --model-dir /tmp/minilm-model --out bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def stats(samples_ms: list[float], batch: int) -> dict:
    a = np.asarray(samples_ms)
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p95_ms": round(float(np.percentile(a, 95)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3), "n": int(a.size),
            "throughput_items_s": round(batch * 1000.0 / float(a.mean()), 1)}


def timed(fn, min_iters: int, max_iters: int, budget_s: float, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(out) < max_iters and (len(out) < min_iters or time.perf_counter() < t_end):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def synthetic_feeds(length: int, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(2000, 29000, size=(batch, length), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    types = np.zeros_like(ids)
    types[:, length // 8:] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": np.ones_like(ids)}


def rss_of_scorer(bundle: str, threads: int, precision: str) -> dict:
    code = f"""
import json, resource
from suffice.serving import SufficiencyScorer, ScorerConfig
s = SufficiencyScorer.load({bundle!r}, ScorerConfig(precision={precision!r}, intra_op_threads={threads}))
for _ in range(5): s.score("When did Chopin leave Warsaw?", ["Chopin left Warsaw in 1830. " * 30])
rss = [l for l in open("/proc/self/status") if l.startswith(("VmRSS", "VmHWM"))]
print(json.dumps({{l.split(":")[0]: int(l.split()[1]) / 1024 for l in rss}}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return {"error": p.stderr[-500:]}
    d = json.loads(p.stdout.strip().splitlines()[-1])
    return {"rss_mb": round(d["VmRSS"], 1), "peak_rss_mb": round(d["VmHWM"], 1)}


def rss_of_torch(model_dir: str, threads: int) -> dict:
    """Resident memory of a fresh process holding the PyTorch eager model (after 5 forward passes)."""
    return _rss_of(f"""
import torch
from transformers import AutoModelForSequenceClassification
torch.set_num_threads({threads})
m = AutoModelForSequenceClassification.from_pretrained({model_dir!r}).eval()
ids = torch.full((1, 256), 2000, dtype=torch.long)
with torch.inference_mode():
    for _ in range(5): m(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
""")


def rss_of_lexical() -> dict:
    """Resident memory of a fresh process running the lexical heuristic (keyword coverage)."""
    return _rss_of("""
from suffice.serving.lexical import keyword_coverage
for _ in range(5): keyword_coverage("When did Chopin leave Warsaw?", ["Chopin left Warsaw in 1830. " * 30])
""")


def _rss_of(setup: str) -> dict:
    code = setup + """
import json
rss = [l for l in open("/proc/self/status") if l.startswith(("VmRSS", "VmHWM"))]
print(json.dumps({l.split(":")[0]: int(l.split()[1]) / 1024 for l in rss}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return {"error": p.stderr[-500:]}
    d = json.loads(p.stdout.strip().splitlines()[-1])
    return {"rss_mb": round(d["VmRSS"], 1), "peak_rss_mb": round(d["VmHWM"], 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--model-dir", help="trained-model dir for the PyTorch eager baseline (skipped when absent)")
    ap.add_argument("--extra-onnx", action="append", default=[], help="NAME=PATH: another ONNX file to time side by side")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--budget-s", type=float, default=3.0, help="seconds per (variant, length, batch) cell")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)

    import onnxruntime as ort

    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving.lexical import keyword_coverage

    bundle = Path(args.bundle)
    has_int8 = bool(json.loads((bundle / "suffice.json").read_text()).get("int8_model_file"))
    runners = {}
    for prec in ("int8", "fp32") if has_int8 else ("fp32",):  # an fp32-only bundle (int8 parity refused) has no int8 model
        s = SufficiencyScorer.load(bundle, ScorerConfig(precision=prec, intra_op_threads=args.threads))
        runners[f"onnx_{prec}"] = (lambda m: (lambda f: m.run(f)))(s._model)
    for spec in args.extra_onnx:
        name, path = spec.split("=", 1)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        runners[name] = (lambda se, ns: (lambda f: se.run(None, {n: f[n] for n in ns})))(sess, names)
    if args.model_dir and not args.no_torch:
        import torch
        from transformers import AutoModelForSequenceClassification

        torch.set_num_threads(args.threads)
        tm = AutoModelForSequenceClassification.from_pretrained(args.model_dir).eval()

        def torch_run(f, tm=tm):
            with torch.inference_mode():
                return tm(**{k: torch.from_numpy(v) for k, v in f.items()}).logits

        runners["torch_eager_fp32"] = torch_run

    words = "Chopin left Warsaw in 1830 shortly before the November Uprising and settled in Paris".split()
    results: dict = {"cells": [], "env": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                                          "threads": args.threads, "onnxruntime": ort.__version__, "python": platform.python_version()}}
    for L in args.lengths:
        for B in args.batches:
            feeds = synthetic_feeds(L, B)
            row = {"tokens": L, "batch": B}
            for name, fn in runners.items():
                budget = args.budget_s * (2 if name.startswith("torch") else 1)
                row[name] = stats(timed(lambda: fn(feeds), 5, 200, budget), B)
            text = " ".join(words[i % len(words)] for i in range(int(L * 0.75)))
            row["lexical"] = stats(timed(lambda: [keyword_coverage("When did Chopin leave Warsaw?", [text]) for _ in range(B)], 5, 200, 1.0), B)
            t = row.get("torch_eager_fp32", {}).get("p50_ms")
            if t:
                for prec in ("int8", "fp32"):
                    if f"onnx_{prec}" in row:
                        row[f"speedup_{prec}_vs_torch_p50"] = round(t / row[f"onnx_{prec}"]["p50_ms"], 2)
            results["cells"].append(row)
            print(json.dumps({k: (v["p50_ms"] if isinstance(v, dict) else v) for k, v in row.items()}), flush=True)

    scorer = SufficiencyScorer.load(bundle, ScorerConfig(intra_op_threads=args.threads))
    passage = ("Frederic Chopin was a Polish composer. He left Warsaw in 1830, shortly before the November Uprising. "
               "He settled in Paris, where he taught piano and composed. ") * 12
    results["end_to_end_score_256_window"] = stats(timed(lambda: scorer.score("When did Chopin leave Warsaw?", [passage]), 10, 300, args.budget_s), 1)
    results["file_sizes_mb"] = {f.name: round(f.stat().st_size / 1e6, 2) for f in bundle.iterdir()}
    results["memory"] = {prec: rss_of_scorer(str(bundle), args.threads, prec) for prec in (("int8", "fp32") if has_int8 else ("fp32",))}
    if "torch_eager_fp32" in runners:
        results["memory"]["torch_eager_fp32"] = rss_of_torch(str(args.model_dir), args.threads)
    results["memory"]["lexical"] = rss_of_lexical()
    results["manifest_parity"] = json.loads((bundle / "suffice.json").read_text()).get("parity")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("end_to_end_score_256_window", "file_sizes_mb", "memory")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
