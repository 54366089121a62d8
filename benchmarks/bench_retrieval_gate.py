"""The retrieval gate on held-out threads: quality against the goal, the baseline, latency, examples.

Runs the exported gate exactly as a service does (``RetrievalGate.decide`` on whole threads,
torch-free) on the test threads of one or two splits, next to TF-IDF + logistic regression fitted
on the same split's train threads:

- ``opening_message``: the split training used (same seed, same fractions, rebuilt from
  ``configs/retrieval-gate.yaml``): threads grouped by their opening message. Train and test share
  the 30 domains of retrieval-gate/train.jsonl, their vocabulary and writing style.
- ``domains`` (leave-domains-out, issue 21): train.jsonl plus retrieval-gate/pairs.jsonl (80 further
  domains, contrastive SKIP/RETRIEVE pairs); whole pairs.jsonl domains are held out
  (``split_by_domain``), train.jsonl's threads all train, so the test threads come from domains no
  training thread came from: what a new deployment meets. A gate trained on train.jsonl alone never
  saw any pairs.jsonl domain; TF-IDF + LR here is fitted on train.jsonl + the train domains.

Per split: macro-F1, SKIP precision, the share of follow-ups skipped and AUROC, at the stored SKIP
threshold (what ``decide`` uses) and at 0.5; TF-IDF + LR at 0.5 and at its own precision-first
threshold (picked on the split's validation threads by the rule training uses for the gate); accuracy
per category at each operating point; pair accuracy (both threads of a contrastive pair right). Once:
the latency of ``decide`` at 128-token inputs (int8) and the issue's acceptance examples.

Goals, issue 7 (``goals``): macro-F1 >= 0.90 and >= 3 F1 points above TF-IDF + LR, each classifier
at its own 0.5 decision; SKIP precision >= 0.95 while skipping >= 30% of follow-ups at the stored
threshold; p50 <= 10 ms at 128 tokens (int8). Issue 21 (``goals_issue21``, the domains split is the
one that counts): macro-F1 >= 0.90, SKIP precision >= 0.95 and skip rate >= 30%, all at the stored
threshold; >= 5 F1 points over TF-IDF + LR both at 0.5 and with each at its precision-first threshold;
the acceptance examples all right.

Issue 33 (``styles``, on the first split's test threads): the same threads with the new message written
in each *held-out* style (``suffice.training.data.styles``: the styles the gate's config did not train
on; ``--styles`` to choose), at the stored threshold, with the threshold each style would need for 95%
SKIP precision (how the threshold moves under the shift) and the combinations of the model with its
second opinions (``combinations``): the out-of-distribution guard, the search guard (a message asking
for a search or for more than was shown: :func:`~suffice.serving.gates.retrieval.search_request`), a referent veto (a name of the new
message the conversation never mentions forces RETRIEVE) and, with ``--scorer``, the sufficiency
scorer on (new message, the assistant's earlier turns), SKIP only when both agree.

    python benchmarks/bench_retrieval_gate.py --bundle models/gate-x/bundle --split both --out gate.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SPLITS = ("opening_message", "domains")
OTHER_WRITERS = REPO / "benchmarks" / "data" / "gate-other-writers"  # hand-written threads of other writers (issue 33)

FRUIT_THREAD = [
    {"role": "user", "content": "What fruit do you have and what do they cost?"},
    {"role": "assistant", "content": "Here are today's fruit prices:\n\n| Fruit | Price per lb |\n|---|---|\n"
                                     "| Bananas | $0.69 |\n| Mangoes | $2.49 |\n| Cherries | $5.99 |\n| Grapes | $3.29 |"},
]
# (latest user message, expected decision): the issue's acceptance examples, asked after the first answer.
ACCEPTANCE = [
    ("Sort that by price descending", "SKIP"),
    ("What about apples?", "RETRIEVE"),
    ("Explain that in simpler terms", "SKIP"),
    ("Now find me all fruits under $2", "RETRIEVE"),
    ("Thanks!", "SKIP"),
    ("Actually, what vegetables do you have?", "RETRIEVE"),
]
FIRST_MESSAGE = ("What is the price of bananas?", "RETRIEVE")


def acceptance(gate) -> list[dict]:
    """The issue's examples, each decided on the fruit-price thread (and one first message)."""
    out = []
    for text, want in ACCEPTANCE:
        d = gate.decide([*FRUIT_THREAD, {"role": "user", "content": text}])
        out.append({"message": text, "expected": want, "decision": d.decision, "p_skip": d.score, "ok": d.decision == want})
    d = gate.decide([{"role": "user", "content": FIRST_MESSAGE[0]}])
    out.append({"message": FIRST_MESSAGE[0] + " (first message)", "expected": FIRST_MESSAGE[1], "decision": d.decision,
                "p_skip": d.score, "ok": d.decision == FIRST_MESSAGE[1]})
    return out


