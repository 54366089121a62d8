"""What crosses the service's walls is typed: the state's models, the chat verdict, the window rule's one owner."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

SERVICE = Path(__file__).resolve().parent.parent / "serving" / "service"


def test_service_state_types_its_models():
    from suffice.serving.gates.retrieval import RetrievalGate
    from suffice.serving.scorer import SufficiencyScorer
    from suffice.serving.service.state import ServiceState

    hints = typing.get_type_hints(ServiceState)
    assert hints["scorer"] is SufficiencyScorer
    assert hints["retrieval_gate"] == typing.Optional[RetrievalGate]


def test_the_service_does_not_probe_its_models_with_getattr():
    probes = []
    for path in sorted(SERVICE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args:
                target = ast.unparse(node.args[0])
                if re.search(r"scorer|retrieval_gate|manifest", target):
                    probes.append(f"{path.name}:{node.lineno} getattr({target}, ...)")
    assert not probes, probes


def test_the_window_rule_has_one_owner():
    """'Does the question fit the window' is serving/packing.py's question_room; the service asks the packer."""
    copies = []
    for path in sorted(SERVICE.glob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\+ 3 [<>]=?|- 3 - 32|window \* 2|max_length - 3", line):
                copies.append(f"{path.name}:{i}: {line.strip()}")
    assert not copies, copies


def test_the_chat_verdict_is_frozen_and_serialises_what_it_set():
    from pydantic import ValidationError

    from suffice.serving.service.schemas import SufficiencyMeta

    meta = SufficiencyMeta(score=None, level="unscored", factors=[], action="unscored", reason="no documents")
    with pytest.raises(ValidationError):
        meta.caveat = "changed"
    with_caveat = meta.model_copy(update={"caveat": "Note."})
    assert meta.caveat is None and with_caveat.caveat == "Note."
    assert meta.to_json() == {"score": None, "level": "unscored", "factors": [], "action": "unscored", "reason": "no documents"}
