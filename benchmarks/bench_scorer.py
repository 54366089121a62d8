"""Latency and throughput of the scorer: every backend and precision this machine runs, side by side.

ONNX Runtime int8 and fp32, OpenVINO int8 (the bundle's NNCF model), fp32 and bf16 (where ``openvino``
is installed; bf16 only on CPUs with AMX or AVX-512 BF16), PyTorch eager fp32 and the lexical heuristic, in one run (timings on
a shared machine are noisy; compare within a run): p50/p95/p99 latency and throughput at
128/256/512 tokens and batch 1/8/32, each variant's p50 ratio to PyTorch eager and to ONNX Runtime
fp32, the CPU model and ISA class (``suffice.serving.cpu``) and the variant ``backend="auto"``
picks on it, a mixed-length batch (padded to the longest vs sorted by length), the end-to-end
``scorer.score`` latency (packing included), model file sizes and the resident memory of a fresh
process holding one scorer, and (``--gate-bundle``) ``RetrievalGate.decide`` at 128 tokens with each
variant of the gate bundle. Writes JSON to ``--out``.

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


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def p50_ratios(row: dict, runners: dict) -> dict:
    """Each model variant's p50 speed-up over PyTorch eager fp32 and over ONNX Runtime fp32 (>1 = faster)."""
    out = {}
    for base in ("torch_eager_fp32", "onnx_fp32"):
        ref = row.get(base, {}).get("p50_ms")
        for name in runners:
            if ref and name != base and name in row:
                out[f"{name}_vs_{base}"] = round(ref / row[name]["p50_ms"], 2)
    return out


def mixed_length_batch(model, budget_s: float, n: int = 32, seed: int = 0) -> dict:
    """Items/s on ``n`` rows of mixed length (40 .. the window): one by one, one call padded to the longest
    row (the old batching), and the runtime's batching (sorted by length, calls capped by max_batch_tokens)."""
    from suffice.serving.packing import PackedInput, pad_packed

    rng = np.random.default_rng(seed)
    top = model.manifest.max_length
    packed = []
    for L in rng.integers(min(40, top - 2), top, size=n):
        ids = [101] + rng.integers(2000, 29000, size=int(L) - 2).tolist() + [102]
        packed.append(PackedInput(ids, [0] * 10 + [1] * (int(L) - 10), [1] * int(L), "select", 8, int(L), int(L), 1, 1, 1, 1))
    fns = {"one_by_one": lambda: [model.run(pad_packed([p], model.packer.pad_id)) for p in packed],
           "padded_to_longest": lambda: model.run(pad_packed(packed, model.packer.pad_id)),
           "sorted_capped": lambda: model.predict_packed(packed)}
    out = {"rows": n, "mean_tokens": round(float(np.mean([len(p.input_ids) for p in packed])), 1),
           "max_batch_tokens": model.config.max_batch_tokens, "variant": model.variant}
    for name, fn in fns.items():
        ms = timed(fn, 2, 20, budget_s, warmup=1)
        out[f"{name}_items_s"] = round(n * 1000.0 / float(np.median(ms)), 2)
    return out