def thread_of(row: dict) -> list[dict]:
    return [{"role": p["title"], "content": p["text"]} for p in row["passages"]] + [{"role": "user", "content": row["question"]}]


def gate_quality(pred_skip: np.ndarray, y_skip: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import f1_score

    skipped = pred_skip == 1
    return {
        "n": int(len(y_skip)),
        "macro_f1": float(f1_score(y_skip, pred_skip, average="macro", labels=[0, 1], zero_division=0)),
        "accuracy": float((pred_skip == y_skip).mean()),
        "skip_precision": float(y_skip[skipped].mean()) if skipped.any() else float("nan"),
        "skip_recall": float(pred_skip[y_skip == 1].mean()) if (y_skip == 1).any() else float("nan"),
        "skip_rate": float(skipped.mean()),
    }


def latency_128(gate, rows, n: int = 200) -> dict[str, float]:
    """p50/p95/p99 of ``decide`` on test threads packed into a 128-token window (follow-ups only),
    the mean packed length, and p50 on the threads whose packed input fills the window (>= 120
    tokens): the "128-token input" of the goal (threads shorter than the window run faster)."""
    from suffice.serving.gates.retrieval import RetrievalGate  # noqa: F401  (same code path as services)

    threads = [thread_of(r) for r in rows][:n]
    for t in threads[:5]:
        gate.decide(t)
    ms, lens = [], []
    for t in threads:
        t0 = time.perf_counter()
        gate.decide(t)
        ms.append((time.perf_counter() - t0) * 1e3)
        lens.append(len(gate._packer.pack(*gate.build_input(t)).input_ids))
    a, L = np.asarray(ms), np.asarray(lens)
    full = a[L >= 120]
    return {"p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "p99_ms": float(np.percentile(a, 99)), "n": int(a.size), "mean_tokens": float(L.mean()),
            "full_window_n": int(full.size), "full_window_p50_ms": float(np.percentile(full, 50)) if full.size else float("nan")}


def split_threads(cfg, split: str, pairs: str | Path | None = None) -> dict[str, list[dict]]:
    """``{"train", "validation", "test"}`` rows of one evaluation split.

    ``opening_message``: training's own split of the gate file (``cfg.gate.path``, default
    retrieval-gate/train.jsonl) by a seeded hash of each thread's opening message, the rows training
    reads. ``domains``: the gate file plus ``pairs`` (default retrieval-gate/pairs.jsonl) with
    ``domain``/``pair`` columns, whole domains held out by :func:`split_by_domain` (same seed and
    fractions); threads without a domain (the gate file's) all train, so the test threads come from
    domains no training thread came from."""
    from suffice.training.data.threads import gate_splits
    from suffice.training.paths import data_dir

    path = Path(cfg.gate.path) if cfg.gate.path else data_dir() / "retrieval-gate" / "train.jsonl"
    return gate_splits(path, split, cfg.seed, cfg.gate.test_fraction, cfg.gate.validation_fraction, pairs or cfg.gate.pairs_path,
                       cfg.gate.extra_paths)


def category_table(rows: list[dict], y: np.ndarray, predictions: dict[str, np.ndarray]) -> dict[str, dict]:
    """Accuracy per category (the rows' ``kind``) for each named prediction (1 = SKIP), with the category's
    label (SKIP, RETRIEVE or mixed) and size; categories sorted SKIP first, then by name.

    >>> category_table([{"kind": "thanks"}, {"kind": "thanks"}, {"kind": "new_topic"}], np.array([1, 1, 0]),
    ...                {"gate": np.array([1, 0, 0])})
    {'thanks': {'label': 'SKIP', 'n': 2, 'gate': 0.5}, 'new_topic': {'label': 'RETRIEVE', 'n': 1, 'gate': 1.0}}
    """
    idx: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        idx.setdefault(r.get("kind") or "?", []).append(i)
    out = {}
    for cat, ix in idx.items():
        labels = set(y[ix].tolist())
        out[cat] = {"label": "mixed" if len(labels) > 1 else "SKIP" if labels == {1} else "RETRIEVE", "n": len(ix),
                    **{name: round(float((np.asarray(p)[ix] == y[ix]).mean()), 3) for name, p in predictions.items()}}
    order = {"SKIP": 0, "mixed": 1, "RETRIEVE": 2}
    return dict(sorted(out.items(), key=lambda kv: (order[kv[1]["label"]], kv[0])))


def pair_accuracy(rows: list[dict], y: np.ndarray, pred: np.ndarray) -> float:
    """Share of contrastive pairs (rows sharing a ``pair``) whose threads are both decided right; nan without pairs.

    >>> pair_accuracy([{"pair": "a"}, {"pair": "a"}, {"pair": "b"}, {"pair": "b"}], np.array([1, 0, 1, 0]), np.array([1, 0, 1, 1]))
    0.5
    """
    ok: dict[str, bool] = {}
    for r, t, p in zip(rows, y, pred):
        if r.get("pair"):
            ok[r["pair"]] = ok.get(r["pair"], True) and bool(t == p)
    return float(np.mean(list(ok.values()))) if ok else float("nan")


def evaluate_split(gates: dict, split: dict[str, list[dict]], min_precision: float) -> dict:
    """One split: each gate precision (``RetrievalGate.decide`` on whole test threads) at the stored threshold
    and at 0.5, TF-IDF + LR fitted on the split's train threads (at 0.5, and at its own precision-first
    threshold picked on the split's validation threads by the rule training uses for the gate), the
    margins, per-category accuracy and pair accuracy."""
    from suffice.training.evaluation.baselines import TfidfLogisticBaseline
    from suffice.training.fit.calibration import threshold_for_precision
    from suffice.training.evaluation.metrics import auroc

    train, val, rows = split["train"], split["validation"], split["test"]
    y = np.asarray([r["label"] for r in rows], dtype=np.int64)  # 1 = SKIP
    out: dict = {"n_train": len(train), "n_validation": len(val), "n_test": len(rows),
                 "test_domains": sorted({r["domain"] for r in rows if r.get("domain")})}
    table_preds: dict[str, np.ndarray] = {}
    pairs: dict[str, float] = {}
    for precision, gate in gates.items():
        decisions = [gate.decide(thread_of(r)) for r in rows]
        pred = np.asarray([1 if d.decision == "SKIP" else 0 for d in decisions])
        q = gate_quality(pred, y)
        q["skip_threshold"] = gate.skip_threshold
        # the classifier's own decision (P(SKIP) >= 0.5, as TF-IDF + LR is scored) beside the
        # precision-first operating point above
        scores = np.nan_to_num(np.asarray([np.nan if d.score is None else d.score for d in decisions]), nan=0.0)
        pred05 = (scores >= 0.5).astype(int)
        q["at_0.5"] = gate_quality(pred05, y)
        q["auroc"] = auroc(scores, y)
        q["fail_open_count"] = sum(d.score is None for d in decisions)
        q["accuracy_by_category"] = {k: v[precision] for k, v in category_table(rows, y, {precision: pred}).items()}
        origins = sorted({r.get("origin", "") for r in rows})
        if len(origins) > 1:  # the teacher's files and gate.extra_paths' writers, each on its own held-out domains
            q["by_origin"] = {o: gate_quality(pred[sel], y[sel]) for o in origins
                              if (sel := np.asarray([r.get("origin", "") == o for r in rows])).any()}
        out[precision] = q
        table_preds[f"{precision}@stored"], table_preds[f"{precision}@0.5"] = pred, pred05
        pairs[f"{precision}@stored"], pairs[f"{precision}@0.5"] = pair_accuracy(rows, y, pred), pair_accuracy(rows, y, pred05)
    head = next(iter(gates))
    base = TfidfLogisticBaseline().fit([r["question"] for r in train], [r["passages"] for r in train], np.asarray([r["label"] for r in train]))
    base_scores = base.score([r["question"] for r in rows], [r["passages"] for r in rows])
    base_pred = base.predict(base_scores)
    out["tfidf_lr"] = gate_quality(base_pred, y)
    out["tfidf_lr"]["auroc"] = auroc(base_scores, y)
    table_preds["tfidf_lr@0.5"] = base_pred
    pairs["tfidf_lr@0.5"] = pair_accuracy(rows, y, base_pred)
    if val:
        val_scores = base.score([r["question"] for r in val], [r["passages"] for r in val])
        t, _ = threshold_for_precision(val_scores, np.asarray([r["label"] for r in val]), min_precision)
        base_pf = (base_scores >= t).astype(int)
        out["tfidf_lr_precision_first"] = {**gate_quality(base_pf, y), "skip_threshold": t, "auroc": out["tfidf_lr"]["auroc"]}
        table_preds["tfidf_lr@threshold"] = base_pf
        pairs["tfidf_lr@threshold"] = pair_accuracy(rows, y, base_pf)
    out["by_category"] = category_table(rows, y, table_preds)
    if any(r.get("pair") for r in rows):
        out["pair_accuracy"] = pairs
    # both deciders at their own 0.5 decision: the classifiers compared as classifiers
    out["f1_points_over_tfidf"] = 100 * (out[head]["at_0.5"]["macro_f1"] - out["tfidf_lr"]["macro_f1"])
    # both at their precision-first threshold (the gate's stored one; TF-IDF's picked the same way on this split's validation)
    pf = out.get("tfidf_lr_precision_first")
    out["f1_points_over_tfidf_at_threshold"] = 100 * (out[head]["macro_f1"] - pf["macro_f1"]) if pf else float("nan")
    return out


def referent_veto(row: dict) -> bool:
    """A name or number of the new message that the conversation does not hold
    (``suffice.serving.lexical.keyword_coverage(...).missing_entities``, the rule the context gate reports)."""
    from suffice.serving.lexical import keyword_coverage

    return bool(keyword_coverage(row["question"], [p["text"] for p in row["passages"]]).missing_entities)


def sufficiency_scores(scorer, rows: list[dict]) -> np.ndarray:
    """P(sufficient) of (new message, the assistant's earlier turns) by a sufficiency bundle: the second opinion."""
    qs = [r["question"] for r in rows]
    ps = [[p["text"] for p in r["passages"] if p["title"] == "assistant"] or [""] for r in rows]
    return np.asarray([res.score for res in scorer.score_batch(qs, ps)], dtype=np.float64)


def second_opinion_ms(scorer, rows: list[dict], n: int = 100) -> dict:
    """What the second opinion adds to one ``decide()``: one scorer call per follow-up (p50/p95 ms)."""
    ms = []
    for r in rows[:n]:
        t0 = time.perf_counter()
        sufficiency_scores(scorer, [r])
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)), "n": len(ms), "variant": scorer.variant}


