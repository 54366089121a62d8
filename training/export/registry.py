"""The MLflow model registry side of bundles: register, resolve back to a folder, promote.

    suffice promote --name suffice-sufficiency --version 3 --alias production

A registered bundle version points at the ``bundle/`` artifact of its run, which is an MLflow
``pyfunc`` model (``MLmodel``, ``requirements.txt``/``conda.yaml``/``python_env.yaml`` pinning
the serving install and never torch, ``code/suffice/serving`` and the bundle under
``data/bundle``), so ``mlflow.pyfunc.load_model("models:/suffice-sufficiency@production")``,
``mlflow.pyfunc.spark_udf`` and ``mlflow models serve`` all score with :mod:`suffice.serving`.
Resolving ``models:/NAME/N`` or ``models:/NAME@alias`` downloads it into a local cache and
validates the bundle with the serving code, so what the registry hands out is exactly what a
service can load.

>>> resolve_bundle("models:/suffice-sufficiency@production")  # doctest: +SKIP
PosixPath('.../mlruns/bundle-cache/suffice-sufficiency/3')
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from suffice.serving.bundle import MANIFEST_NAME, BundleManifest, read_manifest, verify_bundle, write_manifest
from suffice.training.fit.meta import MODEL_META
from suffice.training.paths import default_artifact_location, default_tracking_uri, mlruns_dir
from suffice.training.tracking import headline_tags, version_description

REGISTERED_NAMES = {"sufficiency": "suffice-sufficiency", "retrieval_gate": "suffice-retrieval-gate"}
EXPORT_EXPERIMENT = "suffice-export"


class RegistryError(RuntimeError):
    """A registry URI cannot be resolved or registration failed; the message names the fix."""


def mlflow_client():
    """An MlflowClient on the project's tracking store (``mlruns/mlflow.db`` unless MLFLOW_TRACKING_URI says otherwise)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def find_dir(root: Path, marker: str) -> Path | None:
    """``root`` or the first folder under it holding ``marker`` (a manifest or model metadata file)."""
    if (root / marker).is_file():
        return root
    found = sorted(p.parent for p in root.rglob(marker))
    return found[0] if found else None


def download(uri: str) -> Path:
    """The local folder of a ``models:/`` or ``runs:/`` URI, through :func:`suffice.serving.model_uri.download_registry_uri`
    (an atomic download into ``mlruns/bundle-cache``)."""
    from suffice.serving.model_uri import RegistryURIError, download_registry_uri, is_registry_uri

    if not is_registry_uri(uri):
        raise RegistryError(f"unsupported URI {uri!r}: give a local path, models:/NAME/N, models:/NAME@alias or runs:/RUN/PATH")
    try:
        return download_registry_uri(uri, cache_dir=mlruns_dir() / "bundle-cache")
    except RegistryURIError as e:
        raise RegistryError(str(e)) from e


def resolve_bundle(uri: str) -> Path:
    """A bundle folder for a local path, ``models:/NAME/N``, ``models:/NAME@alias`` or ``runs:/RUN/PATH``.

    The folder is validated (manifest and checksums) before it is returned.

    >>> resolve_bundle("bundles/v3")  # doctest: +SKIP
    PosixPath('bundles/v3')
    """
    if "://" not in uri and not uri.startswith(("models:/", "runs:/")):
        p = Path(uri)
        if (p / "MLmodel").is_file() and not (p / MANIFEST_NAME).is_file():
            from suffice.serving.pyfunc import find_bundle

            p = find_bundle(p)  # a saved/downloaded pyfunc model: its bundle is under data/
        verify_bundle(p)
        return p
    root = download(uri)
    found = find_dir(root, MANIFEST_NAME)
    if found is None:
        raise RegistryError(f"{uri} holds no {MANIFEST_NAME}: it is not an exported bundle (a trained model? run `suffice export --model {uri}`)")
    verify_bundle(found)
    return found


def resolve_model_dir(uri: str) -> Path:
    """A trained-model directory (with suffice_model.json) for a path or a registry/run URI."""
    if not uri.startswith(("models:/", "runs:/")):
        p = Path(uri)
        if not p.is_dir():
            raise RegistryError(f"model directory {p} does not exist: give the output directory of `suffice train` or a models:/ URI")
        return p
    root = download(uri)
    found = find_dir(root, MODEL_META)
    if found is None:
        hint = " (it is an exported bundle already; load it with SufficiencyScorer)" if find_dir(root, MANIFEST_NAME) else ""
        raise RegistryError(f"{uri} holds no suffice_model.json{hint}")
    return found


# The serving install (the core dependencies of suffice) plus pandas, which MLflow's pyfunc
# interface speaks; used when suffice's own metadata cannot be read (running from a source tree).
SERVING_REQUIREMENTS = ("numpy", "onnxruntime", "tokenizers", "pyyaml")
PYFUNC_EXTRA_REQUIREMENTS = ("pandas",)
PYFUNC_LOADER_MODULE = "suffice.serving.pyfunc"


