"""``suffice demo`` (what ``make demo`` runs): the whole path on the embedded default.

1. prepare the shared data and print its table (counts, label balance, teacher vs gold);
2. train the short default config with ``accelerate launch`` (LoRA on all-MiniLM-L6-v2,
   autorater labels), which evaluates on test next to the baselines, registers the model in
   MLflow and exports the ONNX bundle;
3. print where the model, the bundle and the MLflow UI are.

Extra ``--key=value`` arguments are passed to the training config, e.g.
``suffice demo --max_train_items=2000``.

>>> main(["--help"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from suffice.serving.bundle import MANIFEST_NAME
from suffice.training.paths import REPO_ROOT


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="suffice demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO_ROOT / "configs" / "sufficiency.yaml"), help="training config (YAML)")
    ap.add_argument("--data-config", default=str(REPO_ROOT / "configs" / "data.yaml"), help="data config for the printed table")
    ap.add_argument("--skip-data", action="store_true", help="do not prepare/print the shared data table first")
    ap.add_argument("--no-export", action="store_true", help="skip the ONNX export at the end of training")
    return ap


def main(argv: list[str] | None = None) -> int:
    args, overrides = _parser().parse_known_args(argv)
    bad = [o for o in overrides if not (o.startswith("--") and "=" in o)]
    if bad:
        print(f"suffice demo: unexpected argument(s) {bad}: training overrides look like --key=value", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if not args.skip_data:
        from suffice.training.data import cli as data_cli

        print("== 1/2  data: prepare and describe the shared data ==", flush=True)
        rc = data_cli.main(["prepare", "--config", args.data_config])
        if rc:
            return rc
    print("\n== 2/2  train, evaluate on test, register in MLflow, export the bundle ==", flush=True)
    out_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("--output_dir=")), None)
    if out_dir is None:
        out_dir = str(REPO_ROOT / "models" / time.strftime("demo-%Y%m%d-%H%M%S"))
        overrides = [*overrides, f"--output_dir={out_dir}"]
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "suffice.training.train", "--config", args.config,
        *([] if args.no_export else ["--export=true"]), *overrides,
    ]
    print("$ " + shlex.join(["accelerate", "launch", *cmd[3:]]), flush=True)
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    rc = subprocess.call(cmd, env=env)
    if rc:
        print(f"suffice demo: training failed with exit code {rc} (see the messages above)", file=sys.stderr)
        return rc
    bundle = Path(out_dir) / "bundle"
    if (bundle / MANIFEST_NAME).is_file():
        print(f"bundle: {bundle}")
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s.")
    print("Compare runs and registered versions in the MLflow UI: `make mlflow-ui`, then open http://127.0.0.1:5000")
    print("Score with the bundle: python -c \"from suffice.serving import SufficiencyScorer; "
          "print(SufficiencyScorer.load('<bundle dir>').score('question?', ['passage']))\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
