"""suffice.serving: score context sufficiency and gate RAG pipelines with an exported bundle.

Needs only onnxruntime, tokenizers and numpy (no torch, transformers or mlflow).

>>> from suffice.serving import SufficiencyScorer  # doctest: +SKIP
>>> SufficiencyScorer.load("bundles/sufficiency-v3").score("Who wrote Hamlet?", ["Hamlet is by Shakespeare."]).level  # doctest: +SKIP
'sufficient'
"""

from __future__ import annotations

from suffice.serving.bundle import (
    BundleError,
    BundleManifest,
    BundleNotFoundError,
    ChecksumError,
    ManifestError,
    read_manifest,
    verify_bundle,
)
from suffice.serving.gates.context import Artifact, ContextGate, ContextGateConfig, ContextSelection, ExclusionReason
from suffice.serving.gates.retrieval import GateDecision, RetrievalGate, RetrievalGateConfig
from suffice.serving.gates.safety import RejectionReason, RetrievedChunk, SafetyGate, SafetyResult, SafetyThresholds
from suffice.serving.gates.selective import SelectiveAnswerer, SelectiveDecision, selective_curve
from suffice.serving.packing import ContextPacker, QuestionTooLongError
from suffice.serving.scorer import ConfidenceFactor, ScorerConfig, SufficiencyResult, SufficiencyScorer

__all__ = [
    "Artifact", "BundleError", "BundleManifest", "BundleNotFoundError", "ChecksumError", "ConfidenceFactor",
    "ContextGate", "ContextGateConfig", "ContextPacker", "ContextSelection", "ExclusionReason", "GateDecision",
    "ManifestError", "QuestionTooLongError", "RejectionReason", "RetrievalGate", "RetrievalGateConfig",
    "RetrievedChunk", "SafetyGate", "SafetyResult", "SafetyThresholds", "ScorerConfig", "SelectiveAnswerer",
    "SelectiveDecision", "SufficiencyResult", "SufficiencyScorer", "read_manifest", "selective_curve", "verify_bundle",
]