def style_results(gate, rows: list[dict], styles: list[str], min_precision: float, scorer=None,
                  suff_threshold: float | None = None) -> dict:
    """The test threads as written (``own``) and rewritten in each held-out style, then all held-out styles
    pooled: each at the stored threshold (the shipped ``decide``, OOD and search guards on), the threshold that would
    give ``min_precision`` SKIP precision on that set, and ``combinations`` of the model (guard off) with
    the OOD guard, the referent veto and (``scorer``) the sufficiency second opinion at ``suff_threshold``."""
    from suffice.training.data.styles import styled_row

    sets = {"own": rows, **{st: [styled_row(r, st) for r in rows] for st in styles}}
    return set_results(gate, sets, min_precision, scorer, suff_threshold, pooled_name="held_out_pooled", unpooled=("own",))


def set_results(gate, sets: dict[str, list[dict]], min_precision: float, scorer=None, suff_threshold: float | None = None,
                pooled_name: str = "pooled", unpooled: tuple[str, ...] = ()) -> dict:
    """Each named set of threads (prepared rows) at the stored threshold and its combinations (see
    :func:`style_results`), then the sets not in ``unpooled`` pooled under ``pooled_name`` (when there are any)."""
    from dataclasses import replace

    from suffice.serving.gates.retrieval import RetrievalGate, out_of_distribution, search_request
    from suffice.training.evaluation.metrics import auroc
    from suffice.training.fit.calibration import threshold_for_precision

    raw = RetrievalGate(gate._model, replace(gate.config, ood_guard=False, search_guard=False))
    t = gate.skip_threshold
    out: dict = {}
    pooled: dict[str, list] = {}
    for name, rs in sets.items():
        y = np.asarray([r["label"] for r in rs])
        p = np.asarray([raw.decide(thread_of(r)).score or 0.0 for r in rs])
        ood = np.asarray([out_of_distribution(r["question"]) is not None for r in rs])
        ref = np.asarray([referent_veto(r) for r in rs])
        srch = np.asarray([search_request(r["question"]) for r in rs])
        guarded = np.asarray([gate.guard(r["question"]) is not None for r in rs])  # the shipped decide's guards
        suff = sufficiency_scores(scorer, rs) if scorer is not None else None
        parts = {"y": y, "p": p, "ood": ood, "ref": ref, "search": srch, "guarded": guarded, **({"suff": suff} if suff is not None else {})}
        if name not in unpooled:
            for k, v in parts.items():
                pooled.setdefault(k, []).append(v)
        out[name] = _style_entry(parts, t, min_precision, suff_threshold, auroc, threshold_for_precision)
    if pooled:
        out[pooled_name] = _style_entry({k: np.concatenate(v) for k, v in pooled.items()}, t, min_precision, suff_threshold,
                                              auroc, threshold_for_precision)
    return out


