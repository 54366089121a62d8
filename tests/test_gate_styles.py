"""Retrieval-gate writing styles (issue 33): label-keeping rewrites, styled copies, the conservative threshold."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from suffice.serving.lexical import entities
from suffice.training.data.styles import CONVERSATION_STYLES, MESSAGE_STYLES, STYLES, apply_style, check_styles, style_of, styled_copies, styled_row

MESSAGES = ["Could you please sort that by price descending?", "ok so what about the Pro plan for 3 users, is it cheaper?",
            "Thanks!", "Now find me all fruits under $2", "Does Greenbasket deliver to Millbrook Heights on Sundays?"]


@pytest.mark.parametrize("style", sorted(MESSAGE_STYLES))
def test_styles_change_the_writing_not_the_request(style):
    for m in MESSAGES:
        out = apply_style(style, m, seed="t1")
        assert out.strip() and out == apply_style(style, m, seed="t1")  # deterministic
        if style != "typos":  # names and numbers survive: the referents the label hangs on
            assert all(e.lower() in out.lower() for e in entities(m)), (m, out)
        if style in ("terse", "no_punct", "lowercase", "shouting"):  # these add no word at all
            assert set(re.findall(r"[\w$']+", out.lower())) <= set(re.findall(r"[\w$']+", m.lower()))
    assert apply_style("typos", MESSAGES[0], seed="a") != MESSAGES[0]


def test_conversation_styles_keep_every_turn_and_add_no_name():
    turns = [{"title": "user", "content": "x", "text": "What does the Pro plan cost?"},
             {"title": "assistant", "text": "The Pro plan costs $12 a month."},
             {"title": "user", "text": "And Basic?"}, {"title": "assistant", "text": "Basic is $5. Want me to compare them?"}]
    row = {"id": "t1", "question": "yes please", "passages": turns, "label": 1, "source": "retrieval-gate"}
    assert set(CONVERSATION_STYLES) <= set(STYLES)
    for style in CONVERSATION_STYLES:
        out = styled_row(row, style)
        assert out == styled_row(row, style) and out["question"] == row["question"] and out["label"] == 1
        assert row["passages"] == turns  # the input row is not modified
        texts = [t["text"] for t in out["passages"]]
        for t in turns:  # every original turn survives, in order, its words unchanged
            assert any(t["text"] in x for x in texts)
    from suffice.training.data import styles as st

    chatty = styled_row(row, "chatty_assistant")["passages"]
    for orig, out in zip(turns, chatty):  # only the pleasantries are added around an assistant's reply
        stripped = out["text"]
        for phrase in (*st._OPENERS, *st._CLOSERS):
            stripped = stripped.replace(phrase, "").strip()
        assert stripped == orig["text"]
    assert chatty[3]["text"].endswith("compare them?")  # an offer stays the last thing the assistant said
    assert chatty[1]["text"] != turns[1]["text"] and chatty[0] == turns[0]
    first = styled_row(row, "small_talk_first")["passages"]
    assert [t["title"] for t in first[:2]] == ["user", "assistant"] and first[2:] == turns
    with pytest.raises(ValueError, match="rewrites the earlier turns"):
        apply_style("chatty_assistant", "hi")


def test_styles_are_the_same_in_another_process():
    """Styled copies key a resumable run's data hash: another hash seed must give the same text."""
    code = ("from suffice.training.data.styles import apply_style as a;"
            "print(a('typos', 'Could you please sort that by price descending?', 'x'), a('greeting', 'hi there', 'y'))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("0", "18")}
    assert len(outs) == 1


def test_styled_copies_keep_pairs_and_labels():
    rows = [{"id": f"t{i}", "question": q, "passages": [{"title": "assistant", "text": "Basic is $5."}], "label": i % 2,
             "source": "retrieval-gate", "pair": f"p{i // 2}"} for i, q in enumerate(MESSAGES[:4])]
    out = styled_copies(rows, ["typos", "terse", "verbose"], 2, seed=0)
    assert len(out) == 8 and all(style_of(r["source"]) in {"typos", "terse", "verbose"} for r in out)
    by_pair: dict[str, set] = {}
    for r in out:
        src = next(x for x in rows if r["id"].startswith(x["id"] + "~"))
        assert r["label"] == src["label"] and r["passages"] == src["passages"] and r["pair"] == f"{src['pair']}~{style_of(r['source'])}"
        by_pair.setdefault(src["pair"], set()).add(r["pair"])
    assert all(len(v) == 2 for v in by_pair.values())  # both threads of a pair got the same two styles
    assert styled_row(rows[0], "lowercase")["id"] == "t0~lowercase" and style_of("retrieval-gate") == ""
    assert styled_copies(rows, [], 1, 0) == [] and styled_copies(rows, ["typos"], 0, 0) == []
    with pytest.raises(ValueError, match="unknown style 'klingon'.*choose from"):
        check_styles(["typos", "klingon"])


def test_config_checks_styles():
    from suffice.training.fit.config import ConfigError, RetrievalGateData

    assert RetrievalGateData(styles=["typos", "typos", "terse"]).styles == ["typos", "terse"]
    with pytest.raises(ConfigError, match="unknown style 'emoji'"):
        RetrievalGateData(styles=["emoji"])
    with pytest.raises(ConfigError, match="style_copies"):
        RetrievalGateData(style_copies=-1)


def test_gate_splits_get_styled_train_and_validation(tmp_path):
    """gate.styles adds styled train copies and one validation copy per style; test stays the writer's own."""
    import json

    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.splits import load_gate_splits

    threads = tmp_path / "threads.jsonl"
    with threads.open("w") as f:
        for i in range(60):
            msgs = [{"role": "user", "content": f"What does plan {i} cost?"}, {"role": "assistant", "content": f"Plan {i} costs ${i}."},
                    {"role": "user", "content": "Thanks, put that in a table" if i % 2 else f"What about plan {i + 100}?"}]
            f.write(json.dumps({"id": f"t{i}", "messages": msgs, "label": "SKIP" if i % 2 else "RETRIEVE"}) + "\n")
    plain = load_gate_splits(build_train_config("configs/retrieval-gate.yaml", [f"--gate.path={threads}", "--gate.split=opening_message",
                                                                                "--gate.styles=[]"]))
    cfg = build_train_config("configs/retrieval-gate.yaml", [f"--gate.path={threads}", "--gate.split=opening_message",
                                                              "--gate.styles=[typos,terse]", "--gate.style_copies=1"])
    styled = load_gate_splits(cfg)
    assert len(styled.train) == 2 * len(plain.train) and len(styled.validation) == 3 * len(plain.validation)
    assert len(styled.test) == len(plain.test) and set(styled.test["source"]) == {"retrieval-gate"}
    assert set(styled.validation["source"]) == {"retrieval-gate", "retrieval-gate~typos", "retrieval-gate~terse"}
    assert styled.data_hash != plain.data_hash


def test_skip_threshold_is_the_most_conservative_style():
    from suffice.serving.calibration import Calibration
    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.finalize import skip_threshold

    cfg = build_train_config("configs/retrieval-gate.yaml", ["--gate.style_threshold=max"])
    rng = np.random.default_rng(0)
    y = np.tile([0, 1], 200)
    own = np.where(y == 1, 2.0, -2.0) + rng.normal(0, 1, y.size)          # the writer's own threads: well separated
    shifted = np.where(y == 1, 0.5, -0.5) + rng.normal(0, 1, y.size)      # a style the model reads worse
    logits = np.stack([-np.concatenate([own, shifted]), np.concatenate([own, shifted])], axis=1) / 2
    labels = np.concatenate([y, y])
    cal = Calibration(temperature=1.0)
    alone, _ = skip_threshold(cfg, logits[:400], labels[:400], cal)
    th, info = skip_threshold(cfg, logits, labels, cal, ["retrieval-gate"] * 400 + ["retrieval-gate~typos"] * 400)
    assert set(info["skip_threshold_by_style"]) == {"own", "typos"} and info["threshold_rule"] == "max over styles"
    assert info["skip_threshold_by_style"]["own"] == pytest.approx(alone["skip"])
    assert th["skip"] == max(info["skip_threshold_by_style"].values()) > alone["skip"]
    assert info["validation_skip_precision"] >= 0.95

    # gate.style_threshold=pooled: one threshold over all copies, between the two styles' own thresholds
    pooled_cfg = build_train_config("configs/retrieval-gate.yaml", ["--gate.style_threshold=pooled"])
    pth, pinfo = skip_threshold(pooled_cfg, logits, labels, cal, ["retrieval-gate"] * 400 + ["retrieval-gate~typos"] * 400)
    assert pinfo["threshold_rule"] == "pooled over styles" and pinfo["skip_threshold_by_style"] == info["skip_threshold_by_style"]
    assert alone["skip"] <= pth["skip"] < th["skip"] and pinfo["validation_skip_precision"] >= 0.95


def test_style_threshold_rule_is_checked():
    from suffice.training.fit.config import ConfigError, RetrievalGateData

    with pytest.raises(ConfigError, match="gate.style_threshold='median': choose 'max' or 'pooled'"):
        RetrievalGateData(style_threshold="median")