def varied_lengths_stream(runners: dict, names: list[str], n: int = 200, seed: int = 0) -> dict:
    """Batch-1 calls at ``n`` lengths drawn from 16..256 tokens (a service's stream: most lengths new to the
    engine), the runners interleaved call by call so that other load hits them alike: mean/p50/p95 ms each."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 257, size=n)
    ms: dict[str, list[float]] = {name: [] for name in names}
    for L in lengths:
        feeds = synthetic_feeds(int(L), 1)
        for name in names:
            t = time.perf_counter()
            runners[name](feeds)
            ms[name].append((time.perf_counter() - t) * 1e3)
    return {"calls": n, "distinct_lengths": int(len(set(lengths.tolist()))),
            **{name: {"mean_ms": round(float(np.mean(v)), 2), "p50_ms": round(float(np.percentile(v, 50)), 2),
                      "p95_ms": round(float(np.percentile(v, 95)), 2)} for name, v in ms.items()}}


def bundle_variants(bundle: Path, cpu, openvino: bool) -> list[tuple[str, str, str]]:
    """(name, backend, precision) of every variant the bundle holds that this machine can run."""
    m = json.loads((bundle / "suffice.json").read_text())
    out = [("onnx_int8", "onnxruntime", "int8")] if m.get("int8_model_file") else []
    out.append(("onnx_fp32", "onnxruntime", "fp32"))
    if openvino:
        out += [("openvino_int8", "openvino", "int8")] if m.get("openvino_int8_model_file") else []
        out += [("openvino_fp32", "openvino", "fp32")] + ([("openvino_bf16", "openvino", "bf16")] if cpu.bf16 else [])
    return out


def gate_latency_128(bundle: str, variants: list[tuple[str, str, str]], threads: int, budget_s: float) -> dict:
    """p50/p95 of ``RetrievalGate.decide`` on a thread whose packed input fills a 128-token window, per variant."""
    from suffice.serving.gates.retrieval import RetrievalGate, RetrievalGateConfig

    turn = "We compared the prices of apples, pears and plums at the three markets last week and wrote them down. "
    thread = [{"role": "user", "content": "What do apples cost at the market? " + turn * 2},
              {"role": "assistant", "content": "Apples cost 2.10 a kilo at the north market. " + turn * 3},
              {"role": "user", "content": "Can you put those prices in a table for me, sorted by price?"}]
    out = {}
    for name, backend, prec in variants:
        gate = RetrievalGate.load(bundle, RetrievalGateConfig(backend=backend, precision=prec, intra_op_threads=threads, max_tokens=128))
        tokens = len(gate._packer.pack(*gate.build_input(thread)).input_ids)
        out[name] = {**stats(timed(lambda: gate.decide(thread), 10, 400, budget_s), 1), "tokens": tokens, "variant": gate.variant}
        print(json.dumps({"gate_decide_128": {name: out[name]}}), flush=True)
    return out


def rss_of_scorer(bundle: str, threads: int, precision: str, backend: str = "onnxruntime", lengths: int = 100) -> dict:
    """Resident memory of a fresh process: after importing the serving package, after loading the scorer
    (parity probe included), after 5 ``score()`` calls (``rss_mb``, the headline number) and after
    ``lengths`` more calls on contexts of varied length (engines that keep memory per input shape grow here)."""
    code = f"""
import json
def rss(): return next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
out = {{}}
from suffice.serving import SufficiencyScorer, ScorerConfig
out["after_import_mb"] = rss()
s = SufficiencyScorer.load({bundle!r}, ScorerConfig(precision={precision!r}, backend={backend!r}, intra_op_threads={threads}))
out["after_load_mb"], out["variant"] = rss(), s.variant
for _ in range(5): s.score("When did Chopin leave Warsaw?", ["Chopin left Warsaw in 1830. " * 30])
out["rss_mb"] = rss()
words = "Chopin left Warsaw in 1830 shortly before the November Uprising and settled in Paris".split()
for i in range({lengths}):
    s.score("When did Chopin leave Warsaw?", [" ".join(words[j % len(words)] for j in range(5 + (i * 37) % 300))])
