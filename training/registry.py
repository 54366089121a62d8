"""The MLflow model registry side of bundles: register, resolve back to a folder, promote.

    suffice promote --name suffice-sufficiency --version 3 --alias production

A registered bundle version points at the ``bundle/`` artifact of its run; resolving
``models:/NAME/N`` or ``models:/NAME@alias`` downloads it into a local cache and validates it
with the serving code, so what the registry hands out is exactly what a service can load.

>>> resolve_bundle("models:/suffice-sufficiency@production")  # doctest: +SKIP
PosixPath('.../mlruns/bundle-cache/suffice-sufficiency/3')
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from suffice.serving.bundle import MANIFEST_NAME, read_manifest, verify_bundle, write_manifest
from suffice.training.paths import default_artifact_location, default_tracking_uri, mlruns_dir

REGISTERED_NAMES = {"sufficiency": "suffice-sufficiency", "retrieval_gate": "suffice-retrieval-gate"}
EXPORT_EXPERIMENT = "suffice-export"
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w\-]+))$")


class RegistryError(RuntimeError):
    """A registry URI cannot be resolved or registration failed; the message names the fix."""


def _client():
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _find_dir(root: Path, marker: str) -> Path | None:
    if (root / marker).is_file():
        return root
    found = sorted(p.parent for p in root.rglob(marker))
    return found[0] if found else None


def _download(uri: str) -> Path:
    import mlflow

    _client()
    m = _MODELS_URI.match(uri)
    if uri.startswith("models:/") and not m:
        raise RegistryError(f"cannot parse {uri!r}: use models:/NAME/VERSION or models:/NAME@ALIAS")
    if m:
        client = _client()
        try:
            mv = client.get_model_version_by_alias(m["name"], m["alias"]) if m["alias"] else client.get_model_version(m["name"], m["version"])
        except Exception as e:  # mlflow raises MlflowException subclasses; keep its message, add the fix
            raise RegistryError(f"{uri}: {e}. List versions with the MLflow UI or `mlflow models` and check the name/alias") from e
        cache = mlruns_dir() / "bundle-cache" / m["name"] / str(mv.version)
        source = client.get_model_version_download_uri(m["name"], mv.version)
    elif uri.startswith("runs:/"):
        cache = mlruns_dir() / "bundle-cache" / "runs" / re.sub(r"[^\w.-]+", "_", uri[len("runs:/"):])
        source = uri
    else:
        raise RegistryError(f"unsupported URI {uri!r}: give a local path, models:/NAME/N, models:/NAME@alias or runs:/RUN/PATH")
    if cache.is_dir() and any(cache.iterdir()):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    try:
        mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(cache))
    except Exception as e:  # same: name the URI and the source it points at
        raise RegistryError(f"could not download {uri} (source {source}): {e}") from e
    return cache


def resolve_bundle(uri: str) -> Path:
    """A bundle folder for a local path, ``models:/NAME/N``, ``models:/NAME@alias`` or ``runs:/RUN/PATH``.

    The folder is validated (manifest and checksums) before it is returned.

    >>> resolve_bundle("bundles/v3")  # doctest: +SKIP
    PosixPath('bundles/v3')
    """
    if "://" not in uri and not uri.startswith(("models:/", "runs:/")):
        p = Path(uri)
        verify_bundle(p)
        return p
    root = _download(uri)
    found = _find_dir(root, MANIFEST_NAME)
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
    root = _download(uri)
    found = _find_dir(root, "suffice_model.json")
    if found is None:
        hint = " (it is an exported bundle already; load it with SufficiencyScorer)" if _find_dir(root, MANIFEST_NAME) else ""
        raise RegistryError(f"{uri} holds no suffice_model.json{hint}")
    return found


def register_bundle(bundle_dir: str | Path, run_id: str | None = None, name: str | None = None) -> tuple[str, str]:
    """Log ``bundle_dir`` as the ``bundle`` artifact of its training run and register it.

    The run is ``run_id``, else the manifest's ``mlflow_run_id``, else a new run in the
    ``suffice-export`` experiment. The version number is written into the manifest (which is
    not itself checksummed) before the files are logged, so the registered copy names itself.
    Returns (registered model name, version).
    """
    bundle = Path(bundle_dir)
    manifest = verify_bundle(bundle)
    name = name or REGISTERED_NAMES[manifest.task]
    client = _client()
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
        client.create_registered_model(name, description="suffice exported bundles (model.onnx, model.int8.onnx, tokenizer.json, suffice.json)")
    source = client.get_run(run_id).info.artifact_uri.rstrip("/") + "/bundle"
    mv = client.create_model_version(name, source=source, run_id=run_id, tags={"task": manifest.task})
    from dataclasses import replace

    write_manifest(bundle, replace(manifest, registered_model=name, model_version=str(mv.version), mlflow_run_id=run_id))
    client.log_artifacts(run_id, str(bundle), artifact_path="bundle")
    return name, str(mv.version)


def promote(name: str, version: str, alias: str) -> None:
    """Point ``alias`` (e.g. production) at a version, after checking it resolves to a valid bundle."""
    resolve_bundle(f"models:/{name}/{version}")
    _client().set_registered_model_alias(name, alias, str(version))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="suffice promote", description="set a registry alias on a bundle version")
    ap.add_argument("--name", default="suffice-sufficiency")
    ap.add_argument("--version", required=True)
    ap.add_argument("--alias", default="production")
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
