"""Service building blocks without a model: config checks, BM25, metrics, queue, upstream client, imports."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from llm_server import FakeLLMServer, Reply
from test_service_support import free_port

from suffice.serving.service.config import ServiceConfigError, load_service_config, read_api_keys
from suffice.serving.service.metrics import ServiceMetrics
from suffice.serving.service.retrievers import BM25Retriever, RetrieverError, available_retrievers, load_retriever
from suffice.serving.service.upstream import UpstreamClient, UpstreamError, public_url

REPO = Path(__file__).resolve().parent.parent


# -- config ---------------------------------------------------------------------------------
def test_shipped_config_loads_with_documented_defaults():
    cfg = load_service_config(REPO / "configs" / "service.yaml")
    sc = cfg.sufficient_context
    assert (sc.thresholds.sufficient, sc.thresholds.partial, sc.min_contexts) == (None, None, 1)  # the bundle's thresholds
    assert (cfg.limits.max_body_bytes, cfg.limits.max_passages, cfg.limits.max_chars) == (1 << 20, 64, 100_000)
    assert cfg.upstream.api_key_env == "SUFFICE_UPSTREAM_API_KEY" and cfg.auth.api_keys_env is None
    assert (cfg.runtime.backend, cfg.runtime.precision) == ("auto", "auto")


@pytest.mark.parametrize("yaml_text, key", [
    ("sufficient_context: {thresholds: {sufficient: 0.4, partial: 0.6}}", "sufficient_context.thresholds"),
    ("sufficient_context: {enabled: maybe}", "sufficient_context.enabled"),
    ("limits: {queue_size: 0}", "limits"),
    ("limits: {max_body: 10}", "limits.max_body"),
    ("upstream: {base_url: ftp://x}", "upstream"),
    ("runtime: {workers: 2.5}", "runtime.workers"),
    ("runtime: {backend: tensorrt}", "runtime: backend='tensorrt': choose one of auto, onnxruntime, openvino"),
    ("runtime: {precision: fp16}", "runtime: precision='fp16'"),
    ("retriever: {options: [1, 2]}", "retriever.options"),
    ("servr: {port: 1}", "servr"),
])
def test_config_errors_name_the_key(tmp_path, yaml_text, key):
    p = tmp_path / "service.yaml"
    p.write_text(yaml_text)
    with pytest.raises(ServiceConfigError) as e:
        load_service_config(p)
    assert key in str(e.value) and str(p) in str(e.value)


def test_config_overrides_and_bad_yaml(tmp_path):
    cfg = load_service_config(None, ["--sufficient_context.decline_insufficient=false", "--upstream.base_url=http://h:1/v1"])
    assert cfg.sufficient_context.decline_insufficient is False and cfg.upstream.base_url == "http://h:1/v1"
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed")
    with pytest.raises(ServiceConfigError, match="not valid YAML"):
        load_service_config(bad)
    with pytest.raises(ServiceConfigError, match="does not exist"):
        load_service_config(tmp_path / "missing.yaml")


def test_api_keys_come_from_the_named_env_var(monkeypatch):
    cfg = load_service_config(None, ["--auth.api_keys_env=TEST_SUFFICE_KEYS"])
    monkeypatch.delenv("TEST_SUFFICE_KEYS", raising=False)
    with pytest.raises(ServiceConfigError, match="auth.api_keys_env"):
        read_api_keys(cfg.auth)  # protected but no keys: refuse to start open
    monkeypatch.setenv("TEST_SUFFICE_KEYS", " k1-secret , k2-secret ")
    assert read_api_keys(cfg.auth) == ["k1-secret", "k2-secret"]


# -- retrievers -----------------------------------------------------------------------------
CORPUS = [
    {"id": "eiffel", "title": "Eiffel Tower", "text": "The Eiffel Tower is a lattice tower in Paris, France."},
    {"id": "louvre", "title": "Louvre", "text": "The Louvre is the world's most visited art museum, in Paris."},
    {"id": "mars", "title": "Mars", "text": "Mars has two small moons, Phobos and Deimos."},
    {"id": "vienna", "title": "Vienna", "text": "The Danube flows through Vienna, the capital of Austria."},
]


def test_bm25_ranks_and_reads_jsonl(tmp_path):
    p = tmp_path / "corpus.jsonl"
    p.write_text("\n".join(json.dumps(d) for d in CORPUS) + "\n\n" + json.dumps("A bare string document about moons.") + "\n")
    r = load_retriever("bm25", {"corpus": str(p)})
    assert len(r) == 5
    hits = r.retrieve("How many moons does Mars have?", k=2)
    assert [h.id for h in hits] == ["mars", "6"] and hits[0].score > hits[1].score > 0
    assert [h.id for h in r.retrieve("Which tower is in Paris?", k=1)] == ["eiffel"]
    assert r.retrieve("zzzz qqqq", k=3) == []
    assert "bm25" in available_retrievers() and load_retriever("none") is None


@pytest.mark.parametrize("line, message", [
    ("{not json", ":2: not valid JSON"),
    ('{"id": "x"}', ":2: 'text' must be a string"),
    ('{"id": "eiffel", "text": "dup"}', ":2: duplicate id 'eiffel'"),
    ('{"text": "t", "body": "b"}', ":2: unknown field(s) ['body']"),
])
def test_bm25_corpus_errors_name_the_line(tmp_path, line, message):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(CORPUS[0]) + "\n" + line + "\n")
    with pytest.raises(RetrieverError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        BM25Retriever(p)


def test_retriever_plugins_by_module_path_and_unknown_names():
    r = load_retriever("test_service_config:make_static_retriever", {"answer": "fixed"})
    assert [d.text for d in r.retrieve("anything", 3)] == ["fixed"]
    with pytest.raises(RetrieverError, match="unknown retriever.name='nope'"):
        load_retriever("nope")
    with pytest.raises(RetrieverError, match="rejected retriever.options"):
        load_retriever("bm25", {"corpus_path": "x"})


def make_static_retriever(answer: str):
    from suffice.serving.service.retrievers import RetrievedDocument

    class Static:
        def retrieve(self, query, k):
            return [RetrievedDocument(id="s", text=answer)]

    return Static()


# -- metrics --------------------------------------------------------------------------------
def test_each_app_has_its_own_registry():
    a, b = ServiceMetrics(), ServiceMetrics()
    a.observe_sufficiency(0.91, "sufficient", 0.003)
    a.observe_request("/v1/sufficiency", "POST", 200, 0.01)
    text_a, text_b = a.render()[0].decode(), b.render()[0].decode()
    assert 'sufficient_context_level_total{level="sufficient"} 1.0' in text_a
    assert 'sufficient_context_level_total{level="sufficient"} 0.0' in text_b
    assert 'http_requests_total{method="POST",route="/v1/sufficiency",status="200"} 1.0' in text_a


# -- backpressure ---------------------------------------------------------------------------
def test_model_queue_refuses_beyond_capacity_and_releases_slots():
    from suffice.serving.service.queue import ModelQueue, QueueFullError

    release = threading.Event()

    async def scenario():
        q = ModelQueue(workers=1, capacity=2)
        first = asyncio.ensure_future(q.run(release.wait, 5))
        second = asyncio.ensure_future(q.run(lambda: "second"))
        await asyncio.sleep(0.05)
        assert q.depth == 2
        with pytest.raises(QueueFullError):
            await q.run(lambda: "third")
        release.set()
        assert await first is True and await second == "second"
        await asyncio.sleep(0.01)
        assert q.depth == 0 and await q.run(lambda: 7) == 7
        q.shutdown()

    asyncio.run(scenario())


# -- upstream client ------------------------------------------------------------------------
def test_public_url_drops_credentials():
    assert public_url("https://u:p@host:9/v1/chat/completions?key=s") == "https://host:9/v1/chat/completions"


def test_upstream_client_maps_failures_and_streams():
    async def scenario(base: str):
        ok = UpstreamClient(base, api_key="sk-upstream-secret", timeout_s=0.5, connect_timeout_s=0.5)
        try:
            answer = await ok.chat({"model": "m", "messages": [{"role": "user", "content": "hello"}]})
            assert answer["choices"][0]["message"]["content"] == "hi there"
            with pytest.raises(UpstreamError) as e500:
                await ok.chat({"model": "m", "messages": [{"role": "user", "content": "boom"}]})
            with pytest.raises(UpstreamError) as eslow:
                await ok.chat({"model": "m", "messages": [{"role": "user", "content": "slow"}]})
            with pytest.raises(UpstreamError) as edrop:
                await ok.chat({"model": "m", "messages": [{"role": "user", "content": "drop"}]})
            stream = await ok.open_stream({"model": "m", "messages": [{"role": "user", "content": "stream me"}]})
            events = [ev async for ev in stream.events()]
            await stream.aclose()
        finally:
            await ok.aclose()
        refused = UpstreamClient(f"http://127.0.0.1:{free_port()}/v1", api_key=None, connect_timeout_s=0.5)
        with pytest.raises(UpstreamError) as eref:
            await refused.chat({"model": "m", "messages": []})
        await refused.aclose()
        return e500.value, eslow.value, edrop.value, eref.value, events

    with FakeLLMServer(default=lambda body: Reply.text("hi there")) as llm:
        llm.on("boom", Reply.error(500), repeat=True)
        llm.on("slow", Reply.text("late", delay_s=2.0), repeat=True)
        llm.on("drop", Reply.drop(), repeat=True)
        llm.on("stream me", Reply.text("streamed answer text"), repeat=True)
        e500, eslow, edrop, eref, events = asyncio.run(scenario(llm.base_url))
        assert llm.requests[0]["headers"]["authorization"] == "Bearer sk-upstream-secret"
    assert (e500.status, e500.code, e500.upstream_status) == (502, "upstream_error", 500) and "HTTP 500" in e500.message
    assert (eslow.status, eslow.code) == (504, "upstream_timeout")
    assert (edrop.status, edrop.code) == (502, "upstream_unreachable")
    assert (eref.status, eref.code) == (502, "upstream_unreachable")
    for e in (e500, eslow, edrop, eref):
        assert "sk-upstream-secret" not in e.message
    assert events[-1].done
    text = "".join(ev.json()["choices"][0]["delta"].get("content", "") for ev in events[:-1])
    assert text == "streamed answer text"


# -- imports --------------------------------------------------------------------------------
def test_service_imports_no_torch_and_serving_does_not_import_the_service():
    code = textwrap.dedent("""
        import sys, json
        import suffice.serving
        before = "suffice.serving.service" in sys.modules
        from suffice.serving.service import create_app, main
        heavy = sorted(m for m in ("torch", "transformers", "peft", "mlflow", "optimum") if m in sys.modules)
        print(json.dumps({"before": before, "heavy": heavy}))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"before": False, "heavy": []}


def test_only_the_service_subpackage_imports_fastapi():
    serving = REPO / "serving"
    offenders = [p.name for p in serving.glob("*.py")
                 if any(tok in p.read_text(encoding="utf-8") for tok in ("import fastapi", "from fastapi", "import uvicorn", "from uvicorn"))]
    assert offenders == []
