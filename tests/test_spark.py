"""Scale-out on Spark: ``mlflow.pyfunc.spark_udf(spark, "models:/suffice-sufficiency@production")`` on a
local session with two workers scores a partitioned DataFrame exactly like the direct scorer.

Needs the ``[spark]`` extra (pyspark) and a Java runtime (``apt-get install openjdk-17-jre-headless``);
skipped with the reason otherwise. Slow (a JVM and Python workers start): ``pytest -m slow tests/test_spark.py``.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import pytest

from pyfunc_support import MIXED_ROWS, as_scorer_input, mlflow_store, shared_store, tiny_bundle

pytestmark = pytest.mark.slow

pytest.importorskip("optimum")
pytest.importorskip("mlflow")
pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'suffice[spark]'")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("no Java runtime for Spark: apt-get install openjdk-17-jre-headless (or set JAVA_HOME)", allow_module_level=True)

URI = "models:/suffice-sufficiency@production"


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this interpreter
    session = (SparkSession.builder.master("local[2]").appName("suffice-spark-test")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2").config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .getOrCreate())
    yield session
    session.stop()


def _rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        r = MIXED_ROWS[i % len(MIXED_ROWS)]
        out.append({"id": i, "question": r["question"] if i < len(MIXED_ROWS) else f"{r['question']} ({i})", **{k: v for k, v in r.items() if k != "question"}})
    return out


def test_spark_udf_through_the_registry_alias_equals_the_direct_scorer(spark, tiny_bert_dir, tmp_path_factory, monkeypatch):
    import mlflow
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from suffice.serving import ScorerConfig, SufficiencyScorer

    bundle = tiny_bundle(tmp_path_factory, tiny_bert_dir)
    root, _, _ = shared_store(tmp_path_factory, bundle)
    rows = _rows(60)
    passage = T.StructType([T.StructField("title", T.StringType()), T.StructField("text", T.StringType())])
    structs = T.StructType([T.StructField("id", T.LongType()), T.StructField("question", T.StringType()),
                            T.StructField("passages", T.ArrayType(passage)), T.StructField("context", T.StringType())])
    strings = T.StructType([T.StructField("id", T.LongType()), T.StructField("question", T.StringType()),
                            T.StructField("passages", T.ArrayType(T.StringType()))])
    as_struct = [{"id": r["id"], "question": r["question"], "context": r.get("context"),
                  "passages": None if "passages" not in r else [p if isinstance(p, dict) else {"title": "", "text": p} for p in r["passages"]]}
                 for r in rows]
    as_strings = [{"id": r["id"], "question": r["question"],
                   "passages": [p["text"] if isinstance(p, dict) else p for p in r.get("passages") or ([r["context"]] if r.get("context") else [])]}
                  for r in rows]

    with mlflow_store(root, monkeypatch):
        # fp32: scores do not depend on which rows share an ONNX batch, so partitions cannot move them
        udf = mlflow.pyfunc.spark_udf(spark, URI, env_manager="local", model_config={"precision": "fp32", "intra_op_threads": 1})
    direct = SufficiencyScorer.load(bundle, ScorerConfig(precision="fp32"))

    for data, schema, cols in ((as_struct, structs, ["question", "passages", "context"]), (as_strings, strings, ["question", "passages"])):
        df = spark.createDataFrame(data, schema).repartition(2)
        assert df.rdd.getNumPartitions() == 2
        scored = df.withColumn("r", udf(F.struct(*cols))).select("id", "r.score", "r.level", "r.latency_ms").orderBy("id").collect()
        assert [s["id"] for s in scored] == list(range(len(rows)))
        q, p = as_scorer_input([{k: v for k, v in d.items() if k != "id"} for d in data])
        want = direct.score_batch(q, p)
        np.testing.assert_allclose([s["score"] for s in scored], [w.score for w in want], atol=1e-5)
        assert [s["level"] for s in scored] == [w.level for w in want]
        assert all(s["latency_ms"] >= 0 for s in scored)
