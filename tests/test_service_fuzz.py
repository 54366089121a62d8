"""Property-based: nothing a client sends to any route gets a 500 (real uvicorn, real tiny bundle).

For every POST route hypothesis sends schema-shaped bodies with hostile values (lone surrogates,
NaN, huge numbers, wrong types, too many passages, over-long questions), arbitrary JSON, raw
bytes and wrong content types, and checks: wrong content type -> 415, bytes that are not JSON
-> 422, otherwise only the route's documented statuses; every error is a JSON body with a
message, and a 422 names the field.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
hypothesis = pytest.importorskip("hypothesis")

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis import strategies as st
from llm_server import FakeLLMServer, Reply
from test_service_support import ServiceServer, load_scorer, service_bundles

from suffice.serving.service import create_app, load_service_config

# Hypothesis writes caches (constants, unicode tables) under ./.hypothesis as soon as a test is
# decorated; keep them out of the working tree.
set_hypothesis_home_dir(tempfile.mkdtemp(prefix="suffice-hypothesis-"))

FUZZ = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])

JSON_TYPES = ["application/json", "application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"]
OTHER_TYPES = ["text/plain", "", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml"]

scalars = (st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=20))
json_values = st.recursive(scalars, lambda ch: st.lists(ch, max_size=4) | st.dictionaries(st.text(max_size=8), ch, max_size=4),
                           max_leaves=12)
texts = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["", "   ", "\ud800", "x\udfffy", "\x00", "Where is the Eiffel Tower?", "why " * 300, "word " * 3000,
                     "\u202e\u0301\U0001f600", "a" * 20_000]),
)
passage = texts | st.fixed_dictionaries({"text": texts}, optional={"title": texts | json_values}) | json_values
passages = st.lists(passage, max_size=6) | st.lists(st.just("p"), min_size=60, max_size=70) | json_values
numbers = st.integers(-5, 2**70) | st.floats(allow_nan=True, allow_infinity=True) | json_values


def maybe_extra(d: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(d, st.tuples(d, st.text(min_size=1, max_size=6), json_values).map(lambda t: {**t[0], t[1]: t[2]} if isinstance(t[0], dict) else t[0]))


sufficiency_body = maybe_extra(st.fixed_dictionaries({"question": texts | json_values}, optional={"passages": passages}))
batch_body = st.lists(sufficiency_body, max_size=4) | st.lists(st.just({"question": "q?"}), min_size=64, max_size=66) | json_values
artifact = st.fixed_dictionaries({"id": texts | json_values, "kind": st.sampled_from(["system", "task", "message", "document", "video"]) | json_values,
                                  "content": texts}, optional={"authority": numbers, "priority": numbers})
context_gate_body = maybe_extra(st.fixed_dictionaries({"artifacts": st.lists(artifact, max_size=6) | json_values},
                                                      optional={"question": texts | json_values, "budget_tokens": numbers, "max_docs": numbers}))
chunk = texts | st.fixed_dictionaries({"text": texts}, optional={"score": numbers, "title": texts, "id": texts | numbers}) | json_values
threshold_keys = st.sampled_from(["min_retrieval_confidence", "min_context_chars", "reject_insufficient", "min_relevance",
                                  "model_weight", "min_citation_coverage", "min_grounding", "support_overlap", "bogus"])
safety_body = maybe_extra(st.fixed_dictionaries({"question": texts | json_values}, optional={
    "chunks": st.lists(chunk, max_size=5) | json_values, "answer": texts | json_values,
    "thresholds": st.dictionaries(threshold_keys, numbers, max_size=3) | json_values}))
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", ""]) | json_values,
                                 "content": texts | json_values | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=2)})
gate_body = maybe_extra(st.fixed_dictionaries({"messages": st.lists(message, max_size=5) | json_values}))
chat_body = maybe_extra(st.fixed_dictionaries({"messages": st.lists(message, max_size=4) | json_values}, optional={
    "model": texts | json_values, "stream": st.booleans() | json_values, "temperature": numbers,
    "documents": st.lists(chunk, max_size=5) | json_values}))

# Well-typed bodies whose text is still hostile: they get past the schema and reach the model.
questions = st.text(min_size=1, max_size=60).filter(str.strip) | st.sampled_from(["Where is the Eiffel Tower?", "\u202e\u0301\U0001f600 ?"])
good_passage = texts | st.fixed_dictionaries({"title": texts, "text": texts})
sufficiency_valid = st.fixed_dictionaries({"question": questions, "passages": st.lists(good_passage, max_size=5)})
valid = {
    "/v1/sufficiency": sufficiency_valid,
    "/v1/sufficiency (batch form)": st.lists(sufficiency_valid, max_size=4),
    "/v1/context-gate": st.fixed_dictionaries(
        {"artifacts": st.lists(st.fixed_dictionaries({"id": st.text(min_size=1, max_size=6),
                                                      "kind": st.sampled_from(["system", "task", "message", "document"]),
                                                      "content": texts}), max_size=6, unique_by=lambda a: a["id"])},
        optional={"budget_tokens": st.integers(1, 5000), "max_docs": st.integers(0, 10), "question": questions}),
    "/v1/safety-check": st.fixed_dictionaries(
        {"question": questions, "chunks": st.lists(texts | st.fixed_dictionaries({"text": texts, "score": st.floats(0, 1)}), max_size=4)},
        optional={"answer": texts}),
    "/v1/retrieval-gate": st.fixed_dictionaries(
        {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": texts}), min_size=1, max_size=5)}),
    "/v1/chat/completions": st.fixed_dictionaries(
        {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]), "content": texts}),
                              min_size=1, max_size=4).map(lambda ms: ms + [{"role": "user", "content": "Where is it?"}]),
         "documents": st.lists(texts, max_size=4)}, optional={"stream": st.booleans()}),
}
ROUTES = {
    "/v1/sufficiency": (sufficiency_body, {200, 413, 422}),
    "/v1/sufficiency (batch form)": (batch_body, {200, 413, 422}),
    "/v1/context-gate": (context_gate_body, {200, 409, 413, 422}),
    "/v1/safety-check": (safety_body, {200, 413, 422}),
    "/v1/retrieval-gate": (gate_body, {200, 413, 422}),
    "/v1/chat/completions": (chat_body, {200, 409, 413, 422}),
}


def wire(route: str) -> st.SearchStrategy:
    """(raw body, content type): mostly well-typed hostile bodies, then loose shapes, any JSON, garbage, wrong types."""
    body_strategy = ROUTES[route][0]
    dumps = lambda v: json.dumps(v).encode()  # noqa: E731
    loose = st.one_of(body_strategy, json_values).map(dumps)
    garbage = st.binary(max_size=64) | st.sampled_from([b"{", b"[" * 5000 + b"]" * 5000, b'{"question": "x",}', b"\xff\xfe{}", b"NaN"])
    good = st.tuples(valid[route].map(dumps), st.sampled_from(JSON_TYPES))
    return st.one_of(
        good, good, good,
        st.tuples(loose, st.sampled_from(JSON_TYPES)),
        st.tuples(garbage, st.sampled_from(JSON_TYPES)),
        st.tuples(loose | garbage, st.sampled_from(OTHER_TYPES)),
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_bert_dir):
    from suffice.serving import RetrievalGate

    bundles = service_bundles(tmp_path_factory, tiny_bert_dir)
    with FakeLLMServer(default=lambda body: Reply.text("An answer.")) as llm:
        cfg = load_service_config(None, [f"--upstream.base_url={llm.base_url}", "--sufficient_context.thresholds.sufficient=0.6",
                                         "--sufficient_context.thresholds.partial=0.5"])
        app = create_app(cfg, load_scorer(bundles["sufficiency"], 0.6, 0.5), retrieval_gate=RetrievalGate.load(bundles["retrieval_gate"]),
                         api_keys=[], upstream_api_key=None)
        with ServiceServer(app) as s, s.client(timeout=60) as c:
            yield c


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw.decode("utf-8"))
        return True
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False


@pytest.mark.parametrize("route", list(ROUTES))
def test_no_client_input_gets_a_5xx(server, route):
    allowed = ROUTES[route][1]
    seen: dict[int, int] = {}

    @FUZZ
    @given(wire(route))
    def check(sent):
        raw, ctype = sent
        headers = {"content-type": ctype} if ctype else {}
        r = server.post(route.split(" ")[0], content=raw, headers=headers)
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code < 500, (r.status_code, r.text[:500])
        if ctype in OTHER_TYPES:
            assert r.status_code == 415, r.text
        elif not _is_json(raw):  # broken JSON (or JSON nested too deeply for Python's parser)
            assert r.status_code == 422 and r.json()["error"]["code"] in ("invalid_json", "nested_too_deeply"), r.text
        else:
            assert r.status_code in allowed, (r.status_code, r.text[:500])
        if r.status_code >= 400:
            err = r.json()["error"]
            assert err["message"] and err["code"]
            if r.status_code == 422 and err["code"] != "invalid_json":
                assert err["param"], r.text
        elif route == "/v1/chat/completions" and not r.headers["content-type"].startswith("text/event-stream"):
            assert "sufficiency" in r.json()

    check()
    # hypothesis may stop early on a slow machine, so the two error classes are also probed directly
    for raw, ctype in ((b"{}", "text/plain"), (b"{not json", "application/json")):
        r = server.post(route.split(" ")[0], content=raw, headers={"content-type": ctype})
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
    print(route, dict(sorted(seen.items())))
    assert seen.get(200, 0) > 0 and seen.get(415, 0) > 0 and seen.get(422, 0) > 0, seen  # the fuzz reached the model too


@FUZZ
@given(method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "POST"]),
       path=st.sampled_from(["/", "/v1", "/v1/", "/v1/sufficiency/", "/metrics/x", "/%ff", "/v1/chat", "/readyz?x=1"]) | st.text(
           alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="#?%"), max_size=30).map(lambda p: "/" + p))
def test_random_methods_and_paths_never_5xx(server, method, path):
    r = server.request(method, path, content=b"{}", headers={"content-type": "application/json"})
    assert r.status_code < 500, (method, path, r.status_code, r.text[:300])