out["after_{lengths}_lengths_mb"] = rss()
out["peak_rss_mb"] = next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps(out))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return {"error": p.stderr[-500:]}
    d = json.loads(p.stdout.strip().splitlines()[-1])
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in d.items()}


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
    ap.add_argument("--no-memory", action="store_true", help="skip the resident-memory subprocesses")
    ap.add_argument("--no-mixed", action="store_true", help="skip the mixed-length batch cell")
    ap.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO variants even where openvino is installed")
    ap.add_argument("--openvino-plain", action="store_true",
                    help="also time the OpenVINO int8 IR on the plain engine (no int8 embedding rewrite, no length buckets)")
    ap.add_argument("--gate-bundle", help="a retrieval-gate bundle: time decide() at 128 tokens with each of its variants")
    args = ap.parse_args(argv)

    import onnxruntime as ort

    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving.lexical import keyword_coverage

    from suffice.serving.backends import openvino_available
    from suffice.serving.cpu import detect

    cpu = detect()
    bundle = Path(args.bundle)
    runners, loaded = {}, {}
    # an fp32-only bundle (int8 parity refused) has no int8 model; OpenVINO bf16 only where the CPU has bf16 units
    with_ov = openvino_available() and not args.no_openvino
    variants = bundle_variants(bundle, cpu, with_ov)
    for name, backend, prec in variants:
        s = SufficiencyScorer.load(bundle, ScorerConfig(backend=backend, precision=prec, intra_op_threads=args.threads))
        if not s.variant.startswith(f"{backend}-{prec}"):  # the parity probe refused it: say so, time what serving would run
            print(f"{name}: not used on this CPU ({s.describe()['rejected_variants']})", flush=True)
        runners[name] = (lambda m: (lambda f: m.run(f)))(s._model)
        loaded[name] = s.describe()
    if with_ov and cpu.bf16 and any(name == "openvino_int8" for name, _, _ in variants):
        # the int8 IR with the bf16 hint around its int8 layers, timed whatever export's rule said about it
        from suffice.serving.backends import OpenVinoEngine
        from suffice.serving.bundle import read_manifest

        m = read_manifest(bundle)
        if loaded["openvino_int8"].get("variant") == "openvino-int8-bf16":
            # precision="int8" took the bf16-hint variant (export passed it): time the f32-hint int8 in its own column
            runners["openvino_int8"] = OpenVinoEngine(bundle / m.openvino_int8_model_file, "int8", args.threads).run
            loaded["openvino_int8"] = {**loaded["openvino_int8"], "variant": "openvino-int8", "probe": None}
        runners["openvino_int8_bf16_hint"] = OpenVinoEngine(bundle / m.openvino_int8_model_file, "int8", args.threads, hint="bf16").run
        loaded["openvino_int8_bf16_hint"] = {"variant": "openvino-int8-bf16", "probe": None,
                                             "rejected_variants": [] if m.parity.openvino_int8_bf16_passed else
                                             [{"variant": "openvino-int8-bf16", "reason": "export's int8 rule did not pass it: "
                                               + str(m.parity.openvino_int8.bf16_hint.to_dict() if m.parity.openvino_int8 and m.parity.openvino_int8.bf16_hint
                                                     else "not checked (older bundle)")}]}
    if with_ov and args.openvino_plain and any(name == "openvino_int8" for name, _, _ in variants):
        # the engine before the lean defaults (fp32 copy of the int8 embeddings, no length buckets): what they cost
        from suffice.serving.backends import OpenVinoEngine
        from suffice.serving.bundle import read_manifest

        plain = OpenVinoEngine(bundle / read_manifest(bundle).openvino_int8_model_file, "int8", args.threads, length_bucket=0, keep_int8=False)
        runners["openvino_int8_plain"] = plain.run
        loaded["openvino_int8_plain"] = {"variant": "openvino-int8 (plain engine)", "probe": None, "rejected_variants": []}
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
    results: dict = {"cells": [], "env": {**cpu.as_dict(), "cpu": cpu.describe(), "threads": args.threads, "onnxruntime": ort.__version__,
                                          "openvino": _version("openvino"), "python": platform.python_version(),
                                          "load_average_at_start": [round(x, 2) for x in os.getloadavg()]},
                     "variants": {k: {"variant": d["variant"], "probe": d["probe"], "rejected": d["rejected_variants"]} for k, d in loaded.items()}}
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
            row["p50_ratios"] = p50_ratios(row, runners)
            results["cells"].append(row)
            print(json.dumps({k: (v.get("p50_ms", v) if isinstance(v, dict) else v) for k, v in row.items()}), flush=True)

    if "openvino_int8_plain" in runners:
        results["varied_lengths_stream"] = varied_lengths_stream(runners, ["openvino_int8", "openvino_int8_plain"])
        print(json.dumps({"varied_lengths_stream": results["varied_lengths_stream"]}), flush=True)
    scorer = SufficiencyScorer.load(bundle, ScorerConfig(intra_op_threads=args.threads))
    results["auto_variant"] = scorer.variant
    if not args.no_mixed:
        results["mixed_length_batch"] = mixed_length_batch(scorer._model, args.budget_s)
        print(json.dumps({"mixed_length_batch": results["mixed_length_batch"]}), flush=True)
    passage = ("Frederic Chopin was a Polish composer. He left Warsaw in 1830, shortly before the November Uprising. "
               "He settled in Paris, where he taught piano and composed. ") * 12
    results["end_to_end_score_256_window"] = stats(timed(lambda: scorer.score("When did Chopin leave Warsaw?", [passage]), 10, 300, args.budget_s), 1)
    results["rag_context_10_paragraphs"] = rag_context(scorer, args.budget_s)
    print(json.dumps({"rag_context_10_paragraphs": results["rag_context_10_paragraphs"]}), flush=True)
    results["file_sizes_mb"] = {f.name: round(f.stat().st_size / 1e6, 2) for f in bundle.iterdir()}
    if args.gate_bundle:
        results["gate_decide_128"] = gate_latency_128(args.gate_bundle, bundle_variants(Path(args.gate_bundle), cpu, with_ov),
                                                      args.threads, args.budget_s)
    # ONNX Runtime's variants keep their short names ("int8", "fp32": what benchmarks/run.py and report.py read)
    results["memory"] = {} if args.no_memory else {(prec if be == "onnxruntime" else name): rss_of_scorer(str(bundle), args.threads, prec, be)
                                                   for name, be, prec in variants if be == "onnxruntime" or prec == "int8"}
    if args.no_memory:
        results.pop("memory")
    if "torch_eager_fp32" in runners and not args.no_memory:
        results["memory"]["torch_eager_fp32"] = rss_of_torch(str(args.model_dir), args.threads)
    if not args.no_memory:
        results["memory"]["lexical"] = rss_of_lexical()
    results["env"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["manifest_parity"] = json.loads((bundle / "suffice.json").read_text()).get("parity")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results.get(k) for k in ("auto_variant", "end_to_end_score_256_window", "file_sizes_mb", "memory",
                                                   "gate_decide_128")}, indent=1))
    return 0


