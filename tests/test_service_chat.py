"""The chat gateway end to end: real uvicorn, real tiny bundle, a scripted local OpenAI-compatible upstream.

The tiny random model scores every (question, passages) pair at ~0.62, so the three branches are
chosen with thresholds: (0.6, 0.5) -> sufficient, (0.8, 0.5) -> partial, (0.9, 0.8) -> insufficient.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from llm_server import FakeLLMServer, Reply
from test_service_support import BRANCHES, CAVEAT, LONG_PASSAGE, GatewayFactory, ServiceServer, free_port, load_scorer, metric_value

from suffice.serving.service import create_app, load_service_config

UPSTREAM_KEY = "sk-upstream-secret-4242"
ANSWER = "The Eiffel Tower is in Paris."


def chat_body(**extra):
    body = {"model": "fake-llm", "messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Where is the Eiffel Tower?"}],
            "documents": [{"id": "eiffel", "title": "Eiffel Tower", "text": LONG_PASSAGE},
                          "Gustave Eiffel's company built the Eiffel Tower in Paris."],
            "temperature": 0.1}
    body.update(extra)
    return body


@pytest.fixture(scope="module")
def llm():
    with FakeLLMServer(default=lambda body: Reply.text(ANSWER)) as server:
        yield server


@pytest.fixture
def gateway(bundles, llm):
    """gateway(branch, *overrides, base_url=None, retriever=None) -> a started ServiceServer whose thresholds select ``branch``."""
    factory = GatewayFactory(bundles["sufficiency"], llm.base_url, "--upstream.timeout_s=1.0", "--upstream.connect_timeout_s=1.0",
                             upstream_api_key=UPSTREAM_KEY)
    yield factory
    factory.close()


def sse_events(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# -- the three branches ---------------------------------------------------------------------
def test_sufficient_is_forwarded_with_the_context(gateway, llm):
    s = gateway("sufficient")
    llm.reset_counters()
    with s.client() as c:
        r = c.post("/v1/chat/completions", json=chat_body())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == ANSWER
    meta = body["sufficiency"]
    assert meta["level"] == "sufficient" and meta["action"] == "forwarded" and 0.6 <= meta["score"] < 0.8
    assert {f["name"] for f in meta["factors"]} >= {"model"} and meta["documents"]["admitted"] == ["eiffel", "doc-2"]
    sent = llm.requests[-1]
    assert sent["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert sent["body"]["temperature"] == 0.1 and "documents" not in sent["body"] and sent["body"]["model"] == "fake-llm"
    system = sent["body"]["messages"][0]
    assert system["role"] == "system" and "[document:eiffel]" in system["content"] and "Gustave Eiffel" in system["content"]
    assert sent["body"]["messages"][1:] == chat_body()["messages"]


def test_partial_is_forwarded_with_a_caveat(gateway, llm):
    s = gateway("partial")
    with s.client() as c:
        body = c.post("/v1/chat/completions", json=chat_body(model=None)).json()
    assert body["choices"][0]["message"]["content"] == f"{ANSWER}\n\n{CAVEAT}"
    assert body["sufficiency"]["level"] == "partial" and body["sufficiency"]["action"] == "forwarded_with_caveat"
    assert llm.requests[-1]["body"]["model"] == "gpt-4o-mini"  # the configured default model


def test_insufficient_is_declined_with_what_is_missing(gateway, llm):
    s = gateway("insufficient")
    llm.reset_counters()
    with s.client() as c:
        body = c.post("/v1/chat/completions", json=chat_body()).json()
        empty = c.post("/v1/chat/completions", json=chat_body(documents=[])).json()
    assert llm.n_requests == 0  # declined without calling the LLM
    text = body["choices"][0]["message"]["content"]
    assert body["sufficiency"]["level"] == "insufficient" and body["sufficiency"]["action"] == "declined"
    assert "can't answer" in text and "rephras" in text and body["choices"][0]["finish_reason"] == "stop"
    assert all(m in text for m in body["sufficiency"]["missing_aspects"])
    assert empty["sufficiency"]["score"] == 0.0 and "no passage text" in empty["choices"][0]["message"]["content"]


def test_insufficient_forwarded_with_caveat_when_not_declining(gateway, llm):
    s = gateway("insufficient", "--sufficient_context.decline_insufficient=false")
    with s.client() as c:
        body = c.post("/v1/chat/completions", json=chat_body()).json()
    assert body["choices"][0]["message"]["content"].endswith(CAVEAT)
    assert body["sufficiency"]["level"] == "insufficient" and body["sufficiency"]["action"] == "forwarded_with_caveat"


def test_min_contexts_makes_too_few_documents_insufficient(gateway):
    s = gateway("sufficient", "--sufficient_context.min_contexts=3")
    with s.client() as c:
        meta = c.post("/v1/chat/completions", json=chat_body()).json()["sufficiency"]
    assert meta["level"] == "insufficient" and meta["action"] == "declined"
    assert any(f["name"] == "min_contexts" for f in meta["factors"])


def test_bm25_retriever_supplies_documents(gateway, llm, tmp_path):
    from suffice.serving.service.retrievers import load_retriever

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in [
        {"id": "eiffel", "title": "Eiffel Tower", "text": LONG_PASSAGE},
        {"id": "mars", "title": "Mars", "text": "Mars has two small moons, Phobos and Deimos."}]) + "\n")
    s = gateway("sufficient", retriever=load_retriever("bm25", {"corpus": str(corpus)}))
    body = chat_body()
    del body["documents"]
    with s.client() as c:
        meta = c.post("/v1/chat/completions", json=body).json()["sufficiency"]
    assert meta["documents"]["source"] == "retriever" and meta["documents"]["admitted"] == ["eiffel"]
    assert "[document:eiffel]" in llm.requests[-1]["body"]["messages"][0]["content"]


def test_disabled_sufficiency_is_a_plain_proxy(gateway, llm):
    s = gateway("insufficient", "--sufficient_context.enabled=false")
    with s.client() as c:
        body = c.post("/v1/chat/completions", json=chat_body()).json()
    assert body["choices"][0]["message"]["content"] == ANSWER
    assert body["sufficiency"]["action"] == "unscored" and body["sufficiency"]["score"] is None


# -- streaming ------------------------------------------------------------------------------
def test_streaming_passes_chunks_through_with_metadata_last(gateway):
    s = gateway("partial")
    with s.client() as c:
        r = c.post("/v1/chat/completions", json=chat_body(stream=True))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    final = events[-2]
    assert final["choices"] == [] and final["sufficiency"]["level"] == "partial"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2] if e["choices"])
    assert text == f"{ANSWER}\n\n{CAVEAT}"
    finish = [e for e in events[:-2] if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0] is events[-3]  # the caveat comes before the finish chunk


def test_streaming_usage_chunk_stays_last(gateway):
    s = gateway("partial")
    with s.client() as c:
        events = sse_events(c.post("/v1/chat/completions", json=chat_body(stream=True, stream_options={"include_usage": True})).text)
        metrics = c.get("/metrics").text
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] > 0 and "sufficiency" not in events[-2]
    assert events[-3]["choices"] == [] and events[-3]["sufficiency"]["level"] == "partial"
    assert [e for e in events[:-1] if "sufficiency" in e] == [events[-3]]
    assert metric_value(metrics, "chat_gateway_outcomes_total", {"outcome": "forwarded_with_caveat"}) == 1


def test_streaming_decline(gateway):
    s = gateway("insufficient")
    with s.client() as c:
        events = sse_events(c.post("/v1/chat/completions", json=chat_body(stream=True)).text)
    assert events[-1] == "[DONE]" and events[-2]["sufficiency"]["action"] == "declined"
    assert "can't answer" in "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2] if e["choices"])


# -- upstream failures ----------------------------------------------------------------------
def test_upstream_failures_map_to_502_504_and_log_the_verdict(gateway, llm, caplog):
    caplog.set_level(logging.INFO, logger="suffice.service")
    llm.on("UPSTREAM-500", Reply.error(500), repeat=True)
    llm.on("UPSTREAM-SLOW", Reply.text("late", delay_s=3.0), repeat=True)
    llm.on("UPSTREAM-DROP", Reply.drop(), repeat=True)
    llm.on("UPSTREAM-LEAK", Reply.error(401, body={"error": {"message": f"bad key {UPSTREAM_KEY}"}}), repeat=True)
    s = gateway("partial")

    def ask(c, tag, **kw):
        body = chat_body(**kw)
        body["messages"][-1]["content"] += f" {tag}"
        return c.post("/v1/chat/completions", json=body)

    with s.client() as c:
        r500, slow, drop, leak = (ask(c, t) for t in ("UPSTREAM-500", "UPSTREAM-SLOW", "UPSTREAM-DROP", "UPSTREAM-LEAK"))
        stream500 = ask(c, "UPSTREAM-500", stream=True)
        metrics = c.get("/metrics").text
    assert r500.status_code == 502 and r500.json()["error"]["code"] == "upstream_error" and r500.json()["upstream_status"] == 500
    assert r500.json()["sufficiency"]["level"] == "partial"
    assert slow.status_code == 504 and slow.json()["error"]["code"] == "upstream_timeout"
    assert drop.status_code == 502 and drop.json()["error"]["code"] == "upstream_unreachable"
    assert leak.status_code == 502 and "[REDACTED]" in leak.text
    assert stream500.status_code == 502 and stream500.headers["content-type"].startswith("application/json")
    for r in (r500, slow, drop, leak, stream500):
        assert UPSTREAM_KEY not in r.text
    assert UPSTREAM_KEY not in caplog.text
    failures = [rec.getMessage() for rec in caplog.records if "upstream failure" in rec.getMessage()]
    assert len(failures) == 5 and all("level=partial" in m and "score=0.6" in m for m in failures)
    assert metric_value(metrics, "upstream_errors_total", {"kind": "upstream_timeout"}) == 1
    assert metric_value(metrics, "http_requests_total", {"route": "/v1/chat/completions", "status": "502"}) == 4
    # a failed upstream call is no forwarded answer
    assert metric_value(metrics, "chat_gateway_outcomes_total", {"outcome": "upstream_failed"}) == 5
    assert metric_value(metrics, "chat_gateway_outcomes_total", {"outcome": "forwarded_with_caveat"}) == 0


def test_refused_upstream_is_502(gateway):
    s = gateway("sufficient", base_url=f"http://127.0.0.1:{free_port()}/v1")
    with s.client() as c:
        r = c.post("/v1/chat/completions", json=chat_body())
    assert r.status_code == 502 and "cannot reach the upstream" in r.json()["error"]["message"]
    assert "127.0.0.1" not in r.text  # the upstream's address stays in the service log


def test_chat_bad_input(gateway):
    s = gateway("partial")
    with s.client() as c:
        assert c.post("/v1/chat/completions", json={"messages": []}).status_code == 422
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "assistant", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["sufficiency"]["level"] == "unscored"  # no user turn: nothing to score
        assert "no user message" in r.json()["sufficiency"]["reason"]
        r = c.post("/v1/chat/completions", json=chat_body(documents=["d"] * 65))
        assert r.status_code == 413 and "documents" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json=chat_body(documents=[{"id": 1, "text": "a"}, {"id": 1, "text": "b"}]))
        assert r.status_code == 409 and r.json()["error"]["code"] == "duplicate_ids" and r.json()["error"]["param"] == "documents"


# -- shutdown -------------------------------------------------------------------------------
def test_shutdown_drains_in_flight_requests(gateway, llm):
    llm.on("SLOW-DRAIN", Reply.text("finished after the shutdown began", delay_s=0.8), repeat=True)
    s = gateway("sufficient", "--upstream.timeout_s=5")
    body = chat_body()
    body["messages"][-1]["content"] += " SLOW-DRAIN"
    result: dict = {}

    def call():
        with s.client() as c:
            result["r"] = c.post("/v1/chat/completions", json=body)

    t = threading.Thread(target=call)
    t.start()
    # wait for *this* request upstream (an earlier test's slow reply may still hold the module's fake LLM)
    def arrived() -> bool:
        return any("SLOW-DRAIN" in json.dumps(r["body"]) for r in list(llm.requests))

    deadline = time.monotonic() + 20
    while not arrived() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert arrived() and llm.in_flight >= 1
    url = s.url
    t0 = time.monotonic()
    s.stop()  # like SIGTERM: stop accepting, finish what is in flight
    t.join(10)
    assert result["r"].status_code == 200 and result["r"].json()["choices"][0]["message"]["content"] == "finished after the shutdown began"
    assert time.monotonic() - t0 >= 0.3
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/healthz", timeout=2)


def test_stream_that_breaks_midway_ends_with_an_error_event(bundles):
    first = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": "The Eiffel"}, "finish_reason": None}]}

    class BrokenStream(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield f"data: {json.dumps(first)}\n\n".encode()
            raise httpx.ReadError("connection reset by peer")

    transport = httpx.MockTransport(lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=BrokenStream()))
    cfg = load_service_config(None, ["--upstream.base_url=http://upstream.invalid/v1", "--context_gate.model_weight=0.0",
                                     "--sufficient_context.thresholds.sufficient=0.6"])
    app = create_app(cfg, load_scorer(bundles["sufficiency"], 0.6, 0.5), api_keys=[], upstream_api_key=None, upstream_transport=transport)
    with ServiceServer(app) as s, s.client() as c:
        r = c.post("/v1/chat/completions", json=chat_body(stream=True))
    events = sse_events(r.text)
    assert r.status_code == 200 and events[0]["choices"][0]["delta"]["content"] == "The Eiffel"
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "upstream_unreachable"
    assert events[-2]["sufficiency"]["level"] == "sufficient"
