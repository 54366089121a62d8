"""The ``suffice`` command line: one entry point, one module per subcommand.

Each subcommand lives in its own module exposing ``main(argv) -> int`` and imports its heavy
dependencies (torch, mlflow...) only when it runs, so ``suffice --help`` is instant.

    suffice data prepare            build the DatasetDict under data/ and print its table
    suffice data stats              counts and teacher/gold agreement per source
    suffice label --input ITEMS --rater NAME
    suffice weak --config configs/sufficiency.yaml --out data/weak/demo-weak.jsonl
    suffice train --config configs/sufficiency.yaml   (or: accelerate launch -m suffice.training.train ...)
    suffice evaluate --model PATH --split test
    suffice soup --models DIR DIR [...] --output_dir DIR
    suffice export --model PATH --out DIR
    suffice serve --bundle DIR
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("suffice.training.data.cli", "prepare datasets and print statistics (prepare, stats)"),
    "label": ("suffice.training.autorater.cli", "label (question, context) pairs with an LLM autorater; agreement; import"),
    "synth": ("suffice.training.synth.cli", "generate synthetic training questions with a teacher LLM"),
    "weak": ("suffice.training.data.weak", "build rule-based weak-supervision pairs for an intermediate training stage"),
    "train": ("suffice.training.train", "train a sufficiency / retrieval-gate model (same as accelerate launch -m suffice.training.train)"),
    "evaluate": ("suffice.training.evaluation.evaluate", "evaluate a model and the baselines on a split"),
    "soup": ("suffice.training.fit.soup", "average fine-tuned models of the same base into one (greedy or uniform model soup)"),
    "export": ("suffice.training.export.cli", "merge, export to ONNX, quantise, check parity and write a bundle"),
    "fit-selective": ("suffice.training.evaluation.selective_fit", "fit the selective-answering model (sufficiency x confidence)"),
    "serve": ("suffice.serving.service", "start the HTTP service on a bundle"),
    "score": ("suffice.serving.batch", "score a JSONL/Parquet file offline with a bundle"),
    "promote": ("suffice.training.export.registry", "set a registry alias on a model version"),
    "demo": ("suffice.training.demo", "run the whole path on the embedded default (what `make demo` runs)"),
}


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = ["usage: suffice COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {c.ljust(width)}  {desc}" for c, (_, desc) in COMMANDS.items()]
    lines += ["", "Run `suffice COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("--version", "-V"):
        from importlib.metadata import version

        print(f"suffice {version('suffice')}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"suffice: unknown command '{cmd}'.\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name = COMMANDS[cmd][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("suffice"):
            print(f"suffice: command '{cmd}' is not available in this version ({module_name} missing)", file=sys.stderr)
            return 2
        extra = "serve" if cmd == "serve" else "train"
        print(f"suffice {cmd}: missing dependency '{e.name}': install it with `pip install 'suffice[{extra}]'`", file=sys.stderr)
        return 2
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
