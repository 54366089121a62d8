"""``suffice train`` and ``accelerate launch -m suffice.training.train``: the entry module.

    accelerate launch -m suffice.training.train --config configs/sufficiency.yaml [--key=value ...]
    suffice train --config configs/sufficiency.yaml --lora.r=8 --num_train_epochs=3
    suffice train --config configs/sufficiency.yaml --output_dir=models/x --resume   # continue a killed run

The training itself lives in :mod:`suffice.training.fit` (:func:`suffice.training.fit.run.run`
is the outline of a run).

>>> main(["--config", "configs/sufficiency.yaml", "--max_train_items=300", "--num_train_epochs=1"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import sys

from suffice.serving.config import ConfigError, dump_yaml
from suffice.training.fit.config import build_train_config
from suffice.training.fit.run import run


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="suffice train",
        description="Train a sufficiency / retrieval-gate cross-encoder. Any TrainConfig field can be overridden with "
                    "--key=value (nested: --lora.r=8, --data.sources=[squad2]); --resume continues the newest checkpoint.",
    )
    ap.add_argument("--config", help="YAML config (configs/sufficiency.yaml, configs/sufficiency-full.yaml, configs/retrieval-gate.yaml)")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return ap


def main(argv: list[str] | None = None) -> int:
    """``suffice train`` and ``accelerate launch -m suffice.training.train``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, overrides = build_parser().parse_known_args(argv)
    try:
        cfg = build_train_config(args.config, overrides)
    except ConfigError as e:
        print(f"suffice train: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return 0
    try:
        run(cfg)
    except ConfigError as e:
        print(f"suffice train: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