def _style_entry(parts: dict, t: float, min_precision: float, suff_threshold, auroc, threshold_for_precision) -> dict:
    y, p, ood, ref = parts["y"], parts["p"], parts["ood"], parts["ref"]
    model = p >= t
    srch = parts["search"]
    combos = {"model": model, "model+ood": model & ~ood, "model+ood+search": model & ~ood & ~srch,
              "model+ood+referent": model & ~ood & ~ref}
    if "suff" in parts:
        agree = parts["suff"] >= suff_threshold
        combos.update({"model+ood+sufficiency": model & ~ood & agree, "model+ood+referent+sufficiency": model & ~ood & ~ref & agree})
    t95, reached = threshold_for_precision(p, y, min_precision)
    return {"stored": gate_quality((model & ~parts["guarded"]).astype(int), y), "auroc": auroc(p, y), "threshold_for_target": t95,
            "target_reached": reached, "ood_rate": float(ood.mean()), "referent_veto_rate": float(ref.mean()), "search_request_rate": float(srch.mean()),
            "combinations": {k: gate_quality(v.astype(int), y) for k, v in combos.items()}}


def other_writer_results(gate, files: list[Path], min_precision: float, scorer=None, suff_threshold: float | None = None) -> dict:
    """Threads written by other people (one labelled retrieval-gate JSONL per writer, read by
    :func:`~suffice.training.data.threads.gate_training_rows`): each file and all pooled as :func:`set_results`
    (the shipped ``decide`` at the stored threshold, the threshold 95% SKIP precision would need there, the
    combinations), the pooled accuracy per category, and the goals of issue 33 on the pooled threads."""
    from suffice.training.data.threads import gate_training_rows

    sets = {f.stem: gate_training_rows(f) for f in files}
    res = set_results(gate, sets, min_precision, scorer, suff_threshold, pooled_name="pooled")
    rows = [r for rs in sets.values() for r in rs]
    y = np.asarray([r["label"] for r in rows])
    pred = np.asarray([int(gate.decide(thread_of(r)).decision == "SKIP") for r in rows])
    pooled = res.get("pooled", res[next(iter(sets))])["stored"]
    return {"files": [str(f) for f in files], "n": {k: len(v) for k, v in sets.items()}, "sets": res,
            "by_category": category_table(rows, y, {"stored": pred}),
            "goals": {"skip_precision>=0.95": pooled["skip_precision"] >= 0.95, "skip_rate>=0.30": pooled["skip_rate"] >= 0.30,
                      "macro_f1>=0.90": pooled["macro_f1"] >= 0.90}}


