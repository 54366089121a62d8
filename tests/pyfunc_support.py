"""Helpers for the pyfunc / batch-scoring / Spark tests: one tiny bundle per session, registration,
and a ``sitecustomize`` that makes a child Python an environment without torch (and, optionally,
without an installed suffice)."""

from __future__ import annotations

import os
import shutil
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from serving_support import make_model_dir, validation_items

HEAVY = ("torch", "transformers", "peft", "optimum", "accelerate", "datasets")
_BUNDLES: dict[str, Path] = {}
_STORES: dict[str, tuple[Path, str, str]] = {}

# Rows in every shape the pyfunc input schema allows.
MIXED_ROWS = [
    {"question": "Where is the Eiffel Tower?", "passages": [{"title": "Paris", "text": "The Eiffel Tower is a lattice tower in Paris, France."}]},
    {"question": "When did Chopin leave Warsaw?", "passages": ["Chopin left Warsaw in 1830, shortly before the November Uprising."]},
    {"question": "Who founded the city of Lima?", "context": "Lima is the capital of Peru. It lies on the Pacific coast."},
    {"question": "How many moons does Mars have?", "passages": [{"title": "Mars", "text": "Mars has two small moons, Phobos and Deimos."}, "Deimos is the smaller."]},
    {"question": "Who painted the Mona Lisa?", "passages": []},
    {"question": "What year did the Berlin Wall fall?", "passages": ["The Berlin Wall fell on 9 November 1989. " * 40]},
]


def as_scorer_input(rows: list[dict]) -> tuple[list[str], list[list]]:
    """What the direct scorer gets for the same rows (context -> one passage, missing -> none)."""
    return [r["question"] for r in rows], [r["passages"] if r.get("passages") is not None else ([r["context"]] if r.get("context") else []) for r in rows]


def tiny_bundle(tmp_path_factory, tiny_bert_dir) -> Path:
    """One exported tiny bundle (int8 + fp32) per session; copy it before registering (registration edits the manifest)."""
    if "sufficiency" not in _BUNDLES:
        from suffice.training.export import export_bundle

        root = tmp_path_factory.mktemp("pyfunc-bundle")
        _BUNDLES["sufficiency"] = export_bundle(make_model_dir(tiny_bert_dir, root / "model"), root / "bundle", validation_items(40))
    return _BUNDLES["sufficiency"]


@contextmanager
def mlflow_store(root: Path, monkeypatch=None) -> Iterator[str]:
    """Point suffice and MLflow (environment and mlflow's process-wide URIs) at a store under ``root``.

    With ``monkeypatch`` the environment stays set until the test ends; without, until the block ends.
    """
    import mlflow
    import pytest

    root.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mp = monkeypatch or pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mp.setenv("SUFFICE_MLRUNS_DIR", str(root))
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield uri
    finally:
        if monkeypatch is None:
            mp.undo()


def register_and_promote(bundle: Path, tmp_path: Path, alias: str = "production") -> tuple[str, str]:
    """Copy ``bundle`` under tmp_path, register it in the test's MLflow store and point ``alias`` at it."""
    from suffice.training.export import registry

    local = tmp_path / "registered-bundle"
    shutil.copytree(bundle, local)
    name, version = registry.register_bundle(local)
    assert registry.main(["--name", name, "--version", version, "--alias", alias]) == 0
    return name, version


def shared_store(tmp_path_factory, bundle: Path) -> tuple[Path, str, str]:
    """One MLflow store per session holding ``bundle`` as suffice-sufficiency version 1 @production.

    Returns (store folder, name, version); use it in a test through :func:`mlflow_store`.
    Registration costs seconds (store creation, environment pinning), so it is done once.
    """
    if "store" not in _STORES:
        root = tmp_path_factory.mktemp("pyfunc-store")
        with mlflow_store(root / "mlruns"):
            name, version = register_and_promote(bundle, root)
        _STORES["store"] = (root / "mlruns", name, version)
    return _STORES["store"]


def no_torch_site(dst: Path, hide_installed_suffice: bool = False) -> dict[str, str]:
    """Write a ``sitecustomize.py`` into ``dst`` that makes torch & co. unimportable in any child
    Python started with the returned environment (children of children included, through
    PYTHONPATH). With ``hide_installed_suffice`` the editable install of suffice is switched off
    too, so suffice.serving can only come from a model's own ``code/`` folder."""
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import sys

        BLOCKED = {HEAVY!r}

        class _NoTorchHere:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is not installed in this environment (blocked by the test)")
                return None

        sys.meta_path.insert(0, _NoTorchHere())
        if {hide_installed_suffice!r}:
            sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
            sys.path[:] = [p for p in sys.path if "__editable__" not in p]
    """))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(dst)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env
