"""Turn what a service is given (a bundle folder or an MLflow registry URI) into a local bundle folder.

``suffice serve --bundle models:/suffice-sufficiency@production`` resolves the alias once, at
start-up, to a version, downloads that version into a local cache and serves the folder; a
running service never talks to the registry again (promote a new version, then restart or
roll the service). Registry URIs need ``mlflow`` (or ``mlflow-skinny``) installed; it is
imported only when such a URI is given, so ``import suffice.serving`` stays free of it.

>>> resolve_bundle_uri("bundles/v3")  # doctest: +SKIP
PosixPath('bundles/v3')
>>> resolve_bundle_uri("models:/suffice-sufficiency@production")  # doctest: +SKIP
PosixPath('/root/.cache/suffice/bundles/suffice-sufficiency/3/data/bundle')

The tracking store is ``$MLFLOW_TRACKING_URI``, else ``$SUFFICE_MLRUNS_DIR/mlflow.db``, else
``mlruns/mlflow.db`` in the working directory or the source checkout (where ``suffice train``
and ``suffice export --register`` write by default). Downloads go to ``$SUFFICE_BUNDLE_CACHE``,
else ``$SUFFICE_MLRUNS_DIR/bundle-cache``, else ``~/.cache/suffice/bundles``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from suffice.serving.bundle import BundleError, BundleNotFoundError
from suffice.serving.pyfunc import find_bundle

__all__ = ["REGISTRY_SCHEMES", "RegistryURIError", "bundle_cache_dir", "download_atomic", "is_registry_uri",
           "local_bundle_dir", "resolve_bundle_uri", "tracking_uri"]

REGISTRY_SCHEMES = ("models:/", "runs:/")
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w\-]+))$")


class RegistryURIError(BundleError):
    """A models:/ or runs:/ URI cannot be resolved to a bundle; the message names the fix."""


def is_registry_uri(uri: str | os.PathLike) -> bool:
    """True for ``models:/...`` and ``runs:/...``.

    >>> is_registry_uri("models:/suffice-sufficiency@production"), is_registry_uri("bundles/v3")
    (True, False)
    """
    return str(uri).startswith(REGISTRY_SCHEMES)


def tracking_uri() -> str | None:
    """The MLflow store a registry URI is looked up in (see the module docstring); None = MLflow's default."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if os.environ.get("SUFFICE_MLRUNS_DIR"):
        return f"sqlite:///{Path(os.environ['SUFFICE_MLRUNS_DIR']).resolve() / 'mlflow.db'}"
    for root in (Path.cwd(), Path(__file__).resolve().parent.parent):
        db = root / "mlruns" / "mlflow.db"
        if db.is_file():
            return f"sqlite:///{db}"
    return None


def bundle_cache_dir() -> Path:
    if os.environ.get("SUFFICE_BUNDLE_CACHE"):
        return Path(os.environ["SUFFICE_BUNDLE_CACHE"])
    if os.environ.get("SUFFICE_MLRUNS_DIR"):
        return Path(os.environ["SUFFICE_MLRUNS_DIR"]) / "bundle-cache"
    return Path.home() / ".cache" / "suffice" / "bundles"