def pyfunc_requirements() -> list[str]:
    """pip requirements of the logged pyfunc model: the serving install pinned at the installed versions.

    They come from suffice's core dependencies (what ``pip install suffice`` installs: numpy,
    onnxruntime, tokenizers, pyyaml), never the ``train`` extra, so no torch; MLflow adds its
    own pin. suffice itself is not a requirement: the model carries ``suffice.serving`` in its
    ``code/`` folder, so it loads where suffice is not installed (or not on an index).

    >>> [r.split("==")[0] for r in pyfunc_requirements()]  # doctest: +SKIP
    ['numpy', 'onnxruntime', 'tokenizers', 'pyyaml', 'pandas']
    """
    from importlib.metadata import PackageNotFoundError, requires, version

    try:
        declared = [r for r in (requires("suffice") or []) if "extra ==" not in r and "extra==" not in r]
        names = [re.split(r"[<>=!~ \[;(]", r, maxsplit=1)[0] for r in declared] or list(SERVING_REQUIREMENTS)
    except PackageNotFoundError:
        names = list(SERVING_REQUIREMENTS)
    out = []
    for name in [*names, *PYFUNC_EXTRA_REQUIREMENTS]:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            raise RegistryError(f"{name} is a serving requirement but is not installed here, so it cannot be pinned: "
                                f"`pip install {name}` (or `pip install 'suffice[train]'`)") from None
    return out


def pyfunc_signature():
    """The model signature: ``question`` plus ``passages`` (a list of strings or {title, text}) or ``context`` in;
    ``score``, ``level``, ``latency_ms`` out.

    ``passages`` is typed ``Any`` because a cell may hold strings or objects, or be empty where a
    row gives ``context`` instead (MLflow's ``Array`` type refuses a missing cell); the pyfunc
    validates each element itself and names the row of a bad one.
    """
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, ColSpec, DataType, Schema

    inputs = Schema([
        ColSpec(DataType.string, "question"),
        ColSpec(AnyType(), "passages", required=False),
        ColSpec(DataType.string, "context", required=False),
    ])
    outputs = Schema([ColSpec(DataType.double, "score"), ColSpec(DataType.string, "level"), ColSpec(DataType.double, "latency_ms")])
    return ModelSignature(inputs=inputs, outputs=outputs)


def _serving_code_tree(dst: Path) -> Path:
    """Copy suffice.serving (without the HTTP service subpackage) to ``dst/suffice/serving``; returns ``dst/suffice``."""
    import suffice.serving

    src = Path(suffice.serving.__file__).resolve().parent
    shutil.copytree(src, dst / "suffice" / "serving", ignore=shutil.ignore_patterns("service", "__pycache__", "*.pyc"))
    return dst / "suffice"


def save_pyfunc_model(bundle_dir: str | Path, path: str | Path, manifest: BundleManifest | None = None) -> Path:
    """Write ``bundle_dir`` as an MLflow pyfunc model folder at ``path`` (which must not exist).

    The folder holds ``MLmodel`` (loader module :mod:`suffice.serving.pyfunc`, signature, input
    example), the pinned environment (:func:`pyfunc_requirements`), ``code/suffice/serving`` and
    the bundle under ``data/bundle``.

    >>> import mlflow; save_pyfunc_model("bundles/v3", "/tmp/v3-pyfunc")  # doctest: +SKIP
    >>> mlflow.pyfunc.load_model("/tmp/v3-pyfunc").predict(pd.DataFrame({"question": ["Q?"], "context": ["..."]}))  # doctest: +SKIP
    """
    import mlflow
    import pandas as pd

    from suffice.serving.pyfunc import DEFAULT_MODEL_CONFIG, INPUT_EXAMPLE

    bundle = Path(bundle_dir)
    manifest = manifest or verify_bundle(bundle)
    if manifest.task != "sufficiency":
        raise RegistryError(f"{bundle} is a {manifest.task} bundle: the pyfunc model wraps sufficiency bundles only "
                            "(load a retrieval gate with suffice.serving.RetrievalGate.load)")
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="suffice-pyfunc-") as tmp:
        staged = Path(tmp) / "bundle"
        shutil.copytree(bundle, staged)  # fixed name, so the model's data is always data/bundle
        code = _serving_code_tree(Path(tmp) / "code")
        mlflow.pyfunc.save_model(
            path=str(path), loader_module=PYFUNC_LOADER_MODULE, data_path=str(staged), code_paths=[str(code)],
            pip_requirements=pyfunc_requirements(), signature=pyfunc_signature(),
            input_example=pd.DataFrame(INPUT_EXAMPLE), model_config=dict(DEFAULT_MODEL_CONFIG),
            metadata={"suffice": {"task": manifest.task, "base_model": manifest.base_model,
                                  "registered_model": manifest.registered_model, "model_version": manifest.model_version,
                                  "mlflow_run_id": manifest.mlflow_run_id, "max_length": manifest.max_length}},
        )
    return path


