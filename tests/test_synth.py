"""`suffice synth` against a real local OpenAI-compatible server (tests/llm_server.py): question writing with
malformed replies, 429 and 500s, re-judging and the disagreement rate, deduplication, resumability, split
inheritance into the data pipeline, multi-passage mode with partial variants, MLflow without secrets, and the
import of the shipped synthetic questions."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import pytest
from llm_server import FakeLLMServer, Reply, messages_text

from suffice.training.synth.cli import main
from suffice.training.synth.config import SynthConfig
from suffice.training.synth.corpus import load_corpus, make_seeds, normalize_question
from suffice.training.synth.prompt import SINGLE_KINDS, UNANSWERABLE_KINDS, GenerationPrompt, split_counts
from suffice.training.synth.questions import GenerationParseError, extract_questions, validate_question
from store_support import store_rows

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures"
SHARED = FIX / "shared"
FIXTURE_SYNTH = SHARED / "synthetic" / "squad2-questions.jsonl"
SECRET = "sk-synth-test-0a1b2c3d-DO-NOT-LEAK"
KEY_ENV = "SUFFICE_TEST_SYNTH_KEY"
ANSWERABLE = ("direct", "paraphrase", "combine")
UNANSWERABLE = tuple(UNANSWERABLE_KINDS)
TITLES = ("Alpha", "Beta", "Gamma", "Delta", "Epsilon")
SPLIT_OF = {"Alpha": "train", "Beta": "train", "Gamma": "validation", "Delta": "test", "Epsilon": "train"}


# ---------------------------------------------------------------- the fake teacher


def _passages(text: str) -> list[tuple[str, str]]:
    """(subject, line) of each passage in a generation prompt: the title, or the first three words."""
    block = re.split(r"\nPASSAGES?:\n", text)[-1]
    out = []
    for line in block.splitlines():
        m = re.match(r"\[\d+\] (.*)$", line)
        if m:
            body = m.group(1)
            title = body.split(": ", 1)[0] if ": " in body and len(body.split(": ", 1)[0].split()) <= 3 else ""
            out.append((title or " ".join(body.split()[:3]), body))
    return out


def write_questions(text: str) -> Reply:
    """Answerable questions name their subject in «»; unanswerable ones say "unknown"; multi questions name both."""
    k = int(re.search(r"Write (\d+) new questions", text).group(1))
    passages = _passages(text)
    if "PASSAGES:" in text:
        (a, _), (b, _) = passages[:2]
        qs = [{"question": f"Which came first, «{a}» or «{b}» ({i})?", "kind": ("bridge", "comparison")[i % 2],
               "label": 1, "level": "sufficient", "answer": a} for i in range(k)]
        return Reply.questions(qs)
    subject, body = passages[0]
    tag = len(body)
    n_ans = int(re.search(r": (\d+) answerable", text).group(1))
    offered = re.findall(r"^- (\w+): ", text, re.M)  # the kinds the prompt lists
    ans = [x for x in ANSWERABLE if x in offered] or ["direct"]
    un = [x for x in UNANSWERABLE if x in offered] or ["premise_date"]
    qs = [{"question": f"What is known fact {i} about «{subject}» #{tag}?", "kind": ans[i % len(ans)], "label": 1,
           "level": "sufficient", "answer": f"fact {i}"} for i in range(n_ans)]
    qs += [{"question": f"What is the unknown detail {j} of «{subject}» #{tag}?", "kind": un[j % len(un)], "label": 0,
            "level": "partial", "answer": None} for j in range(k - n_ans)]
    return Reply.questions(qs)


def judge(text: str) -> Reply:
    """1 iff the question is not an "unknown" one and every «subject» it names is a passage of the context."""
    item = text.split("Now the item to judge.")[-1]
    m = re.search(r"QUESTION: (.*?)\nCONTEXT:\n(.*)", item, re.S)
    question, context = m.group(1), m.group(2)
    subjects = re.findall(r"«([^»]*)»", question)
    ok = "unknown" not in question and all(f"] {s}" in context for s in subjects)
    return Reply.verdict(int(ok))


def teacher(body: dict) -> Reply:
    text = messages_text(body)
    if "Now the item to judge." in text:
        return judge(text)
    if "new questions" in text:
        return write_questions(text)
    return Reply.text("I do not understand the request.")


@pytest.fixture
def server():
    with FakeLLMServer(default=teacher) as s:
        yield s


def write_corpus(path: Path, titles=TITLES) -> Path:
    with path.open("w") as f:
        for n, t in enumerate(titles):
            f.write(json.dumps({"id": f"wiki:{n}", "source": "wiki", "split": SPLIT_OF[t], "group": f"wiki:{t}",
                                "question": f"What is {t} known for?",
                                "passages": [{"title": t, "text": f"{t} is a town. It was founded in 19{n}0."}]}) + "\n")
    return path


def common(server: FakeLLMServer, tmp_path: Path, *extra: str) -> list[str]:
    return ["--store", str(tmp_path / "labels.sqlite"), "--out", str(tmp_path / "synth.jsonl"), f"--base_url={server.base_url}",
            "--model=fake-llm", "--api_key_env=", "--no-progress", "--mlflow=false", "--backoff_base_s=0.01",
            "--backoff_max_s=0.05", "--timeout_s=5", *extra]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "report.json").read_text())


# ---------------------------------------------------------------- generation, judging, resuming


def test_generation_with_malformed_replies_429_and_500_then_rejudging(server, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    server.on("PASSAGE:\n[1] Beta:", Reply.text("Sure! Here are some great questions about Beta."))  # the reminder fixes it
    server.on("PASSAGE:\n[1] Gamma:", Reply.error(429, retry_after=0))
    server.on("PASSAGE:\n[1] Delta:", Reply.error(500))
    server.on("PASSAGE:\n[1] Epsilon:", Reply.text("no"), Reply.text("still no JSON"))  # stays unparsed
    server.on("QUESTION: What is the unknown detail 1 of «Alpha»", Reply.verdict(1))  # writer 0 / judge 1
    server.on("QUESTION: What is known fact 0 about «Beta»", Reply.verdict(0))  # writer 1 / judge 0
    rc = main(["--corpus", str(corpus), "--per-passage", "4", "--json", str(tmp_path / "report.json"), *common(server, tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    got = rows(tmp_path / "synth.jsonl")
    assert len(got) == 4 * 4 - 2  # Alpha, Beta, Gamma, Delta; Epsilon unparsed; two disagreements dropped
    for r in got:
        subject = re.search(r"«(\w+)»", r["question"]).group(1)
        assert r["split"] == SPLIT_OF[subject] and r["group"] == f"wiki:{subject}"
        assert r["label_source"] == "synthetic" and r["generator"] == "gen:fake-llm" and r["source"] == "wiki-synthetic"
        assert r["id"].startswith("wiki-synth:") and r["judge"].startswith("llm:fake-llm@binary-")
        assert (r["label"], r["level"]) == ((1, "sufficient") if "known fact" in r["question"] else (0, "partial"))
        assert r["kind"] in (ANSWERABLE if r["label"] else UNANSWERABLE)
        assert (r["answer"] is not None) == (r["label"] == 1)
        assert r["passages"] == [{"title": subject, "text": f"{subject} is a town. It was founded in 19{TITLES.index(subject)}0."}]
    questions = {r["question"] for r in got}
    assert not any(q.startswith("What is the unknown detail 1 of «Alpha»") or q.startswith("What is known fact 0 about «Beta»")
                   for q in questions)
    s = report(tmp_path)
    assert (s["judged"], s["disagree"], s["disagreement_rate"]) == (16, 2, 2 / 16)
    assert s["disagree_by_direction"] == {"writer 0 / judge 1": 1, "writer 1 / judge 0": 1}
    assert (s["unparsed_replies"], s["kept"], s["kept_by_split"]) == (1, 14, {"test": 4, "train": 6, "validation": 4})
    gen = s["generation"]
    assert gen["failures"] == {"http_429": 1, "http_500": 1, "unparsed_reply": 2, "unparsed": 1}
    assert (gen["requests"], gen["stored_ok"], gen["stored_unparsed"]) == (5 + 2 + 2, 4, 1)
    assert s["judging"]["requests"] == 16 and server.n_requests == 9 + 16
    assert gen["tokens_in"] > 0 and s["judging"]["tokens_in"] > 0
    assert "disagreement rate 12.5% (the noise estimate)" in out and "1 unparsed" in out and "http_429 1" in out
    # The judge's verdicts are ordinary labels in the shared store, next to the cached generations.
    conn = sqlite3.connect(tmp_path / "labels.sqlite")
    assert conn.execute("SELECT COUNT(*) FROM labels WHERE rater='llm:fake-llm'").fetchone()[0] == 16
    assert conn.execute("SELECT COUNT(*), SUM(status='unparsed') FROM generations").fetchone() == (5, 1)
    assert "still no JSON" in conn.execute("SELECT raw FROM generations WHERE status='unparsed'").fetchone()[0]


def test_second_run_makes_no_requests_and_retry_unparsed_finishes(server, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    server.on("PASSAGE:\n[1] Epsilon:", Reply.text("no"), Reply.text("no again"))
    args = ["--corpus", str(corpus), "--per-passage", "2", "--json", str(tmp_path / "report.json"), *common(server, tmp_path)]
    assert main(args) == 0
    first = (tmp_path / "synth.jsonl").read_text()
    assert len(rows(tmp_path / "synth.jsonl")) == 8
    server.reset_counters()
    capsys.readouterr()
    assert main(args) == 0
    assert server.n_requests == 0  # neither a generation nor a verdict is asked for twice
    assert (tmp_path / "synth.jsonl").read_text() == first
    assert "5 already generated (skipped), 0 asked" in capsys.readouterr().out
    assert report(tmp_path)["judging"]["skipped_already_stored"] == 8
    assert main([*args, "--retry-unparsed"]) == 0
    assert server.n_requests == 1 + 2  # Epsilon's passage once, then its two questions judged
    assert len(rows(tmp_path / "synth.jsonl")) == 10


def test_duplicates_and_invalid_questions_are_dropped_and_counted(server, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", titles=("Alpha", "Beta"))
    existing = tmp_path / "existing.jsonl"
    existing.write_text(json.dumps({"id": "old:1", "question": "Who founded Beta?", "passages": []}) + "\n")
    q = lambda text, kind="direct", label=1, answer="x", **kw: {"question": text, "kind": kind, "label": label,  # noqa: E731
                                                              "answer": answer, **kw}
    server.on("PASSAGE:\n[1] Alpha:", Reply.questions([
        q("When was Alpha founded?"),
        q("what is ALPHA known for"),  # the corpus's own question, in other case and punctuation
        q("When was  Alpha founded ?!", kind="paraphrase"),  # repeats the first one
        q("How old is Alpha's mayor?", kind="missing_attribute", label=0, answer=None),
        q("Which river runs through Alpha?", kind="riddle"),  # unknown kind
        q("Is Alpha a city?", kind="premise_entity", label=1),  # label contradicts kind
        q("What is Alpha's motto?", answer=None),  # answerable without an answer
        {"kind": "direct"},  # no question
    ]))
    server.on("PASSAGE:\n[1] Beta:", Reply.questions([
        q("When was Alpha founded?"),  # repeats a question of another passage
        q("Who founded Beta?"),  # in --existing
        q("How many people live in Beta?"),
    ]))
    server.on("QUESTION: How old is Alpha's mayor?", Reply.verdict(0))
    rc = main(["--corpus", str(corpus), "--per-passage", "4", "--existing", str(existing), "--json", str(tmp_path / "report.json"),
               *common(server, tmp_path)])
    assert rc == 0
    s = report(tmp_path)
    assert (s["duplicates_existing"], s["duplicates_batch"], s["duplicates_dropped"]) == (2, 2, 4)
    assert s["invalid"] == {"answerable_without_answer": 1, "label_contradicts_kind": 1, "no_question": 1, "unknown_kind": 1}
    assert s["candidates"] == 3 and s["judging"]["requests"] == 3
    assert sorted(r["question"] for r in rows(tmp_path / "synth.jsonl")) == [
        "How many people live in Beta?", "How old is Alpha's mayor?", "When was Alpha founded?"]


# ---------------------------------------------------------------- splits and the data pipeline


def test_questions_inherit_their_passage_split_and_test_passages_never_feed_training(server, tmp_path):
    rc = main(["--corpus", str(SHARED / "items.jsonl"), "--per-passage", "2", "--json", str(tmp_path / "report.json"),
               *common(server, tmp_path)])
    assert rc == 0
    from suffice.training.data.loaders import load_items

    items = load_items(SHARED / "items.jsonl")
    split_of_text = {}
    for it in items:
        for p in it.passages:
            split_of_text.setdefault(p.text, set()).add(it.split)
    got = rows(tmp_path / "synth.jsonl")
    assert {r["split"] for r in got} == {"train", "validation", "test"}
    group_split = {it.group: it.split for it in items}
    for r in got:
        assert r["split"] == group_split[r["group"]] and split_of_text[r["passages"][0]["text"]] == {r["split"]}
    test_texts = {p.text for it in items if it.split == "test" for p in it.passages}
    assert any(r["passages"][0]["text"] in test_texts and r["split"] == "test" for r in got)

    from suffice.training.data.builder import DataConfig, build

    ds, manifest = build(DataConfig(data_dir=str(SHARED), include_variants=False, synthetic_path=str(tmp_path / "synth.jsonl")),
                         progress=False)
    train_synth = [r for r in ds["train"] if r["label_source"] == "synthetic"]
    assert len(train_synth) == sum(r["split"] == "train" for r in got) > 0
    assert not any(r["passages"][0]["text"] in test_texts for r in train_synth)
    # synthetic questions keep a validation split (reported as their own source), never a test one
    assert len([r for r in ds["validation"] if r["label_source"] == "synthetic"]) == sum(r["split"] == "validation" for r in got)
    assert not [r for r in ds["test"] if r["label_source"] == "synthetic"]
    assert manifest["dropped"]["synthetic outside train/validation or across a split"] == sum(r["split"] == "test" for r in got)
    # --splits train asks only about training passages.
    server.reset_counters()
    out2 = tmp_path / "train-only.jsonl"
    assert main(["--corpus", str(SHARED / "items.jsonl"), "--per-passage", "2", "--splits", "train",
                 *common(server, tmp_path), "--out", str(out2)]) == 0
    assert server.n_requests == 0 and {r["split"] for r in rows(out2)} == {"train"}


def test_multi_passage_mode_writes_bridge_questions_and_partial_variants(server, tmp_path):
    # f1 (train) pairs its two supporting passages, m1 (train) its supporting ones, f2 (test) its first two.
    server.on("QUESTION: Which came first, «Acme Corp» or «Widget» (1)?\nCONTEXT:\n[1] Acme Corp: Acme Corp was founded by "
              "Jane Roe.\n[2] Widget:", Reply.verdict(0))  # the full question is judged insufficient
    rc = main(["--corpus", str(SHARED / "items.jsonl"), "--multi", "--per-passage", "2", "--json", str(tmp_path / "report.json"),
               *common(server, tmp_path)])
    assert rc == 0
    got = rows(tmp_path / "synth.jsonl")
    parents = [r for r in got if not r.get("variant")]
    variants = [r for r in got if r.get("variant")]
    s = report(tmp_path)
    assert (s["passages"], s["variants"], s["candidates"]) == (3, 12, 18)
    assert (s["disagree"], s["parent_dropped"], s["kept"]) == (1, 2, 15)
    assert len(parents) == 5 and len(variants) == 10
    by_id = {r["id"]: r for r in parents}
    for r in parents:
        assert (r["label"], r["level"], len(r["passages"])) == (1, "sufficient", 2) and r["kind"] in ("bridge", "comparison")
    for v in variants:
        parent = by_id[v["parent_id"]]
        assert (v["label"], v["level"], v["variant"], v["kind"]) == (0, "partial", "drop_passage", parent["kind"])
        assert v["question"] == parent["question"] and len(v["passages"]) == 1 and v["passages"][0] in parent["passages"]
        assert v["passages"][0]["title"] != v["dropped"] and v["split"] == parent["split"] and v["answer"] is None
    assert {r["split"] for r in got if "Acme" in r["question"]} == {"test"}
    titles = {tuple(p["title"] for p in r["passages"]) for r in parents}
    assert ("Freedonia", "Port Alba") in titles or ("Port Alba", "Freedonia") in titles


def test_plain_passage_corpora_get_a_split_of_their_own(tmp_path):
    entries = load_corpus(FIX / "passages.txt", split="train")
    assert [e.passages[0].text for e in entries] == ["Blue Lake is a crater lake in Oregon.", "Red Hill is a mountain in Wales."]
    assert {e.split for e in entries} == {"train"} and entries[0].group.startswith("p:")
    hashed = load_corpus(FIX / "passages.jsonl")
    assert [e.passages[0].title for e in hashed] == ["Blue Lake", ""] and all(e.split in ("train", "validation", "test") for e in hashed)
    assert load_corpus(FIX / "passages.jsonl")[0].split == hashed[0].split  # deterministic
    pairs = make_seeds(entries, "multi")
    assert len(pairs) == 1 and len(pairs[0].passages) == 2


def test_plain_passages_end_to_end(server, tmp_path):
    rc = main(["--corpus", str(FIX / "passages.txt"), "--per-passage", "3", "--kinds", "direct,premise_date", "missing_attribute",
               "--source=lakes", "--json", str(tmp_path / "report.json"), *common(server, tmp_path), "--split=train"])
    assert rc == 0
    got = rows(tmp_path / "synth.jsonl")
    assert len(got) == 6 and {r["source"] for r in got} == {"lakes-synthetic"} and {r["split"] for r in got} == {"train"}
    assert {r["kind"] for r in got} <= {"direct", "premise_date", "missing_attribute"}
    prompt = next(q["body"]["messages"][1]["content"] for q in server.requests if "new questions" in messages_text(q["body"]))
    assert "- direct:" in prompt and "- premise_date:" in prompt and "- paraphrase:" not in prompt
    assert "2 answerable" in prompt and "1 plausibly unanswerable" in prompt


def test_lexical_judge_makes_no_requests(server, tmp_path):
    rc = main(["--corpus", str(FIX / "passages.txt"), "--per-passage", "2", "--judge", "lexical", "--rater_id=llm:x",
               "--json", str(tmp_path / "report.json"), *common(server, tmp_path)])
    assert rc == 0
    s = report(tmp_path)
    assert s["judge"].startswith("lexical-coverage@coverage-") and s["judged"] == 4
    assert s["judging"]["requests"] == 0 and server.n_requests == 2


# ---------------------------------------------------------------- MLflow, secrets, errors


def test_mlflow_run_in_the_synth_experiment_and_the_key_never_leaks(server, tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    corpus = write_corpus(tmp_path / "corpus.jsonl", titles=("Alpha", "Beta"))
    server.on("PASSAGE:\n[1] Alpha:", Reply.error(429, retry_after=0, body={"error": f"slow down, Bearer {SECRET}"}))
    server.on("PASSAGE:\n[1] Beta:", Reply.text(f"echo {SECRET}"))
    args = [a for a in common(server, tmp_path) if a not in ("--api_key_env=", "--mlflow=false")]
    rc = main(["--corpus", str(corpus), "--per-passage", "2", f"--api_key_env={KEY_ENV}", "--price_per_1k_input=0.001", "-v", *args])
    out, err = capsys.readouterr()
    assert rc == 0 and "MLflow run" in out and "(experiment synth)" in out
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"

    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("synth").experiment_id])
    m = run.data.metrics
    assert m["judged"] == 4 and m["disagreement_rate"] == 0 and m["duplicates_dropped"] == 0 and m["kept"] == 4
    assert m["generation.requests"] == 2 + 1 + 1 and m["generation.failures.http_429"] == 1 and m["judging.requests"] == 4
    assert m["cost_usd"] > 0 and m["kept.train"] == 4
    assert run.data.params["model"] == "fake-llm" and run.data.params["synth.per_passage"] == "2"
    assert run.data.tags["prompt_version"].startswith("gen-single-")
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"accounting.json", "resolved_config.json", "generation_prompt.md", "judge_prompt.md"} <= artifacts
    local = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, tracking_uri=os.environ["MLFLOW_TRACKING_URI"],
                                                     dst_path=str(tmp_path / "dl")))
    texts = {"stdout": out, "stderr": err, "log": caplog.text, "output": (tmp_path / "synth.jsonl").read_text(),
             "store": "\n".join(sqlite3.connect(tmp_path / "labels.sqlite").iterdump()),
             "mlflow db": Path(os.environ["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///")).read_bytes().decode("latin-1"),
             "mlflow artifacts": "\n".join(p.read_text() for p in local.rglob("*") if p.is_file())}
    assert "***" in texts["store"]  # the echoed key was scrubbed before it was stored
    for where, text in texts.items():
        assert SECRET not in text, f"API key leaked into the {where}"


@pytest.mark.parametrize("args, message", [
    (["--rater", "cached"], "suffice synth import"),
    (["--per-passage", "0"], "per_passage=0 must be between 1 and 50"),
    (["--kinds", "riddle"], "are not single-passage kinds"),
    (["--kinds", "bridge"], "need --multi"),
    (["--multi", "--kinds", "direct"], "are not multi-passage kinds"),
    (["--per_pasage=3"], "unknown config key 'per_pasage'"),
    (["--judge_model=x"], "LabelingConfig keys are"),
    (["--format=html"], "choose auto, passages or one of"),
    ([f"--api_key_env={KEY_ENV}"], f"{KEY_ENV} is not set"),
])
def test_errors_name_the_fix(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    base = ["--corpus", str(FIX / "passages.txt"), "--model=m", "--api_key_env=", "--store", str(tmp_path / "s.sqlite"),
            "--mlflow=false", "--base_url=http://127.0.0.1:9/v1"]
    assert main([*base, *args]) == 2
    assert message in capsys.readouterr().err


def test_missing_corpus_and_empty_multi_corpus(tmp_path, capsys):
    base = ["--model=m", "--api_key_env=", "--store", str(tmp_path / "s.sqlite"), "--mlflow=false", "--base_url=http://127.0.0.1:9/v1"]
    assert main(["--corpus", str(tmp_path / "nope.txt"), *base]) == 2
    assert "does not exist" in capsys.readouterr().err
    one = tmp_path / "one.txt"
    one.write_text("Only one passage here.\n")
    assert main(["--corpus", str(one), "--multi", *base]) == 2
    assert "holds no pairs" in capsys.readouterr().err


# ---------------------------------------------------------------- prompt and reply parsing


def test_reply_parsing_takes_the_last_question_list_and_tolerates_sloppy_json():
    echoed = 'Format: {"questions": [{"question": "...", "kind": "direct"}]}\nMine:\n{"questions": [{"question": "Who?", "kind": "direct"}]}'
    assert extract_questions(echoed) == [{"question": "Who?", "kind": "direct"}]
    lines = '{"question": "A?", "kind": "direct"}\n{"question": "B?", "kind": "combine"}'
    assert [q["question"] for q in extract_questions(lines)] == ["A?", "B?"]
    assert extract_questions("[{'question': 'C?', 'kind': 'direct', 'label': True,}]")[0]["label"] is True
    for bad in ("", "Sorry, I cannot.", '{"answer": 3}'):
        with pytest.raises(GenerationParseError):
            extract_questions(bad)


def test_question_validation_and_defaults():
    kinds = SINGLE_KINDS
    q, why = validate_question({"question": " Who  built it? ", "kind": "Related-Entity"}, kinds)
    assert why is None and (q.question, q.kind, q.label, q.level, q.answer) == ("Who built it?", "related_entity", 0, "insufficient", None)
    q, _ = validate_question({"question": "How far?", "kind": "combine", "label": "yes", "answer": 12.5}, kinds)
    assert (q.label, q.level, q.answer) == (1, "sufficient", "12.5")
    assert validate_question({"question": "Q?", "kind": "direct", "label": 1, "level": "partial", "answer": "a"}, kinds)[1] == \
        "level_contradicts_label"
    assert validate_question({"question": "Q?", "kind": "direct", "answer": "a"}, ("premise_date",))[1] == "unknown_kind"
    assert validate_question("Q?", kinds) == (None, "not_an_object")


def test_prompt_version_follows_every_text_the_model_sees():
    a = GenerationPrompt("single", SINGLE_KINDS, 10)
    assert a.version == GenerationPrompt("single", tuple(reversed(SINGLE_KINDS)), 10).version  # order does not matter
    assert a.version != GenerationPrompt("single", SINGLE_KINDS, 8).version
    assert a.version != GenerationPrompt("single", ("direct",), 10).version
    assert GenerationPrompt("multi", ("bridge",), 10).version.startswith("gen-multi-")
    assert split_counts(10, SINGLE_KINDS) == (5, 5) and split_counts(3, ANSWERABLE) == (3, 0)
    msg = a.messages([], ["Who?"])[1]["content"]
    assert "5 answerable" in msg and "ALREADY ASKED" in msg and "- Who?" in msg
    assert normalize_question("Who is Ada?") == normalize_question("who is ada")
    with pytest.raises(Exception, match="need --multi"):
        SynthConfig(corpus="x", kinds=["comparison"])


# ---------------------------------------------------------------- import and re-judging of shipped questions


def test_import_of_the_fixture_synthetic_file_is_idempotent(tmp_path, capsys):
    store = tmp_path / "labels.sqlite"
    assert main(["import", "--path", str(FIXTURE_SYNTH), "--store", str(store)]) == 0
    shipped = {r["id"]: r for r in rows(FIXTURE_SYNTH)}
    got = {r["item_id"]: r for r in store_rows(store)}
    assert set(got) == set(shipped)
    for iid, r in got.items():
        assert (r["rater"], r["prompt_version"], r["status"]) == ("llm-generator-v1", "shipped", "ok")
        assert (r["label"], r["level"]) == (shipped[iid]["label"], shipped[iid]["level"])
        assert shipped[iid]["kind"] in r["rationale"]
    assert "3 new, 0 already" in capsys.readouterr().out
    assert main(["import", "--path", str(FIXTURE_SYNTH), "--store", str(store)]) == 0
    assert "0 new, 3 already" in capsys.readouterr().out and len(store_rows(store)) == 3
    from suffice.training.autorater.cli import main as label_main

    assert label_main(["list", "--store", str(store)]) == 0
    assert "llm-generator-v1@shipped" in capsys.readouterr().out


def test_import_of_the_shipped_synthetic_questions(shared_data_dir, tmp_path, capsys):
    path = shared_data_dir / "synthetic" / "squad2-questions.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is absent: the shared data has no synthetic questions")
    store = tmp_path / "labels.sqlite"
    assert main(["import", "--store", str(store)]) == 0  # the default path is the shipped file
    n_lines = sum(1 for line in path.open() if line.strip())
    got = store_rows(store)
    assert len(got) == n_lines and {r["rater"] for r in got} == {"llm-generator-v1"}
    assert sum(r["label"] for r in got) == sum(json.loads(line)["label"] for line in path.open() if line.strip())
    assert f"{n_lines} new" in capsys.readouterr().out


def test_rejudging_written_questions_reports_the_disagreement(server, tmp_path, capsys):
    server.on("QUESTION: How heavy is the alpha stone?", Reply.verdict(0))
    server.on("QUESTION: Who built the beta bridge?", Reply.verdict(1))  # the judge disagrees with the writer's 0
    server.on("QUESTION: In which year", Reply.verdict(1))
    out = tmp_path / "judged.jsonl"
    rc = main(["judge", "--input", str(FIXTURE_SYNTH), *[a for a in common(server, tmp_path) if a != str(tmp_path / "synth.jsonl")
                                                          and a != "--out"], "--out", str(out)])
    assert rc == 0
    assert sorted(r["id"] for r in rows(out)) == ["squad2-synth:s1", "squad2-synth:s2"]
    assert "disagreement rate 33.3%" in capsys.readouterr().out