def split_goals(s: dict, head: str, latency: dict, examples: list[dict]) -> tuple[dict, dict]:
    """(issue 7's goals as this bench always checked them, issue 21's goals) for one split's results."""
    g = s[head]
    ok_examples = all(a["ok"] for a in examples)
    issue7 = {
        "macro_f1>=0.90": g["at_0.5"]["macro_f1"] >= 0.90,
        "skip_precision>=0.95": g["skip_precision"] >= 0.95,
        "skip_rate>=0.30": g["skip_rate"] >= 0.30,
        "f1_points_over_tfidf>=3": s["f1_points_over_tfidf"] >= 3,
        "p50_128_int8<=10ms": head == "int8" and latency["full_window_p50_ms"] <= 10.0,
        "acceptance_examples": ok_examples,
    }
    # issue 21 reads every goal at the stored threshold; the margin must hold both at 0.5 and at
    # each decider's precision-first threshold (a nan margin, no validation threads, is not met)
    issue21 = {
        "macro_f1@stored>=0.90": g["macro_f1"] >= 0.90,
        "skip_precision>=0.95": g["skip_precision"] >= 0.95,
        "skip_rate>=0.30": g["skip_rate"] >= 0.30,
        "f1_points_over_tfidf>=5": s["f1_points_over_tfidf"] >= 5 and s["f1_points_over_tfidf_at_threshold"] >= 5,
        "acceptance_examples": ok_examples,
    }
    return issue7, issue21


def hardware(threads: int) -> dict:
    """The CPU (model, ISA class, bf16/VNNI units: ``suffice.serving.cpu``) and the threads used."""
    from suffice.serving.cpu import detect

    info = detect()
    return {**info.as_dict(), "cpu": info.model, "threads": threads, "isa": info.isa_class}


