"""Verdict parsing (fences, stray text, lenient JSON, refusals) and the prompt texts and version hash."""

from __future__ import annotations

import pytest

from suffice.training.autorater.parsing import VerdictParseError, parse_verdict
from suffice.training.autorater.prompts import EXAMPLE_VERDICT, PROMPTS, SufficiencyPrompt, format_context, get_prompt

COT = "Step-by-step:\nQ1: Who? A1: Ada (passage 1).\nExplanation: The context names her.\n"


@pytest.mark.parametrize("reply, label", [
    (COT + '{"Sufficient Context": 1}', 1),
    (COT + '{"Sufficient Context": 0}', 0),
    (COT + '```json\n{"Sufficient Context": 1}\n```', 1),
    (COT + '```\n{ "Sufficient Context" : 0 }\n```\nLet me know if you need more.', 0),
    (COT + "{'Sufficient Context': 'yes'} hope that helps", 1),
    (COT + '{"sufficient_context": true,}', 1),
    (COT + "{Sufficient Context: 0}", 0),
    (COT + "Sufficient Context: 1", 1),
    (COT + '**Verdict**: {"Sufficient Context": "0"}', 0),
    # The model echoes the prompt's example verdict first; its own verdict comes last and wins.
    ('Example says {"Sufficient Context": 0}. For this item: ' + COT + '{"Sufficient Context": 1}', 1),
    (COT + '{"answer": "Ada", "note": "brace } inside a string"}\n{"Sufficient Context": 1}', 1),
])
def test_binary_verdicts(reply, label):
    v = parse_verdict(reply)
    assert v.label == label
    assert v.level is None


def test_rationale_is_the_explanation():
    v = parse_verdict(COT + '{"Sufficient Context": 1}')
    assert v.rationale == "The context names her."


@pytest.mark.parametrize("reply", [
    "", "   ", "I am not sure whether the context is enough.",
    '{"answer": "Ada"}',                       # JSON, but no verdict
    '{"Sufficient Context": "maybe"}',         # verdict key with an unusable value
    '{"Sufficient Context": 2}',
    # The last verdict is the model's conclusion: an unusable one is refused even after a usable draft.
    '{"Sufficient Context": 1} ... on reflection: {"Sufficient Context": "unclear"}',
])
def test_no_verdict_is_an_error_not_a_label(reply):
    with pytest.raises(VerdictParseError):
        parse_verdict(reply)


@pytest.mark.parametrize("reply, label, level", [
    ('{"Sufficient Context": 0, "Level": "partial"}', 0, "partial"),
    ('{"Sufficient Context": 0, "Level": "Insufficient"}', 0, "insufficient"),
    ('{"Sufficient Context": 1, "Level": "sufficient"}', 1, "sufficient"),
    ('{"Level": "partial"}', 0, "partial"),
    ('{"Sufficient Context": 1}', 1, "sufficient"),  # a lone 1 can only mean sufficient
])
def test_three_level_verdicts(reply, label, level):
    v = parse_verdict(COT + reply, scheme="three_level")
    assert (v.label, v.level) == (label, level)


@pytest.mark.parametrize("reply", [
    '{"Sufficient Context": 1, "Level": "partial"}',  # contradiction: never resolved by guessing
    '{"Sufficient Context": 0}',                       # partial or insufficient? refuse
    '{"Sufficient Context": 0, "Level": "somewhat"}',
    '{"Sufficient Context": 1, "Level": "mostly"}',
])
def test_three_level_refuses_ambiguous(reply):
    with pytest.raises(VerdictParseError):
        parse_verdict(COT + reply, scheme="three_level")


def test_binary_accepts_a_level_only_verdict():
    assert parse_verdict('{"Level": "sufficient"}').label == 1
    assert parse_verdict('{"Level": "partial"}').label == 0


def test_prompt_follows_the_recipe():
    for scheme, prompt in PROMPTS.items():
        msgs = prompt.messages("Who founded Acme?", [{"title": "Acme", "text": "Acme was founded by Ada."}])
        user = msgs[-1]["content"]
        assert msgs[0]["role"] == "system" and msgs[-1]["role"] == "user"
        assert "diligent reader" in user and "outside knowledge" in user and "multi-hop" in user
        assert "Step-by-step" in user and "Explanation" in user
        assert user.count("EXAMPLE") == 1  # exactly one worked example: 1-shot
        assert EXAMPLE_VERDICT[scheme] in user
        assert user.rstrip().endswith("[1] Acme: Acme was founded by Ada.")
        # The example's own verdict must parse under the scheme (the model imitates it).
        assert parse_verdict(EXAMPLE_VERDICT[scheme], scheme=scheme).label == 0
    assert "partial" in PROMPTS["three_level"].instructions and "partial" not in PROMPTS["binary"].instructions


def test_prompt_version_is_stable_and_tracks_the_text():
    a, b = get_prompt("binary"), get_prompt("three_level")
    assert a.version == get_prompt("binary").version
    assert a.version.startswith("binary-") and b.version.startswith("three_level-")
    edited = SufficiencyPrompt(a.scheme, a.system, a.instructions.replace("diligent", "careful"))
    assert edited.version != a.version
    with pytest.raises(ValueError, match="unknown label scheme"):
        get_prompt("five_level")


def test_format_context_numbers_passages():
    assert format_context([{"title": "A", "text": " x. "}, {"title": "", "text": "y."}]) == "[1] A: x.\n[2] y."
    assert "no context" in format_context([])
