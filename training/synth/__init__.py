"""The synth stage (``suffice synth``): a teacher LLM writes questions about passages, a judge re-labels
them, and the accepted ones become training items.

``suffice.training.synth`` was one module before this package; its public names still resolve here
(lazily, so importing a submodule does not load the command line) for one release.
"""

from __future__ import annotations

import importlib
from typing import Any

_MOVED = "suffice.training.synth.cli"


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    module = importlib.import_module(_MOVED)
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'suffice.training.synth' has no attribute {name!r}") from None