def run(bundle: str | Path, config: str = str(REPO / "configs" / "retrieval-gate.yaml"), overrides: list[str] | None = None,
        threads: int = 2, cfg=None, split: str = "opening_message", pairs: str | Path | None = None,
        styles: list[str] | None = None, scorer: str | Path | None = None, suff_threshold: float | None = None,
        other_writers: list[str | Path] | None = None) -> dict:
    """Every measurement of this module on one bundle, as a JSON-ready dict.

    ``split``: ``opening_message`` (training's split, the default here so callers keep their numbers),
    ``domains`` (leave-domains-out) or ``both``. Each split's results are under ``splits[name]``; the
    first split's are also at the top level (the fields this report always had), with the latency and
    the acceptance examples, which do not depend on the split. ``styles``: the held-out styles of the first
    split's style results (the ``domains`` split where measured; None = every style ``cfg.gate.styles`` does not train on; [] = none);
    ``scorer``: a sufficiency bundle as the second opinion, SKIP only at P(sufficient) >= ``suff_threshold``
    (None = its ``partial`` threshold). The headline precision is int8; a bundle
    without an int8 model (its int8 failed the parity check at export) is measured in fp32 and says so
    (``headline_precision``; ``headline_variant`` names the engine, e.g. ``openvino-int8``). ``other_writers``:
    labelled thread files written by other people (:data:`OTHER_WRITERS`; None = that folder's files, [] = none),
    scored as :func:`other_writer_results` (``other_writers`` in the result)."""
    from suffice.serving.backends import openvino_available
    from suffice.serving.bundle import read_manifest
    from suffice.serving.gates.retrieval import RetrievalGate, RetrievalGateConfig
    from suffice.serving.scorer import ScorerConfig, SufficiencyScorer
    from suffice.training.data.styles import STYLES, check_styles
    from suffice.training.fit.config import build_train_config

    names = SPLITS if split == "both" else (split,)
    if any(n not in SPLITS for n in names):
        raise ValueError(f"unknown split {split!r}: choose one of {[*SPLITS, 'both']}")
    cfg = cfg if cfg is not None else build_train_config(config, overrides or [])
    m = read_manifest(bundle)
    # int8 = what precision="int8" loads: ONNX Runtime int8, or the OpenVINO int8 IR where only that passed export
    head = "int8" if m.int8_model_file or (m.openvino_int8_model_file and openvino_available()) else "fp32"
    precisions = ("int8", "fp32") if head == "int8" else ("fp32",)
    gates = {p: RetrievalGate.load(bundle, RetrievalGateConfig(precision=p, intra_op_threads=threads)) for p in precisions}
    min_precision = cfg.calibration.skip_min_precision or 0.95
    splits = {}
    style_split = "domains" if "domains" in names else names[0]  # the split whose test domains no training thread came from
    for name in names:
        rows = split_threads(cfg, name, pairs)
        splits[name] = evaluate_split(gates, rows, min_precision)
        if name == names[0]:
            # inputs of ~128 tokens: cap the window at 128 so the latency is the 128-token figure
            window = min(128, gates[head]._model.manifest.max_length)
            gate128 = RetrievalGate.load(bundle, RetrievalGateConfig(precision=head, intra_op_threads=threads, max_tokens=window))
            latency = latency_128(gate128, rows["test"])
            examples = acceptance(gates[head])
        if name == style_split:
            held_out = [st for st in STYLES if st not in cfg.gate.styles] if styles is None else check_styles(styles, "--styles")
            suff = SufficiencyScorer.load(scorer, ScorerConfig(intra_op_threads=threads)) if scorer else None
            st = suff_threshold if suff_threshold is not None or suff is None else suff.thresholds["partial"]
            style_report = {"split": name, "trained_styles": list(cfg.gate.styles), "held_out_styles": held_out, "scorer": str(scorer) if scorer else None,
                            "sufficiency_threshold": st, "sets": style_results(gates[head], rows["test"], held_out, min_precision, suff, st),
                            **({"second_opinion_ms": second_opinion_ms(suff, rows["test"])} if suff is not None else {})}
    for s in splits.values():
        s["goals"], s["goals_issue21"] = split_goals(s, head, latency, examples)
    files = sorted(OTHER_WRITERS.glob("*.jsonl")) if other_writers is None else [Path(f) for f in other_writers]
    if files:
        ow = other_writer_results(gates[head], files, min_precision, suff, st)  # the styles' second opinion and threshold
    return {"bundle": str(bundle), "hardware": hardware(threads), "headline_precision": head,
            "headline_variant": gates[head].variant, "split": names[0],
            **splits[names[0]], "latency_128": latency, "acceptance": examples, "splits": splits, "styles": style_report,
            **({"other_writers": ow} if files else {})}


