"""The OpenAI-compatible rater against a real local HTTP server (tests/llm_server.py): labels,
retries, Retry-After, timeouts, dropped connections, unparsed replies, concurrency, secrets."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import time

import httpx
import pytest
from llm_server import FakeLLMServer, Reply, messages_text

from suffice.training.autorater.labeling_config import LabelingConfig
from suffice.training.autorater.raters import OpenAICompatibleRater, RaterConfigError, RaterFatalError, parse_retry_after
from suffice.training.autorater.runner import label_items
from suffice.training.autorater.store import LabelStore
from suffice.training.data.schema import Item, Passage

SECRET = "sk-test-9f8e7d6c5b4a-DO-NOT-LEAK"
KEY_ENV = "SUFFICE_TEST_LLM_KEY"
_ITEM = re.compile(r"ITEM-(\d+)\b")


def expected_label(i: int) -> int:
    return int(i % 3 != 0)


def judge(body: dict) -> Reply:
    """The fake LLM's default behaviour: a well-formed verdict that depends on the item number."""
    m = _ITEM.search(messages_text(body))
    return Reply.verdict(expected_label(int(m.group(1))) if m else 0, fenced=bool(m and int(m.group(1)) % 2))


def make_items(n: int) -> list[Item]:
    return [Item(id=f"test:{i}", question=f"What is recorded for ITEM-{i}?", source="test",
                 passages=[Passage(f"Record {i}", f"The record for ITEM-{i} says {i * 7}.")]) for i in range(n)]


@pytest.fixture
def server():
    with FakeLLMServer(default=judge) as s:
        yield s


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


def config(server: FakeLLMServer, **kw) -> LabelingConfig:
    base = dict(rater="openai-compatible", base_url=server.base_url, model="fake-llm", api_key_env=KEY_ENV,
                concurrency=4, timeout_s=2.0, max_retries=3, backoff_base_s=0.01, backoff_max_s=0.05,
                mlflow=False, progress=False)
    base.update(kw)
    return LabelingConfig(**base)


def run(server, tmp_path, items, **kw):
    cfg = config(server, **kw)
    with LabelStore(tmp_path / "labels.sqlite") as store:
        acc = label_items(items, OpenAICompatibleRater(cfg), store, concurrency=cfg.concurrency, progress=False,
                          price_per_1k_input=cfg.price_per_1k_input, price_per_1k_output=cfg.price_per_1k_output)
    return acc


def stored(tmp_path) -> dict[str, sqlite3.Row]:
    conn = sqlite3.connect(tmp_path / "labels.sqlite")
    conn.row_factory = sqlite3.Row
    return {r["item_id"]: r for r in conn.execute("SELECT * FROM labels")}


def test_well_formed_verdicts_are_stored_with_their_cost(server, tmp_path, key_env):
    items = make_items(12)
    acc = run(server, tmp_path, items, price_per_1k_input=0.5, price_per_1k_output=1.5)
    rows = stored(tmp_path)
    assert {k: r["label"] for k, r in rows.items()} == {it.id: expected_label(i) for i, it in enumerate(items)}
    for r in rows.values():
        assert r["status"] == "ok" and r["rater"] == "llm:fake-llm" and r["prompt_version"].startswith("binary-")
        assert '"Sufficient Context"' in r["raw"] and r["rationale"] == "Every step is answered by the context."
        assert r["tokens_in"] > 100 and r["tokens_out"] > 5 and r["latency_s"] > 0 and r["attempts"] == 1
    assert (acc.requests, acc.retries, acc.stored_ok, acc.failed) == (12, 0, 12, 0)
    assert acc.tokens_in == sum(r["tokens_in"] for r in rows.values())
    assert acc.cost_usd == pytest.approx(acc.tokens_in / 1000 * 0.5 + acc.tokens_out / 1000 * 1.5)
    body = server.requests[0]["body"]
    assert body["temperature"] == 0 and body["model"] == "fake-llm" and body["messages"][0]["role"] == "system"
    # The key is sent (so the leak test below means something) as a bearer token.
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"


