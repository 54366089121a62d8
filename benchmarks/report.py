"""``report.md`` and the latency plot from a benchmark's ``results.json`` (every number in it measured in that run).

>>> Path("report.md").write_text(render_markdown(json.loads(Path("results.json").read_text())))  # doctest: +SKIP
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

VARIANTS = {"onnx_int8": "int8 ONNX", "onnx_fp32": "fp32 ONNX", "torch_eager_fp32": "PyTorch eager fp32", "lexical": "lexical heuristic"}
SCORER_NAMES = {"student_int8": "student int8", "student_fp32": "student fp32", "keyword_coverage": "lexical heuristic (keyword coverage)",
                "answer_in_context": "answer-in-context (reads gold answers)", "tfidf_lr": "TF-IDF + LR", "autorater_labels": "autorater labels (teacher)",
                "model": "gate model"}


def _f(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


# ------------------------------------------------------------------------------------------
# derived numbers
# ------------------------------------------------------------------------------------------
def speed_ratios(speed: Mapping[str, Any]) -> list[dict[str, Any]]:
    """p50 ratios per (tokens, batch) cell: how many times faster the int8 scorer is than each other variant."""
    out = []
    for c in speed.get("cells", []):
        base = (c.get("onnx_int8") or c.get("onnx_fp32") or {}).get("p50_ms")
        row = {"tokens": c["tokens"], "batch": c["batch"]}
        for v in ("onnx_fp32", "torch_eager_fp32"):
            if v in c and "onnx_int8" in c:
                row[f"int8_vs_{v}"] = _ratio(c[v]["p50_ms"], base)
        if "lexical" in c:
            row["lexical_vs_int8"] = _ratio(base, c["lexical"]["p50_ms"])
        if "torch_eager_fp32" in c and "onnx_fp32" in c:
            row["fp32_vs_torch_eager_fp32"] = _ratio(c["torch_eager_fp32"]["p50_ms"], c["onnx_fp32"]["p50_ms"])
        out.append(row)
    return out


def headline(results: Mapping[str, Any]) -> list[str]:
    """The headline sentences of the report: ratios measured side by side in this run."""
    lines = []
    speed = results.get("speed") or {}
    for r in speed_ratios(speed):
        if r["tokens"] == 256 and r["batch"] in (1, 32):
            if r.get("int8_vs_torch_eager_fp32"):
                lines.append(f"int8 ONNX is {r['int8_vs_torch_eager_fp32']:.1f}x faster than PyTorch eager fp32 at 256 tokens, batch {r['batch']} (p50)")
            if r.get("int8_vs_onnx_fp32"):
                lines.append(f"int8 ONNX is {r['int8_vs_onnx_fp32']:.2f}x as fast as fp32 ONNX at 256 tokens, batch {r['batch']} (p50)")
    llm = results.get("llm") or {}
    if llm.get("speed_ratio_llm_over_student"):
        lines.append(f"the local LLM rater takes {llm['llm_seconds_per_judgment']['mean']:.1f} s per judgment, "
                     f"{llm['speed_ratio_llm_over_student']:,.0f}x the {llm['student_precision']} student's end-to-end time on the same "
                     f"{sum(llm['sample']['per_source'].values())} test items")
    tc = results.get("training") or {}
    if tc.get("ratio_full_over_lora_s_per_1k"):
        lines.append(f"full fine-tuning takes {tc['ratio_full_over_lora_s_per_1k']:.2f}x the wall time of LoRA per 1k examples "
                     f"({tc['full']['seconds_per_1k_examples']:.0f} s vs {tc['lora']['seconds_per_1k_examples']:.0f} s)")
    return lines


# ------------------------------------------------------------------------------------------
# sections
# ------------------------------------------------------------------------------------------
def _speed_section(speed: Mapping[str, Any]) -> list[str]:
    cells = speed.get("cells", [])
    variants = [v for v in VARIANTS if any(v in c for c in cells)]
    env = speed.get("env", {})
    out = ["## Speed and cost", "",
           f"Model forward pass on synthetic inputs of exactly N tokens (tokenisation excluded; the lexical heuristic runs on "
           f"~0.75·N words of text per pair), {env.get('threads', '?')} intra-op threads, onnxruntime {env.get('onnxruntime', '?')}. "
           "Latency is per call (one batch); throughput is pairs per second.", "",
           "### Latency p50 / p95 / p99 (ms per call)", "",
           _table(["tokens", "batch"] + [VARIANTS[v] for v in variants],
                  [[c["tokens"], c["batch"]] + [f"{_f(c[v]['p50_ms'], 2)} / {_f(c[v]['p95_ms'], 2)} / {_f(c[v]['p99_ms'], 2)}" if v in c else "–"
                                                for v in variants] for c in cells]), "",
           "### Throughput (pairs/s)", "",
           _table(["tokens", "batch"] + [VARIANTS[v] for v in variants],
                  [[c["tokens"], c["batch"]] + [_f(c[v]["throughput_items_s"], 1) if v in c else "–" for v in variants] for c in cells]), ""]
    ratios = speed_ratios(speed)
    if ratios:
        cols = [("int8_vs_onnx_fp32", "int8 vs fp32 ONNX"), ("int8_vs_torch_eager_fp32", "int8 vs PyTorch eager"),
                ("fp32_vs_torch_eager_fp32", "fp32 ONNX vs PyTorch eager"), ("lexical_vs_int8", "lexical heuristic vs int8")]
        cols = [c for c in cols if any(r.get(c[0]) for r in ratios)]
        out += ["### Speed-up (p50 latency of the other variant / this one, same run)", "",
                _table(["tokens", "batch"] + [c[1] for c in cols],
                       [[r["tokens"], r["batch"]] + [f"{r[k]:.2f}x" if r.get(k) else "–" for k, _ in cols] for r in ratios]), ""]
    mem = speed.get("memory", {})
    sizes = speed.get("file_sizes_mb", {})
    if mem:
        names = {"int8": "int8 ONNX", "fp32": "fp32 ONNX", "torch_eager_fp32": "PyTorch eager fp32", "lexical": "lexical heuristic"}
        files = {"int8": sizes.get("model.int8.onnx"), "fp32": sizes.get("model.onnx")}
        out += ["### Resident memory (fresh process holding one scorer, after 5 calls)", "",
                _table(["variant", "RSS MB", "peak RSS MB", "model file MB"],
                       [[names.get(k, k), _f(v.get("rss_mb"), 1), _f(v.get("peak_rss_mb"), 1), _f(files.get(k), 1)] for k, v in mem.items()]), ""]
    e2e = speed.get("end_to_end_score_256_window")
    if e2e:
        out += [f"End-to-end `scorer.score()` (packing + tokenisation + model, default precision, one ~900-token passage "
                f"packed into the window): p50 {_f(e2e['p50_ms'], 2)} ms, p95 {_f(e2e['p95_ms'], 2)} ms, p99 {_f(e2e['p99_ms'], 2)} ms.", ""]
    return out


def _llm_section(llm: Mapping[str, Any]) -> list[str]:
    out = ["### The LLM rater it replaces (local, llama.cpp)", ""]
    if llm.get("not_measured"):
        return out + [f"Not measured: {llm['not_measured']}", ""]
    n = sum(llm["sample"]["per_source"].values())
    sj = llm["llm_seconds_per_judgment"]
    out += [f"{llm['model']}, {llm['runtime']}, the autorater prompt `{llm['prompt_version']}` (1-shot, step-by-step), "
            f"temperature 0, at most {llm['max_tokens']} new tokens; GGUF sha256 `{llm['gguf_sha256']}` verified before loading. "
            f"Sample: {n} test items ({', '.join(f'{k}: {v}' for k, v in llm['sample']['per_source'].items())}), "
            f"not the 200 the issue asks for: at ~{sj['mean']:.0f} s per judgment on 2 cores, 200 items would take "
            f"~{200 * sj['mean'] / 60:.0f} min.", "",
            f"- LLM: {sj['mean']:.1f} s per judgment (p50 {sj['p50']:.1f} s, p95 {sj['p95']:.1f} s); "
            f"{llm['tokens']['prompt_mean']:.0f} prompt + {llm['tokens']['completion_mean']:.0f} completion tokens on average; "
            f"{llm['unparsed']} of {n} replies had no parsable verdict{(' (' + '; '.join(llm['unparsed_reasons']) + ')') if llm['unparsed_reasons'] else ''}.",
            f"- {llm['student_precision']} student, end to end on the same items one at a time: {1000 * llm['student_seconds_per_item']['mean']:.1f} ms per item.",
            f"- **The LLM takes {llm['speed_ratio_llm_over_student']:,.0f}x as long per judgment as the {llm['student_precision']} student.**", "",
            "Agreement on the sample (accuracy / Cohen's κ; the LLM only on the replies it could parse):", ""]
    rows = []
    for src, t in llm["per_source"].items():
        def cell(m: Mapping[str, Any]) -> str:
            return f"{_f(m.get('accuracy'))} / {_f(m.get('kappa_autorater'))} (n={int(m.get('n', 0))})" if m.get("n") else "–"
        rows.append([src, t["n"], t["parsed"], cell(t["llm_vs_autorater"]), cell(t["llm_vs_gold"]), cell(t["student_vs_autorater"]), cell(t["student_vs_gold"])])
    out += [_table(["source", "items", "LLM parsed", "LLM vs autorater", "LLM vs gold", "student vs autorater", "student vs gold"], rows), ""]
    return out


def _workload_section(w: Mapping[str, Any]) -> list[str]:
    mix = ", ".join(f"{n} x ~{t}" for t, n in w["target_tokens_mix"].items())
    cli, svc = w["suffice_score"], w["service"]
    batches = sorted(int(k.split("_")[1]) for k in cli if k.startswith("batch_"))
    rows = [[f"`suffice score --batch-size {b}`", _f(cli[f"batch_{b}"]["items_per_s"], 1), "–", "–"] for b in batches]
    rows += [[f"service, lists of {b}, 1 client", _f(svc[f"batch_{b}"]["items_per_s"], 1), _f(svc[f"batch_{b}"]["p50_ms"], 1),
              _f(svc[f"batch_{b}"]["p95_ms"], 1)] for b in batches if f"batch_{b}" in svc]
    c8 = svc.get("batch_1_clients_8")
    if c8:
        rows.append(["service, single items, 8 clients", _f(c8["items_per_s"], 1), _f(c8["p50_ms"], 1), _f(c8["p95_ms"], 1)])
    return ["### Cost as the work grows", "",
            f"{w['items']} items of mixed length (target tokens: {mix}; the longest are ~10-paragraph RAG contexts the packing "
            f"cuts to the window), {w['threads']} threads; the service's variant: `{(svc.get('readyz') or {}).get('variant')}`; "
            f"`suffice score` start-up {cli['startup_s']:.2f} s, taken out of its items/s.", "",
            _table(["path", "items/s", "request p50 ms", "request p95 ms"], rows), ""]


def _training_section(tc: Mapping[str, Any]) -> list[str]:
    out = ["### Training cost (this CPU)", ""]
    if tc.get("not_measured"):
        return out + [f"Not measured: {tc['not_measured']}", ""]
    out += [f"{tc['base_model']}, batch {tc['batch_size']}, window {tc['max_length']}, {tc['threads']} threads; "
            f"{tc['rounds']} alternating rounds of {tc['steps_per_round']} optimiser steps each (forward, weighted cross-entropy, backward, "
            "clipping, AdamW), after 2 warm-up steps.", "",
            _table(["fine-tuning", "trainable params", "examples timed", "mean tokens/example", "examples/s", "wall s per 1k examples"],
                   [[m, f"{tc[m]['trainable_params']:,} of {tc[m]['total_params']:,}", tc[m]["examples"], _f(tc[m]["mean_tokens_per_example"], 0),
                     _f(tc[m]["examples_per_s"], 2), _f(tc[m]["seconds_per_1k_examples"], 0)] for m in ("lora", "full")]), "",
            f"Full fine-tuning takes **{tc['ratio_full_over_lora_s_per_1k']:.2f}x** the wall time of LoRA per 1k examples."]
    run = tc.get("training_run")
    if run:
        out += ["", f"For reference, loaded from the trained model's own log ({run['source']}): "
                    + ", ".join(f"epoch {h['epoch']}: {h['train_examples_per_s']:.1f} examples/s" for h in run["history"])
                    + (f"; training took {run['train_seconds']:.0f} s." if run.get("train_seconds") else ".")]
    return out + [""]


def _metric_rows(tables: Mapping[str, Mapping[str, Any]], source: str, cols: Sequence[str]) -> list[list[str]]:
    rows = []
    for name, table in tables.items():
        m = (table or {}).get(source)
        if m:
            rows.append([SCORER_NAMES.get(name, name)] + [(_f(m.get(c)) if c not in ("n",) else _f(int(m.get(c, 0)))) for c in cols])
    return rows


def _quality_section(q: Mapping[str, Any], llm: Mapping[str, Any] | None) -> list[str]:
    out = ["## Quality", ""]
    if q.get("not_measured"):
        return out + [f"Not measured: {q['not_measured']}", ""]
    match = {True: "the same data the model was trained on", False: "**different** from the model's training data", None: "not recorded by the model"}
    out += [f"Test split: {q['n']} items ({q['n_gold']} with a gold label), reference labels from the autorater; training labels: "
            f"{q['label_source']}; data hash `{q['data_hash']}` "
            f"({match[q['data_hash_matches_model']]}). Baselines decide positive-vs-rest with thresholds tuned on train "
            f"({', '.join(f'{k} {v:.3f}' for k, v in q['baseline_thresholds'].items())}). The student decides at P(sufficient) >= 0.5 "
            "(argmax).", ""]
    par = q.get("int8_vs_fp32") or {}
    if par:
        out += [f"int8 vs fp32 on the whole test split: the same decision on {par['decision_agreement']:.1%} of items; "
                f"score difference int8 - fp32: mean {par['mean_score_diff_int8_minus_fp32']:+.4f}, largest |difference| {par['max_abs_score_diff']:.4f}.", ""]
    sources = ["overall"] + sorted(s for s in next(iter(q["vs_autorater"].values())) if s != "overall")
    cols_a = ["n", "accuracy", "macro_f1", "auroc", "ece", "kappa_autorater"]
    cols_g = ["n", "accuracy", "macro_f1", "kappa_autorater"]
    out += ["### Against the autorater labels", ""]
    for s in sources:
        out += [f"**{s}**", "", _table(["scorer"] + ["n", "accuracy", "macro-F1", "AUROC", "ECE", "κ"], _metric_rows(q["vs_autorater"], s, cols_a)), ""]
    out += ["### Against gold labels (rows with a gold label; κ here is Cohen's κ with gold)", ""]
    for s in sources:
        rows = _metric_rows(q["vs_gold"], s, cols_g)
        if rows:
            out += [f"**{s}**", "", _table(["scorer", "n", "accuracy", "macro-F1", "κ"], rows), ""]
    if llm and not llm.get("not_measured"):
        out += ["The local LLM rater on its sample is in *Speed and cost* above (its agreement table).", ""]
    out += ["### Calibration and selective answering", "",
            f"Reliability diagram of the student's calibrated score: [reliability.png](reliability.png); "
            f"ECE (15 bins) overall {_f(next(iter(q['vs_autorater'].values()))['overall'].get('ece'))}.", "",
            "Selective accuracy vs coverage (most confident first; confidence = distance from the decision threshold): "
            "[selective_accuracy.png](selective_accuracy.png)", "",
            _table(["scorer", "accuracy at 50% coverage", "at 80%", "at 100%"],
                   [[SCORER_NAMES.get(k, k), _f(v.get("acc_at_50")), _f(v.get("acc_at_80")), _f(v.get("acc_at_100"))]
                    for k, v in q["selective_accuracy"].items()]), ""]
    return out


def _longctx_section(lc: Mapping[str, Any]) -> list[str]:
    out = ["## Long context: question-aware selection vs plain truncation", ""]
    if lc.get("not_measured"):
        return out + [f"Not measured: {lc['not_measured']}", ""]
    aiw = lc["answer_in_window"]
    windows = sorted({int(k.split("@")[1]) for v in aiw.values() for k in v if k.startswith("share_select@")})
    rows = []
    for src, v in sorted(aiw.items()):
        rows.append([src, v["items"], _f(v["answer_in_context"] / v["items"] if v["items"] else None)]
                    + [f"{_f(v.get(f'share_select@{w}'))} vs {_f(v.get(f'share_truncate@{w}'))}" for w in windows]
                    + [_f(v.get(f"truncated@{windows[0]}", 0) / v["items"] if v["items"] else None)])
    out += ["Share of answerable multi-hop items (all splits) whose gold answer is inside the packed window, `select` vs `truncate` "
            "(model-free; question never truncated):", "",
            _table(["source", "items", "answer anywhere in context"] + [f"in window @{w}: select vs truncate" for w in windows]
                   + [f"context over window @{windows[0]}"], rows), ""]
    for split, per in lc.get("student", {}).items():
        out += [f"The {lc['precision']} student (trained with `{lc['model_strategy']}`, window {lc['window']}) on the {per['n']} multi-hop "
                f"{split}-split items, scored with each strategy ({per['reference']}):", ""]
        rows = []
        for strategy in ("select", "truncate"):
            for ref in ("vs_labels", "vs_gold"):
                for src, m in sorted(per[strategy][ref].items()):
                    rows.append([strategy, "labels" if ref == "vs_labels" else "gold", src, _f(int(m.get("n", 0))), _f(m.get("accuracy")),
                                 _f(m.get("macro_f1")), _f(m.get("auroc"))])
        out += [_table(["strategy", "against", "source", "n", "accuracy", "macro-F1", "AUROC"], rows), ""]
    return out


def _gate_section(g: Mapping[str, Any]) -> list[str]:
    out = ["## Retrieval gate vs its baseline", ""]
    if g.get("not_measured"):
        return out + [f"Not measured: {g['not_measured']}", ""]
    th = ", ".join(f"{k} {v:.3f}" for k, v in g["thresholds"].items())
    out += [f"Model `{g['model']}` ({g['kind']}) on {g['n_test']} held-out test threads (data `{g['data_hash']}`); "
            f"SKIP threshold {th}; baselines tuned on the train threads.", "",
            _table(["scorer", "n", "accuracy", "macro-F1", "AUROC", "ECE"],
                   [[SCORER_NAMES.get(k, k), _f(int(t['overall']['n'])), _f(t['overall'].get('accuracy')), _f(t['overall'].get('macro_f1')),
                     _f(t['overall'].get('auroc')), _f(t['overall'].get('ece'))] for k, t in g["tables"].items()]), ""]
    m = g["tables"]["model"]["overall"]
    for name in g["thresholds"]:
        if f"share_at_{name}" in m:
            out += [f"At the stored `{name}` threshold the gate skips retrieval on {_f(m[f'share_at_{name}'])} of threads with "
                    f"precision {_f(m.get(f'precision_at_{name}'))} and recall {_f(m.get(f'recall_at_{name}'))} for SKIP.", ""]
    return out + _gate_service_section(g.get("service") or {})


def _gate_service_section(sv: Mapping[str, Any]) -> list[str]:
    """The exported gate as services run it (benchmarks/bench_retrieval_gate.py): goals, latency, examples."""
    out = ["### The exported gate as a service calls it (`RetrievalGate.decide`)", ""]
    if not sv:
        return []
    if sv.get("not_measured"):
        return out + [f"Not measured: {sv['not_measured']}", ""]
    head = sv["headline_precision"]
    from bench_retrieval_gate import gate_rows

    rows = [[name, _f(q["macro_f1"]), _f(q["skip_precision"]), _f(q["skip_rate"]), _f(q["accuracy"]), _f(q.get("auroc"))]
            for name, q in gate_rows(sv)]
    lat = sv["latency_128"]
    out += [f"{sv['n_test']} held-out threads (trained on {sv['n_train']}); each model at the stored SKIP threshold "
            f"(precision first) and at 0.5; TF-IDF + LR at 0.5.", "",
            _table(["decider", "macro-F1", "SKIP precision", "SKIP rate", "accuracy", "AUROC"], rows), "",
            f"- `decide()` {head}, test threads in a 128-token window (mean {_f(lat.get('mean_tokens'), 0)} tokens): "
            f"p50 {lat['p50_ms']:.2f} ms, p95 {lat['p95_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms ({lat['n']} calls); "
            f"full 128-token windows: p50 {_f(lat.get('full_window_p50_ms'), 2)} ms ({lat.get('full_window_n', 0)} calls)",
            f"- macro-F1 points over TF-IDF + LR: {sv['f1_points_over_tfidf']:+.1f}",
            "- goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in sv["goals"].items()), "",
            _table(["message (fruit-price thread)", "expected", "decision", "P(SKIP)"],
                   [[a["message"], a["expected"], a["decision"] + ("" if a["ok"] else " (wrong)"),
                     "-" if a["p_skip"] is None else _f(a["p_skip"])] for a in sv["acceptance"]]), ""]
    return out


def render_markdown(results: Mapping[str, Any]) -> str:
    """The whole report; sections for parts that did not run say so."""
    meta = results["meta"]
    hw = meta["hardware"]
    t = results["timings_s"]
    out = [f"# suffice benchmarks, {meta['date']}", "",
           ("**SMOKE RUN: a tiny random model on a handful of items; these numbers only show the code paths work.**\n" if meta["smoke"] else ""),
           f"- hardware: {hw['cpu_model']}, ISA class {hw.get('isa_class', '?')}, {hw['cores']} cores ({hw['cpu_flags']}), {hw['memory_gb']} GiB RAM; shared machine, so compare "
           "numbers within this run (ratios), not across runs",
           f"- load average (1/5/15 min) at start {hw.get('load_average_at_start')}, at end {hw.get('load_average_at_end')} "
           f"(other work on this {hw['cores']}-core machine during the run); CPU probe (wall time of a fixed 3M-iteration Python loop: "
           f"the lower, the more CPU this run got) {hw.get('cpu_probe_ms_at_start')} ms at start, {hw.get('cpu_probe_ms_at_end')} ms at end",
           f"- software: Python {meta['versions']['python']}, onnxruntime {meta['versions'].get('onnxruntime')}, torch {meta['versions'].get('torch')}",
           f"- model: `{meta['model'].get('model_dir')}`, bundle `{meta['model'].get('bundle')}`"
           + (f", registered `{meta['model']['registered']}`" if meta["model"].get("registered") else ""),
           *([f"- int8: {meta['model']['int8_note']}"] if meta["model"].get("int8_note") else []),
           f"- git commit `{meta.get('git_commit')}`; command `{meta['command']}`",
           f"- wall time {t.get('total', 0):.0f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in t.items() if k != "total"),
           *[f"- part `{part}` was measured in a later run ({m['started']}, command `{m['command']}`, load average at start "
             f"{m['load_average_at_start']}, {m['seconds']:.0f} s) and merged into this results.json; every other number is from the run above"
             for part, m in (meta.get("merged_parts") or {}).items()], ""]
    lines = headline(results)
    if lines:
        out += ["## Headline (ratios measured side by side in this run)", ""] + [f"- {x}" for x in lines] + [""]
    if results.get("speed"):
        out += _speed_section(results["speed"])
    if results.get("workload"):
        out += _workload_section(results["workload"])
    if results.get("llm"):
        out += _llm_section(results["llm"])
    if results.get("training"):
        out += _training_section(results["training"])
    if results.get("quality"):
        out += _quality_section(results["quality"], results.get("llm"))
    if results.get("longctx"):
        out += _longctx_section(results["longctx"])
    if results.get("gate"):
        out += _gate_section(results["gate"])
    failed = {k: v for k, v in results.get("errors", {}).items()}
    if failed:
        out += ["## Parts that failed", ""] + [f"- {k}: {v}" for k, v in failed.items()] + [""]
    return "\n".join(out).replace("\n\n\n", "\n\n")


def plot_latency(speed: Mapping[str, Any], path: Path) -> Path:
    """p50 latency per variant at each token length, one panel per batch size (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = speed["cells"]
    batches = sorted({c["batch"] for c in cells})
    lengths = sorted({c["tokens"] for c in cells})
    variants = [v for v in VARIANTS if any(v in c for c in cells)]
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 4), squeeze=False)
    width = 0.8 / max(len(variants), 1)
    for ax, b in zip(axes[0], batches):
        for i, v in enumerate(variants):
            ys = [next((c[v]["p50_ms"] for c in cells if c["batch"] == b and c["tokens"] == L and v in c), np.nan) for L in lengths]
            ax.bar(np.arange(len(lengths)) + i * width, ys, width, label=VARIANTS[v])
        ax.set_xticks(np.arange(len(lengths)) + width * (len(variants) - 1) / 2, [str(L) for L in lengths])
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("p50 latency per call (ms)")
        ax.set_title(f"batch {b}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(variants), fontsize="small")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
