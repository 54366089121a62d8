"""``suffice demo`` (what ``make demo`` runs): the whole path on the embedded default.

1. prepare the shared data and print its table (counts, label balance, teacher vs gold);
2. stage 0 (``--stage0 on``): ``configs/pretrain.yaml`` turns all-MiniLM-L6-v2 into a
   (question, passage) pair reader on rows that cost nothing (``<output_dir>/stage0``);
3. train the short default config with ``accelerate launch`` (LoRA, autorater labels; from the
   stage-0 directory when there is one), which evaluates on test next to the baselines, exports
   the ONNX bundle and registers it in MLflow as a pyfunc model (``suffice-sufficiency``; the
   trained-model folder goes to ``suffice-sufficiency-model``);
4. point the alias ``candidate`` at the new bundle version (checked to resolve to a valid
   bundle) and print the commands that use it: ``suffice serve``, ``suffice score``,
   ``mlflow.pyfunc.load_model``, and ``suffice promote`` to make it ``production``;
5. stage 0 is exported and registered too (the version before the candidate), so the registry holds
   two versions to compare: the demo prints the MLflow UI's runs table (headline columns) and its
   side-by-side comparison of the two versions.

With ``--no-export`` nothing servable is registered (and no alias is set).

Extra ``--key=value`` arguments are passed to the training config, e.g.
``suffice demo --max_train_items=2000``; ``--stage0.KEY=VALUE`` goes to the stage-0 config instead
(``--stage0.max_train_items=6000``). A ``--base_model`` is where the first stage starts; ``--tracking.*``
goes to both stages.

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

from suffice.serving.config import not_overrides
from suffice.serving.bundle import MANIFEST_NAME
from suffice.training.paths import REPO_ROOT


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="suffice demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO_ROOT / "configs" / "sufficiency.yaml"), help="training config (YAML)")
    ap.add_argument("--data-config", default=str(REPO_ROOT / "configs" / "data.yaml"), help="data config for the printed table")
    ap.add_argument("--skip-data", action="store_true", help="do not prepare/print the shared data table first")
    ap.add_argument("--no-export", action="store_true", help="skip the ONNX export at the end of training")
    ap.add_argument("--stage0", choices=["on", "off"], default=STAGE0_DEFAULT,
                    help=f"train stage 0 (--pretrain-config) first and start the demo config from it (default {STAGE0_DEFAULT})")
    ap.add_argument("--pretrain-config", default=str(REPO_ROOT / "configs" / "pretrain.yaml"), help="the stage-0 config (YAML)")
    ap.add_argument("--mixed-precision", choices=["auto", "no", "bf16"], default="auto",
                    help="both stages: auto = bf16 autocast on CPUs with AMX or AVX512-BF16 (or a GPU that has it), else fp32")
    return ap


# On by default: started from stage 0, the demo config leaves the ln 2 loss plateau from its first steps and
# does better on the sufficiency configs' selection metric (validation source means) on both stage-1 seeds
# measured, within the demo's 30-minute budget (benchmarks/results/2026-11-28/stage0.md).
STAGE0_DEFAULT = "on"
STAGE0_PREFIX = "--stage0."


def split_overrides(overrides: list[str], stage0: bool) -> tuple[list[str], list[str]]:
    """(stage-0 overrides, stage-1 overrides): ``--stage0.K=V`` -> stage 0 as ``--K=V``; ``--tracking.*`` -> both;
    ``--base_model`` -> the first stage that runs; the rest -> stage 1.

    >>> split_overrides(["--stage0.max_train_items=9", "--base_model=m", "--tracking.tracking_uri=u", "--seed=1"], True)
    (['--max_train_items=9', '--base_model=m', '--tracking.tracking_uri=u'], ['--tracking.tracking_uri=u', '--seed=1'])
    >>> split_overrides(["--base_model=m", "--seed=1"], False)
    ([], ['--base_model=m', '--seed=1'])
    """
    stray = [o for o in overrides if o.startswith(STAGE0_PREFIX)]
    if stray and not stage0:
        raise ValueError(f"{stray} given with --stage0 off: drop them or add --stage0 on")
    first: list[str] = []
    second: list[str] = []
    for o in overrides:
        if o.startswith(STAGE0_PREFIX):
            first.append("--" + o[len(STAGE0_PREFIX):])
        elif o.startswith("--tracking."):
            first.append(o)
            second.append(o)
        elif o.startswith("--base_model=") and stage0:
            first.append(o)
        else:
            second.append(o)
    return (first if stage0 else []), second


def launch(config: str, overrides: list[str], env: dict[str, str]) -> int:
    """``accelerate launch -m suffice.training.train --config CONFIG OVERRIDES`` on one process; its exit code."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
        # precision comes from the suffice config (`mixed_precision`, resolved per machine), not the launcher
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "suffice.training.train", "--config", config, *overrides,
    ]
    print("$ " + shlex.join(["accelerate", "launch", *cmd[3:]]), flush=True)
    return subprocess.call(cmd, env=env)