def test_transient_failures_are_retried_and_counted(server, tmp_path, key_env):
    server.on("ITEM-1?", Reply.error(429, retry_after=0))
    server.on("ITEM-2?", Reply.error(500), Reply.error(503))
    server.on("ITEM-3?", Reply.drop())
    server.on("ITEM-4?", Reply.verdict(0, delay_s=1.5))  # past the 0.4 s timeout
    server.on("ITEM-5?", Reply.error(200, body={"object": "not a completion"}))
    items = make_items(8)
    acc = run(server, tmp_path, items, timeout_s=0.4)
    rows = stored(tmp_path)
    assert {k: r["label"] for k, r in rows.items()} == {it.id: expected_label(i) for i, it in enumerate(items)}
    assert dict(acc.failures) == {"http_429": 1, "http_500": 1, "http_503": 1, "connection": 1, "timeout": 1, "bad_response": 1}
    assert acc.retries == 6 and acc.requests == 8 + 6 == server.n_requests
    assert rows["test:2"]["attempts"] == 3 and rows["test:0"]["attempts"] == 1


def test_retry_after_is_honoured(server, tmp_path, key_env):
    server.on("ITEM-0?", Reply.error(429, retry_after=1))
    started = time.monotonic()
    acc = run(server, tmp_path, make_items(1), backoff_base_s=0.001, backoff_max_s=0.001)
    assert time.monotonic() - started >= 0.95  # the server's 1 s, not the 1 ms backoff
    assert acc.stored_ok == 1 and acc.failures["http_429"] == 1


def test_retry_after_forms():
    assert parse_retry_after("2") == 2.0 and parse_retry_after("0.25") == 0.25 and parse_retry_after("-3") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:05 GMT", now=1445412480.0) == 5.0
    assert parse_retry_after(None) is None and parse_retry_after("later") is None


def test_give_up_after_max_retries_then_a_rerun_finishes(server, tmp_path, key_env):
    server.on("ITEM-0?", *[Reply.error(502)] * 3)  # max_retries=2 -> 3 attempts, all 502
    acc = run(server, tmp_path, make_items(3), max_retries=2)
    assert acc.failed == 1 and acc.stored_ok == 2
    assert acc.failures["http_502"] == 3 and acc.failures["gave_up"] == 1
    assert "test:0" not in stored(tmp_path)  # a failure is not a label: the next run tries again
    server.reset_counters()
    acc2 = run(server, tmp_path, make_items(3), max_retries=2)
    assert (acc2.skipped, acc2.stored_ok, server.n_requests) == (2, 1, 1)
    assert stored(tmp_path)["test:0"]["label"] == expected_label(0)


def test_unparsable_reply_is_re_asked_once_then_kept_raw(server, tmp_path, key_env):
    server.on("ITEM-0?", Reply.text("Looks fine to me."), Reply.verdict(1))
    server.on("ITEM-1?", Reply.text("I would rather not say."), Reply.text("Still no verdict, sorry."))
    server.on("ITEM-2?", Reply.text('{"Sufficient Context": 1, "Level": "banana"} and {"Sufficient Context": "perhaps"}'),
              Reply.text("nothing"))
    acc = run(server, tmp_path, make_items(4))
    rows = stored(tmp_path)
    assert rows["test:0"]["status"] == "ok" and rows["test:0"]["label"] == 1
    assert "Looks fine to me." in rows["test:0"]["raw"] and rows["test:0"]["attempts"] == 2
    for iid, texts in (("test:1", ["I would rather not say.", "Still no verdict, sorry."]), ("test:2", ["banana", "nothing"])):
        r = rows[iid]
        assert r["status"] == "unparsed" and r["label"] is None and r["level"] is None
        assert all(t in r["raw"] for t in texts)
    assert acc.stored_unparsed == 2 and acc.failures["unparsed"] == 2 and acc.failures["unparsed_reply"] == 3
    reminder = [q for q in server.requests if len(q["body"]["messages"]) == 4]
    assert len(reminder) == 3
    assert reminder[0]["body"]["messages"][2]["role"] == "assistant"
    assert "Reply again" in reminder[0]["body"]["messages"][3]["content"]
    # A plain re-run leaves unparsed rows alone; retry_unparsed asks again and replaces them.
    server.reset_counters()
    assert run(server, tmp_path, make_items(4)).to_label == 0 and server.n_requests == 0
    with LabelStore(tmp_path / "labels.sqlite") as store:
        acc3 = label_items(make_items(4), OpenAICompatibleRater(config(server)), store, progress=False, retry_unparsed=True)
    assert acc3.to_label == 2 and acc3.stored_ok == 2
    assert stored(tmp_path)["test:1"]["label"] == expected_label(1)