def register_bundle(bundle_dir: str | Path, run_id: str | None = None, name: str | None = None, *, client=None,
                    tags: dict[str, str] | None = None, description: str | None = None) -> tuple[str, str]:
    """Log ``bundle_dir`` as the ``bundle`` artifact of its training run and register it.

    This is the only way a version of ``suffice-sufficiency`` / ``suffice-retrieval-gate`` is
    made, so every version is servable: a sufficiency bundle is logged as an MLflow pyfunc model
    (:func:`save_pyfunc_model`: flavour, signature, input example), a retrieval-gate bundle as its
    plain folder. Training calls it when it exports (``export: true``); ``suffice export
    --register`` for a bundle exported later.

    The run is ``run_id``, else the manifest's ``mlflow_run_id``, else a new run in the
    ``suffice-export`` experiment. The version number is written into the manifest (which is
    not itself checksummed) before the files are logged, so the registered copy names itself.
    ``client``: the MlflowClient to use (default: the project's store); ``tags`` and
    ``description`` go on the version, after the run's ``headline/`` metrics as tags
    (:func:`suffice.training.tracking.headline_tags`); the description starts with those numbers in one
    line (:func:`suffice.training.tracking.version_description`). The version links its run, so MLflow's
    version comparison shows the run's params and metrics side by side. Returns (registered model
    name, version).

    >>> register_bundle("bundles/v3")  # doctest: +SKIP
    ('suffice-sufficiency', '3')
    """
    bundle = Path(bundle_dir)
    manifest = verify_bundle(bundle)
    name = name or REGISTERED_NAMES[manifest.task]
    client = client or mlflow_client()
    run_id = run_id or manifest.mlflow_run_id
    if run_id:
        try:
            client.get_run(run_id)
        except Exception as e:  # MlflowException: unknown run id
            raise RegistryError(f"run {run_id} (from the manifest) is not in the tracking store {default_tracking_uri()}: {e}. "
                                "Set MLFLOW_TRACKING_URI to the store the model was trained with, or pass run_id") from e
    else:
        exp = client.get_experiment_by_name(EXPORT_EXPERIMENT)
        exp_id = exp.experiment_id if exp else client.create_experiment(EXPORT_EXPERIMENT, artifact_location=default_artifact_location())
        run_id = client.create_run(exp_id, run_name=f"export-{bundle.name}").info.run_id
        client.set_terminated(run_id)
    try:
        client.get_registered_model(name)
    except Exception:  # not registered yet: create it (any other failure resurfaces just below)
        client.create_registered_model(name, description="suffice exported bundles as MLflow pyfunc models "
                                       "(suffice.serving on ONNX Runtime; the bundle is under data/bundle)")
    run = client.get_run(run_id)
    source = run.info.artifact_uri.rstrip("/") + "/bundle"
    # the run's headline metrics on the version itself: its page and the registry search show them
    version_tags = {**headline_tags(run.data.metrics), **(tags or {}), "task": manifest.task,
                    **({"flavor": "python_function"} if manifest.task == "sufficiency" else {})}
    mv = client.create_model_version(name, source=source, run_id=run_id, tags={k: str(v) for k, v in version_tags.items() if v is not None},
                                     description=version_description(run.data.metrics, description))
    from dataclasses import replace

    manifest = replace(manifest, registered_model=name, model_version=str(mv.version), mlflow_run_id=run_id)
    write_manifest(bundle, manifest)
    try:
        if manifest.task == "sufficiency":
            with tempfile.TemporaryDirectory(prefix="suffice-register-") as tmp:
                model_dir = save_pyfunc_model(bundle, Path(tmp) / "bundle", manifest)
                client.log_artifacts(run_id, str(model_dir), artifact_path="bundle")
        else:  # a retrieval gate is no pyfunc model: its bundle folder is the artifact
            client.log_artifacts(run_id, str(bundle), artifact_path="bundle")
    except BaseException as e:
        # a version whose source was never written would resolve to nothing: take it back
        client.delete_model_version(name, mv.version)
        if isinstance(e, Exception) and not isinstance(e, RegistryError):
            raise RegistryError(f"could not log {bundle} as a pyfunc model for {name} version {mv.version} (version removed): {e}") from e
        raise
    return name, str(mv.version)


def promote(name: str, version: str, alias: str) -> None:
    """Point ``alias`` (e.g. production) at a version, after checking it resolves to a valid bundle."""
    resolve_bundle(f"models:/{name}/{version}")
    mlflow_client().set_registered_model_alias(name, alias, str(version))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="suffice promote", description="set a registry alias on a bundle version "
                                 "(after checking that the version resolves to a valid bundle); the store is "
                                 "MLFLOW_TRACKING_URI, else suffice's mlruns/mlflow.db",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--name", default=REGISTERED_NAMES["sufficiency"],
                    help=f"registered model name ({REGISTERED_NAMES['retrieval_gate']} for the retrieval gate)")
    ap.add_argument("--version", required=True, help="the model version to point the alias at (`suffice export --register` printed it)")
    ap.add_argument("--alias", default="production", help="the alias to set; a service loads it as models:/NAME@ALIAS")
    args = ap.parse_args(argv)
    try:
        promote(args.name, args.version, args.alias)
    except (RegistryError, ValueError) as e:
        print(f"promote failed: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"name": args.name, "version": args.version, "alias": args.alias}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
