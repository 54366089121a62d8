"""Which calibration serves every source: pooled vs source-balanced, temperature vs Platt (issue 22, "ECE <= 0.05 on each source").

    flock /tmp/cpu-heavy.lock python benchmarks/bench_calibration.py --model-dir models/demo [--model-dir DIR ...] \\
        [--prepared-dir ../other-tree/data] [--out benchmarks/results/2026-11-28]

For each trained-model directory: its validation and test rows (the prepared dataset its
``train_config.yaml`` names; the one whose ``data_hash`` equals the model's is preferred among
``--prepared-dir`` folders, else the default prepared folder) are scored ONCE with the torch model
(raw logits, :func:`suffice.training.evaluation.evaluate.model_dir_logits`). Then each variant
(:data:`VARIANTS`: the pooled temperature of today, the source-balanced temperature, pooled and
source-balanced Platt) is fitted on VALIDATION only, with the code training runs
(:func:`suffice.training.fit.calibration.fit_calibration`), and measured on validation and test
per source: ECE, macro-F1 at the 0.5 decision, coverage and precision at the 0.8 "sufficient"
threshold.

Selection uses validation only: the lowest worst per-source validation ECE over the real sources
(synthetic ones left out: they never go to test), today's variant winning ties. Its test numbers
are reported once, next to every other variant's for context. Output: ``calibration-<model>.json``
per model and ``calibration.md`` (the short table, over every ``calibration-*.json`` in ``--out``). Nothing is written anywhere
else (datasets caching is off: the prepared folders are only read).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from suffice.training.data.schema import is_synthetic_source

# name -> (calibration.pool, calibration.method); the first is today's default
VARIANTS = {
    "pooled-temperature": ("pooled", "temperature"),
    "balanced-temperature": ("source_balanced", "temperature"),
    "pooled-platt": ("pooled", "platt"),
    "balanced-platt": ("source_balanced", "platt"),
    "real-temperature": ("real", "temperature"),
    "real-platt": ("real", "platt"),
}
TODAY = "pooled-temperature"
SUFFICIENT = 0.8
SELECTION_RULE = ("lowest worst per-source validation ECE over the real sources (synthetic ones never go to test); "
                  "today's pooled temperature wins ties; test is reported, never used to choose.")


def source_table(scores: np.ndarray, labels: np.ndarray, sources: Sequence[str], ece_bins: int,
                 sufficient: float = SUFFICIENT) -> dict[str, dict[str, float]]:
    """Per source and ``overall``: n, ECE, macro-F1 at 0.5, AUROC, mean score and positive rate, coverage /
    precision at ``sufficient``.

    >>> t = source_table(np.array([0.9, 0.2, 0.85, 0.4]), np.array([1, 0, 0, 1]), ["a", "a", "b", "b"], 15)
    >>> t["a"]["macro_f1"], t["b"]["coverage_at_sufficient"], t["overall"]["precision_at_sufficient"]
    (1.0, 0.5, 0.5)
    """
    from suffice.training.evaluation.metrics import per_source_metrics
    from suffice.training.fit.calibration import decisiveness

    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    probs = np.stack([1 - scores, scores], axis=1)
    table = per_source_metrics(probs, labels, list(sources), label_names=["insufficient", "sufficient"], positive_index=1,
                               predictions=(scores >= 0.5).astype(int), ece_bins=ece_bins)
    src = np.asarray(list(sources), dtype=object)
    out = {}
    for name, m in table.items():
        sel = np.ones(len(src), dtype=bool) if name == "overall" else src == name
        d = decisiveness(scores[sel], labels[sel], sufficient)
        # mean score vs positive rate: a gap of opposite signs in two sources is one no global (monotone) map can close
        out[name] = {"n": int(m["n"]), "ece": m.get("ece"), "macro_f1": m.get("macro_f1"), "auroc": m.get("auroc"),
                     "mean_score": float(scores[sel].mean()) if sel.any() else float("nan"), "positive_rate": m.get("positive_rate"),
                     "coverage_at_sufficient": d["coverage_at_sufficient"], "precision_at_sufficient": d["precision_at_sufficient"]}
    return out


def real_eces(table: Mapping[str, Mapping[str, Any]]) -> list[float]:
    """The per-source ECEs of the real sources (``overall`` left out)."""
    return [float(m["ece"]) for s, m in table.items() if s != "overall" and not is_synthetic_source(s) and m["ece"] is not None and np.isfinite(m["ece"])]


def worst_real_ece(table: Mapping[str, Mapping[str, Any]]) -> float:
    """The largest per-source ECE over the real sources: what "ECE <= 0.05 on each source" is read against."""
    values = real_eces(table)
    return float(max(values)) if values else float("nan")


def compare_variants(val: Mapping[str, Any], test: Mapping[str, Any] | None, positive_index: int = 1,
                     ece_bins: int = 15) -> dict[str, Any]:
    """Fit every variant on ``val`` (``{logits, labels, sources}``), measure it on val and ``test``, select on val.

    >>> rng = np.random.default_rng(0); z = rng.normal(0, 2, (200, 2)); y = (z[:, 1] > z[:, 0]).astype(int)
    >>> split = {"logits": z, "labels": y, "sources": ["a"] * 150 + ["b"] * 50}
    >>> r = compare_variants(split, split)
    >>> sorted(r["variants"]) == sorted(VARIANTS) and r["selected"] in VARIANTS
    True
    """
    from suffice.training.fit.calibration import CalibrationSettings, fit_calibration

    out: dict[str, Any] = {"variants": {}}
    for name, (pool, method) in VARIANTS.items():
        cal = fit_calibration(CalibrationSettings(method=method, pool=pool), val["logits"], val["labels"], val["sources"], positive_index)
        row: dict[str, Any] = {"pool": pool, "method": method, "calibration": cal.to_record(),
                               "validation": source_table(cal.scores(val["logits"], positive_index), val["labels"], val["sources"], ece_bins)}
        row["validation_worst_real_ece"] = worst_real_ece(row["validation"])
        row["validation_mean_real_ece"] = float(np.mean(real_eces(row["validation"]) or [np.nan]))
        if test is not None:
            row["test"] = source_table(cal.scores(test["logits"], positive_index), test["labels"], test["sources"], ece_bins)
            row["test_worst_real_ece"] = worst_real_ece(row["test"])
        out["variants"][name] = row
    best = TODAY
    for name, row in out["variants"].items():  # strict <: today's variant wins ties
        if row["validation_worst_real_ece"] < out["variants"][best]["validation_worst_real_ece"]:
            best = name
    out["selected"] = best
    out["selection_rule"] = SELECTION_RULE
    return out


def find_prepared(name: str, data_hash: str | None, prepared_dirs: Sequence[Path]) -> Path | None:
    """The prepared dataset folder ``<dir>/<name>`` whose manifest's data_hash is the model's, first found."""
    for d in prepared_dirs:
        p = Path(d) / name / "manifest.json"
        if p.is_file() and json.loads(p.read_text()).get("data_hash") == data_hash:
            return p.parent
    return None


def score_model(model_dir: Path, prepared_dirs: Sequence[Path], batch_size: int = 64, cache: Path | None = None) -> dict[str, Any]:
    """Raw logits, labels and sources of ``model_dir``'s validation and test rows (the slow part: once per model;
    ``cache``: a folder keeping the logits as ``<split>.npz``, read back on the next run)."""
    import datasets

    from suffice.serving.bundle import sha256_file
    from suffice.serving.packing import ContextPacker
    from suffice.training.data.builder import load_prepared
    from suffice.training.evaluation import evaluate as ev
    from suffice.training.fit.encode import encode_split, subsample
    from suffice.training.fit.meta import ModelMeta
    from suffice.training.fit.model import load_tokenizer

    datasets.disable_caching()  # encoded copies stay in memory: the prepared folders are only read
    datasets.disable_progress_bars()
    t0 = time.perf_counter()
    info = ev.model_info(model_dir)
    meta = ModelMeta.read(model_dir)
    cfg, config_used = ev.eval_config(info, model_dir, None, [])
    found = find_prepared(cfg.data_config().name, meta.data_hash, prepared_dirs) if not cfg.train_file else None
    if found is not None:
        dsd, manifest = load_prepared(found)
        splits = {"validation": dsd["validation"], "test": dsd["test"] if "test" in dsd else None}
        data_hash = manifest.get("data_hash")
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_quality import load_splits_readonly

        s = load_splits_readonly(cfg)
        splits, data_hash = {"validation": s.validation, "test": s.test}, s.data_hash
    packer = ContextPacker(load_tokenizer(model_dir), max_length=info["max_length"], strategy=info["strategy"])
    tok_hash = sha256_file(model_dir / "tokenizer.json")
    out: dict[str, Any] = {"model_dir": str(model_dir), "config": config_used, "prepared": str(found) if found else "default",
                           "data_hash": data_hash, "data_hash_matches_model": data_hash == meta.data_hash,
                           "stored_calibration": meta.calibrator.to_record(), "positive_index": meta.positive_index,
                           "ece_bins": cfg.calibration.ece_bins, "run_id": (meta.mlflow or {}).get("run_id")}
    for split in ("validation", "test"):
        if splits[split] is None or len(splits[split]) == 0:
            out[split] = None
            continue
        # the rows training calibrated and tested on (max_eval_items samples them the same way)
        enc = encode_split(subsample(splits[split], cfg.max_eval_items, cfg.seed), packer, cfg, tok_hash)
        cached = cache / f"{split}.npz" if cache else None
        t1 = time.perf_counter()
        if cached is not None and cached.is_file():
            logits = np.load(cached)["logits"]
        else:
            logits = ev.model_dir_logits(model_dir, enc, batch_size, packer.pad_id)
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                np.savez(cached, logits=logits)
        out[split] = {"logits": logits, "labels": np.asarray(enc["labels"]), "sources": list(enc["source"]),
                      "scoring_seconds": time.perf_counter() - t1, "from_cache": cached is not None and cached.is_file()}
    out["seconds"] = time.perf_counter() - t0
    return out


def npz_runs(path: Path) -> dict[str, dict[str, Any]]:
    """Runs of a GPU sweep's returned logits (``benchmarks/student_sweep/``: ``val_label``, ``val_source``,
    ``<run>__val__<epoch>``...), each at the epoch ``student_sweep/report.py`` selects: the best mean
    validation macro-F1 over sources at the raw 0.5 decision (validation only)."""
    from suffice.serving.calibration import softmax

    z = np.load(path)
    val_y, test_y = z["val_label"].astype(int), z["test_label"].astype(int)
    val_s, test_s = [str(x) for x in z["val_source"]], [str(x) for x in z["test_source"]]
    epochs: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for k in z.files:
        if k.count("__") == 2:
            name, split, ep = k.split("__")
            epochs.setdefault(name, {}).setdefault(int(ep), {})[split] = z[k].astype(np.float64)

    def val_mean(logits: np.ndarray) -> float:
        table = source_table(softmax(logits)[:, 1], val_y, val_s, 15)
        return float(np.mean([m["macro_f1"] for s, m in table.items() if s != "overall"]))

    out = {}
    for name, by_epoch in epochs.items():
        best = max(by_epoch, key=lambda ep: val_mean(by_epoch[ep]["val"]))
        out[name] = {"epoch": best, "validation": {"logits": by_epoch[best]["val"], "labels": val_y, "sources": val_s},
                     "test": {"logits": by_epoch[best]["test"], "labels": test_y, "sources": test_s}}
    return out


def machine() -> dict[str, Any]:
    from suffice.serving.cpu import detect

    cpu = detect()
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), "unknown") if Path("/proc/cpuinfo").is_file() else "unknown"
    return {"cpu_model": model, "isa": cpu.describe(), "cores": os.cpu_count(), "load_average": list(os.getloadavg())}


def _f(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:.3f}"


def markdown(results: Sequence[Mapping[str, Any]]) -> str:
    """The short table: per model and variant, the worst real-source validation ECE, test ECE per source,
    test macro-F1 at 0.5 and coverage / precision at 0.8 (overall)."""
    lines = ["# Calibration variants: fitted on validation, selected on validation, reported on test\n",
             "Selection: " + SELECTION_RULE + "\n"]
    for r in results:
        cmp_, mach = r["comparison"], r["machine"]
        test_sources = sorted(s for s in next(iter(cmp_["variants"].values())).get("test", {}) if s != "overall")
        where = (f"run {r.get('run_id') or '-'}; data hash matches the model's: {r['data_hash_matches_model']}" if "model_dir" in r
                 else f"GPU sweep logits {r['logits_npz']}, validation-selected epoch {r['epoch']}")
        lines += [f"## {r['name']} ({where}; {r['n_validation']} validation / {r['n_test']} test items)\n",
                  f"`{r['command']}`: {mach['isa']}; busy (shared 2-core machine, load average "
                  f"{mach['load_average'][0]:.1f} at start).\n",
                  f"Selected on validation: **{cmp_['selected']}**.\n",
                  "| variant | fitted | val ECE worst / mean (real sources) | " + " | ".join(f"test ECE {s}" for s in test_sources)
                  + " | test macro-F1 | test cov@0.8 | test prec@0.8 |",
                  "|---|---|---|" + "---|" * len(test_sources) + "---|---|---|"]
        for name, v in cmp_["variants"].items():
            c = v["calibration"]
            params = f"T={c['temperature']:.3f}" if c["method"] == "temperature" else f"a={c['platt']['a']:.3f} b={c['platt']['b']:.3f}"
            t = v.get("test") or {}
            mark = " (selected)" if name == cmp_["selected"] else ""
            lines.append(f"| {name}{mark} | {params} | {_f(v['validation_worst_real_ece'])} / {_f(v.get('validation_mean_real_ece'))} | "
                         + " | ".join(_f(t.get(s, {}).get("ece")) for s in test_sources)
                         + f" | {_f(t.get('overall', {}).get('macro_f1'))} | {_f(t.get('overall', {}).get('coverage_at_sufficient'))}"
                         f" | {_f(t.get('overall', {}).get('precision_at_sufficient'))} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", action="append", default=[], help="trained-model directory (suffice_model.json); repeat for more")
    ap.add_argument("--logits-npz", action="append", default=[],
                    help="a GPU sweep's returned logits (benchmarks/student_sweep/ format): every run in it, at its validation-selected epoch")
    ap.add_argument("--prepared-dir", action="append", default=[], help="folders holding prepared datasets (<dir>/<name>/manifest.json)")
    ap.add_argument("--out", default="benchmarks/results/2026-11-28", help="where calibration-<model>.json and calibration.md go")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--logits-cache", help="keep each model's logits under DIR/<model>/<split>.npz and reuse them (refits without rescoring)")
    args = ap.parse_args(argv)
    from suffice.serving.jsonl import json_safe

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_calibration.py " + " ".join(sys.argv[1:] if argv is None else argv)
    for d in args.model_dir:
        mach = machine()
        cache = Path(args.logits_cache) / Path(d).name if args.logits_cache else None
        scored = score_model(Path(d), [Path(p) for p in args.prepared_dir], args.batch_size, cache)
        cmp_ = compare_variants(scored["validation"], scored["test"], scored["positive_index"], scored["ece_bins"])
        r = {k: v for k, v in scored.items() if k not in ("validation", "test")}
        mach["load_average_end"] = list(os.getloadavg())
        r.update(command=command, machine=mach, comparison=cmp_, n_validation=len(scored["validation"]["labels"]),
                 n_test=len(scored["test"]["labels"]) if scored["test"] else 0,
                 scoring_seconds={s: scored[s]["scoring_seconds"] for s in ("validation", "test") if scored[s]})
        r["name"] = Path(d).name
        (out / f"calibration-{Path(d).name}.json").write_text(json.dumps(json_safe(r), indent=2) + "\n")
        print(f"{d}: stored calibration {scored['stored_calibration']}; selected {cmp_['selected']}; " + ", ".join(f"{n}: val worst real ECE {v['validation_worst_real_ece']:.3f}"
                                                           for n, v in cmp_["variants"].items()), flush=True)
    for f in args.logits_npz:
        for name, run in npz_runs(Path(f)).items():
            cmp_ = compare_variants(run["validation"], run["test"])
            r = {"name": name, "logits_npz": str(f), "epoch": run["epoch"], "command": command, "machine": machine(), "comparison": cmp_,
                 "n_validation": len(run["validation"]["labels"]), "n_test": len(run["test"]["labels"])}
            (out / f"calibration-{name}.json").write_text(json.dumps(json_safe(r), indent=2) + "\n")
            print(f"{name} (epoch {run['epoch']}): selected {cmp_['selected']}; " + ", ".join(
                f"{n}: val worst real ECE {v['validation_worst_real_ece']:.3f}" for n, v in cmp_["variants"].items()), flush=True)
    if not (args.model_dir or args.logits_npz):
        ap.error("give at least one --model-dir or --logits-npz")
    # every model measured into this folder so far, this run's and earlier ones'
    results = [json.loads(p.read_text()) for p in sorted(out.glob("calibration-*.json"))]
    (out / "calibration.md").write_text(markdown(results))
    print(f"wrote {out / 'calibration.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