def gate_rows(r: dict) -> list[tuple[str, dict]]:
    """(label, quality) rows of one split's results: each precision at the stored SKIP threshold and at 0.5,
    then TF-IDF + LR at 0.5 and (when measured) at its precision-first threshold."""
    rows = []
    for k in ("int8", "fp32"):
        if k in r:
            t = r[k]["skip_threshold"]
            rows.append((f"{k} @ {t:.3f} (stored)", r[k]))
            rows.append((f"{k} @ 0.5", {**r[k]["at_0.5"], "auroc": r[k]["auroc"]}))
    rows.append(("tfidf_lr @ 0.5", r["tfidf_lr"]))
    if "tfidf_lr_precision_first" in r:
        pf = r["tfidf_lr_precision_first"]
        rows.append((f"tfidf_lr @ {pf['skip_threshold']:.3f} (val)", pf))
    return rows


def format_split(name: str, r: dict) -> list[str]:
    """One split's section: the deciders, the margins, pair accuracy, per-category accuracy, the goals."""
    lines = [f"== split {name}: retrieval gate on {r['n_test']} held-out threads (trained on {r['n_train']}, "
             f"validation {r['n_validation']})"]
    if r.get("test_domains"):
        lines.append(f"   test domains ({len(r['test_domains'])}): " + "; ".join(r["test_domains"]))
    lines.append(f"{'decider':<26} {'macro-F1':>9} {'SKIP prec':>10} {'SKIP rate':>10} {'accuracy':>9} {'AUROC':>6}")
    for label, q in gate_rows(r):
        lines.append(f"{label:<26} {q['macro_f1']:>9.3f} {q['skip_precision']:>10.3f} {q['skip_rate']:>10.3f} {q['accuracy']:>9.3f} "
                     f"{q.get('auroc', float('nan')):>6.3f}")
    for k in ("int8", "fp32"):
        for origin, q in r.get(k, {}).get("by_origin", {}).items():
            lines.append(f"  {k} @ stored, {origin:<18} n {q['n']:>4}: macro-F1 {q['macro_f1']:.3f}, SKIP precision {q['skip_precision']:.3f}, "
                         f"SKIP rate {q['skip_rate']:.3f}")
    lines.append(f"F1 points over TF-IDF + LR: {r['f1_points_over_tfidf']:+.1f} (both at 0.5), "
                 f"{r['f1_points_over_tfidf_at_threshold']:+.1f} (each at its precision-first threshold)")
    if "pair_accuracy" in r:
        lines.append("pair accuracy (both threads right): " + ", ".join(f"{k} {v:.3f}" for k, v in r["pair_accuracy"].items()))
    cols = [k for k in next(iter(r["by_category"].values()), {}) if k not in ("label", "n")]
    lines.append(f"{'category':<24} {'label':<8} {'n':>4} " + " ".join(f"{c:>18}" for c in cols))
    for cat, row in r["by_category"].items():
        lines.append(f"{cat:<24} {row['label']:<8} {row['n']:>4} " + " ".join(f"{row[c]:>18.3f}" for c in cols))
    lines.append("goals (issue 7): " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in r["goals"].items()))
    lines.append("goals (issue 21): " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in r["goals_issue21"].items()))
    return lines


def format_styles(split: str, sr: dict) -> list[str]:
    """The held-out-style section: each set at the stored threshold, the threshold it would need, the combinations."""
    lines = [f"== styles: {split} test threads rewritten in styles training did not use (trained on: "
             f"{', '.join(sr['trained_styles']) or 'the writer’s own only'})"]
    lines.append(f"{'set':<16} {'macro-F1':>9} {'SKIP prec':>10} {'SKIP rate':>10} {'AUROC':>6} {'t@target':>9} {'OOD':>6} {'veto':>6}")
    for name, e in sr["sets"].items():
        q = e["stored"]
        lines.append(f"{name:<16} {q['macro_f1']:>9.3f} {q['skip_precision']:>10.3f} {q['skip_rate']:>10.3f} {e['auroc']:>6.3f} "
                     f"{e['threshold_for_target']:>9.3f} {e['ood_rate']:>6.3f} {e['referent_veto_rate']:>6.3f}")
    extra = f" (sufficiency: {sr['scorer']} at >= {sr['sufficiency_threshold']:.2f})" if sr.get("scorer") else ""
    if "second_opinion_ms" in sr:
        so = sr["second_opinion_ms"]
        lines.append(f"the second opinion costs one scorer call per follow-up: p50 {so['p50']:.2f} ms, p95 {so['p95']:.2f} ms ({so['variant']})")
    lines.append(f"combinations at the stored threshold{extra}: SKIP precision / SKIP rate / macro-F1")
    for name in ("own", "held_out_pooled"):
        if name in sr["sets"]:
            for combo, q in sr["sets"][name]["combinations"].items():
                lines.append(f"  {name:<16} {combo:<32} {q['skip_precision']:.3f} / {q['skip_rate']:.3f} / {q['macro_f1']:.3f}")
    return lines


