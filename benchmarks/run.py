"""``make bench``: the benchmark suite, side by side in one run, written as report.md + results.json + PNGs.

Parts (``--parts``, comma-separated; all but ``llm`` by default):

``speed``     scorer latency p50/p95/p99 at 128/256/512 tokens x batch 1/8/32, throughput and resident
              memory for int8 ONNX, fp32 ONNX, PyTorch eager fp32 (same weights) and the lexical
              heuristic (benchmarks/bench_scorer.py in a fresh process).
``quality``   the student (int8, fp32) and the baselines per source on the test split against the
              autorater labels and gold; reliability diagram; selective accuracy vs coverage.
``workload``  items/s of `suffice score` and of the HTTP service at batch 1, 8, 32 on mixed lengths (64 to
              ~1,300 tokens: a 10-paragraph RAG context), benchmarks/bench_workload.py.
``training``  examples/s and wall time per 1k examples, LoRA vs full fine-tuning, on this CPU.
``longctx``   question-aware selection vs plain truncation on the multi-hop sources.
``gate``      the retrieval gate vs its baseline (when a retrieval-gate model exists).
``llm``       the LLM rater it replaces: a local Qwen2.5-Coder-1.5B through llama.cpp on a sample of
              test items (``pip install 'suffice[llm]'``; slow: ~minutes per handful of items).

Every comparison is measured in the same run and quoted as a ratio, because these machines are
shared and noisy; absolute times come with the hardware they were measured on. Results go to
``benchmarks/results/<date>/`` and to the MLflow experiment ``benchmarks``.

    python benchmarks/run.py                                  # newest models/*/ with a bundle
    python benchmarks/run.py --model-dir models/demo-20250101-120000 --parts speed,quality
    python benchmarks/run.py --parts llm --llm-per-source 8   # the local LLM rater only
    python benchmarks/run.py --smoke --out /tmp/bench         # tiny random model, < 60 s
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

PARTS = ("speed", "workload", "quality", "training", "longctx", "gate", "llm")
DEFAULT_PARTS = ("speed", "workload", "quality", "training", "longctx", "gate")
EXPERIMENT = "benchmarks"


# ------------------------------------------------------------------------------------------
# what is benchmarked, and on what
# ------------------------------------------------------------------------------------------
def newest_model_dir(root: Path = REPO / "models") -> Path:
    """The newest ``models/*/`` holding an exported sufficiency bundle (``bundle/suffice.json``)."""
    found = [p.parent.parent for p in root.glob("*/bundle/suffice.json") if json.loads(p.read_text()).get("task") == "sufficiency"]
    if not found:
        raise FileNotFoundError(f"no model with an exported bundle under {root} (looked for */bundle/suffice.json): "
                                "run `make demo` first, or give --model-dir / --bundle / --model")
    return max(found, key=lambda p: (p / "bundle" / "suffice.json").stat().st_mtime)


def resolve_targets(args) -> tuple[Path | None, Path]:
    """(trained-model directory or None, bundle directory) from the arguments."""
    if args.model:
        from suffice.training.evaluation import evaluate as ev
        from suffice.training.evaluation import report as evr

        path = ev.resolve_model(args.model)
        if (path / "suffice.json").is_file():
            return (Path(args.model_dir) if args.model_dir else None), path
        bundle = Path(args.bundle) if args.bundle else path / "bundle"
        if not (bundle / "suffice.json").is_file():
            raise FileNotFoundError(f"{args.model} resolved to the model directory {path}, which holds no bundle: give --bundle DIR")
        return path, bundle
    if args.bundle:
        bundle = Path(args.bundle)
        if not (bundle / "suffice.json").is_file():
            raise FileNotFoundError(f"--bundle {bundle}: no suffice.json there; give an exported bundle folder")
        model_dir = Path(args.model_dir) if args.model_dir else (bundle.parent if (bundle.parent / "suffice_model.json").is_file() else None)
        return model_dir, bundle
    model_dir = Path(args.model_dir) if args.model_dir else newest_model_dir()
    bundle = model_dir / "bundle"
    if not (bundle / "suffice.json").is_file():
        raise FileNotFoundError(f"--model-dir {model_dir} has no exported bundle (bundle/suffice.json): run `suffice export` or give --bundle")
    return model_dir, bundle


