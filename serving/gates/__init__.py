"""RAG gates built on the scorer, one module each.

- :mod:`~suffice.serving.gates.context`: ``ContextGate``, what goes into the prompt.
- :mod:`~suffice.serving.gates.safety`: ``SafetyGate``, when to say "I don't know".
- :mod:`~suffice.serving.gates.retrieval`: ``RetrievalGate``, whether a chat turn needs retrieval.
- :mod:`~suffice.serving.gates.selective`: ``SelectiveAnswerer``, abstain on sufficiency and confidence.

>>> from suffice.serving.gates import ContextGate, SafetyGate  # doctest: +SKIP
"""

from __future__ import annotations

from suffice.serving.gates.context import (
    KIND_ORDER,
    Artifact,
    ContextGate,
    ContextGateConfig,
    ContextSelection,
    Exclusion,
    ExclusionReason,
    approx_token_count,
    document_relevance,
)
from suffice.serving.gates.retrieval import RETRIEVE, SKIP, GateDecision, RetrievalGate, RetrievalGateConfig, thread_input, turns_as_passages
from suffice.serving.gates.safety import (
    CHECK_REASONS,
    RejectionReason,
    RetrievedChunk,
    SafetyGate,
    SafetyResult,
    SafetyThresholds,
)
from suffice.serving.gates.selective import SelectiveAnswerer, SelectiveDecision, fit_logistic, selective_curve

__all__ = [
    "CHECK_REASONS", "KIND_ORDER", "RETRIEVE", "SKIP", "Artifact", "ContextGate", "ContextGateConfig", "ContextSelection",
    "Exclusion", "ExclusionReason", "GateDecision", "RejectionReason", "RetrievalGate", "RetrievalGateConfig",
    "RetrievedChunk", "SafetyGate", "SafetyResult", "SafetyThresholds", "SelectiveAnswerer", "SelectiveDecision",
    "approx_token_count", "document_relevance", "fit_logistic", "selective_curve", "thread_input", "turns_as_passages",
]