def main(argv: list[str] | None = None) -> int:
    args, overrides = _parser().parse_known_args(argv)
    bad = not_overrides(overrides)
    if bad:
        print(f"suffice demo: unexpected argument(s) {bad}: training overrides look like --key=value", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    stage0 = args.stage0 == "on"
    steps = 3 if stage0 else 2
    if not args.skip_data:
        from suffice.training.data import cli as data_cli

        print(f"== 1/{steps}  data: prepare and describe the shared data ==", flush=True)
        rc = data_cli.main(["prepare", "--config", args.data_config])
        if rc:
            return rc
    try:
        first, overrides = split_overrides(overrides, stage0)
    except ValueError as e:
        print(f"suffice demo: {e}", file=sys.stderr)
        return 2
    out_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("--output_dir=")), None)
    if out_dir is None:
        out_dir = str(REPO_ROOT / "models" / time.strftime("demo-%Y%m%d-%H%M%S"))
        overrides = [*overrides, f"--output_dir={out_dir}"]
    precision = [f"--mixed_precision={args.mixed_precision}"]
    store = next((o.split("=", 1)[1] for o in overrides if o.startswith("--tracking.tracking_uri=")), None)
    if store:  # the alias goes into the store training registered in
        os.environ["MLFLOW_TRACKING_URI"] = store
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if stage0:
        stage0_dir = str(Path(out_dir) / "stage0")
        print("\n== 2/3  stage 0: a (question, passage) pair reader from rows that cost nothing ==", flush=True)
        # exported and registered too: the version the candidate is compared with in the registry
        register0 = [] if args.no_export else ["--export=true", "--tracking.register=true"]
        rc = launch(args.pretrain_config, [*precision, *register0, f"--output_dir={stage0_dir}", *first], env)
        if rc:
            print(f"suffice demo: stage 0 failed with exit code {rc} (see the messages above)", file=sys.stderr)
            return rc
        overrides = [f"--base_model={stage0_dir}", *overrides]
    print(f"\n== {steps}/{steps}  train, evaluate on test, export the bundle, register it in MLflow ==", flush=True)
    rc = launch(args.config, [*precision, *([] if args.no_export else ["--export=true"]), *overrides], env)
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
    for line in compare_lines([Path(out_dir) / "stage0" / "bundle", bundle] if stage0 else [bundle]):
        print(line)
    return rc


def compare_lines(bundles: list[Path]) -> list[str]:
    """Where the MLflow UI compares what the demo made: the runs table with the headline columns and,
    for two registered bundles (stage 0 and the candidate), MLflow's side-by-side view of the two versions."""
    from suffice.serving.bundle import read_manifest
    from suffice.training.tracking import compare_versions_url, runs_table_url, ui_base

    port, base = os.environ.get("MLFLOW_PORT", "5000"), ui_base()
    manifests = [read_manifest(b) for b in bundles if (b / MANIFEST_NAME).is_file()]
    registered = [m for m in manifests if m.registered_model and m.model_version and m.mlflow_run_id]
    lines = [f"Compare runs and registered versions in the MLflow UI: `make mlflow-ui{'' if port == '5000' else f' MLFLOW_PORT={port}'}`, then open"]
    experiment_id = experiment_of(registered[-1].mlflow_run_id) if registered else None
    lines.append(f"  runs:     {runs_table_url(experiment_id, base)}" if experiment_id else f"  {base}")
    if len(registered) >= 2 and len({m.registered_model for m in registered}) == 1:
        runs = {m.model_version: m.mlflow_run_id for m in registered}
        lines.append(f"  versions {' and '.join(runs)} side by side: {compare_versions_url(registered[0].registered_model, runs, base)}")
    return lines


