"""One owner for the task vocabulary: the level and label names, the default thresholds and the
id2label tables are spelled only in ``serving/bundle.py`` (its task table); the rest of the code
imports them. This reads the source (code, not docstrings) for second copies."""

from __future__ import annotations

import ast
from pathlib import Path

from suffice.serving.bundle import DEFAULT_THRESHOLDS, LEVELS, RETRIEVE, SKIP, SKIP_THRESHOLD, TASK_SPECS, TASKS

REPO = Path(__file__).resolve().parents[1]
OWNER = REPO / "serving" / "bundle.py"
LABELS = {*LEVELS, RETRIEVE, SKIP}
THRESHOLD_NAMES = {*LEVELS, SKIP_THRESHOLD}


def _const(node, kind):
    return isinstance(node, ast.Constant) and isinstance(node.value, kind) and not isinstance(node.value, bool)


def second_copies(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every literal that spells the vocabulary again."""
    found = []
    # type annotations (Literal["RETRIEVE", "SKIP"]) and __all__ lists name things, they do not define them
    annotations = {id(n) for node in ast.walk(tree) if isinstance(node, ast.Subscript) for n in ast.walk(node.slice)}
    annotations |= {id(n) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets) for n in ast.walk(node.value)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            pairs = [(k, v) for k, v in zip(node.keys, node.values) if k is not None]
            if any(_const(k, str) and k.value in THRESHOLD_NAMES and _const(v, float) for k, v in pairs):
                found.append((node.lineno, "a default-threshold dict ({'sufficient': 0.8, ...})"))
            if any(_const(k, int) and _const(v, str) and v.value in LABELS for k, v in pairs):
                found.append((node.lineno, "an id2label dict ({0: 'insufficient', ...})"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and id(node) not in annotations:
            names = {e.value for e in node.elts if _const(e, str)}
            if {RETRIEVE, SKIP} <= names or {"insufficient", "sufficient"} <= names:
                found.append((node.lineno, f"a label-name sequence {sorted(names)}"))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id in THRESHOLD_NAMES and node.value is not None and _const(node.value, float):
                found.append((node.lineno, f"a default threshold {node.target.id} = {node.value.value}"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args[len(node.args.args) - len(node.args.defaults):] if node.args.defaults else []
            for a, d in [*zip(args, node.args.defaults), *zip(node.args.kwonlyargs, node.args.kw_defaults)]:
                if a.arg in THRESHOLD_NAMES and d is not None and _const(d, float):
                    found.append((node.lineno, f"a default threshold argument {a.arg}={d.value}"))
    return found


def test_the_bundle_owns_the_task_vocabulary():
    assert TASKS == ("sufficiency", "retrieval_gate")
    assert dict(DEFAULT_THRESHOLDS["sufficiency"]) == {"sufficient": 0.8, "partial": 0.5}
    assert TASK_SPECS["retrieval_gate"].id2label() == {0: "RETRIEVE", 1: "SKIP"}
    assert second_copies(ast.parse(OWNER.read_text()))  # the check sees the owner's own table


def test_no_second_copy_of_the_task_vocabulary():
    copies = []
    for root in ("serving", "training"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path == OWNER:
                continue
            copies += [f"{path.relative_to(REPO)}:{line}: {what}" for line, what in second_copies(ast.parse(path.read_text()))]
    assert not copies, ("the task vocabulary is spelled again; import it from suffice.serving.bundle "
                        "(TASK_SPECS, LEVELS, RETRIEVE/SKIP, DEFAULT_THRESHOLDS):\n" + "\n".join(copies))


def test_the_check_finds_a_copy():
    src = 'T = {"sufficient": 0.8}\nL = {0: "RETRIEVE", 1: "SKIP"}\nG = ("RETRIEVE", "SKIP")\ndef f(sufficient=0.8): pass\n'
    assert sorted(line for line, _ in second_copies(ast.parse(src))) == [1, 2, 3, 4]
