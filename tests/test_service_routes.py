"""Every route of the service through a real uvicorn server on 127.0.0.1, on a real tiny bundle."""

from __future__ import annotations

import logging
import threading
import time

import pytest

pytest.importorskip("fastapi")

from test_service_support import LONG_PASSAGE, ServiceServer, load_scorer, metric_value

from suffice.serving.service import create_app, load_service_config

Q = "Where is the Eiffel Tower?"
PASSAGES = [{"title": "Eiffel Tower", "text": LONG_PASSAGE}, "Paris is the capital of France."]


@pytest.fixture(scope="module")
def scorer(bundles):
    return load_scorer(bundles["sufficiency"])


@pytest.fixture(scope="module")
def gate(bundles):
    from suffice.serving import RetrievalGate

    return RetrievalGate.load(bundles["retrieval_gate"])


@pytest.fixture(scope="module")
def server(scorer, gate):
    cfg = load_service_config(None, ["--context_gate.model_weight=0.0"])
    with ServiceServer(create_app(cfg, scorer, retrieval_gate=gate, api_keys=[], upstream_api_key=None)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with server.client() as c:
        yield c


# -- the routes -----------------------------------------------------------------------------
def test_sufficiency_matches_the_library_and_names_the_model(client, scorer):
    r = client.post("/v1/sufficiency", json={"question": Q, "passages": PASSAGES})
    assert r.status_code == 200, r.text
    body = r.json()
    direct = scorer.score(Q, PASSAGES)
    assert body["score"] == pytest.approx(direct.score, abs=1e-6) and body["level"] == direct.level == "partial"
    assert body["model_version"] == "sha256:" + scorer.manifest.files["model.onnx"][:12]
    assert body["missing_aspects"] and {f["name"] for f in body["confidence_factors"]} >= {"model"}
    assert set(body) == {"score", "level", "missing_aspects", "confidence_factors", "latency_ms", "model_version"}
    assert body["latency_ms"] > 0


def test_sufficiency_batch_form_keeps_order(client, scorer):
    items = [{"question": Q, "passages": PASSAGES}, {"question": "Who wrote Dracula?", "passages": []},
             {"question": "How many moons does Mars have?", "passages": ["Mars has two moons."]}]
    r = client.post("/v1/sufficiency", json=items)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [o["level"] for o in out] == ["partial", "insufficient", "partial"]
    assert out[1]["score"] == 0.0 and "any context" in out[1]["missing_aspects"][0]
    assert out[2]["score"] == pytest.approx(scorer.score(items[2]["question"], items[2]["passages"]).score, abs=1e-5)
    assert client.post("/v1/sufficiency", json=[]).json() == []


def test_context_gate_admits_excludes_with_reasons(client):
    arts = [{"id": "sys", "kind": "system", "content": "You answer questions about Paris."},
            {"id": "q", "kind": "message", "content": "What is the capital of France?"},
            {"id": "d1", "kind": "document", "content": "Paris is the capital of France."},
            {"id": "d2", "kind": "document", "content": "France's capital, Paris, lies on the Seine."},
            {"id": "ad", "kind": "document", "content": "Buy our shoes today!"},
            {"id": "blank", "kind": "document", "content": "   "}]
    r = client.post("/v1/context-gate", json={"artifacts": arts, "max_docs": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [a["id"] for a in body["admitted"]] == ["sys", "q", "d1"]
    assert {e["id"]: e["reason"] for e in body["excluded"]} == {"blank": "empty", "ad": "out_of_scope", "d2": "doc_cap"}
    assert "[document:d1]" in body["context"] and body["tokens_used"] <= body["budget_tokens"] == 1024
    tight = client.post("/v1/context-gate", json={"artifacts": arts, "budget_tokens": 12}).json()
    assert "budget" in {e["reason"] for e in tight["excluded"]} and tight["tokens_used"] <= 12
    named = client.post("/v1/context-gate", json={"artifacts": arts, "question": "Where do shoes come from?", "max_docs": 1})
    assert named.status_code == 200 and "ad" in [a["id"] for a in named.json()["admitted"]], named.text  # the question decides
    old = client.post("/v1/context-gate", json={"artifacts": arts, "query": "What is the capital of France?"})
    assert old.status_code == 422 and "'query' is now 'question'" in old.json()["error"]["message"], old.text


def test_safety_check_returns_the_full_result(client):
    chunks = [{"text": "Paris is the capital of France. " * 5, "score": 0.9, "title": "Paris"}]
    ok = client.post("/v1/safety-check", json={"question": "What is the capital of France?", "chunks": chunks,
                                               "answer": "The capital of France is Paris [1]."})
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body["should_reject"] is False and body["rejection_reason"] is None
    assert "grounding" in body["passed_checks"] and body["diagnostics"]["sufficiency_level"] == "partial"
    empty = client.post("/v1/safety-check", json={"question": "What is the capital of Peru?"}).json()
    assert empty["should_reject"] and empty["rejection_reason"] == "insufficient_context"
    strict = client.post("/v1/safety-check", json={"question": "What is the capital of France?", "chunks": chunks,
                                                   "thresholds": {"min_retrieval_confidence": 0.95}}).json()
    assert strict["failed_checks"] == ["retrieval_confidence"] and strict["rejection_reason"] == "low_confidence"


def test_one_item_schema_in_every_room(client, scorer):
    """HTTP takes `context` as pyfunc and `suffice score` do, `passages: []` falls back to it, a bare
    string in `passages` is one error everywhere, and /v1/safety-check names the question `question`."""
    from suffice.serving.pyfunc import rows_from_frame

    ctx = "The Eiffel Tower is a lattice tower in Paris, France."
    want = scorer.score(Q, [ctx]).score
    for body in ({"question": Q, "context": ctx}, {"question": Q, "passages": [], "context": ctx}):
        r = client.post("/v1/sufficiency", json=body)
        assert r.status_code == 200 and r.json()["score"] == pytest.approx(want, abs=1e-6), (body, r.text)
        assert rows_from_frame([body]) == ([Q], [[ctx]])
    r = client.post("/v1/sufficiency", json={"question": Q, "passages": ctx})
    assert r.status_code == 422 and r.json()["error"]["param"] == "body.passages"
    message = r.json()["error"]["message"]
    assert "put a single context string in 'context'" in message
    with pytest.raises(ValueError, match="put a single context string in 'context'"):
        rows_from_frame([{"question": Q, "passages": ctx}])
    r = client.post("/v1/safety-check", json={"query": Q, "chunks": [ctx]})
    assert r.status_code == 422 and "'query' is now 'question'" in r.json()["error"]["message"], r.text
    assert client.post("/v1/safety-check", json={"question": Q, "chunks": [ctx]}).status_code == 200


def test_retrieval_gate_route(client, gate):
    first = client.post("/v1/retrieval-gate", json={"messages": [{"role": "user", "content": "What is our refund policy?"}]})
    assert first.status_code == 200 and first.json()["decision"] == "RETRIEVE" and first.json()["score"] is None
    thread = [{"role": "user", "content": "What is our refund policy?"},
              {"role": "assistant", "content": "Refunds are accepted within 30 days."},
              {"role": "user", "content": "Can you make that a bullet list?"}]
    r = client.post("/v1/retrieval-gate", json={"messages": thread})
    body = r.json()
    direct = gate.decide(thread)
    assert body["decision"] == direct.decision and body["score"] == pytest.approx(direct.score, abs=1e-6)


def test_retrieval_gate_absent_is_404_not_500(scorer):
    with ServiceServer(create_app(load_service_config(None), scorer, api_keys=[], upstream_api_key=None)) as s, s.client() as c:
        r = c.post("/v1/retrieval-gate", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_configured"
    assert "retrieval_gate.bundle" in r.json()["error"]["message"]


def test_health_ready_and_openapi(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready" and ready.json()["retrieval_gate"] is True
    spec = client.get("/openapi.json").json()
    assert set(spec["paths"]) >= {"/v1/sufficiency", "/v1/context-gate", "/v1/safety-check",
                                  "/v1/retrieval-gate", "/v1/chat/completions", "/healthz", "/readyz", "/metrics"}
    assert "413" in spec["paths"]["/v1/sufficiency"]["post"]["responses"]


# -- bad input ------------------------------------------------------------------------------
def test_bad_inputs_get_4xx_that_name_the_problem(client):
    def post(path, **kw):
        return client.post(path, **kw)

    r = post("/v1/sufficiency", json={"question": Q, "passages": [{"title": "t"}]})
    assert r.status_code == 422 and r.json()["error"]["param"].startswith("body.passages.0")
    r = post("/v1/sufficiency", json={"question": "   ", "passages": []})
    assert r.status_code == 422 and r.json()["error"]["param"] == "body.question"
    r = post("/v1/sufficiency", content=b'{"question": "x", "passages": [', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_json"
    r = post("/v1/sufficiency", content=b'{"question": "x"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    r = post("/v1/sufficiency", content=b'{"question": "x"}')
    assert r.status_code == 415
    r = post("/v1/sufficiency", json={"question": Q, "passages": ["p"] * 65})
    assert r.status_code == 413 and "64" in r.json()["error"]["message"]
    r = post("/v1/sufficiency", json={"question": Q, "passages": ["x" * 60_000, "y" * 40_001]})
    assert r.status_code == 413 and "100000" in r.json()["error"]["message"]
    r = post("/v1/sufficiency", content=b'{"question": "' + b"a" * (1 << 20) + b'"}', headers={"content-type": "application/json"})
    assert r.status_code == 413 and "1048576" in r.json()["error"]["message"]

    def chunked():
        for _ in range(40):
            yield b"x" * 32768

    r = post("/v1/sufficiency", content=chunked(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = post("/v1/sufficiency", json=[{"question": Q}, {"question": Q, "passages": [3]}])
    assert r.status_code == 422 and r.json()["error"]["param"].startswith("body.1.passages.0")
    r = post("/v1/sufficiency", json=[{"question": Q}] * 65)
    assert r.status_code == 413 and "max_batch" in r.json()["error"]["message"]
    r = post("/v1/sufficiency", json={"question": "why " * 300, "passages": ["p"]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "question_too_long"
    r = post("/v1/context-gate", json={"artifacts": [{"id": "a", "kind": "document", "content": "x"}] * 2})
    assert r.status_code == 409 and "unique" in r.json()["error"]["message"] and r.json()["error"]["param"] == "artifacts"
    r = post("/v1/context-gate", json={"artifacts": [{"id": "a", "kind": "video", "content": "x"}]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "body.artifacts.0.kind"
    r = post("/v1/safety-check", json={"question": "q?", "thresholds": {"min_grounding": 2}})
    assert r.status_code == 422 and r.json()["error"]["param"] == "body.thresholds.min_grounding"
    r = post("/v1/retrieval-gate", json={"messages": []})
    assert r.status_code == 422 and r.json()["error"]["param"] == "body.messages"
    assert client.get("/v1/sufficiency").status_code == 405
    assert post("/v1/nothing-here", json={}).status_code == 404


def test_api_keys_are_checked_and_never_logged(scorer, caplog):
    secret = "sk-service-key-0123456789"
    app = create_app(load_service_config(None), scorer, api_keys=[secret, "sk-other-key-abcdef"], upstream_api_key=None)
    caplog.set_level(logging.DEBUG)
    with ServiceServer(app) as s, s.client() as c:
        body = {"question": Q, "passages": PASSAGES}
        assert c.post("/v1/sufficiency", json=body).status_code == 401
        bad = c.post("/v1/sufficiency", json=body, headers={"Authorization": "Bearer sk-service-key-0123456780"})
        assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"
        assert c.post("/v1/sufficiency", json=body, headers={"Authorization": f"Bearer {secret}"}).status_code == 200
        assert c.post("/v1/sufficiency", json=body, headers={"Authorization": "Bearer sk-other-key-abcdef"}).status_code == 200
        assert c.get("/healthz").status_code == 200 and c.get("/metrics").status_code == 200
        assert secret not in bad.text
    assert secret not in caplog.text


# -- load shedding and readiness ------------------------------------------------------------
class GatedScorer:
    """The real scorer, held at a gate so a test can keep requests in flight."""

    def __init__(self, inner, fail: bool = False):
        self.inner, self.fail = inner, fail
        self.manifest, self.count_tokens, self.packer, self.variant = inner.manifest, inner.count_tokens, inner.packer, inner.variant
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.warmed = False

    def score(self, question, passages):
        if not self.warmed:
            self.warmed = True
            if self.fail:
                raise RuntimeError("onnxruntime session is broken")
            return self.inner.score(question, passages)
        self.entered.release()
        self.release.wait(10)
        return self.inner.score(question, passages)

    def score_batch(self, questions, passages_list):
        return self.inner.score_batch(questions, passages_list)


def test_full_queue_answers_503_with_retry_after(scorer):
    gated = GatedScorer(scorer)
    cfg = load_service_config(None, ["--limits.queue_size=2", "--runtime.workers=1", "--limits.retry_after_s=3"])
    body = {"question": Q, "passages": PASSAGES}
    with ServiceServer(create_app(cfg, gated, api_keys=[], upstream_api_key=None)) as s:
        results: list[int] = []

        def call():
            with s.client() as c:
                results.append(c.post("/v1/sufficiency", json=body).status_code)

        threads = [threading.Thread(target=call) for _ in range(2)]
        for t in threads:
            t.start()
        assert gated.entered.acquire(timeout=10)  # one running, one queued: the queue is full
        deadline = time.monotonic() + 5
        with s.client() as c:
            while c.get("/readyz").json()["queue_depth"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            r = c.post("/v1/sufficiency", json=body)
            assert r.status_code == 503 and r.headers["retry-after"] == "3" and "queue_size" in r.json()["error"]["message"]
            assert c.get("/healthz").status_code == 200  # the event loop stays responsive
            gated.release.set()
            for t in threads:
                t.join(10)
            assert results == [200, 200]
            assert c.post("/v1/sufficiency", json=body).status_code == 200
            text = c.get("/metrics").text
        assert metric_value(text, "sufficient_context_queue_rejections_total") == 1.0
        assert metric_value(text, "http_requests_total", {"route": "/v1/sufficiency", "status": "503"}) == 1.0


def test_failed_warm_up_is_not_ready_but_alive(scorer):
    with ServiceServer(create_app(load_service_config(None), GatedScorer(scorer, fail=True), api_keys=[], upstream_api_key=None)) as s:
        with s.client() as c:
            r = c.get("/readyz")
            assert r.status_code == 503 and "warm-up failed" in r.json()["reason"] and "broken" in r.json()["reason"]
            assert c.get("/healthz").status_code == 200


# -- metrics after known traffic ------------------------------------------------------------
def test_metrics_after_known_traffic(scorer, gate):
    cfg = load_service_config(None)
    with ServiceServer(create_app(cfg, scorer, retrieval_gate=gate, api_keys=[], upstream_api_key=None)) as s, s.client() as c:
        for _ in range(3):
            assert c.post("/v1/sufficiency", json={"question": Q, "passages": PASSAGES}).status_code == 200
        assert c.post("/v1/sufficiency", json={"question": Q, "passages": []}).status_code == 200
        assert c.post("/v1/sufficiency", json=[{"question": Q, "passages": PASSAGES}, {"question": Q}]).status_code == 200
        assert c.post("/v1/sufficiency", json={"question": 1}).status_code == 422
        assert c.post("/v1/retrieval-gate", json={"messages": [{"role": "user", "content": "hi"}]}).json()["decision"] == "RETRIEVE"
        assert c.post("/v1/nope", json={}).status_code == 404
        text = c.get("/metrics").text
    assert metric_value(text, "sufficient_context_level_total", {"level": "partial"}) == 4
    assert metric_value(text, "sufficient_context_level_total", {"level": "insufficient"}) == 2
    assert metric_value(text, "sufficient_context_level_total", {"level": "sufficient"}) == 0
    assert metric_value(text, "sufficient_context_score_count") == 6
    assert metric_value(text, "sufficient_context_score_bucket", {"le": "0.5"}) == 2  # the two empty contexts (0.0)
    assert metric_value(text, "sufficient_context_score_sum") == pytest.approx(4 * 0.624, abs=0.01)
    assert metric_value(text, "sufficient_context_latency_seconds_count") == 6
    assert metric_value(text, "retrieval_gate_decisions_total", {"decision": "RETRIEVE"}) == 1
    assert metric_value(text, "retrieval_gate_decisions_total", {"decision": "SKIP"}) == 0
    assert metric_value(text, "http_requests_total", {"route": "/v1/sufficiency", "status": "200"}) == 5
    assert metric_value(text, "http_requests_total", {"route": "/v1/sufficiency", "status": "422"}) == 1
    assert metric_value(text, "http_requests_total", {"route": "other", "status": "404"}) == 1
    assert metric_value(text, "http_request_duration_seconds_count", {"route": "/v1/sufficiency"}) == 6