def with_int8(bundle: Path, work: Path) -> tuple[Path, str | None]:
    """The bundle itself when it ships an int8 model; else a copy in ``work`` with an int8 model quantised
    now by the exporter's own ``quantise`` (a bundle is fp32-only when int8 failed the export parity
    check), so that int8 and fp32 are still compared side by side. Returns (bundle, note or None)."""
    import dataclasses
    import shutil

    from suffice.serving.bundle import MODEL_INT8, read_manifest, sha256_file, write_manifest
    from suffice.training.export import quantise

    manifest = read_manifest(bundle)
    if manifest.int8_model_file:
        return bundle, None
    copy = work / "bundle-with-int8"
    shutil.copytree(bundle, copy)
    how = quantise(copy / manifest.model_file, copy / MODEL_INT8)
    files = {**dict(manifest.files), MODEL_INT8: sha256_file(copy / MODEL_INT8)}
    write_manifest(copy, dataclasses.replace(manifest, int8_model_file=MODEL_INT8, files=files,
                                             parity=dataclasses.replace(manifest.parity, other={**manifest.parity.other,
                                                                                                  "benchmark_quantization": how})))
    return copy, (f"the bundle ships no int8 model (`suffice demo` exports fp32 only when int8 fails the export parity check), so the "
                  f"int8 model measured here was quantised from the bundle's fp32 graph in this run with "
                  f"suffice.training.export.quantise: {how}")


def cpu_probe_ms() -> float:
    """Wall time of a fixed pure-Python loop (3M additions): how much CPU this process gets right now on a shared machine."""
    t = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i
    return round((time.perf_counter() - t) * 1e3, 1)


