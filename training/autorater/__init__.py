"""The autorater stage: label (question, context) items with an LLM, cached, resumable, cost-accounted.

The small student model is distilled from these labels. A user points ``suffice label`` at any
OpenAI-compatible server (OpenAI, Gemini, vLLM, llama.cpp) and labels their own RAG traffic; on
machines without one, the shipped teacher labels (rater ``llm-autorater-v1``) are the default.

    from suffice.training.autorater import LabelingConfig, LabelStore, build_rater, label_items
    cfg = LabelingConfig(rater="openai-compatible", base_url="http://localhost:8000/v1", model="qwen2.5-7b")
    with LabelStore(cfg.store_path()) as store:
        print(label_items(items, build_rater(cfg), store, concurrency=cfg.concurrency).format())

Modules: ``labeling_config`` (:class:`LabelingConfig`, built by the generic engine in
``suffice.serving.config``), ``prompts`` (the 1-shot step-by-step prompt and its version hash),
``parsing`` (verdicts out of free text), ``raters`` (the Rater interface and its three implementations),
``store`` (the SQLite LabelStore; ``StoredReply``, the record base shared with synth's generation cache),
``runner`` (batch labelling, accounting, and the resumable worker loop synth's generation uses too),
``agreement`` (kappa, accuracy, confusion per source), ``cli`` (``suffice label``).
"""

from suffice.training.autorater.labeling_config import LabelingConfig
from suffice.training.autorater.parsing import Verdict, VerdictParseError, parse_verdict
from suffice.training.autorater.prompts import SufficiencyPrompt, get_prompt
from suffice.training.autorater.raters import (
    CachedRater,
    LexicalRater,
    OpenAICompatibleRater,
    Rater,
    RaterConfigError,
    RaterFatalError,
    Rating,
    build_rater,
)
from suffice.training.autorater.runner import Accounting, label_items, label_items_async, log_to_mlflow
from suffice.training.autorater.store import LabelRecord, LabelStore

__all__ = [
    "Accounting", "CachedRater", "LabelRecord", "LabelStore", "LabelingConfig", "LexicalRater", "OpenAICompatibleRater",
    "Rater", "RaterConfigError", "RaterFatalError", "Rating", "SufficiencyPrompt", "Verdict", "VerdictParseError",
    "build_rater", "get_prompt", "label_items", "label_items_async", "log_to_mlflow", "parse_verdict",
]
