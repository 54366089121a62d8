"""Spark scale-out: rows/s of ``mlflow.pyfunc.spark_udf(spark, "models:/suffice-sufficiency@production")``
on a local Spark session at 1 and 2 workers, next to the direct scorer in one process.

The bundle is registered in a throw-away MLflow store (so the registry alias path is the one
timed), the input is the shared items (real questions, 1 to 20 passages each), each Spark worker
runs ONNX Runtime on one thread (``model_config={"intra_op_threads": 1}``), so ``local[N]``
uses N cores. Every run is checked against the direct scorer (max |score difference|). Timings
on a shared machine are noisy: the load average before and after is recorded.

    python benchmarks/bench_spark.py --bundle models/demo-20261124-215259/bundle --out bench_spark.json
    python benchmarks/bench_spark.py --bundle bundles/v3 --workers 1 2 4 --rows 20000

Needs the ``[spark]`` extra and a Java runtime (``apt-get install openjdk-17-jre-headless``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def default_bundle() -> Path:
    found = sorted(REPO.glob("models/*/bundle/suffice.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit("no trained bundle under models/*/bundle: run `make demo` (or `suffice export`) and pass --bundle DIR")
    return found[-1].parent


def load_rows(path: Path, n: int | None) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                rows.append({"question": d["question"],
                             "passages": [{"title": p.get("title") or "", "text": p.get("text") or ""} for p in d["passages"]]})
    if n and n < len(rows):  # evenly spaced, so every source (and context length) is in the sample
        rows = [dict(rows[(i * len(rows)) // n]) for i in range(n)]
    elif n:
        rows = [dict(rows[i % len(rows)]) for i in range(n)]
    for i, r in enumerate(rows):
        r["id"] = i
    return rows


def cpu_info() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    return {"cpu": model, "logical_cpus": os.cpu_count(), "affinity_cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "load_avg": [round(x, 2) for x in os.getloadavg()]}


def direct_run(bundle: Path, rows: list[dict], threads: int) -> dict:
    from suffice.serving import ScorerConfig, SufficiencyScorer

    scorer = SufficiencyScorer.load(bundle, ScorerConfig(intra_op_threads=threads))
    scorer.score_batch([r["question"] for r in rows[:32]], [r["passages"] for r in rows[:32]])  # warm-up
    t = time.perf_counter()
    res = scorer.score_batch([r["question"] for r in rows], [r["passages"] for r in rows])
    dt = time.perf_counter() - t
    return {"threads": threads, "seconds": round(dt, 2), "rows_per_s": round(len(rows) / dt, 1),
            "scores": [r.score for r in res], "precision": scorer.precision}


def spark_run(uri: str, rows: list[dict], workers: int, threads: int, partitions_per_worker: int) -> dict:
    import mlflow
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    spark = (SparkSession.builder.master(f"local[{workers}]").appName(f"suffice-bench-{workers}")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.memory", "4g").config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    try:
        passage = T.StructType([T.StructField("title", T.StringType()), T.StructField("text", T.StringType())])
        schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("question", T.StringType()),
                               T.StructField("passages", T.ArrayType(passage))])
        parts = workers * partitions_per_worker
        df = spark.createDataFrame(rows, schema).repartition(parts).cache()
        n = df.count()
        udf = mlflow.pyfunc.spark_udf(spark, uri, env_manager="local", model_config={"intra_op_threads": threads})
        # warm-up: every worker loads the model once (Python workers are reused across tasks)
        warm = spark.createDataFrame(rows[: parts * 4], schema).repartition(parts)
        warm.withColumn("r", udf(F.struct("question", "passages"))).select("r.score").collect()
        t = time.perf_counter()
        scored = df.withColumn("r", udf(F.struct("question", "passages"))).select("id", "r.score").collect()
        dt = time.perf_counter() - t
        by_id = {r["id"]: r["score"] for r in scored}
        return {"workers": workers, "partitions": parts, "threads_per_worker": threads, "rows": n, "seconds": round(dt, 2),
                "rows_per_s": round(n / dt, 1), "scores": [by_id[i] for i in range(n)]}
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", help="bundle folder (default: the newest models/*/bundle, as `make demo` writes)")
    ap.add_argument("--input", help="JSONL of items (default: items.jsonl of the shared data)")
    ap.add_argument("--rows", type=int, default=None, help="rows to score (default: every item; fewer samples them evenly, more repeats them)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime threads per Spark worker")
    ap.add_argument("--partitions-per-worker", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the JSON report here too")
    args = ap.parse_args(argv)

    from suffice.training.paths import data_dir

    bundle = Path(args.bundle) if args.bundle else default_bundle()
    src = Path(args.input) if args.input else data_dir() / "items.jsonl"
    rows = load_rows(src, args.rows)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report: dict = {"bundle": str(bundle), "input": str(src), "rows": len(rows), "host_before": cpu_info()}
    with tempfile.TemporaryDirectory(prefix="suffice-bench-spark-") as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        os.environ["SUFFICE_MLRUNS_DIR"] = tmp
        from suffice.serving import read_manifest
        from suffice.training.export import registry

        local = Path(tmp) / "bundle"
        shutil.copytree(bundle, local)
        # a run of the throw-away store (the manifest's run id belongs to the store the model was trained in)
        client = registry.mlflow_client()
        run_id = client.create_run(client.create_experiment("bench-spark", artifact_location=(Path(tmp) / "artifacts").as_uri())).info.run_id
        name, version = registry.register_bundle(local, run_id=run_id)
        registry.promote(name, version, "production")
        uri = f"models:/{name}@production"
        m = read_manifest(local)
        report["model"] = {"uri": uri, "version": version, "base_model": m.base_model, "max_length": m.max_length,
                           "int8": bool(m.int8_model_file), "strategy": m.long_context_strategy}
        print(f"bench_spark: {len(rows)} rows from {src}; bundle {bundle} ({m.base_model}, window {m.max_length}) as {uri}", file=sys.stderr)

        direct = direct_run(local, rows, threads=1)
        print(f"bench_spark: direct scorer, 1 thread: {direct['rows_per_s']} rows/s", file=sys.stderr)
        runs = []
        for w in args.workers:
            r = spark_run(uri, rows, w, args.threads, args.partitions_per_worker)
            r["max_abs_diff_vs_direct"] = max(abs(a - b) for a, b in zip(r.pop("scores"), direct["scores"]))
            runs.append(r)
            print(f"bench_spark: local[{w}]: {r['rows_per_s']} rows/s ({r['seconds']} s; max |diff| vs direct "
                  f"{r['max_abs_diff_vs_direct']:.2g})", file=sys.stderr)
        direct.pop("scores")
    report.update(direct=direct, spark=runs, host_after=cpu_info())
    if len(runs) > 1:
        report["speedup"] = {f"local[{r['workers']}]": round(r["rows_per_s"] / runs[0]["rows_per_s"], 2) for r in runs}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
