"""``suffice data prepare`` and ``suffice data stats``.

    suffice data prepare [--config configs/data.yaml] [--key=value ...]
        build the DatasetDict under data/<name>/ (with manifest.json) and print its table
    suffice data stats [--config configs/data.yaml] [--prepared NAME_OR_PATH] [--key=value ...]
        print the table for a prepared dataset, or (without --prepared) build it in memory

``--key=value`` overrides any DataConfig field (``--label_source=gold``, ``--sources=squad2,qed``).
Without ``--config`` the repository's configs/data.yaml is used when it exists.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from suffice.serving.config import ConfigError, build_config, not_overrides
from suffice.training.paths import REPO_ROOT
from suffice.training.data.schema import SPLITS, DataFormatError

DEFAULT_CONFIG = REPO_ROOT / "configs" / "data.yaml"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_stats(manifest: dict[str, Any]) -> str:
    """The human-readable table for a manifest: items per split/source, label balance, agreement, drops.

    >>> print(format_stats(manifest))  # doctest: +SKIP
    """
    c = manifest["counts"]
    out = [f"dataset '{manifest['name']}'  rows={c['total']}  data_hash={manifest['data_hash'][:16]}"
           f"  label_source={manifest['label_policy']['label_source']} (fallback={manifest['label_policy']['fallback']})"]
    if manifest.get("path"):
        out.append(f"saved at {manifest['path']}")
    srcs = sorted(c["by_source"])
    rows = [[s] + [c["by_split"][sp]["source"].get(s, 0) for sp in SPLITS] + [c["by_source"][s]["total"]] for s in srcs]
    rows.append(["total"] + [c["by_split"][sp]["total"] for sp in SPLITS] + [c["total"]])
    out += ["", "Items per split and source", _table(["source", *SPLITS, "total"], rows)]

    rows = []
    for s in srcs:
        lab = c["by_source"][s]["label"]
        n = c["by_source"][s]["total"]
        ls = ", ".join(f"{k}:{v}" for k, v in c["by_source"][s]["label_source"].items())
        var = sum(v for k, v in c["by_source"][s]["variant"].items() if k)
        rows.append([s, lab.get("1", 0), lab.get("0", 0), lab.get("-1", 0), _pct(lab.get("1", 0) / n if n else None), var, ls])
    out += ["", "Label balance per source (all splits)",
            _table(["source", "sufficient", "not", "unlabelled", "% suff", "variants", "label sources"], rows)]
    rows = [[sp, c["by_split"][sp]["label"].get("1", 0), c["by_split"][sp]["label"].get("0", 0),
             c["by_split"][sp]["label"].get("-1", 0), ", ".join(f"{k}:{v}" for k, v in c["by_split"][sp]["level"].items() if k)]
            for sp in SPLITS]
    out += ["", "Label balance per split", _table(["split", "sufficient", "not", "unlabelled", "levels"], rows)]

    ag = manifest.get("agreement") or {}
    rows = [[s, a["n"], _pct(a["accuracy"]), "-" if a["kappa"] is None else f"{a['kappa']:.3f}",
             _pct(a["teacher_sufficient"]), _pct(a["gold_sufficient"])] for s, a in ag.items()]
    out += ["", "Teacher (autorater) vs gold-derived label, real items",
            _table(["source", "n", "accuracy", "kappa", "teacher suff", "gold suff"], rows) if rows else "(no item has both labels)"]

    pre = manifest.get("pretrain")
    if pre:  # stage 0 (DataConfig.pretrain): the train split is pair-reading rows
        out += ["", f"Stage-0 train rows from {pre['parents']} questions with a known answer (of {pre['train_rows_before']} train rows)",
                _table(["kind", "rows"], [[k, n] for k, n in pre["rows_by_kind"].items()])]

    e = manifest["empty_passages"]
    out += ["", f"Empty-passage items: {e['total']}" + (f" ({', '.join(f'{k}: {v}' for k, v in e['by_source'].items())})" if e["total"] else "")]
    d = manifest.get("dropped") or {}
    out.append("Dropped rows: none" if not d else f"Dropped rows: {sum(d.values())}")
    out += [f"  {k}: {v}" for k, v in d.items()]
    shared = manifest.get("rows_sharing_passage_text_across_splits") or {}
    if shared:
        out.append("Rows sharing a passage text with another split (in the input): "
                   + ", ".join(f"{k}: {v}" for k, v in shared.items()))
    if manifest.get("autorater_labels_without_item"):
        out.append(f"Autorater labels with no matching item: {manifest['autorater_labels_without_item']}")
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="suffice data", description="Prepare datasets and print their statistics.",
                                allow_abbrev=False, epilog="Any other --key=value overrides a DataConfig field, e.g. --label_source=gold.")
    sub = p.add_subparsers(dest="action", required=True)
    for name, help_ in (("prepare", "build and save the DatasetDict + manifest under data/<name>/"),
                        ("stats", "print counts, label balance and teacher/gold agreement")):
        s = sub.add_parser(name, help=help_, allow_abbrev=False)
        s.add_argument("--config", type=Path, default=None, help=f"YAML DataConfig (default: {DEFAULT_CONFIG} if present)")
        s.add_argument("--quiet", action="store_true", help="no progress bars")
        if name == "stats":
            s.add_argument("--prepared", default=None, help="name or path of a prepared dataset to describe instead of building")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``suffice data``.

    >>> main(["stats", "--sources=squad2", "--include_variants=false"])  # doctest: +SKIP
    0
    """
    args, rest = _parser().parse_known_args(argv)
    bad = not_overrides(rest)
    if bad:
        print(f"suffice data: unexpected argument(s) {bad}: overrides look like --key=value", file=sys.stderr)
        return 2
    from suffice.training.data.builder import DataConfig, build, load_prepared, prepare

    try:
        if getattr(args, "prepared", None):
            _, manifest = load_prepared(args.prepared)
        else:
            config = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
            cfg = build_config(DataConfig, config, rest)
            _, manifest = (prepare if args.action == "prepare" else build)(cfg, progress=not args.quiet)
    except (ConfigError, DataFormatError, FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"suffice data {args.action}: error: {e}", file=sys.stderr)
        return 2
    print(format_stats(manifest))
    return 0
