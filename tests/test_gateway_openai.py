"""The chat gateway as a user meets it: the official ``openai`` client against a real uvicorn gateway
(tiny bundle) in front of the scripted local OpenAI-compatible upstream (tests/llm_server.py).

The tiny random model scores every (question, passages) pair at ~0.62, so the branches are chosen
with thresholds, as in test_service_chat.py: (0.6, 0.5) sufficient, (0.8, 0.5) partial, (0.9, 0.8)
insufficient.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from pydantic import BaseModel

from llm_server import FakeLLMServer, Reply
from test_service_support import BRANCHES, CAVEAT, LONG_PASSAGE, GatewayFactory, ServiceServer, metric_value


ANSWER = "The Eiffel Tower is in Paris."
JSON_ANSWER = '{"answer": "Paris"}'
DOCS = [{"id": "eiffel", "title": "Eiffel Tower", "text": LONG_PASSAGE},
        "Gustave Eiffel's company built the Eiffel Tower in Paris."]
QUESTION = "Where is the Eiffel Tower?"


class Answer(BaseModel):
    answer: str


@pytest.fixture(scope="module")
def llm():
    with FakeLLMServer(default=lambda body: Reply.text(ANSWER)) as server:
        server.on("JSON-PLEASE", Reply.text(JSON_ANSWER), repeat=True)
        yield server


@pytest.fixture
def gateway(bundles, llm):
    """gateway(branch, *overrides, retrieval_gate=None) -> a started ServiceServer in front of the fake upstream."""
    factory = GatewayFactory(bundles["sufficiency"], llm.base_url, "--upstream.timeout_s=2.0", "--upstream.model=fake-llm")
    yield factory
    factory.close()


def client(server: ServiceServer, **kw) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", timeout=30, max_retries=kw.pop("max_retries", 0), **kw)


def ask(text: str = QUESTION) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


# -- 1. structured output -------------------------------------------------------------------
def test_parse_with_partial_context_keeps_the_json_and_signals_the_caveat(gateway):
    s = gateway("partial")
    c = client(s)
    done = c.chat.completions.parse(model="fake-llm", messages=ask(QUESTION + " JSON-PLEASE"), response_format=Answer,
                                    extra_body={"documents": DOCS})
    msg = done.choices[0].message
    assert msg.parsed == Answer(answer="Paris") and msg.content == JSON_ANSWER and CAVEAT not in msg.content
    meta = done.model_extra["sufficiency"]
    assert meta["level"] == "partial" and meta["action"] == "forwarded_with_caveat" and meta["caveat"] == CAVEAT
    raw = c.chat.completions.with_raw_response.create(model="fake-llm", messages=ask(QUESTION + " JSON-PLEASE"),
                                                      response_format={"type": "json_object"}, extra_body={"documents": DOCS})
    assert raw.headers["x-suffice-level"] == "partial" and raw.headers["x-suffice-action"] == "forwarded_with_caveat"
    assert raw.headers["x-suffice-caveat"] == CAVEAT and float(raw.headers["x-suffice-score"]) > 0
    assert json.loads(raw.parse().choices[0].message.content) == {"answer": "Paris"}
    # plain chat keeps the caveat in the text, as before
    plain = c.chat.completions.create(model="fake-llm", messages=ask(), extra_body={"documents": DOCS})
    assert plain.choices[0].message.content == f"{ANSWER}\n\n{CAVEAT}"


def test_tools_request_gets_no_caveat_in_the_content(gateway):
    s = gateway("partial")
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
    done = client(s).chat.completions.create(model="fake-llm", messages=ask(QUESTION + " JSON-PLEASE"), tools=tools,
                                             extra_body={"documents": DOCS})
    assert done.choices[0].message.content == JSON_ANSWER and done.model_extra["sufficiency"]["caveat"] == CAVEAT


def test_structured_decline_is_a_refusal_the_sdk_surfaces(gateway, llm):
    s = gateway("insufficient")
    llm.reset_counters()
    c = client(s)
    done = c.chat.completions.parse(model="fake-llm", messages=ask(), response_format=Answer, extra_body={"documents": DOCS})
    msg = done.choices[0].message
    assert msg.content is None and msg.parsed is None and "can't answer" in msg.refusal
    assert done.model_extra["sufficiency"]["action"] == "declined" and llm.n_requests == 0
    with c.chat.completions.stream(model="fake-llm", messages=ask(), response_format=Answer,
                                   extra_body={"documents": DOCS}) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content is None and "can't answer" in final.choices[0].message.refusal
    # without response_format the decline stays the assistant's text
    plain = c.chat.completions.create(model="fake-llm", messages=ask(), extra_body={"documents": DOCS})
    assert "can't answer" in plain.choices[0].message.content and plain.choices[0].message.refusal is None


def test_streamed_structured_answer_has_no_caveat_and_ends_with_the_verdict(gateway):
    s = gateway("partial")
    chunks = list(client(s).chat.completions.create(model="fake-llm", messages=ask(QUESTION + " JSON-PLEASE"), stream=True,
                                                    response_format={"type": "json_object"}, extra_body={"documents": DOCS}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == JSON_ANSWER
    assert chunks[-1].choices == [] and chunks[-1].model_extra["sufficiency"]["caveat"] == CAVEAT


# -- 2. upstream 429 / 503 and the verdict cache ----------------------------------------------
def test_upstream_429_and_503_pass_through_with_retry_after(gateway, llm):
    llm.on("RATE-LIMITED", Reply.error(429, retry_after=7), repeat=True)
    llm.on("OVERLOADED", Reply.error(503, retry_after=3), repeat=True)
    s = gateway("sufficient")
    c = client(s)
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(model="fake-llm", messages=ask(QUESTION + " RATE-LIMITED"), extra_body={"documents": DOCS})
    r = e.value.response
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    body = r.json()
    assert body["error"]["code"] == "upstream_rate_limited" and body["sufficiency"]["level"] == "sufficient"
    assert "127.0.0.1" not in r.text and str(llm.port) not in body["error"]["message"]  # the upstream URL never leaks
    with pytest.raises(openai.APIStatusError) as e:
        c.chat.completions.create(model="fake-llm", messages=ask(QUESTION + " OVERLOADED"), stream=True,
                                  extra_body={"documents": DOCS})
    assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "3"


def test_client_retry_after_429_is_not_scored_again(gateway, llm):
    llm.on("RETRY-ONCE", Reply.error(429, retry_after=1), Reply.text(ANSWER))
    s = gateway("sufficient")
    done = client(s, max_retries=2).chat.completions.create(model="fake-llm", messages=ask(QUESTION + " RETRY-ONCE"),
                                                            extra_body={"documents": DOCS})
    assert done.choices[0].message.content == ANSWER
    with s.client() as h:
        metrics = h.get("/metrics").text
    assert metric_value(metrics, "chat_verdict_cache_total", {"result": "miss"}) == 1
    assert metric_value(metrics, "chat_verdict_cache_total", {"result": "hit"}) == 1
    assert metric_value(metrics, "sufficient_context_level_total") == 1  # scored once for two requests


# -- 3. long turns --------------------------------------------------------------------------
def test_long_turn_is_scored_by_its_question_and_forwarded(gateway, llm):
    s = gateway("sufficient")
    background = " ".join(f"I have been reading about famous towers, item {i}, for a school project." for i in range(40))
    turn = f"{background} Anyway, where is the Eiffel Tower?"
    done = client(s).chat.completions.create(model="fake-llm", messages=ask(turn), extra_body={"documents": DOCS})
    meta = done.model_extra["sufficiency"]
    assert done.choices[0].message.content == ANSWER and meta["question_scored"] == "Anyway, where is the Eiffel Tower?"
    assert any(f["name"] == "question_shortened" for f in meta["factors"])
    assert llm.requests[-1]["body"]["messages"][-1]["content"] == turn  # the upstream gets the whole turn
    no_question = client(s).chat.completions.create(model="fake-llm", messages=ask(background), extra_body={"documents": DOCS})
    assert no_question.model_extra["sufficiency"]["question_scored"].endswith("for a school project.")
    with s.client() as h:  # /v1/sufficiency keeps refusing questions over the window
        r = h.post("/v1/sufficiency", json={"question": turn, "passages": ["x"]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "question_too_long"


# -- 5. / 6. what a decline says, and chit-chat ----------------------------------------------
def test_documents_the_context_gate_drops_are_named_in_the_decline(gateway):
    s = gateway("partial")
    done = client(s).chat.completions.create(model="fake-llm", messages=ask(), extra_body={"documents": [
        {"id": "mars", "text": "Mars has two small moons, Phobos and Deimos."}]})
    meta = done.model_extra["sufficiency"]
    text = done.choices[0].message.content
    assert meta["action"] == "declined" and meta["documents"]["excluded"] == [{"id": "mars", "reason": "out_of_scope"}]
    assert "matched" in text and "mars" in text and "no passage text" not in text
    # the explanation says the gate dropped the document, not that none was given
    assert not any("were given" in f["detail"] for f in meta["factors"]), meta["factors"]
    assert meta["factors"][0]["name"] == "context_gate" and "admitted none of the 1 document(s)" in meta["factors"][0]["detail"]


def test_chit_chat_without_documents_is_forwarded_unscored(gateway, llm):
    s = gateway("insufficient")
    done = client(s).chat.completions.create(model="fake-llm", messages=[{"role": "user", "content": "Hello"}])
    meta = done.model_extra["sufficiency"]
    assert done.choices[0].message.content == ANSWER
    assert meta["level"] == "unscored" and meta["action"] == "unscored" and "no `documents`" in meta["reason"]
    strict = gateway("insufficient", "--sufficient_context.without_documents=decline")
    declined = client(strict).chat.completions.create(model="fake-llm", messages=[{"role": "user", "content": "Hello"}])
    assert declined.model_extra["sufficiency"]["action"] == "declined"


def test_retrieval_gate_skip_forwards_chit_chat_without_scoring(gateway, bundles, llm, tmp_path):
    from suffice.serving import RetrievalGate, RetrievalGateConfig

    thread = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER},
              {"role": "user", "content": "Thanks!"}]
    skip = gateway("insufficient", retrieval_gate=RetrievalGate.load(bundles["retrieval_gate"], RetrievalGateConfig(skip_threshold=0.0)))
    done = client(skip).chat.completions.create(model="fake-llm", messages=thread)
    meta = done.model_extra["sufficiency"]
    assert done.choices[0].message.content == ANSWER and meta["level"] == "unscored" and "SKIP" in meta["reason"]
    retrieve = gateway("insufficient", retrieval_gate=RetrievalGate.load(bundles["retrieval_gate"], RetrievalGateConfig(skip_threshold=1.0)))
    meta = client(retrieve).chat.completions.create(model="fake-llm", messages=thread,
                                                    extra_body={"documents": DOCS}).model_extra["sufficiency"]
    assert meta["action"] == "declined"  # documents given: always scored


# -- 7. models ----------------------------------------------------------------------------
def test_models_list(gateway):
    s = gateway("sufficient")
    c = client(s)
    assert [m.id for m in c.models.list()] == ["fake-llm"]
    assert c.models.retrieve("fake-llm").id == "fake-llm"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("other")
