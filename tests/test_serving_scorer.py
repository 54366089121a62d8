"""SufficiencyScorer: loading and refusing bundles, scoring, batching, threads, explanations."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from serving_support import ITEMS, make_model_dir, validation_items

pytest.importorskip("optimum")


@pytest.fixture(scope="module")
def bundle(tiny_bert_dir, tmp_path_factory):
    from suffice.training.export import export_bundle

    root = tmp_path_factory.mktemp("scorer")
    model_dir = make_model_dir(tiny_bert_dir, root / "model", lora=False)
    # a random tiny model's AUROC on 30 items moves by points under any perturbation: these tests are about serving
    return model_dir, export_bundle(model_dir, root / "bundle", validation_items(30))


@pytest.fixture
def copy(bundle, tmp_path):
    dst = tmp_path / "bundle"
    shutil.copytree(bundle[1], dst)
    return dst


def test_tampered_and_truncated_files_are_refused(copy):
    from suffice.serving import ChecksumError, SufficiencyScorer

    original = (copy / "model.int8.onnx").read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF
    (copy / "model.int8.onnx").write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="model.int8.onnx.*modified or truncated"):
        SufficiencyScorer.load(copy)
    (copy / "model.int8.onnx").write_bytes(original)
    SufficiencyScorer.load(copy)  # restored: loads again
    tok = (copy / "tokenizer.json").read_bytes()
    (copy / "tokenizer.json").write_bytes(tok[: len(tok) // 2])
    with pytest.raises(ChecksumError, match="tokenizer.json"):
        SufficiencyScorer.load(copy)


def test_missing_file_bad_manifest_and_wrong_folder_are_refused(copy, tmp_path):
    from suffice.serving import BundleNotFoundError, ManifestError, SufficiencyScorer

    with pytest.raises(BundleNotFoundError, match="suffice export"):
        SufficiencyScorer.load(tmp_path / "nowhere")
    m = json.loads((copy / "suffice.json").read_text())
    (copy / "suffice.json").write_text(json.dumps({**m, "schema_version": 99}))
    with pytest.raises(ManifestError, match="schema_version 99"):
        SufficiencyScorer.load(copy)
    (copy / "suffice.json").write_text(json.dumps({**m, "temprature": 1.0}))
    with pytest.raises(ManifestError, match="temprature"):
        SufficiencyScorer.load(copy)
    (copy / "suffice.json").write_text(json.dumps({**m, "positive_label": "yes"}))
    with pytest.raises(ManifestError, match="positive_label"):
        SufficiencyScorer.load(copy)
    (copy / "suffice.json").write_text(json.dumps(m))
    (copy / "model.onnx").unlink()
    with pytest.raises(BundleNotFoundError, match="model.onnx"):
        SufficiencyScorer.load(copy)


def test_scores_levels_and_passage_forms(bundle):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    scorer = SufficiencyScorer.load(bundle[1], ScorerConfig(intra_op_threads=1))
    r = scorer.score("Where is the Eiffel Tower?", [{"title": "Paris", "text": "The Eiffel Tower is in Paris."}])
    assert 0.0 <= r.score <= 1.0 and r.level == scorer.level_for(r.score)
    assert abs(sum(r.probabilities.values()) - 1.0) < 1e-6 and r.latency_ms > 0
    assert r.confidence_factors[0].name == "model"
    s = scorer.score("Where is the Eiffel Tower?", ["Paris. The Eiffel Tower is in Paris."])
    assert s.level in ("sufficient", "partial", "insufficient")
    # thresholds are overridable: everything is sufficient at 0 and nothing at 1
    assert SufficiencyScorer.load(bundle[1], ScorerConfig(thresholds={"sufficient": 0.0, "partial": 0.0})).score("Q?", ["x"]).level == "sufficient"
    low = SufficiencyScorer.load(bundle[1], ScorerConfig(thresholds={"sufficient": 1.0, "partial": 1.0})).score("Q?", ["x"])
    assert low.level == "insufficient" and low.missing_aspects
    with pytest.raises(ValueError, match="unknown threshold"):
        ScorerConfig(thresholds={"suficient": 0.9})


def test_empty_passages_give_insufficient_with_a_reason(bundle):
    from suffice.serving import SufficiencyScorer

    scorer = SufficiencyScorer.load(bundle[1])
    for empty in ([], None, [""], [{"title": "T", "text": "   "}]):
        r = scorer.score("Who wrote Hamlet?", empty)
        assert r.level == "insufficient" and r.score == 0.0
        assert r.confidence_factors[0].name == "empty_context" and "no passage" in r.missing_aspects[0]
    with pytest.raises(ValueError, match="non-empty string"):
        scorer.score("  ", ["text"])
    scored, unscored = scorer.score_batch(["Who wrote Hamlet?"] * 2, [["Hamlet is a play by Shakespeare."], []])
    assert scored.latency_ms > 0 and unscored.latency_ms == 0.0  # a row the model never saw took none of its time


def test_missing_aspects_name_uncovered_terms_and_entities(bundle):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    scorer = SufficiencyScorer.load(bundle[1], ScorerConfig(thresholds={"sufficient": 1.0, "partial": 1.0}))
    r = scorer.score("When did Frederic Chopin leave Warsaw?", ["Chopin was a composer born in Poland."])
    assert "no passage mentions 'Warsaw'" in r.missing_aspects
    assert any("'leave'" in m for m in r.missing_aspects)
    assert any(f.name == "missing_entities" and "Warsaw" in f.detail for f in r.confidence_factors)


def test_long_context_reports_the_window(bundle):
    from suffice.serving import SufficiencyScorer

    r = SufficiencyScorer.load(bundle[1]).score("What year did the Berlin Wall fall?", ["The Berlin Wall fell on 9 November 1989. " * 60])
    f = [f for f in r.confidence_factors if f.name == "context_window"]
    assert f and "select" in f[0].detail


@pytest.mark.parametrize("precision,atol", [("fp32", 1e-5), ("int8", 1e-2)])
def test_batched_equals_unbatched(bundle, precision, atol):
    """fp32 is batch-invariant; dynamic int8 quantises activations per tensor, so the other rows of
    a batch shift its scale slightly (documented in SufficiencyScorer.score_batch)."""
    from suffice.serving import ScorerConfig, SufficiencyScorer

    scorer = SufficiencyScorer.load(bundle[1], ScorerConfig(precision=precision))
    qs = [q for q, _, _ in ITEMS] + ["Who wrote Hamlet?"]
    ps = [p for _, p, _ in ITEMS] + [[]]
    one = [scorer.score(q, p) for q, p in zip(qs, ps)]
    for bs in (1, 3, 32):
        many = scorer.score_batch(qs, ps, batch_size=bs)
        np.testing.assert_allclose([r.score for r in many], [r.score for r in one], atol=atol)
        if precision == "fp32":
            assert [r.level for r in many] == [r.level for r in one]
    assert [len(b) for b in scorer.iter_score_batches(qs, ps, batch_size=4)] == [4, 4, 3]
    with pytest.raises(ValueError, match="one list per question"):
        scorer.score_batch(qs, ps[:-1])


def test_thread_safe_under_8_threads(bundle):
    from suffice.serving import ScorerConfig, SufficiencyScorer

    scorer = SufficiencyScorer.load(bundle[1], ScorerConfig(precision="fp32", intra_op_threads=1))
    pairs = [(q, p) for q, p, _ in ITEMS] * 8
    want = [scorer.score(q, p).score for q, p in pairs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda qp: scorer.score(*qp).score, pairs))
        batched = list(pool.map(lambda i: [r.score for r in scorer.score_batch([q for q, _ in pairs[i:i + 5]], [p for _, p in pairs[i:i + 5]])], range(0, len(pairs), 5)))
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose([s for b in batched for s in b], want, atol=1e-5)


def test_serving_packs_exactly_like_training(bundle):
    """Same long-context strategy as training, shared code: identical token ids for every item."""
    from tokenizers import Tokenizer

    from suffice.serving import SufficiencyScorer
    from suffice.serving.packing import ContextPacker

    model_dir, b = bundle
    meta = json.loads((model_dir / "suffice_model.json").read_text())
    scorer = SufficiencyScorer.load(b)
    assert scorer.manifest.long_context_strategy == meta["long_context_strategy"] and scorer.manifest.max_length == meta["max_length"]
    training = ContextPacker(Tokenizer.from_file(str(model_dir / "tokenizer.json")), meta["max_length"], meta["long_context_strategy"])
    for q, p, _ in ITEMS:
        assert scorer.packer.pack(q, p) == training.pack(q, p)


def test_retrieval_gate_bundle_is_not_a_scorer(tiny_bert_dir, tmp_path):
    from suffice.serving import BundleError, SufficiencyScorer
    from suffice.training.export import export_bundle

    md = make_model_dir(tiny_bert_dir, tmp_path / "gate", task="retrieval_gate", lora=False)
    b = export_bundle(md, tmp_path / "gate-bundle", quantize=False)
    with pytest.raises(BundleError, match="RetrievalGate.load"):
        SufficiencyScorer.load(b)


def test_scores_are_bit_identical_under_two_hash_seeds(bundle):
    """Two processes, two hash seeds, the same rows: the same scores to the last bit."""
    from test_determinism import ROWS, run_with_hash_seed

    script = ROWS.replace("N_ROWS", "200").replace("N_PASSAGES", "6") + f'''
from suffice.serving import ScorerConfig, SufficiencyScorer
scorer = SufficiencyScorer.load({str(bundle[1])!r}, ScorerConfig(precision="fp32", intra_op_threads=1))
print([r.score.hex() for r in scorer.score_batch([q for q, _ in ROWS], [p for _, p in ROWS], batch_size=100)])
'''
    a, b = run_with_hash_seed(0, script), run_with_hash_seed(1, script)
    assert a == b, "scores differ between PYTHONHASHSEED 0 and 1"


def test_manifest_edits_are_refused_naming_the_field(copy, caplog):
    """Thresholds 0.8/0.5 -> 0.3/0.1 would turn partial rows sufficient: the manifest's digests refuse it,
    with checksums on or off; a bundle from before digests loads with a warning naming the fix."""
    from suffice.serving import ManifestError, ScorerConfig, SufficiencyScorer

    exported = (copy / "suffice.json").read_text()
    m = json.loads(exported)
    assert set(m["field_digests"]) == set(m) - {"field_digests"} | {"calibration"}
    for edit in ({"thresholds": {"sufficient": 0.3, "partial": 0.1}}, {"temperature": 0.5}, {"max_length": 64}):
        (copy / "suffice.json").write_text(json.dumps({**m, **edit}))
        for verify in (True, False):
            with pytest.raises(ManifestError, match=rf"{next(iter(edit))}.*edited after export.*suffice export"):
                SufficiencyScorer.load(copy, ScorerConfig(verify_checksums=verify))
    (copy / "suffice.json").write_text(exported)
    assert SufficiencyScorer.load(copy).thresholds["sufficient"] == m["thresholds"]["sufficient"]
    (copy / "suffice.json").write_text(json.dumps({k: v for k, v in m.items() if k != "field_digests"}))
    with caplog.at_level("WARNING", logger="suffice.serving.bundle"):
        SufficiencyScorer.load(copy)
    assert "no field_digests" in caplog.text and "suffice export" in caplog.text


def test_path_and_tokenizer_checks_do_not_depend_on_checksums(copy, tmp_path):
    from suffice.serving import BundleError, ManifestError, ScorerConfig, SufficiencyScorer

    from serving_support import rewrite_manifest

    m = json.loads((copy / "suffice.json").read_text())
    evil = tmp_path / "evil.onnx"
    shutil.copy(copy / "model.onnx", evil)
    files = {**m["files"], "../evil.onnx": m["files"]["model.onnx"]}
    rewrite_manifest(copy, {**m, "model_file": "../evil.onnx", "files": files})
    for verify in (True, False):
        with pytest.raises(ManifestError, match=r"'\.\./evil\.onnx' must be a plain name inside the bundle"):
            SufficiencyScorer.load(copy, ScorerConfig(verify_checksums=verify))
    rewrite_manifest(copy, m)
    (copy / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(BundleError, match="cannot read its tokenizer 'tokenizer.json'.*suffice export"):
        SufficiencyScorer.load(copy, ScorerConfig(verify_checksums=False))
