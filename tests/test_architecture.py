"""The shape of the house, checked: packages are installed, no private imports across modules, no import cycles.

Static (``ast``) checks over ``training/`` and ``serving/``; nothing is imported.

- every folder holding ``__init__.py`` is listed in pyproject.toml's ``[tool.setuptools] packages``
  (a folder missing there is silently left out of the wheel);
- no module imports a private name (``_x``) of another suffice module, neither with
  ``from suffice.a import _x`` nor as ``a._x`` on an imported suffice module;
- the suffice import graph, counting imports inside functions, has no cycle. An edge goes from a
  module to the module it names (``from suffice.a.b import c`` -> ``suffice.a.b.c`` when that is a
  module, else ``suffice.a.b``; a package means its ``__init__``); the parent packages Python also
  initialises are not edges, so a package ``__init__`` may re-export its own submodules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"suffice.serving": ROOT / "serving", "suffice.training": ROOT / "training"}



def _modules() -> dict[str, Path]:
    """Module name -> file, for every .py under the package dirs (a package is its __init__)."""
    out = {}
    for pkg, root in PACKAGE_DIRS.items():
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts or any(p.startswith(".") for p in path.relative_to(root).parts):
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in ``module``, functions included."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((_absolute(module, node), [a.name for a in node.names], node.lineno))
    return out


def _targets(imported: str, names: list[str]) -> list[str]:
    """The suffice modules an import statement loads (as graph edges)."""
    if not imported.startswith("suffice."):
        return []
    found = [f"{imported}.{n}" for n in names if f"{imported}.{n}" in MODULES]
    if len(found) < len(names) or not names:
        found.append(imported)
    return [t for t in found if t in MODULES]


def _pyproject_packages() -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(data["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(_pyproject_packages())
    folders = sorted(name for name in MODULES if _is_package(name))
    missing = [f for f in folders if f not in listed]
    assert not missing, f"package folders missing from pyproject.toml [tool.setuptools] packages: {missing}"
    stale = sorted(p for p in listed if p not in folders)
    assert not stale, f"pyproject.toml lists packages that have no folder with __init__.py: {stale}"


def private_imports() -> list[str]:
    """``module:line imports _name from other`` for every private name taken from another suffice module."""
    out = []
    for module in MODULES:
        tree = ast.parse(MODULES[module].read_text())
        aliases: dict[str, str] = {}  # local name -> suffice module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                src = _absolute(module, node)
                if not src.startswith("suffice.") or src == module:
                    continue
                for a in node.names:
                    if f"{src}.{a.name}" in MODULES:
                        aliases[a.asname or a.name] = f"{src}.{a.name}"
                    elif a.name.startswith("_") and not a.name.startswith("__"):
                        out.append(f"{module}:{node.lineno} imports {a.name} from {src}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("suffice.") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__") and aliases[node.value.id] != module):
                out.append(f"{module}:{node.lineno} uses {node.value.id}.{node.attr} of {aliases[node.value.id]}")
    return sorted(set(out))


def import_cycles() -> list[list[str]]:
    """Every elementary cycle's first appearance in a DFS of the suffice import graph (functions included)."""
    graph = {m: sorted({t for imp, names, _ in _imports(m) for t in _targets(imp, names) if t != m}) for m in MODULES}
    cycles, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m] = "open"
        stack.append(m)
        for n in graph[m]:
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def test_no_module_imports_a_private_name_of_another():
    found = private_imports()
    assert not found, "private names imported across modules (make them public or move them):\n" + "\n".join(found)


def test_no_import_cycles_even_inside_functions():
    cycles = [" -> ".join(c) for c in import_cycles()]
    assert not cycles, "import cycles among suffice modules (imports inside functions count):\n" + "\n".join(cycles)


def test_the_checks_see_what_they_check():
    """The scan reads the tree: both halves and the moved stage packages are in it."""
    assert {"suffice.serving.bundle", "suffice.training.fit.run", "suffice.training.evaluation.evaluate",
            "suffice.training.export.bundle", "suffice.serving.batch"} <= set(MODULES)
    assert ("suffice.training.fit.loop", ["TrainState"], 0)[0] in {t for t in _targets("suffice.training.fit.loop", ["TrainState"])}