def hardware() -> dict[str, Any]:
    """CPU model and ISA class (``suffice.serving.cpu``, the detection serving selects its variant with), cores,
    the SIMD features that matter for int8 and bf16, memory, load."""
    from suffice.serving.cpu import detect

    cpu = detect()
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in cpu.flags]
    model = cpu.model
    try:
        mem_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem_kb = 0
    return {"cpu_model": model, "isa_class": cpu.isa_class, "cpu": cpu.describe(), "bf16": cpu.bf16, "vnni": cpu.vnni,
            "cores": os.cpu_count(), "cpu_flags": ", ".join(simd) or "no AVX2", "memory_gb": round(mem_kb / 2**20, 1),
            "platform": platform.platform(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "cpu_probe_ms_at_start": cpu_probe_ms()}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("onnxruntime", "openvino", "torch", "transformers", "peft", "llama-cpp-python"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def git_commit() -> str | None:
    try:
        p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return p.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------------------------------
# parts
# ------------------------------------------------------------------------------------------
class Bench:
    """One benchmark run: targets, settings, the shared evaluation set and the results so far."""

    def __init__(self, args, model_dir: Path | None, bundle: Path, out: Path, gate_model: str | None):
        self.args, self.model_dir, self.bundle, self.out, self.gate_model = args, model_dir, bundle, out, gate_model
        self.smoke = args.smoke
        self._eval_set = None

    @property
    def eval_set(self):
        if self._eval_set is None:
            from bench_quality import EvalSet

            self._eval_set = EvalSet.load(self.bundle, self.model_dir)
        return self._eval_set

    def speed(self) -> dict[str, Any]:
        from report import plot_latency, speed_ratios

        raw = self.out / "bench_scorer.json"
        cmd = [sys.executable, str(HERE / "bench_scorer.py"), "--bundle", str(self.bundle), "--out", str(raw),
               "--threads", str(self.args.threads), "--budget-s", str(self.args.budget_s)]
        if self.model_dir is not None:
            cmd += ["--model-dir", str(self.model_dir)]
        if self.smoke:
            cmd += ["--lengths", "64", "128", "--batches", "1", "8"]
        print("$ " + shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO)
        speed = json.loads(raw.read_text())
        raw.unlink()
        speed["ratios"] = speed_ratios(speed)
        plot_latency(speed, self.out / "latency.png")
        return speed

    def workload(self) -> dict[str, Any]:
        raw = self.out / "bench_workload.json"
        cmd = [sys.executable, str(HERE / "bench_workload.py"), "--bundle", str(self.bundle), "--out", str(raw),
               "--threads", str(self.args.threads), *(["--items", "20", "--batches", "1,8"] if self.smoke else [])]
        print("$ " + shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO)
        work = json.loads(raw.read_text())
        raw.unlink()
        return work

    def quality(self) -> dict[str, Any]:
        from bench_quality import quality

        return quality(self.eval_set, self.out)

    def training(self) -> dict[str, Any]:
        from bench_training import training_cost

        from suffice.training.fit.model import resolve_base_dir

        es = self.eval_set
        base = self.model_dir if self.smoke else resolve_base_dir(es.cfg.base_model)
        steps, rounds = (2, 1) if self.smoke else (self.args.train_steps, 2)
        result = training_cost(es.cfg, base, es.train, pad_id=_pad_id(self.bundle), steps=steps, rounds=rounds, threads=self.args.threads)
        run = training_run_log(self.model_dir)
        if run:
            result["training_run"] = run
        return result

    def longctx(self) -> dict[str, Any]:
        from bench_quality import long_context, multi_hop_items

        from tiny_model import SMOKE_ITEMS

        es = self.eval_set
        items = multi_hop_items(SMOKE_ITEMS if self.smoke else None)
        windows = sorted({es.info["max_length"], 512}) if not self.smoke else [es.info["max_length"]]
        return long_context(es, items, windows)

    def gate(self) -> dict[str, Any]:
        from bench_quality import find_gate_model, retrieval_gate

        model, how = find_gate_model(self.gate_model)
        if model is None:
            return {"not_measured": how}
        result = retrieval_gate(model, self.out)
        result["found"] = how
        result["service"] = self._gate_service(result)
        return result

    def _gate_service(self, result: dict[str, Any]) -> dict[str, Any]:
        """bench_retrieval_gate on the exported bundle: ``RetrievalGate.decide`` on whole test threads as a
        service calls it (int8), SKIP precision / skip rate against the goal, latency at 128 tokens and the
        issue's acceptance examples."""
        import bench_retrieval_gate

        from suffice.training.evaluation import evaluate as ev

        from suffice.training.evaluation import report as evr

        path = Path(result["resolved"])
        bundle = path if (path / "suffice.json").is_file() else path / "bundle"
        if not (bundle / "suffice.json").is_file():
            return {"not_measured": f"{result['model']} has no exported bundle (suffice export --model {path} --out {path / 'bundle'})"}
        info = ev.model_info(path)
        cfg, _ = ev.eval_config(info, path, None, [])
        return bench_retrieval_gate.run(bundle, threads=self.args.threads, cfg=cfg)

    def llm(self) -> dict[str, Any]:
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is None:
            return {"not_measured": "llama-cpp-python is not installed (pip install 'suffice[llm]'; it builds llama.cpp, ~5 min on 2 cores)"}
        from llm_rater import llm_rater

        # judgments are logged as they are made: a killed run resumes (same --out) without judging again
        return llm_rater(self.eval_set, per_source=self.args.llm_per_source, max_tokens=self.args.llm_max_tokens, threads=self.args.threads,
                         log_path=self.out / "llm_judgments.jsonl")


def _pad_id(bundle: Path) -> int:
    from tokenizers import Tokenizer

    return int(Tokenizer.from_file(str(bundle / "tokenizer.json")).token_to_id("[PAD]"))


def training_run_log(model_dir: Path | None) -> dict[str, Any] | None:
    """Examples/s per epoch as the training run itself logged them (its last checkpoint's state)."""
    if model_dir is None:
        return None
    states = sorted((model_dir / "checkpoints").glob("step-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    if not states:
        return None
    state = json.loads(states[-1].read_text())
    history = [{"epoch": h.get("epoch"), "train_examples_per_s": h["train_examples_per_s"]} for h in state.get("history", [])
               if h.get("train_examples_per_s")]
    if not history:
        return None
    meta = json.loads((model_dir / "suffice_model.json").read_text()) if (model_dir / "suffice_model.json").is_file() else {}
    return {"source": str(states[-1].relative_to(model_dir)), "history": history, "train_seconds": meta.get("train_seconds")}


# ------------------------------------------------------------------------------------------
# MLflow
# ------------------------------------------------------------------------------------------
def mlflow_metrics(results: dict[str, Any]) -> dict[str, float]:
    """The numbers worth comparing across runs, flat (NaN and None left out)."""
    from suffice.training.evaluation.metrics import flat_metrics

    m: dict[str, float] = {f"seconds_{k}": v for k, v in results["timings_s"].items()}
    speed = results.get("speed") or {}
    for c in speed.get("cells", []):
        for v in ("onnx_int8", "onnx_fp32", "openvino_fp32", "openvino_bf16", "torch_eager_fp32", "lexical"):
            if v in c:
                for k in ("p50_ms", "p95_ms", "p99_ms", "throughput_items_s"):
                    m[f"speed_{v}_{c['tokens']}t_b{c['batch']}_{k}"] = c[v][k]
        for k, v in (c.get("p50_ratios") or {}).items():
            m[f"p50_ratio_{k}_{c['tokens']}t_b{c['batch']}"] = v
    for r in speed.get("ratios", []):
        for k, v in r.items():
            if k.startswith(("int8_vs", "fp32_vs")) and v:
                m[f"ratio_{k}_{r['tokens']}t_b{r['batch']}"] = v
    for k, v in (speed.get("memory") or {}).items():
        if "rss_mb" in v:
            m[f"memory_{k}_rss_mb"] = v["rss_mb"]
    q = results.get("quality") or {}
    for ref in ("vs_autorater", "vs_gold"):
        for name, table in (q.get(ref) or {}).items():
            m.update(flat_metrics({s: {k: x for k, x in t.items() if k in ("accuracy", "macro_f1", "auroc", "paired_auroc", "ece", "kappa_autorater", "kappa_gold")}
                                   for s, t in table.items()}, f"quality_{ref}_{name}"))
    tc = results.get("training") or {}
    for mode in ("lora", "full"):
        if mode in tc:
            m[f"training_{mode}_examples_per_s"] = tc[mode]["examples_per_s"]
            m[f"training_{mode}_seconds_per_1k"] = tc[mode]["seconds_per_1k_examples"]
    lc = results.get("longctx") or {}
    for src, v in (lc.get("answer_in_window") or {}).items():
        for k, x in v.items():
            if k.startswith("share_"):
                m[f"longctx_{src}_{k.replace('@', '_at_')}"] = x
    g = results.get("gate") or {}
    for name, table in (g.get("tables") or {}).items():
        m.update(flat_metrics({"overall": {k: x for k, x in table["overall"].items() if k in ("accuracy", "macro_f1", "auroc", "ece")}}, f"gate_{name}"))
    sv = g.get("service") or {}
    if sv.get("headline_precision"):
        head = sv["headline_precision"]
        for k in ("macro_f1", "skip_precision", "skip_rate"):
            m[f"gate_service_{head}_{k}"] = sv[head][k]
        m["gate_service_p50_128_ms"] = sv["latency_128"]["p50_ms"]
        m["gate_service_f1_points_over_tfidf"] = sv["f1_points_over_tfidf"]
    llm = results.get("llm") or {}
    if llm.get("speed_ratio_llm_over_student"):
        m["llm_seconds_per_judgment"] = llm["llm_seconds_per_judgment"]["mean"]
        m["llm_speed_ratio_over_student"] = llm["speed_ratio_llm_over_student"]
        for ref in ("llm_vs_autorater", "llm_vs_gold"):
            acc = llm["per_source"]["overall"][ref].get("accuracy")
            if acc is not None:
                m[f"{ref}_accuracy"] = acc
    import math

    return {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def log_to_mlflow(results: dict[str, Any], out: Path) -> str | None:
    from suffice.training.paths import default_tracking_uri
    from suffice.training.tracking import RunTracker

    meta = results["meta"]
    tracker = RunTracker(True, default_tracking_uri(), EXPERIMENT)
    tracker.start(f"bench-{meta['date']}{'-smoke' if meta['smoke'] else ''}",
                  tags={"smoke": str(meta["smoke"]), "git_commit": meta.get("git_commit") or "", "cpu": meta["hardware"]["cpu_model"]})
    tracker.log_params({"model_dir": meta["model"].get("model_dir"), "bundle": meta["model"].get("bundle"), "parts": ",".join(meta["parts"]),
                        "cores": meta["hardware"]["cores"], "cpu_flags": meta["hardware"]["cpu_flags"],
                        "isa_class": meta["hardware"].get("isa_class"), "threads": meta["threads"],
                        **{f"version_{k}": v for k, v in meta["versions"].items()}})
    tracker.log_metrics(mlflow_metrics(results))
    tracker.log_artifacts(out, "benchmark")
    tracker.end("FINISHED" if not results.get("errors") else "FAILED")
    return tracker.run_id


# ------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------
def merge_into(path: Path, new: dict[str, Any], parts: list[str]) -> dict[str, Any]:
    """The earlier results.json at ``path`` with ``parts`` replaced by this run's, each merged part labelled
    with when and how it was measured (its numbers are not from the earlier run)."""
    if not path.is_file():
        raise FileNotFoundError(f"--merge: {path} does not exist; run the other parts into that folder first")
    old = json.loads(path.read_text())
    merged = old.setdefault("meta", {}).setdefault("merged_parts", {})
    for part in parts:
        if part in new:
            old[part] = new[part]
            old.setdefault("errors", {}).pop(part, None)
            merged[part] = {"started": new["meta"]["started"], "command": new["meta"]["command"], "seconds": new["timings_s"].get(part),
                            "load_average_at_start": new["meta"]["hardware"].get("load_average_at_start")}
        elif part in new.get("errors", {}):
            old.setdefault("errors", {})[part] = new["errors"][part]
    return old


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--model-dir", help="trained-model directory (default: the newest models/*/ with bundle/suffice.json)")
    ap.add_argument("--bundle", help="exported bundle folder (default: <model-dir>/bundle)")
    ap.add_argument("--model", help="a registry URI instead: models:/suffice-sufficiency/N, models:/NAME@alias, runs:/ID/PATH")
    ap.add_argument("--gate-model", help="retrieval-gate model dir, bundle or URI (default: the newest suffice-retrieval-gate version)")
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"comma list from {','.join(PARTS)} (default: all but llm)")
    ap.add_argument("--out", help="output folder (default: benchmarks/results/<YYYY-MM-DD>)")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model on a few items: checks the code paths in < 60 s")
    ap.add_argument("--threads", type=int, default=None,
                    help="intra-op threads for every scorer and for training (default 2; smoke 1, which stays quick on a busy machine)")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds per latency cell and variant (default 3; smoke 0.05)")
    ap.add_argument("--train-steps", type=int, default=8, help="timed optimiser steps per round and fine-tuning mode (2 rounds)")
    ap.add_argument("--llm-per-source", type=int, default=8, help="test items per source judged by the local LLM")
    ap.add_argument("--llm-max-tokens", type=int, default=256, help="new tokens per LLM judgment (the step-by-step reasoning + verdict)")
    ap.add_argument("--no-int8-fallback", action="store_true",
                    help="for an fp32-only bundle, measure fp32 only instead of quantising an int8 copy for the benchmark")
    ap.add_argument("--merge", action="store_true",
                    help="add this run's parts to the results.json already in --out (each labelled as measured later) instead of replacing it")
    ap.add_argument("--no-mlflow", action="store_true", help="do not log to the MLflow 'benchmarks' experiment")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"bench: unknown part(s) {unknown}: choose from {list(PARTS)}", file=sys.stderr)
        return 2
    if args.budget_s is None:
        args.budget_s = 0.05 if args.smoke else 3.0
    if args.threads is None:
        args.threads = 1 if args.smoke else 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    date = time.strftime("%Y-%m-%d")
    out = Path(args.out) if args.out else HERE / "results" / date
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    gate_model = args.gate_model
    if args.smoke:
        from tiny_model import build_smoke_models

        smoke_root = Path(tempfile.mkdtemp(prefix="suffice-bench-smoke-"))
        dirs = build_smoke_models(smoke_root)
        model_dir, bundle = dirs["model_dir"], dirs["bundle"]
        gate_model = gate_model or str(dirs["gate_model_dir"])
    else:
        try:
            model_dir, bundle = resolve_targets(args)
        except FileNotFoundError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
    shipped_bundle = bundle
    int8_note = None
    if not args.no_int8_fallback:
        bundle, int8_note = with_int8(bundle, Path(tempfile.mkdtemp(prefix="suffice-bench-")))
        if int8_note:
            print(f"bench: {int8_note}", flush=True)
    timings["setup"] = time.perf_counter() - t0
    manifest = json.loads((shipped_bundle / "suffice.json").read_text())
    registered = (f"models:/{manifest['registered_model']}/{manifest['model_version']}"
                  if manifest.get("registered_model") and manifest.get("model_version") else None)
    if registered is None and model_dir is not None and (model_dir / "suffice_model.json").is_file():
        ml = json.loads((model_dir / "suffice_model.json").read_text()).get("mlflow") or {}
        registered = f"models:/{ml['registered_model']}/{ml['version']}" if ml.get("registered_model") and ml.get("version") else None
    results: dict[str, Any] = {"meta": {
        "date": date, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": args.smoke, "parts": parts, "threads": args.threads,
        "command": shlex.join(["python", "benchmarks/run.py", *argv]), "git_commit": git_commit(), "hardware": hardware(), "versions": versions(),
        "model": {"model_dir": str(model_dir) if model_dir else None, "bundle": str(shipped_bundle), "int8_note": int8_note,
                  "registered": registered,
                  "mlflow_run_id": manifest.get("mlflow_run_id"), "bundle_ships_int8": bool(manifest.get("int8_model_file")),
                  "max_length": manifest.get("max_length"), "strategy": manifest.get("long_context_strategy")}},
        "timings_s": timings, "errors": {}}
    print(f"bench: {bundle} ({'smoke' if args.smoke else 'full'}), parts {parts}, out {out}", flush=True)

    bench = Bench(args, model_dir, bundle, out, gate_model)
    for part in parts:
        fn: Callable[[], dict[str, Any]] = getattr(bench, part)
        print(f"\n== {part} ==", flush=True)
        t0 = time.perf_counter()
        try:
            results[part] = fn()
        except Exception as e:  # a failed part is reported (and fails the run) but does not hide the others' numbers
            results["errors"][part] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        timings[part] = time.perf_counter() - t0
        print(f"== {part}: {timings[part]:.1f} s ==", flush=True)
    timings["total"] = time.perf_counter() - t_start
    results["meta"]["hardware"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["meta"]["hardware"]["cpu_probe_ms_at_end"] = cpu_probe_ms()

    from report import render_markdown

    from suffice.serving.jsonl import json_safe

    results = json_safe(results)
    if args.merge:
        results = merge_into(out / "results.json", results, parts)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "report.md").write_text(render_markdown(results))
    print(f"\nbench: wrote {out / 'report.md'}, {out / 'results.json'} in {timings['total']:.0f} s "
          f"({', '.join(f'{k} {v:.0f} s' for k, v in timings.items() if k != 'total')})")
    if not args.no_mlflow:
        run_id = log_to_mlflow(results, out)
        print(f"MLflow run {run_id} (experiment {EXPERIMENT})")
    if results.get("errors"):
        print(f"bench: part(s) failed: {sorted(results['errors'])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