def experiment_of(run_id: str) -> str | None:
    """The experiment id of a run in the project's store (None when the store cannot say)."""
    from suffice.training.export.registry import mlflow_client

    try:
        return mlflow_client().get_run(run_id).info.experiment_id
    except Exception:  # a store that moved or a run that was deleted: print the plain UI address
        return None


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
    warning = indecisive_warning(m)
    if warning:
        print(warning, file=sys.stderr)
    try:
        promote(m.registered_model, m.model_version, CANDIDATE_ALIAS)
    except RegistryError as e:
        print(f"suffice demo: could not set the alias {CANDIDATE_ALIAS}: {e}", file=sys.stderr)
        return 1
    uri = f"models:/{m.registered_model}@{CANDIDATE_ALIAS}"
    print(f"\nregistered {m.registered_model} version {m.model_version} (alias {CANDIDATE_ALIAS}): {uri}")
    from suffice.training.paths import default_tracking_uri

    for line in usage_commands(m.registered_model, m.model_version, default_tracking_uri()):
        print(line)
    return 0


def indecisive_warning(manifest) -> str | None:
    """A loud message when a sufficiency bundle puts no validation item at the "sufficient" level.

    Such a model makes every gate answer with a caveat or decline: it is registered (the demo's
    path works end to end) but must not pass as a usable candidate silently.

    >>> from types import SimpleNamespace as NS
    >>> m = NS(task="sufficiency", model_version="3", thresholds={"sufficient": 0.8}, metrics={"validation_levels": {"coverage_at_sufficient": 0.0}})
    >>> indecisive_warning(m).splitlines()[1]
    '!! version 3 puts no validation item at P(sufficient) >= 0.8: every gate will caveat or decline.'
    >>> indecisive_warning(NS(task="sufficiency", model_version="3", thresholds={}, metrics={"validation_levels": {"coverage_at_sufficient": 0.2}})) is None
    True
    """
    from suffice.serving.bundle import VALIDATION_LEVELS

    levels = (manifest.metrics or {}).get(VALIDATION_LEVELS) or {}
    coverage = levels.get("coverage_at_sufficient")
    if manifest.task != "sufficiency" or coverage is None or coverage > 0:
        return None
    at = (manifest.thresholds or {}).get("sufficient", 0.8)
    bar = "!" * 100
    return "\n".join([
        bar,
        f"!! version {manifest.model_version} puts no validation item at P(sufficient) >= {at:g}: every gate will caveat or decline.",
        "!! It is registered as the candidate so the commands below work, but it is not a usable judge: train the",
        "!! longer recipe (configs/sufficiency-full.yaml or configs/reading.yaml), or check the thresholds, before promoting it.",
        bar,
    ])


def usage_commands(name: str, version: str, store: str, alias: str = CANDIDATE_ALIAS) -> list[str]:
    """The README's commands for a registered bundle version (what the demo prints at the end).

    ``store`` is the tracking URI the version is registered in: plain MLflow (pyfunc, ``mlflow
    models serve``, ``spark_udf``) looks for ``./mlflow.db`` unless ``MLFLOW_TRACKING_URI`` says
    otherwise, so its command names the store and works pasted into any fresh shell.

    >>> usage_commands("suffice-sufficiency", "1", "sqlite:////repo/mlruns/mlflow.db")[1]
    '  suffice serve --bundle models:/suffice-sufficiency@candidate'
    >>> usage_commands("suffice-sufficiency", "1", "sqlite:////repo/mlruns/mlflow.db")[3][:61]
    '  MLFLOW_TRACKING_URI=sqlite:////repo/mlruns/mlflow.db python'
    """
    uri = f"models:/{name}@{alias}"
    return [
        "Use it:",
        f"  suffice serve --bundle {uri}",
        f"  suffice score --input items.jsonl --output scored.jsonl --model {uri}",
        f"  MLFLOW_TRACKING_URI={shlex.quote(store)} python -c \"import mlflow, pandas as pd; m = mlflow.pyfunc.load_model('{uri}'); "
        "print(m.predict(pd.DataFrame([{'question': 'Who founded Lima?', 'context': 'Lima was founded by Pizarro.'}])))\"",
        "Make it production (then serve models:/{0}@production):".format(name),
        f"  suffice promote --name {name} --version {version} --alias production",
    ]


if __name__ == "__main__":
    sys.exit(main())
