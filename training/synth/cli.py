"""``suffice synth``: a teacher LLM writes new training questions about your passages, a second look filters them.

    suffice synth --corpus PASSAGES --per-passage K [--rater openai-compatible] [--kinds KIND ...] [--multi]
                  [--existing FILE ...] [--splits train ...] [--out FILE] [--key=value ...]
    suffice synth import [--path squad2-questions.jsonl] [--store PATH]
    suffice synth judge --input SYNTHETIC.jsonl [--rater openai-compatible|lexical] [--out FILE]

For each passage of the corpus (any format the data loaders read, or plain text / JSON Lines
passages) the LLM writes K questions, half answerable (``direct``, ``paraphrase``, ``combine``)
and half plausibly unanswerable (``premise_date``, ``premise_number``, ``premise_entity``,
``premise_negation``, ``missing_attribute``, ``related_entity``), each with label, level, answer
and kind. ``--multi`` writes questions that need two passages (``bridge``, ``comparison``) and adds
for each one the two variants that drop a passage (label 0, level partial).

Then every item is re-judged with the autorater prompt (``suffice label``'s rater, labels cached in
the same store); items where writer and judge disagree are dropped and counted: the disagreement
rate is the noise estimate. Questions that repeat an existing question (the corpus's own, and
``--existing`` files) or each other are dropped. Every item inherits its passage's split, so a test
passage never feeds training. Generation replies are cached per (generator, prompt version,
passage): a re-run asks only for what is missing. The output is canonical JSONL that
``suffice data prepare`` reads with ``include_synthetic`` (``--synthetic_path=FILE``).

The LLM connection (``--base_url``, ``--model``, ``--api_key_env``, ``--concurrency``, prices...)
is the LabelingConfig of ``suffice label`` (``configs/labeling.yaml``); ``--key=value`` sets a
SynthConfig or a LabelingConfig field.

>>> main(["--corpus", "tests/fixtures/passages.txt", "--per-passage", "4", "--model=qwen2.5-7b",  # doctest: +SKIP
...       "--base_url=http://127.0.0.1:8000/v1", "--api_key_env="])
0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from suffice.training.autorater.cli import setup_logging
from suffice.training.autorater.labeling_config import DEFAULT_CONFIG, RATERS, LabelingConfig
from suffice.training.autorater.prompts import get_prompt
from suffice.training.autorater.raters import RaterConfigError
from suffice.serving.config import ConfigError, build_config, config_from_dict, not_overrides, parse_overrides
from suffice.training.data.schema import SPLITS, DataFormatError
from suffice.training.synth.config import JUDGES, SynthConfig
from suffice.training.synth.prompt import ALL_KINDS, GenerationPrompt
from suffice.training.synth.report import SynthReport, log_to_mlflow
from suffice.training.synth.run import import_synthetic, rejudge, synthesize

PROG = "suffice synth"
ACTIONS = ("import", "judge")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Write synthetic training questions about a corpus with a teacher LLM, re-judge them with the "
                    f"autorater prompt, drop duplicates and disagreements. Other forms: `{PROG} import|judge --help`.",
        epilog="Any other --key=value sets a SynthConfig field (see suffice.training.synth.config.SynthConfig) or a "
               "LabelingConfig field (configs/labeling.yaml), e.g. --model=gpt-4o-mini --base_url=https://api.openai.com/v1")
    p.add_argument("--corpus", required=True, help="passages (.txt, JSONL) or an items file (SQuAD / HotPotQA / MuSiQue / QED / canonical)")
    p.add_argument("--per-passage", type=int, default=None, help="questions per passage (multi: per pair); default 10")
    p.add_argument("--kinds", nargs="+", default=None, metavar="KIND",
                   help=f"kinds to ask for (default: all of the mode): {', '.join(ALL_KINDS)}")
    p.add_argument("--multi", action="store_true", help="questions that need two passages (bridge / comparison) plus partial variants")
    p.add_argument("--judge", choices=JUDGES, default=None, help="who re-judges: the same LLM with the autorater prompt (rater) or lexical")
    p.add_argument("--existing", nargs="+", default=None, metavar="FILE", help="files whose questions must not be repeated")
    p.add_argument("--splits", nargs="+", default=None, choices=SPLITS, help="only passages of these splits (default: all)")
    p.add_argument("--out", default=None, help="output JSONL (default: data/synthetic/<generator>-<mode>.jsonl)")
    p.add_argument("--limit", type=int, default=None, help="only the first N passages (pairs)")
    p.add_argument("--retry-unparsed", action="store_true", help="ask again where the stored reply held no questions")
    _common(p)
    return p


def _action_parser(action: str) -> argparse.ArgumentParser:
    if action == "import":
        p = argparse.ArgumentParser(prog=f"{PROG} import", allow_abbrev=False,
                                    description="Import already written synthetic questions (default: the shipped "
                                                "synthetic/squad2-questions.jsonl) into the label store as <generator>@shipped.")
        p.add_argument("--path", default=None, help="synthetic JSONL (default: <shared data>/synthetic/squad2-questions.jsonl)")
        p.add_argument("--config", type=Path, default=None, help=f"YAML LabelingConfig (default: {DEFAULT_CONFIG} if present)")
        p.add_argument("--store", default=None, help="the SQLite label store (default: data/labels.sqlite)")
        return p
    p = argparse.ArgumentParser(prog=f"{PROG} judge", allow_abbrev=False,
                                description="Re-judge already written synthetic questions with a rater and keep those it agrees with.")
    p.add_argument("--input", required=True, help="synthetic JSONL (e.g. <shared data>/synthetic/squad2-questions.jsonl)")
    p.add_argument("--out", default=None, help="output JSONL (default: <input>.judged.jsonl)")
    p.add_argument("--retry-unparsed", action="store_true", help="ask again for items the judge left unparsed")
    _common(p, judge_choices=("openai-compatible", "lexical"))
    return p


def _common(p: argparse.ArgumentParser, judge_choices: Sequence[str] | None = None) -> None:
    if judge_choices:
        p.add_argument("--rater", choices=judge_choices, default=None, help="the judge (default: openai-compatible)")
    else:
        p.add_argument("--rater", choices=RATERS, default=None, help="the teacher LLM's client (openai-compatible, the default)")
    p.add_argument("--concurrency", type=int, default=None, help="requests in flight at once")
    p.add_argument("--config", type=Path, default=None, help=f"YAML LabelingConfig (default: {DEFAULT_CONFIG} if present)")
    p.add_argument("--store", default=None, help="the SQLite label store, shared with `suffice label` (default: data/labels.sqlite)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    p.add_argument("-v", "--verbose", action="store_true", help="log every retry")


def _split_overrides(rest: list[str]) -> tuple[list[str], list[str]]:
    """``--key=value`` arguments for SynthConfig and for LabelingConfig (unknown keys: an error naming both)."""
    bad = not_overrides(rest)
    if bad:
        raise ConfigError(f"unexpected argument(s) {bad}: options are listed by --help, config overrides look like --key=value")
    synth_keys = {f.name for f in dataclasses.fields(SynthConfig)}
    llm_keys = {f.name for f in dataclasses.fields(LabelingConfig)}
    synth, llm = [], []
    for a in rest:
        key = a[2:].split("=", 1)[0].replace("-", "_").split(".")[0]
        if key in synth_keys:
            synth.append(a)
        elif key in llm_keys:
            llm.append(a)
        else:
            raise ConfigError(f"unknown config key {key!r}: SynthConfig keys are {sorted(synth_keys)}, "
                              f"LabelingConfig keys are {sorted(llm_keys)}")
    return synth, llm


def _labeling_config(args: argparse.Namespace, overrides: list[str], default_rater: str = "openai-compatible") -> LabelingConfig:
    config = args.config if args.config is not None else (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    extra = [f"--rater={getattr(args, 'rater', None) or default_rater}"]
    for key in ("concurrency", "store"):
        v = getattr(args, key, None)
        if v is not None:
            extra.append(f"--{key}={v}")
    return build_config(LabelingConfig, config, [*extra, *overrides])


def _synth_config(args: argparse.Namespace, overrides: list[str], corpus: str) -> SynthConfig:
    data: dict[str, Any] = parse_overrides(overrides)
    given = {"corpus": corpus, "per_passage": getattr(args, "per_passage", None), "kinds": getattr(args, "kinds", None),
             "mode": "multi" if getattr(args, "multi", False) else None, "judge": getattr(args, "judge", None),
             "existing": getattr(args, "existing", None), "splits": getattr(args, "splits", None),
             "out": getattr(args, "out", None), "limit": getattr(args, "limit", None),
             "retry_unparsed": True if getattr(args, "retry_unparsed", False) else None}
    data.update({k: v for k, v in given.items() if v is not None})
    if isinstance(data.get("kinds"), list):  # --kinds a,b c
        data["kinds"] = [k.strip() for v in data["kinds"] for k in str(v).split(",") if k.strip()]
    return config_from_dict(SynthConfig, data)


def _finish(report: SynthReport, args: argparse.Namespace, synth: SynthConfig, cfg: LabelingConfig,
            prompt_text: str | None, judge_prompt_text: str | None) -> int:
    print(report.format())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.summary(), indent=2, sort_keys=True))
    if cfg.mlflow:
        run_id = log_to_mlflow(report, synth=synth, cfg=cfg, prompt_text=prompt_text, judge_prompt_text=judge_prompt_text)
        print(f"MLflow run {run_id} (experiment {synth.experiment})")
    return 2 if report.stopped else 0


def _judge_prompt_text(synth: SynthConfig, cfg: LabelingConfig) -> str | None:
    if synth.judge == "lexical":
        return None
    return get_prompt(cfg.scheme).full_text()


def run_synth(argv: list[str]) -> int:
    args, rest = _parser().parse_known_args(argv)
    setup_logging(args.verbose)
    try:
        synth_over, llm_over = _split_overrides(rest)
        cfg = _labeling_config(args, llm_over)
        if cfg.rater != "openai-compatible":
            fix = ("to bring in the shipped synthetic questions use `suffice synth import`" if cfg.rater == "cached"
                   else "the lexical rater can only judge: use --judge lexical with an LLM writer")
            raise ConfigError(f"{PROG} writes questions with an LLM: --rater must be openai-compatible (got {cfg.rater!r}); {fix}")
        synth = _synth_config(args, synth_over, args.corpus)
        print(f"{PROG}: {synth.per_passage} questions per {'passage' if synth.mode == 'single' else 'pair'} of {synth.corpus} "
              f"({synth.mode}, kinds {', '.join(synth.resolved_kinds())}), writer {cfg.model} at {cfg.base_url}, "
              f"judge {synth.judge}, concurrency {cfg.concurrency}, store {cfg.store_path()}", file=sys.stderr)
        report = synthesize(synth, cfg, progress=cfg.progress and not args.no_progress)
    except (ConfigError, DataFormatError, FileNotFoundError, RaterConfigError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if report.stopped:
        print(f"{PROG}: stopped: {report.stopped}", file=sys.stderr)
    prompt = GenerationPrompt(mode=synth.mode, kinds=synth.resolved_kinds(), per_passage=synth.per_passage)
    return _finish(report, args, synth, cfg, prompt.full_text(), _judge_prompt_text(synth, cfg))


def run_judge(argv: list[str]) -> int:
    args, rest = _action_parser("judge").parse_known_args(argv)
    setup_logging(args.verbose)
    try:
        synth_over, llm_over = _split_overrides(rest)
        cfg = _labeling_config(args, llm_over)
        judge = "lexical" if cfg.rater == "lexical" else "rater"
        synth = _synth_config(args, [*synth_over, f"--judge={judge}"], args.input)
        report = rejudge(args.input, synth, cfg, progress=cfg.progress and not args.no_progress)
    except (ConfigError, DataFormatError, FileNotFoundError, RaterConfigError, ValueError) as e:
        print(f"{PROG} judge: error: {e}", file=sys.stderr)
        return 2
    if report.stopped:
        print(f"{PROG} judge: stopped: {report.stopped}", file=sys.stderr)
    return _finish(report, args, synth, cfg, None, _judge_prompt_text(synth, cfg))


def run_import(argv: list[str]) -> int:
    args, rest = _action_parser("import").parse_known_args(argv)
    try:
        _, llm_over = _split_overrides(rest)
        cfg = _labeling_config(args, llm_over, default_rater="cached")
        if args.path:
            path = Path(args.path)
        else:
            from suffice.training.paths import data_dir

            path = data_dir() / "synthetic" / "squad2-questions.jsonl"
        results = import_synthetic(path, cfg)
    except (ConfigError, DataFormatError, FileNotFoundError, ValueError) as e:
        print(f"{PROG} import: error: {e}", file=sys.stderr)
        return 2
    for writer, read, new in results:
        print(f"imported {writer}@shipped: {read} synthetic labels read from {path}, {new} new, "
              f"{read - new} already in {cfg.store_path()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``suffice synth`` (and its ``import`` and ``judge`` forms)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "import":
        return run_import(argv[1:])
    if argv and argv[0] == "judge":
        return run_judge(argv[1:])
    return run_synth(argv)


if __name__ == "__main__":
    sys.exit(main())