def test_three_level_scheme(server, tmp_path, key_env):
    server.default = lambda body: Reply.verdict(0, level="partial")
    server.on("ITEM-1?", Reply.verdict(1, level="sufficient"))
    run(server, tmp_path, make_items(2), scheme="three_level")
    rows = stored(tmp_path)
    assert (rows["test:0"]["label"], rows["test:0"]["level"]) == (0, "partial")
    assert (rows["test:1"]["label"], rows["test:1"]["level"]) == (1, "sufficient")
    assert rows["test:0"]["prompt_version"].startswith("three_level-")
    assert '"Level"' in server.requests[0]["body"]["messages"][1]["content"]


def test_concurrency_bound_is_respected(server, tmp_path, key_env):
    server.default = lambda body: Reply.verdict(1, delay_s=0.1)
    acc = run(server, tmp_path, make_items(16), concurrency=4)
    assert acc.stored_ok == 16
    assert server.max_in_flight == 4  # reached, never exceeded


def test_missing_usage_is_estimated_and_flagged(server, tmp_path, key_env):
    server.default = lambda body: Reply.text('Explanation: fine.\n{"Sufficient Context": 1}', include_usage=False)
    acc = run(server, tmp_path, make_items(2))
    assert acc.usage_estimated == 2 and acc.tokens_in > 0
    assert "estimated for 2 replies" in acc.format()


def test_fatal_status_stops_the_run_without_burning_the_batch(server, tmp_path, key_env):
    server.default = lambda body: Reply.error(401, body={"error": {"message": "invalid api key"}})
    with pytest.raises(RaterFatalError, match=KEY_ENV) as err:
        run(server, tmp_path, make_items(50), concurrency=2)
    assert server.n_requests <= 2 and SECRET not in str(err.value)
    assert err.value.accounting.stopped


def test_a_bad_request_fails_that_item_only(server, tmp_path, key_env):
    server.on("ITEM-1?", Reply.error(400, body={"error": {"message": "context length exceeded"}}))
    acc = run(server, tmp_path, make_items(3))
    assert acc.failed == 1 and acc.stored_ok == 2 and acc.failures["http_400"] == 1
    assert server.n_requests == 3  # a 400 is not re-sent


def test_missing_key_variable_is_a_clear_error(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(RaterConfigError, match=f"{KEY_ENV} is not set"):
        OpenAICompatibleRater(config(server))
    rater = OpenAICompatibleRater(config(server, api_key_env=""))  # local servers need no key
    asyncio.run(rater.aclose())


def test_api_key_absent_from_logs_store_and_accounting(server, tmp_path, key_env, caplog, capsys):
    # A misconfigured proxy echoes the Authorization header back, in an error and in a reply.
    server.on("ITEM-0?", Reply.error(500, body={"error": f"upstream rejected header Bearer {SECRET}"}))
    server.on("ITEM-1?", Reply.text(f"Authorization: Bearer {SECRET}\nExplanation: ok\n" + '{"Sufficient Context": 1}'))
    server.on("ITEM-2?", Reply.text(f"echo {SECRET}"), Reply.text(f"again {SECRET}"))
    server.on("ITEM-3?", Reply.error(400, body={"error": f"bad key {SECRET}"}))
    server.on("ITEM-4?", Reply.drop())
    caplog.set_level(logging.DEBUG)
    acc = run(server, tmp_path, make_items(8))
    assert acc.stored_ok == 6 and acc.stored_unparsed == 1 and acc.failed == 1
    assert any(q["headers"].get("authorization") == f"Bearer {SECRET}" for q in server.requests)
    out, err = capsys.readouterr()
    dump = "\n".join(sqlite3.connect(tmp_path / "labels.sqlite").iterdump())
    assert "***" in dump  # the echoed key was scrubbed, not stored
    for where, text in (("log", caplog.text), ("stdout", out), ("stderr", err), ("store", dump),
                        ("accounting", json.dumps(acc.summary()) + acc.format())):
        assert SECRET not in text, f"API key leaked into the {where}"


def test_fake_server_streams_server_sent_events(server):
    server.enqueue(Reply.verdict(1))
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hello"}]}
    chunks = []
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[len("data: "):])
    assert chunks[-1] == "[DONE]"
    events = [json.loads(c) for c in chunks[:-1]]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text.endswith('{"Sufficient Context": 1}')
    assert events[-1]["usage"]["completion_tokens"] > 0 and events[-2]["choices"][0]["finish_reason"] == "stop"
    assert httpx.get(server.base_url + "/models").json()["data"][0]["id"] == "fake-llm"