def rag_paragraphs(n: int = 10, seed: int = 0) -> list[dict[str, str]]:
    """``n`` retrieved-looking paragraphs of ~130 tokens each (~1,300 in all), one of them holding the answer."""
    rng = np.random.default_rng(seed)
    words = ("the city council river museum bridge century railway station treaty army festival library harbour "
             "university cathedral population industry mountain island province district market").split()
    out = []
    for k in range(n):
        sents = [" ".join(rng.choice(words, size=int(rng.integers(12, 20)))).capitalize() + "." for _ in range(6)]
        if k == n // 2:
            sents[3] = "Frederic Chopin left Warsaw in 1830, shortly before the November Uprising."
        out.append({"title": f"Paragraph {k}", "text": " ".join(sents)})
    return out


def rag_context(scorer, budget_s: float) -> dict:
    """A real RAG request: ten retrieved paragraphs (~1,300 tokens) through the packing into the window, one by
    one and as ``score_batch`` of 8 and 32 such items; the tokens the packer kept of the total."""
    question, passages = "When did Chopin leave Warsaw?", rag_paragraphs()
    packed = scorer._model.packer_for(None).pack(question, passages)
    out = {"context_tokens_total": int(packed.context_tokens_total), "context_tokens_kept": int(packed.context_tokens_kept),
           "batch_1": stats(timed(lambda: scorer.score(question, passages), 5, 200, budget_s), 1)}
    for b in (8, 32):
        out[f"batch_{b}"] = stats(timed(lambda: scorer.score_batch([question] * b, [passages] * b), 2, 50, budget_s, warmup=1), b)
    return out


if __name__ == "__main__":
    sys.exit(main())