def format_other_writers(ow: dict) -> list[str]:
    """The other-writers section: each writer's file and all pooled at the stored threshold, the combinations, the goals."""
    lines = [f"== threads by other writers ({', '.join(f'{k} {v}' for k, v in ow['n'].items())}): the shipped decide() at the stored threshold"]
    lines.append(f"{'set':<16} {'macro-F1':>9} {'SKIP prec':>10} {'SKIP rate':>10} {'AUROC':>6} {'t@target':>9} {'OOD':>6} {'veto':>6}")
    for name, e in ow["sets"].items():
        q = e["stored"]
        lines.append(f"{name:<16} {q['macro_f1']:>9.3f} {q['skip_precision']:>10.3f} {q['skip_rate']:>10.3f} {e['auroc']:>6.3f} "
                     f"{e['threshold_for_target']:>9.3f} {e['ood_rate']:>6.3f} {e['referent_veto_rate']:>6.3f}")
    pooled = ow["sets"].get("pooled") or next(iter(ow["sets"].values()))
    lines.append("combinations (pooled): SKIP precision / SKIP rate / macro-F1")
    for combo, q in pooled["combinations"].items():
        lines.append(f"  {combo:<32} {q['skip_precision']:.3f} / {q['skip_rate']:.3f} / {q['macro_f1']:.3f}")
    lines.append(f"{'category':<24} {'label':<8} {'n':>4} {'accuracy':>9}")
    for cat, row in ow["by_category"].items():
        lines.append(f"{cat:<24} {row['label']:<8} {row['n']:>4} {row['stored']:>9.3f}")
    lines.append("goals (issue 33, pooled): " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in ow["goals"].items()))
    return lines


def format_report(r: dict) -> str:
    hw = r["hardware"]
    lines = [f"bundle {r['bundle']} ({r['headline_precision']} headline: {r.get('headline_variant', '?')}), CPU {hw.get('cpu_model') or hw['cpu']} "
             f"({hw.get('isa') or 'ISA class unknown'}{', bf16' if hw.get('bf16') else ''}), {hw['threads']} threads"]
    for name, s in r.get("splits", {r.get("split", "opening_message"): r}).items():
        lines += format_split(name, s)
    lat = r["latency_128"]
    lines.append(f"decide() {r['headline_precision']}, {r['split']} test threads in a 128-token window (mean {lat['mean_tokens']:.0f} tokens): "
                 f"p50 {lat['p50_ms']:.2f} ms, p95 {lat['p95_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms; "
                 f"full 128-token windows: p50 {lat['full_window_p50_ms']:.2f} ms ({lat['full_window_n']} calls)")
    if r.get("styles"):
        lines += format_styles(r["styles"]["split"], r["styles"])
    if r.get("other_writers"):
        lines += format_other_writers(r["other_writers"])
    for a in r["acceptance"]:
        p = "-" if a["p_skip"] is None else f"{a['p_skip']:.2f}"
        lines.append(f"  {'ok ' if a['ok'] else 'BAD'} {a['message']!r:<50} -> {a['decision']:<8} (want {a['expected']}, P(SKIP)={p})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="an exported retrieval-gate bundle folder")
    ap.add_argument("--config", default=str(REPO / "configs" / "retrieval-gate.yaml"), help="the config the gate was trained with")
    ap.add_argument("--split", choices=[*SPLITS, "both"], default="both",
                    help="opening_message: training's split; domains: whole pairs.jsonl domains held out; both (default)")
    ap.add_argument("--pairs", help="the domain-labelled pair threads (default: <shared data>/retrieval-gate/pairs.jsonl)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--styles", nargs="*", default=None,
                    help="held-out styles to test on (default: every style the config's gate.styles does not train on)")
    ap.add_argument("--scorer", help="a sufficiency bundle as the SKIP second opinion (combinations table)")
    ap.add_argument("--sufficiency-threshold", type=float, default=None,
                    help="P(sufficient) the second opinion needs for SKIP (default: the scorer's partial threshold)")
    ap.add_argument("--other-writers", nargs="*", default=None,
                    help=f"labelled thread files by other writers (default: {OTHER_WRITERS.relative_to(REPO)}/*.jsonl; none: --other-writers)")
    ap.add_argument("--out", help="write the results as JSON here")
    args, overrides = ap.parse_known_args(argv)
    r = run(args.bundle, args.config, overrides, args.threads, split=args.split, pairs=args.pairs, styles=args.styles,
            scorer=args.scorer, suff_threshold=args.sufficiency_threshold, other_writers=args.other_writers)
    print(format_report(r))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