def resolve_bundle_uri(uri: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local bundle folder for a folder, an MLflow model folder, ``models:/NAME/N``, ``models:/NAME@alias`` or ``runs:/RUN/PATH``.

    The one place in suffice that turns a registry URI or a path into a bundle folder. Registry
    versions are downloaded once by :func:`download_registry_uri`; checksums are checked when
    the scorer loads the folder.
    """
    text = str(uri)
    if not is_registry_uri(text):
        return local_bundle_dir(text)
    return find_bundle(download_registry_uri(text, cache_dir))


def download_registry_uri(uri: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The local folder holding the artifacts of ``models:/NAME/N``, ``models:/NAME@alias`` or ``runs:/RUN/PATH``.

    Downloaded once into ``cache_dir/NAME/VERSION`` (an alias resolves to its version first, so
    two aliases on one version share the download; ``cache_dir/runs/...`` for a run URI),
    atomically (:func:`download_atomic`). The folder is returned as downloaded: a bundle, an
    MLflow model holding one, or a trained-model directory.
    """
    text = str(uri)
    if not is_registry_uri(text):
        raise RegistryURIError(f"{text!r} is not a registry URI: give models:/NAME/VERSION, models:/NAME@ALIAS or runs:/RUN_ID/PATH")
    try:
        import mlflow
        from mlflow.tracking import MlflowClient
    except ImportError as e:
        raise RegistryURIError(f"{text} is an MLflow registry URI but mlflow is not installed ({e}): "
                               "`pip install mlflow-skinny`, or give the bundle folder instead") from e
    store = tracking_uri()
    if store:
        mlflow.set_tracking_uri(store)
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    cache_root = Path(cache_dir) if cache_dir else bundle_cache_dir()
    if text.startswith("models:/"):
        m = _MODELS_URI.match(text)
        if not m:
            raise RegistryURIError(f"cannot parse {text!r}: use models:/NAME/VERSION or models:/NAME@ALIAS")
        try:
            mv = client.get_model_version_by_alias(m["name"], m["alias"]) if m["alias"] else client.get_model_version(m["name"], m["version"])
            source = client.get_model_version_download_uri(m["name"], mv.version)
        except Exception as e:  # MlflowException and store errors: keep MLflow's words, add where we looked and the fix
            raise RegistryURIError(f"{text} is not in the registry at {store or mlflow.get_tracking_uri()}: {e}. "
                                   "Set MLFLOW_TRACKING_URI to the store the bundle was registered in, and check the "
                                   "name/alias (`suffice promote --version N --alias production`)") from e
        target = cache_root / m["name"] / str(mv.version)
    else:
        source = text
        target = cache_root / "runs" / re.sub(r"[^\w.-]+", "_", text[len("runs:/"):])
    if not (target.is_dir() and any(target.iterdir())):
        try:
            with quiet_artifact_progress():
                download_atomic(lambda dst: mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(dst)), target)
        except Exception as e:  # network, permissions, missing artifacts: say which URI and source
            raise RegistryURIError(f"could not download {text} (source {source}) into {target}: {e}") from e
    return target


def local_bundle_dir(path: str | os.PathLike) -> Path:
    """The bundle folder for a local path: the folder itself, or an MLflow model folder's ``data/`` bundle."""
    text = str(path)
    if "://" in text:
        raise RegistryURIError(f"unsupported bundle location {text!r}: give a local folder, models:/NAME/VERSION, "
                               "models:/NAME@ALIAS or runs:/RUN_ID/PATH")
    folder = Path(text)
    if not folder.is_dir():
        raise BundleNotFoundError(f"bundle folder {folder} does not exist: give the folder `suffice export --out` wrote "
                                  "or a registry URI such as models:/suffice-sufficiency@production")
    # an MLflow model folder (a downloaded registry version) holds its bundle under data/;
    # any other folder is taken as the bundle itself, and loading it says what is missing
    return find_bundle(folder) if (folder / "MLmodel").is_file() else folder


@contextlib.contextmanager
def quiet_artifact_progress() -> Iterator[None]:
    """MLflow's per-file "Downloading artifacts" progress bars off while a bundle downloads (a service
    start would print dozens of them); a user's own ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` wins."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    if name in os.environ:
        yield
        return
    os.environ[name] = "false"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def download_atomic(fill: Callable[[Path], object], target: str | os.PathLike) -> Path:
    """Fill a fresh staging folder next to ``target`` with ``fill(staging)``, then rename it to ``target``.

    A killed or failed download never leaves a half-filled ``target`` that a later call would
    take as complete: the staging folder is removed, ``target`` is untouched.

    >>> import tempfile; t = Path(tempfile.mkdtemp()) / "v1"
    >>> download_atomic(lambda d: (d / "a.txt").write_text("a"), t).name, sorted(p.name for p in t.iterdir())
    ('v1', ['a.txt'])
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=target.parent))
    try:
        fill(staging)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
