"""The service's surface as clients and tools meet it (issue 20 item 7 and the start-up checks):
HEAD /healthz, no trailing-slash redirect, /docs offline, a schema that states its rules, numbers
that are numbers, 422 messages without pydantic internals, deep JSON named as such, the coverage
warning at start-up, and the verdict cache and question fitting on their own.
"""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from test_service_support import ServiceServer, load_scorer

from suffice.serving.service import create_app, load_service_config
from suffice.serving.service.app import coverage_warning
from suffice.serving.service.verdicts import VerdictCache, fit_question

Q = "Where is the Eiffel Tower?"


@pytest.fixture(scope="module")
def scorer(bundles):
    return load_scorer(bundles["sufficiency"])


@pytest.fixture(scope="module")
def client(scorer):
    cfg = load_service_config(None, ["--context_gate.model_weight=0.0"])
    with ServiceServer(create_app(cfg, scorer, api_keys=[], upstream_api_key=None)) as s, s.client() as c:
        yield c


def test_head_healthz_and_no_trailing_slash_redirect(client):
    r = client.head("/healthz")
    assert r.status_code == 200 and r.content == b""
    r = client.post("/v1/sufficiency/", json={"question": Q}, follow_redirects=False)
    assert r.status_code == 404 and "location" not in r.headers
    assert client.get("/healthz/", follow_redirects=False).status_code == 404


def test_docs_work_offline_from_local_assets(client):
    page = client.get("/docs")
    assert page.status_code == 200
    assert "cdn." not in page.text and "http://" not in page.text and "https://" not in page.text
    pytest.importorskip("swagger_ui_bundle")
    for src in re.findall(r"""(?:src|href)=['"](/docs/assets/[^'"]+)['"]""", page.text):
        assert client.get(src).status_code == 200, src
    assert '/docs/assets/swagger-ui-bundle.js' in page.text


def test_schema_states_non_blank_fields_and_strict_numbers(client):
    spec = client.get("/openapi.json").json()
    question = spec["components"]["schemas"]["SufficiencyRequest"]["properties"]["question"]
    assert question["minLength"] == 1 and question["pattern"] == r"\S"
    bad = [("/v1/context-gate", {"artifacts": [{"id": "a", "kind": "document", "content": "x", "authority": True}]}),
           ("/v1/context-gate", {"artifacts": [], "budget_tokens": True}),
           ("/v1/safety-check", {"question": "q?", "thresholds": {"min_grounding": False}}),
           ("/v1/safety-check", {"question": "q?", "thresholds": {"reject_insufficient": "yes"}}),
           ("/v1/safety-check", {"question": "q?", "chunks": [{"text": "t", "score": "0.5"}]})]
    for path, body in bad:
        r = client.post(path, json=body)
        assert r.status_code == 422, (path, body, r.text)
    assert client.post("/v1/context-gate", json={"artifacts": [{"id": "a", "kind": "document", "content": "x",
                                                                  "authority": 1}]}).status_code == 200


def test_422_messages_name_fields_without_pydantic_internals(client):
    r = client.post("/v1/sufficiency", json={"question": Q, "passages": [3]})
    err = r.json()["error"]
    assert r.status_code == 422 and err["param"] == "body.passages.0"
    for text in (err["message"], *(f["field"] for f in r.json()["fields"])):
        assert "function-after" not in text and "valid_unicode" not in text and "PassageIn" not in text
    r = client.post("/v1/sufficiency", json={"question": "  "})
    assert r.json()["error"]["message"] == "invalid request: body.question: must contain non-whitespace text"


