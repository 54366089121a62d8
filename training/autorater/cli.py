"""``suffice label``: label items with an LLM autorater, import the shipped teacher, compare raters.

    suffice label --input ITEMS --rater openai-compatible|cached|lexical [--concurrency N] [--limit K]
                  [--config configs/labeling.yaml] [--store PATH] [--key=value ...]
    suffice label import [--path autorater-labels.jsonl] [--store PATH]
    suffice label agreement --a RATER[@VERSION] --b RATER[@VERSION]|gold [--items items.jsonl] [--levels]
    suffice label list [--store PATH]

ITEMS is any file the data loaders read (SQuAD 2.0, HotPotQA, MuSiQue, QED, canonical JSONL).
Any other ``--key=value`` overrides a LabelingConfig field (``--model=gpt-4o-mini``,
``--base_url=http://localhost:8000/v1``, ``--price_per_1k_input=0.00015``).

>>> main(["--input", "tests/fixtures/shared/items.jsonl", "--rater", "lexical", "--mlflow=false"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from suffice.training.autorater.labeling_config import DEFAULT_CONFIG, RATERS, LabelingConfig
from suffice.serving.config import ConfigError, build_config, not_overrides
from suffice.serving.bundle import LEVELS
from suffice.training.data.schema import DataFormatError

PROG = "suffice label"
ACTIONS = ("import", "agreement", "list")
TEACHER_ALIASES = {"cached": "llm-autorater-v1"}


def _config(path: Path | None, overrides: list[str]) -> LabelingConfig:
    config = path if path is not None else (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    return build_config(LabelingConfig, config, overrides)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help=f"YAML LabelingConfig (default: {DEFAULT_CONFIG} if present)")
    p.add_argument("--store", default=None, help="the SQLite label store (default: data/labels.sqlite)")


def _label_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Label (question, context) items with a rater into the label store. "
                    f"Other forms: `{PROG} import|agreement|list --help`.",
        epilog="Any other --key=value overrides a LabelingConfig field (configs/labeling.yaml documents them), "
               "e.g. --model=gpt-4o-mini --base_url=https://api.openai.com/v1 --price_per_1k_input=0.00015")
    p.add_argument("--input", required=True, type=Path, help="items file (SQuAD / HotPotQA / MuSiQue / QED / canonical JSONL)")
    p.add_argument("--format", default="auto", help="input format (default: detected)")
    p.add_argument("--rater", choices=RATERS, default=None, help="which rater (default: the config's, cached)")
    p.add_argument("--concurrency", type=int, default=None, help="requests in flight at once")
    p.add_argument("--limit", type=int, default=None, help="label only the first K items of the input")
    p.add_argument("--retry-unparsed", action="store_true", help="ask again for items stored as unparsed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", type=Path, default=None, help="also write the accounting as JSON here")
    p.add_argument("-v", "--verbose", action="store_true", help="log every retry")
    _common(p)
    return p


def _action_parser(action: str) -> argparse.ArgumentParser:
    if action == "import":
        p = argparse.ArgumentParser(prog=f"{PROG} import", allow_abbrev=False,
                                    description="Import the shipped teacher labels (autorater-labels.jsonl) into the store.")
        p.add_argument("--path", type=Path, default=None, help="labels JSONL (default: <shared data>/autorater-labels.jsonl)")
    elif action == "agreement":
        p = argparse.ArgumentParser(prog=f"{PROG} agreement", allow_abbrev=False,
                                    description="Accuracy, Cohen's kappa and confusion table of two label sources, per data source.")
        p.add_argument("--a", required=True, help="RATER[@PROMPT_VERSION] in the store, or cached / llm-autorater-v1, or gold")
        p.add_argument("--b", default="gold", help="the other side (default: gold)")
        p.add_argument("--items", type=Path, default=None, help="items file for gold labels and sources (default: <shared data>/items.jsonl)")
        p.add_argument("--levels", action="store_true", help="compare the three levels instead of the binary label")
        p.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    else:
        p = argparse.ArgumentParser(prog=f"{PROG} list", allow_abbrev=False, description="What the label store holds.")
    _common(p)
    return p


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (a handler kept across calls must not hold a stale stream)."""

    @property
    def stream(self):  # noqa: D401 - logging's attribute
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(verbose: bool) -> None:
    """Log suffice's messages to stderr (DEBUG with ``verbose``); shared by ``suffice label`` and ``suffice synth``."""
    # Only suffice's logger gets DEBUG: httpx/httpcore debug logs are not ours to vet for secrets.
    logger = logging.getLogger("suffice")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        h = _StderrHandler()
        h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(h)
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING)


