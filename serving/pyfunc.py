"""The bundle as an MLflow ``pyfunc`` model: the loader module MLflow imports, and its ``predict``.

Every registered bundle version is an MLflow model whose ``MLmodel`` names this module as its
``loader_module`` and the bundle folder as its ``data``; loading it builds a
:class:`~suffice.serving.scorer.SufficiencyScorer`, so what MLflow serves, what Spark scores and
what a service scores are one code path (ONNX Runtime + tokenizers; no torch, no transformers).
Neither mlflow nor pandas is imported here until a model is loaded or called.

>>> import mlflow, pandas as pd  # doctest: +SKIP
>>> model = mlflow.pyfunc.load_model("models:/suffice-sufficiency@production")  # doctest: +SKIP
>>> model.predict(pd.DataFrame({"question": ["Where is the Eiffel Tower?"],
...                             "passages": [[{"title": "Paris", "text": "The Eiffel Tower is in Paris."}]]}))  # doctest: +SKIP
      score        level  latency_ms
0  0.93...   sufficient        3.1...

Input: a DataFrame with a ``question`` column and a ``passages`` column (each cell a list of
strings or ``{title, text}`` dicts) or a ``context`` column (each cell one string); a row with
no (or empty) passages falls back to its context (the item rules of :mod:`suffice.serving.items`,
the same as HTTP's). Output: a DataFrame with
``score`` (calibrated P(sufficient)), ``level`` (sufficient / partial / insufficient) and
``latency_ms`` per row, index kept.

``model_config`` (``mlflow.pyfunc.load_model(uri, model_config={...})``, also accepted by
``spark_udf`` and ``mlflow models serve``) sets ``backend`` (auto / onnxruntime / openvino),
``precision`` (auto / int8 / fp32 / bf16), ``intra_op_threads`` and ``batch_size`` of the scorer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Sequence

from suffice.serving.backends import BACKENDS, PRECISIONS
from suffice.serving.bundle import MANIFEST_NAME, BundleNotFoundError
from suffice.serving.items import SufficiencyItem
from suffice.serving.scorer import ScorerConfig, SufficiencyScorer

INPUT_COLUMNS = ("question", "passages", "context")
OUTPUT_COLUMNS = ("score", "level", "latency_ms")
MODEL_CONFIG_KEYS = ("backend", "precision", "intra_op_threads", "batch_size")
# Logged with the model (MLflow passes overrides only to models logged with a model_config).
DEFAULT_MODEL_CONFIG = {"backend": "auto", "precision": "auto", "intra_op_threads": 0, "batch_size": 32}
# What `mlflow models serve` and the registry UI show as the input example.
INPUT_EXAMPLE = [
    {"question": "Where is the Eiffel Tower?",
     "passages": [{"title": "Paris", "text": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France."}]},
    {"question": "When did Chopin leave Warsaw?",
     "passages": ["Chopin left Warsaw in 1830, shortly before the November Uprising."]},
]


def rows_from_frame(frame: Any, index: Sequence[Any] | None = None) -> tuple[list[str], list[list[Any]]]:
    """Questions and passage lists from a DataFrame (or a list of row dicts) in the pyfunc input schema.

    ``index`` names the rows in error messages (default: the DataFrame index, or 0..n-1).

    >>> rows_from_frame([{"question": "Q?", "context": "Some text."}, {"question": "R?", "passages": ["a", {"title": "T", "text": "b"}]}])
    (['Q?', 'R?'], [['Some text.'], ['a', {'title': 'T', 'text': 'b'}]])
    """
    if isinstance(frame, Mapping):
        frame = [frame]
    if isinstance(frame, list):
        records = frame
        columns = {k for r in records for k in (r if isinstance(r, Mapping) else ())}
        index = list(index) if index is not None else list(range(len(records)))
    elif hasattr(frame, "to_dict") and hasattr(frame, "columns"):
        records = frame.to_dict(orient="records")
        columns = {str(c) for c in frame.columns}
        index = list(index) if index is not None else list(frame.index)
    else:
        raise TypeError(f"model input must be a pandas DataFrame (or a list of row dicts), got {type(frame).__name__}")
    if records and "question" not in columns:
        raise ValueError(f"model input has no 'question' column (columns: {sorted(columns)}): give question plus passages or context")
    if records and not columns & {"passages", "context"}:
        raise ValueError(f"model input has neither a 'passages' nor a 'context' column (columns: {sorted(columns)}): "
                         "give passages (a list of strings or {title, text} objects per row) or context (one string per row)")
    questions: list[str] = []
    passages: list[list[Any]] = []
    for idx, rec in zip(index, records):
        if not isinstance(rec, Mapping):
            raise TypeError(f"row {idx}: expected a mapping of column -> value, got {type(rec).__name__}")
        try:
            item = SufficiencyItem.from_fields(rec.get("question"), rec.get("passages"), rec.get("context"))
        except ValueError as e:
            raise ValueError(f"row {idx}: {e}") from None
        questions.append(item.question)
        passages.append(list(item.passages))
    return questions, passages


def scorer_config_from(model_config: Mapping[str, Any] | None) -> ScorerConfig:
    """A :class:`ScorerConfig` from a pyfunc ``model_config``; unknown keys are errors.

    >>> scorer_config_from({"precision": "fp32", "batch_size": 8}).batch_size
    8
    """
    cfg = dict(model_config or {})
    unknown = sorted(set(cfg) - set(MODEL_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown model_config key(s) {unknown}: the suffice pyfunc model accepts {list(MODEL_CONFIG_KEYS)}")
    for key, choices in (("backend", BACKENDS), ("precision", PRECISIONS)):
        if key in cfg and cfg[key] not in choices:
            raise ValueError(f"model_config {key}={cfg[key]!r}: choose one of {', '.join(choices)}")
    for key in ("intra_op_threads", "batch_size"):
        if key in cfg:
            try:
                cfg[key] = int(cfg[key])
            except (TypeError, ValueError):
                raise ValueError(f"model_config {key}={cfg[key]!r} must be an integer") from None
    return ScorerConfig(**cfg)


class SufficiencyPyfunc:
    """The object ``mlflow.pyfunc.load_model`` wraps: a scorer and a DataFrame-in, DataFrame-out ``predict``."""

    def __init__(self, scorer: SufficiencyScorer):
        self.scorer = scorer

    def predict(self, model_input: Any, params: Mapping[str, Any] | None = None):
        """Score every row; returns a DataFrame with ``score``, ``level``, ``latency_ms`` (input index kept).

        ``params`` may carry ``batch_size`` (pairs per ONNX call) for this call only.

        >>> SufficiencyPyfunc(scorer).predict(pd.DataFrame({"question": ["Q?"], "context": ["text"]}))  # doctest: +SKIP
        """
        import pandas as pd

        unknown = sorted(set(params or {}) - {"batch_size"})
        if unknown:
            raise ValueError(f"unknown predict param(s) {unknown}: the suffice pyfunc model accepts ['batch_size']")
        batch_size = (params or {}).get("batch_size")
        questions, passages = rows_from_frame(model_input)
        results = self.scorer.score_batch(questions, passages, batch_size=int(batch_size) if batch_size else None)
        index = model_input.index if isinstance(model_input, pd.DataFrame) else None
        return pd.DataFrame({
            "score": pd.Series([r.score for r in results], dtype="float64", index=index),
            "level": pd.Series([r.level for r in results], dtype="object", index=index),
            "latency_ms": pd.Series([r.latency_ms for r in results], dtype="float64", index=index),
        })


def find_bundle(root: str | Path) -> Path:
    """The bundle folder inside an MLflow model directory (its ``data/`` holds it) or ``root`` itself.

    >>> find_bundle("mlruns/bundle-cache/suffice-sufficiency/3")  # doctest: +SKIP
    PosixPath('mlruns/bundle-cache/suffice-sufficiency/3/data/bundle')
    """
    root = Path(root)
    if (root / MANIFEST_NAME).is_file():
        return root
    found = sorted((p.parent for p in root.rglob(MANIFEST_NAME)), key=lambda p: (len(p.parts), str(p))) if root.is_dir() else []
    if not found:
        raise BundleNotFoundError(f"{root} holds no {MANIFEST_NAME}: it is not a suffice bundle or a registered suffice pyfunc model; "
                                  "give the folder `suffice export --out` wrote or a models:/ URI of a registered bundle")
    return found[0]


_LOADED: OrderedDict[tuple[str, ScorerConfig], SufficiencyPyfunc] = OrderedDict()
_LOADED_MAX = 4
_LOADED_LOCK = threading.Lock()


def _load_pyfunc(data_path: str, model_config: Mapping[str, Any] | None = None) -> SufficiencyPyfunc:
    """MLflow's entry point (``loader_module``): ``data_path`` is the bundle folder logged with the model.

    Loads are cached per process (bundle folder, scorer config; the last few): Spark in local
    mode calls ``load_model`` for every task, and re-hashing the bundle and re-opening the ONNX
    session each time would cost more than scoring a small partition.
    """
    bundle = find_bundle(data_path).resolve()
    config = scorer_config_from(model_config)
    key = (str(bundle), config)
    with _LOADED_LOCK:
        if key in _LOADED:
            _LOADED.move_to_end(key)
            return _LOADED[key]
    model = SufficiencyPyfunc(SufficiencyScorer.load(bundle, config))
    with _LOADED_LOCK:
        _LOADED[key] = model
        while len(_LOADED) > _LOADED_MAX:
            _LOADED.popitem(last=False)
    return model