def test_500_items_at_concurrency_16_with_accounting(server, tmp_path, key_env, capsys):
    """The stage's acceptance run: 500 items, 16 in flight, a realistic sprinkle of failures."""
    server.default = lambda body: Reply(**{**judge(body).__dict__, "delay_s": 0.01})
    for i in range(0, 500, 50):
        server.on(f"ITEM-{i}?", Reply.error(429, retry_after=0.05))
    for i in range(7, 500, 100):
        server.on(f"ITEM-{i}?", Reply.error(503))
    for i in range(13, 500, 125):
        server.on(f"ITEM-{i}?", Reply.drop())
    for i in range(21, 500, 100):
        server.on(f"ITEM-{i}?", Reply.text("Hmm."), Reply.verdict(expected_label(i)))
    server.on("ITEM-499?", Reply.text("no idea"), Reply.text("still no idea"))
    items = make_items(500)
    started = time.monotonic()
    # a generous timeout: on a loaded 2-core machine a 10 ms reply can wait seconds for the event loop
    acc = run(server, tmp_path, items, concurrency=16, timeout_s=15.0, price_per_1k_input=0.00015, price_per_1k_output=0.0006)
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(f"\n{acc.format()}\n(wall {elapsed:.1f} s)")
    rows = stored(tmp_path)
    assert len(rows) == 500 and acc.stored_ok == 499 and acc.stored_unparsed == 1
    assert all(rows[it.id]["label"] == expected_label(i) for i, it in enumerate(items[:499]))
    assert acc.failures["http_429"] == 10 and acc.failures["http_503"] == 5 and acc.failures["connection"] == 4
    assert acc.retries == 19 and acc.requests == 500 + 19 + 5 + 1 == server.n_requests
    assert server.max_in_flight <= 16
    assert acc.cost_usd > 0 and acc.summary()["latency_p95_s"] >= acc.summary()["latency_p50_s"]


def test_lexical_rater_levels_follow_the_thresholds():
    from suffice.training.autorater.raters import LexicalRater

    rater = LexicalRater(LabelingConfig(rater="lexical", lexical_sufficient=0.8, lexical_partial=0.4))
    item = lambda q, text: Item(id="x", question=q, passages=[Passage("", text)])  # noqa: E731
    full = asyncio.run(rater.rate(item("When did Ada Lovelace publish notes?", "Ada Lovelace published her notes in 1843.")))
    half = asyncio.run(rater.rate(item("When did Ada Lovelace visit Turin?", "Ada Lovelace lived in London.")))
    none = asyncio.run(rater.rate(item("Who built the Zorbian tower?", "Bread is baked from dough.")))
    assert (full.label, full.level) == (1, "sufficient")
    assert half.label == 0 and half.level in ("partial", "insufficient") and "missing" in half.rationale
    assert (none.label, none.level) == (0, "insufficient")
    assert rater.prompt_version == "coverage-0.8-0.4"