def _overrides(args: argparse.Namespace, rest: list[str]) -> list[str]:
    bad = not_overrides(rest)
    if bad:
        raise ConfigError(f"unexpected argument(s) {bad}: options are listed by --help, config overrides look like --key=value")
    out = list(rest)
    for key in ("rater", "concurrency", "store"):
        v = getattr(args, key, None)
        if v is not None:
            out.append(f"--{key}={v}")
    return out


# ---------------------------------------------------------------- suffice label --input ...


def run_label(argv: list[str]) -> int:
    args, rest = _label_parser().parse_known_args(argv)
    setup_logging(args.verbose)
    from suffice.training.autorater.raters import RaterConfigError, RaterFatalError, build_rater
    from suffice.training.autorater.runner import label_items, log_to_mlflow
    from suffice.training.autorater.store import LabelStore
    from suffice.training.data.loaders import load_items

    try:
        cfg = _config(args.config, _overrides(args, rest))
        if args.limit is not None and args.limit < 0:
            raise ConfigError(f"--limit={args.limit} must be >= 0")
        items = load_items(args.input, format=args.format)
        rater = build_rater(cfg)
    except (ConfigError, DataFormatError, FileNotFoundError, RaterConfigError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    store_path = cfg.store_path()
    n = len(items) if args.limit is None else min(args.limit, len(items))
    print(f"{PROG}: {n} items from {args.input} -> rater {rater.id} (prompt {rater.prompt_version}), "
          f"concurrency {cfg.concurrency}, store {store_path}", file=sys.stderr)
    rc = 0
    with LabelStore(store_path) as store:
        try:
            acc = label_items(items, rater, store, concurrency=cfg.concurrency, limit=args.limit,
                              progress=cfg.progress and not args.no_progress, retry_unparsed=args.retry_unparsed,
                              price_per_1k_input=cfg.price_per_1k_input, price_per_1k_output=cfg.price_per_1k_output)
        except RaterFatalError as e:
            print(f"{PROG}: stopped: {e}", file=sys.stderr)
            acc, rc = e.accounting, 2
    print(acc.format())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(acc.summary(), indent=2, sort_keys=True))
    if cfg.mlflow:
        prompt_text = rater.describe().get("prompt_text")
        run_id = log_to_mlflow(acc, config=cfg, experiment=cfg.experiment, input_path=str(args.input),
                               prompt_text=prompt_text, store_path=str(store_path))
        print(f"MLflow run {run_id} (experiment {cfg.experiment})")
    return rc


# ---------------------------------------------------------------- import / list


def run_import(args: argparse.Namespace, cfg: LabelingConfig) -> int:
    from suffice.training.autorater.raters import CACHED_VERSION
    from suffice.training.autorater.store import LabelRecord, LabelStore
    from suffice.training.data.loaders import read_autorater_labels

    path = args.path or cfg.cached_labels_path()
    labels = read_autorater_labels(path)
    by_rater: dict[str, list[tuple[str, LabelRecord]]] = defaultdict(list)
    for iid, rec in labels.items():
        rater = cfg.rater_id or (rec["rater"] if rec["rater"] != "unknown" else "llm-autorater-v1")
        by_rater[rater].append((iid, LabelRecord(status="ok", label=int(rec["label"]), level=rec.get("level"),
                                                 rationale=rec.get("rationale") or None, attempts=0)))
    with LabelStore(cfg.store_path()) as store:
        for rater, rows in sorted(by_rater.items()):
            store.register_rater(rater, CACHED_VERSION, kind="cached", scheme="three_level", prompt_text=f"imported from {path}")
            new = store.put_many(rater, CACHED_VERSION, rows)
            print(f"imported {rater}@{CACHED_VERSION}: {len(rows)} labels read from {path}, {new} new, "
                  f"{len(rows) - new} already in {store.path}")
    return 0


def run_list(cfg: LabelingConfig) -> int:
    from suffice.training.autorater.store import LabelStore

    path = cfg.store_path()
    if not Path(path).is_file():
        print(f"{PROG} list: no label store at {path} yet: run `{PROG} --input ... --rater ...` or `{PROG} import`", file=sys.stderr)
        return 2
    with LabelStore(path) as store:
        rows = store.summary()
    print(f"{'rater@prompt_version':<48}{'rows':>8}{'ok':>8}{'unparsed':>10}{'sufficient':>12}{'tokens in/out':>20}")
    for r in rows:
        share = f"{r['positive'] / r['ok']:.1%}" if r["ok"] else "n/a"
        print(f"{r['rater'] + '@' + r['prompt_version']:<48}{r['n']:>8}{r['ok']:>8}{r['unparsed']:>10}{share:>12}"
              f"{str(r['tokens_in']) + '/' + str(r['tokens_out']):>20}")
    return 0


