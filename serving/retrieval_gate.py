"""Moved to :mod:`suffice.serving.gates.retrieval`; this shim re-exports its public names for one release."""

from __future__ import annotations

from suffice.serving.gates.retrieval import RETRIEVE, SKIP, GateDecision, RetrievalGate, RetrievalGateConfig, turns_as_passages

__all__ = ["RETRIEVE", "SKIP", "GateDecision", "RetrievalGate", "RetrievalGateConfig", "turns_as_passages"]
