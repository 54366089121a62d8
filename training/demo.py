"""``suffice demo`` (what ``make demo`` runs): the whole path on the embedded default.

1. prepare the shared data and print its table (counts, label balance, teacher vs gold);
2. train the short default config with ``accelerate launch`` (LoRA on all-MiniLM-L6-v2,
   autorater labels), which evaluates on test next to the baselines, exports the ONNX bundle
   and registers it in MLflow as a pyfunc model (``suffice-sufficiency``; the trained-model
   folder goes to ``suffice-sufficiency-model``);
3. point the alias ``candidate`` at the new bundle version (checked to resolve to a valid
   bundle) and print the commands that use it: ``suffice serve``, ``suffice score``,
   ``mlflow.pyfunc.load_model``, and ``suffice promote`` to make it ``production``.

With ``--no-export`` nothing servable is registered (and no alias is set).

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
    print("\n== 2/2  train, evaluate on test, export the bundle, register it in MLflow ==", flush=True)
    out_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("--output_dir=")), None)
    if out_dir is None:
        out_dir = str(REPO_ROOT / "models" / time.strftime("demo-%Y%m%d-%H%M%S"))
        overrides = [*overrides, f"--output_dir={out_dir}"]
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "suffice.training.train", "--config", args.config,
        # fp32: the demo's numbers and its 17-minute wall time were measured so; bf16 (what `auto`
        # picks on AMX / AVX512-BF16 CPUs) trains LoRA ~1.4x faster but its quality is not yet measured
        "--mixed_precision=no",
        *([] if args.no_export else ["--export=true"]), *overrides,
    ]
    print("$ " + shlex.join(["accelerate", "launch", *cmd[3:]]), flush=True)
    store = next((o.split("=", 1)[1] for o in overrides if o.startswith("--tracking.tracking_uri=")), None)
    if store:  # the alias goes into the store training registered in
        os.environ["MLFLOW_TRACKING_URI"] = store
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    rc = subprocess.call(cmd, env=env)
    if rc:
        print(f"suffice demo: training failed with exit code {rc} (see the messages above)", file=sys.stderr)
        return rc
    export_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("--export_dir=")), None)
    bundle = Path(export_dir) if export_dir else Path(out_dir) / "bundle"
    rc = 0
    if (bundle / MANIFEST_NAME).is_file():
        print(f"bundle: {bundle}")
        rc = set_candidate(bundle)
    elif not args.no_export:
        print(f"suffice demo: training wrote no bundle under {bundle} (the export failed: see above)", file=sys.stderr)
        rc = 1
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s.")
    print("Compare runs and registered versions in the MLflow UI: `make mlflow-ui`, then open http://127.0.0.1:5000")
    return rc


CANDIDATE_ALIAS = "candidate"


def set_candidate(bundle: Path) -> int:
    """Point ``candidate`` at the version training registered for ``bundle`` and print how to use it; 1 when it cannot."""
    from suffice.serving.bundle import read_manifest
    from suffice.training.export.registry import RegistryError, promote

    m = read_manifest(bundle)
    if not (m.registered_model and m.model_version):
        print(f"suffice demo: the bundle {bundle} was not registered (tracking off, or registration failed: see above); "
              f"register it with `suffice export --model {bundle.parent} --out {bundle} --overwrite --register`", file=sys.stderr)
        return 1
    try:
        promote(m.registered_model, m.model_version, CANDIDATE_ALIAS)
    except RegistryError as e:
        print(f"suffice demo: could not set the alias {CANDIDATE_ALIAS}: {e}", file=sys.stderr)
        return 1
    uri = f"models:/{m.registered_model}@{CANDIDATE_ALIAS}"
    print(f"\nregistered {m.registered_model} version {m.model_version} (alias {CANDIDATE_ALIAS}): {uri}")
    for line in usage_commands(m.registered_model, m.model_version):
        print(line)
    return 0


def usage_commands(name: str, version: str, alias: str = CANDIDATE_ALIAS) -> list[str]:
    """The README's commands for a registered bundle version (what the demo prints at the end).

    >>> usage_commands("suffice-sufficiency", "1")[1]
    '  suffice serve --bundle models:/suffice-sufficiency@candidate'
    """
    uri = f"models:/{name}@{alias}"
    return [
        "Use it:",
        f"  suffice serve --bundle {uri}",
        f"  suffice score --input items.jsonl --output scored.jsonl --model {uri}",
        f"  python -c \"import mlflow, pandas as pd; m = mlflow.pyfunc.load_model('{uri}'); "
        "print(m.predict(pd.DataFrame([{'question': 'Who founded Lima?', 'context': 'Lima was founded by Pizarro.'}])))\"",
        "Make it production (then serve models:/{0}@production):".format(name),
        f"  suffice promote --name {name} --version {version} --alias production",
    ]


if __name__ == "__main__":
    sys.exit(main())