# ---------------------------------------------------------------- agreement


class _Sources:
    """Resolves label-source names to ``{item_id: value}`` maps, loading items only when needed."""

    def __init__(self, cfg: LabelingConfig, items_path: Path | None, levels: bool):
        self.cfg, self.items_path, self.levels = cfg, items_path, levels
        self._items = None
        self.notes: list[str] = []

    def items(self) -> list:
        if self._items is None:
            from suffice.training.data.loaders import load_items
            from suffice.training.paths import data_dir

            path = self.items_path or data_dir() / "items.jsonl"
            self._items = load_items(path)
        return self._items

    def source_of(self) -> dict[str, str] | None:
        if self._items is None and self.items_path is None:
            return None  # canonical id prefixes name the source
        return {it.id: it.source or it.id.split(":", 1)[0] for it in self.items()}

    def resolve(self, spec: str) -> tuple[str, dict[str, Any]]:
        from suffice.training.autorater.store import LabelStore

        if spec == "gold":
            from suffice.training.data.loaders import gold_label, gold_level

            fn = gold_level if self.levels else gold_label
            out = {it.id: fn(it) for it in self.items()}
            return "gold", {k: v for k, v in out.items() if v is not None}
        name = TEACHER_ALIASES.get(spec.split("@")[0], spec.split("@")[0]) + (("@" + spec.split("@", 1)[1]) if "@" in spec else "")
        store_path = self.cfg.store_path()
        if Path(store_path).is_file():
            with LabelStore(store_path) as store:
                try:
                    rater, version = store.resolve(name)
                except KeyError as e:
                    if name != "llm-autorater-v1":
                        raise
                    self.notes.append(f"{name}: not in the store ({e.args[0]}); read from the shipped file instead")
                else:
                    rows = store.rows(rater, version)
                    n_unparsed = sum(r.status == "unparsed" for r in rows)
                    if n_unparsed:
                        self.notes.append(f"{rater}@{version}: {n_unparsed} unparsed rows left out")
                    value = (lambda r: r.level) if self.levels else (lambda r: r.label)
                    return f"{rater}@{version}", {r.item_id: value(r) for r in rows if r.status == "ok" and value(r) is not None}
        elif name != "llm-autorater-v1":
            raise KeyError(f"no label store at {store_path}: run `{PROG} --input ... --rater ...` first, or compare `cached` / `gold`")
        from suffice.training.data.loaders import read_autorater_labels

        path = self.cfg.cached_labels_path()
        labels = read_autorater_labels(path)
        key = "level" if self.levels else "label"
        return f"llm-autorater-v1 ({path.name})", {k: v[key] for k, v in labels.items() if v.get(key) is not None}


def run_agreement(args: argparse.Namespace, cfg: LabelingConfig) -> int:
    from suffice.training.autorater.agreement import compare, format_agreement

    sources = _Sources(cfg, args.items, args.levels)
    name_a, a = sources.resolve(args.a)
    name_b, b = sources.resolve(args.b)
    positive, values = ("sufficient", LEVELS) if args.levels else (1, (1, 0))
    rows = compare(a, b, sources.source_of(), positive=positive)
    print(format_agreement(rows, name_a, name_b, values=values))
    only_a, only_b = len(set(a) - set(b)), len(set(b) - set(a))
    print(f"(compared items labelled by both; {only_a} only in a, {only_b} only in b)")
    for note in sources.notes:
        print(f"note: {note}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"a": name_a, "b": name_b, "levels": args.levels,
                                         "rows": [r.to_dict() for r in rows]}, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``suffice label`` (and its ``import``, ``agreement``, ``list`` forms)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ACTIONS:
        return run_label(argv)
    action = argv[0]
    args, rest = _action_parser(action).parse_known_args(argv[1:])
    try:
        cfg = _config(args.config, _overrides(args, rest))
        if action == "import":
            return run_import(args, cfg)
        if action == "agreement":
            return run_agreement(args, cfg)
        return run_list(cfg)
    except (ConfigError, DataFormatError, FileNotFoundError, KeyError, ValueError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"{PROG} {action}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
