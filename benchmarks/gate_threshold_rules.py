"""Which SKIP threshold rule holds under a change of writer (issue 33): each rule picks its threshold on the
validation threads training used (the writer's own and the gate's training styles, as ``gate.style_validation``
builds them), then the test threads of the ``domains`` split are scored once at each rule's threshold, as
written and rewritten in the styles the gate never trained on (pooled; a style that changes no token for the model's tokenizer, e.g. casing for an uncased one, is left out).

Rules (:func:`suffice.training.fit.finalize.styled_skip_threshold`): ``own`` (the writer's validation threads
alone, what a gate without styles stores), ``max`` (the highest per-style threshold, the rule used so far),
``pooled`` (one threshold over all validation copies). ``--validation-styles`` gives the validation copies
other styles than the gate trained on: a gate trained on its writer's style alone can still pick its
threshold on styled validation copies (``gate.styles`` with ``gate.style_copies: 0``).

    python benchmarks/gate_threshold_rules.py --model models/gate-styled2 [--out rules.json]

``--model`` is a training output folder (its ``train_config.yaml`` and ``bundle/``). Runs the shipped
``RetrievalGate`` (torch-free) with the out-of-distribution guard off, as the training's validation does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_retrieval_gate import gate_quality, split_threads, thread_of  # noqa: E402


def run(model_dir: str | Path, threads: int = 2, validation_styles: list[str] | None = None) -> dict:
    """``validation_styles``: the styles of the validation copies the rules read (default: the gate's training
    styles, as training builds them); held out on test are the styles neither trained nor validated on."""
    from dataclasses import replace

    from suffice.serving.gates.retrieval import RetrievalGate, RetrievalGateConfig
    from suffice.training.data.styles import STYLES, check_styles, style_of, styled_row
    from suffice.training.fit.calibration import threshold_for_precision
    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.finalize import STYLE_THRESHOLD_RULES, styled_skip_threshold
    from suffice.training.fit.splits import add_styled_copies

    model_dir = Path(model_dir)
    cfg = build_train_config(str(model_dir / "train_config.yaml"), [])
    if cfg.gate.split != "domains":
        raise SystemExit(f"{model_dir} was trained on gate.split={cfg.gate.split!r}: this comparison needs the domains split")
    gate = RetrievalGate.load(model_dir / "bundle", RetrievalGateConfig(intra_op_threads=threads))
    raw = RetrievalGate(gate._model, replace(gate.config, ood_guard=False, search_guard=False))
    target = cfg.calibration.skip_min_precision or 0.95
    splits = split_threads(cfg, "domains")
    trained = list(cfg.gate.styles)
    validated = trained if validation_styles is None else check_styles(validation_styles, "--validation-styles")
    if validated:  # validation copies only: the train split is not read here
        splits = add_styled_copies(splits, replace(cfg, gate=replace(cfg.gate, styles=validated, style_copies=0, style_validation=True)))

    def scores(rows):
        return (np.asarray([raw.decide(thread_of(r)).score or 0.0 for r in rows]), np.asarray([r["label"] for r in rows]))

    pv, yv = scores(splits["validation"])
    styles = [style_of(r.get("source") or "") for r in splits["validation"]]
    own = np.asarray([s == "" for s in styles])
    rules = {"own": float(threshold_for_precision(pv[own], yv[own], target)[0])}
    per_style: dict[str, float] = {}
    if validated:
        for rule in STYLE_THRESHOLD_RULES:
            rules[rule], per_style = styled_skip_threshold(pv, yv, styles, target, rule)
    test = splits["test"]

    def ids(row):
        return list(gate._packer.pack(*gate.build_input(thread_of(row))).input_ids)

    # a style that changes no token for this model's tokenizer (casing, for an uncased one) is its own threads again
    own_ids = [ids(r) for r in test]
    no_ops = [s for s in STYLES if s not in trained and s not in validated and all(ids(styled_row(r, s)) == i for r, i in zip(test, own_ids))]
    held_out = [s for s in STYLES if s not in trained and s not in validated and s not in no_ops]
    po, yo = scores(test)
    styled = [styled_row(r, s) for s in held_out for r in test]
    ph, yh = scores(styled)
    sh = np.asarray([style_of(r["source"]) for r in styled])
    out = {"model": str(model_dir), "variant": gate.variant, "trained_styles": trained, "validation_styles": validated, "held_out_styles": held_out,
           "no_op_styles": no_ops,
           "target": target, "n_validation": int(len(yv)), "validation_threshold_by_style": per_style,
           "stored_threshold": gate.skip_threshold, "rules": {}}
    for rule, t in rules.items():
        out["rules"][rule] = {"threshold": t, "own_test": gate_quality((po >= t).astype(int), yo),
                              "held_out_styles_test": gate_quality((ph >= t).astype(int), yh),
                              "by_held_out_style": {s: gate_quality((ph[sh == s] >= t).astype(int), yh[sh == s]) for s in held_out}}
    return out


def format_report(r: dict) -> str:
    lines = [f"{r['model']} ({r['variant']}); trained styles {r['trained_styles'] or 'none'}; validation styles {r['validation_styles'] or 'none'}; held out {r['held_out_styles']} "
             f"(left out, no token changed: {r['no_op_styles'] or 'none'})",
             "| rule | threshold | own test F1 / SKIP prec / rate | held-out styles F1 / SKIP prec / rate | per held-out style SKIP prec / rate |",
             "|---|---:|---:|---:|---|"]
    for rule, v in r["rules"].items():
        o, h = v["own_test"], v["held_out_styles_test"]
        each = "; ".join(f"{s} {q['skip_precision']:.3f}/{q['skip_rate']:.3f}" for s, q in v["by_held_out_style"].items())
        lines.append(f"| {rule} | {v['threshold']:.3f} | {o['macro_f1']:.3f} / {o['skip_precision']:.3f} / {o['skip_rate']:.3f} | "
                     f"{h['macro_f1']:.3f} / {h['skip_precision']:.3f} / {h['skip_rate']:.3f} | {each} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, action="append", help="a retrieval-gate training output folder (repeatable)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--validation-styles", nargs="*", default=None,
                    help="styles of the validation copies the rules read (default: each gate's training styles)")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    results = [run(m, a.threads, a.validation_styles) for m in a.model]
    for r in results:
        print(format_report(r), "\n")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