def test_very_deep_json_is_named_as_such(client):
    deep = b"[" * 5000 + b"]" * 5000
    r = client.post("/v1/sufficiency", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "nested_too_deeply"
    assert "not valid JSON" not in r.json()["error"]["message"]
    r = client.post("/v1/sufficiency", content=b'{"question": [[[', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_json"  # broken, not deep
    r = client.post("/v1/sufficiency", json={"question": Q, "passages": [{"title": "[[[[{{{{" * 40, "text": "x"}]})
    assert r.status_code == 200  # brackets inside strings do not count


def test_missing_aspects_match_irregular_forms(scorer):
    r = scorer.score("When did Chopin leave Warsaw?", ["Frederic Chopin left Warsaw in 1830, aged twenty."])
    assert not any("leave" in m for m in r.missing_aspects)


# -- start-up ---------------------------------------------------------------------------------
def fake_scorer(metrics):
    manifest = SimpleNamespace(metrics=metrics, model_version=None, registered_model=None, files={}, model_file="model.onnx")
    return SimpleNamespace(manifest=manifest, thresholds={"sufficient": 0.8, "partial": 0.5})


def test_coverage_warning_names_the_numbers():
    low = coverage_warning(fake_scorer({"validation_levels": {"coverage_at_sufficient": 1 / 256, "sufficient_threshold": 0.8, "items": 256}}), 0.2)
    assert low and "0.4%" in low and "256" in low and "coverage_floor=0.2" in low and "sufficient>=0.8" in low
    assert coverage_warning(fake_scorer({"validation_levels": {"coverage_at_sufficient": 0.35}}), 0.2) is None
    assert coverage_warning(fake_scorer({}), 0.2) is None  # not recorded: say nothing
    assert coverage_warning(fake_scorer({"validation_levels": {"coverage_at_sufficient": 0.1}}), 0.0) is None


def test_coverage_warning_is_logged_at_start(caplog):
    caplog.set_level(logging.WARNING, logger="suffice.service")
    create_app(load_service_config(None), fake_scorer({"validation_levels": {"coverage_at_sufficient": 0.004}}), api_keys=[], upstream_api_key=None)
    assert any("coverage_floor" in rec.getMessage() for rec in caplog.records)


# -- the pieces -------------------------------------------------------------------------------
def words(t: str) -> int:
    return len(t.split())


def test_fit_question_prefers_the_last_questions_then_the_tail():
    assert fit_question("Short?", words, 5) == ("Short?", False)
    text = "Context one. What about A? Context two. And where is B? Thanks."
    assert fit_question(text, words, 8) == ("What about A? And where is B?", True)
    assert fit_question(text, words, 4) == ("And where is B?", True)
    assert fit_question("one two three four five six", words, 2) == ("five six", True)
    assert fit_question("x" * 50, len, 10) == ("x" * 10, True)


def test_verdict_cache_expires_and_is_bounded():
    now = [0.0]
    cache = VerdictCache(ttl_s=10, max_size=2, clock=lambda: now[0])
    cache.put("a", {"v": 1})
    got = cache.get("a")
    got["v"] = 99  # a copy: callers cannot change what is stored
    assert cache.get("a") == {"v": 1}
    cache.put("b", 2), cache.put("c", 3)
    assert cache.get("a") is None and len(cache) == 2
    now[0] = 11
    assert cache.get("b") is None
    assert VerdictCache(ttl_s=0, max_size=5).get("x") is None


def test_service_takes_the_bundles_thresholds_unless_the_config_overrides_them(bundles, tmp_path, caplog):
    """configs/service.yaml leaves the thresholds to the bundle: a bundle trained with other thresholds
    is served with them, and the start-up warning names its recorded validation coverage; an explicit
    --sufficient_context.thresholds.* still wins, key by key."""
    import shutil
    from dataclasses import replace
    from pathlib import Path

    from suffice.serving.bundle import read_manifest, write_manifest
    from suffice.serving.service import build_service

    bundle = shutil.copytree(bundles["sufficiency"], tmp_path / "bundle")
    write_manifest(bundle, replace(read_manifest(bundle), thresholds={"sufficient": 0.65, "partial": 0.35}, metrics={
        "validation_levels": {"coverage_at_sufficient": 0.05, "sufficient_threshold": 0.65, "items": 40}}))
    shipped = Path(__file__).resolve().parent.parent / "configs" / "service.yaml"
    caplog.set_level(logging.WARNING, logger="suffice.service")
    _, scorer, _ = build_service(str(bundle), load_service_config(shipped))
    assert scorer.thresholds == {"sufficient": 0.65, "partial": 0.35}
    warning = next(rec.getMessage() for rec in caplog.records if "coverage_floor" in rec.getMessage())
    assert "(threshold 0.65) on only 5.0% of 40 validation items" in warning and "sufficient>=0.65" in warning
    assert "coverage_floor=0.2" in warning

    _, scorer, _ = build_service(str(bundle), load_service_config(shipped, ["--sufficient_context.thresholds.sufficient=0.9"]))
    assert scorer.thresholds == {"sufficient": 0.9, "partial": 0.35}
    from suffice.serving.service import ServiceConfigError

    with pytest.raises(ServiceConfigError, match=r"sufficient_context.thresholds: partial=0.35 > sufficient=0.3 \(the bundle's sufficient=0.65"):
        build_service(str(bundle), load_service_config(shipped, ["--sufficient_context.thresholds.sufficient=0.3"]))
