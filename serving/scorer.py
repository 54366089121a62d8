"""The fast scorer: is this context enough to answer this question?

>>> scorer = SufficiencyScorer.load("bundles/sufficiency-v3")  # doctest: +SKIP
>>> r = scorer.score("Where is the Eiffel Tower?", [{"title": "Paris", "text": "The Eiffel Tower is in Paris."}])  # doctest: +SKIP
>>> r.level, round(r.score, 2)  # doctest: +SKIP
('sufficient', 0.93)

The score is the calibrated probability of the bundle's positive label
(``softmax(logits / T)[sufficient]``); ``level`` applies the manifest thresholds (sufficient
>= 0.8, partial >= 0.5, else insufficient; overridable). Every result says what the context
lacks (``missing_aspects``) and why the score is what it is (``confidence_factors``).
"""

from __future__ import annotations

import dataclasses

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from suffice.serving.bundle import DEFAULT_THRESHOLDS, INSUFFICIENT, LEVELS, PARTIAL, SUFFICIENT
from suffice.serving.lexical import Coverage, keyword_coverage, stem, tokenize_words
from suffice.serving.packing import PackedInput, normalise_passages
from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

@dataclass(frozen=True)
class ScorerConfig(RuntimeConfig):
    """How a :class:`SufficiencyScorer` runs and decides: the :class:`RuntimeConfig` fields (backend,
    precision, intra_op_threads, inter_op_threads, verify_checksums, check_probe, max_batch_tokens,
    cpu: how the bundle's model runs) plus what the scorer decides with.

    batch_size: pairs per chunk in :meth:`SufficiencyScorer.score_batch` (each chunk is sorted by
        length and run in calls of at most ``max_batch_tokens`` padded tokens).
    thresholds: overrides of the manifest's ``sufficient`` / ``partial`` thresholds.
    borderline_margin: a score this close to a threshold is reported as borderline.

    >>> ScorerConfig(intra_op_threads=2, batch_size=8).runtime().intra_op_threads
    2
    """

    batch_size: int = 32
    thresholds: Mapping[str, float] | None = None
    borderline_margin: float = 0.05

    def __post_init__(self) -> None:
        super().__post_init__()  # validates backend, precision, threads, max_batch_tokens
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size!r} must be a positive integer")
        if self.thresholds is not None:
            unknown = sorted(set(self.thresholds) - {SUFFICIENT, PARTIAL})
            if unknown:
                raise ValueError(f"unknown threshold(s) {unknown}: the scorer uses 'sufficient' and 'partial'")
            for k, v in self.thresholds.items():
                if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                    raise ValueError(f"threshold {k}={v!r} must be a number in [0, 1]")
        if not 0.0 <= self.borderline_margin < 0.5:
            raise ValueError(f"borderline_margin={self.borderline_margin!r} must be in [0, 0.5)")

    def runtime(self) -> RuntimeConfig:
        """The :class:`RuntimeConfig` this scorer loads its bundle with (its own runtime fields)."""
        return RuntimeConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RuntimeConfig)})


@dataclass(frozen=True)
class ConfidenceFactor:
    """One reason behind a score. effect: ``raises``, ``lowers`` or ``neutral``."""

    name: str
    effect: str
    detail: str


@dataclass(frozen=True)
class SufficiencyResult:
    """What the scorer says about one (question, passages) pair.

    score: calibrated probability that the context is sufficient (0..1).
    level: ``sufficient`` / ``partial`` / ``insufficient`` from the thresholds.
    missing_aspects: what the context lacks, in words a user can act on.
    confidence_factors: why the score is what it is.
    latency_ms: wall time for this pair (in a batch: the batch's time shared by its scored rows; 0 for a row
        without context, which the model never saw).
    probabilities: every label's calibrated probability (``id2label`` names).
    """

    score: float
    level: str
    missing_aspects: list[str]
    confidence_factors: list[ConfidenceFactor]
    latency_ms: float
    probabilities: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SufficiencyScorer:
    """Score (question, passages) pairs with an exported bundle; safe to share across threads."""

    def __init__(self, model: OnnxClassifier, config: ScorerConfig):
        self._model = model
        self.config = config
        self.manifest = model.manifest
        self.thresholds = {**DEFAULT_THRESHOLDS["sufficiency"], **dict(self.manifest.thresholds), **dict(config.thresholds or {})}
        if self.thresholds[PARTIAL] > self.thresholds[SUFFICIENT]:
            raise ValueError(f"thresholds partial={self.thresholds[PARTIAL]} > sufficient={self.thresholds[SUFFICIENT]}: partial must be the lower one")
        self._pos = self.manifest.positive_index

    @classmethod
    def load(cls, path: str | os.PathLike, config: ScorerConfig | None = None) -> "SufficiencyScorer":
        """Load a bundle folder: validate the manifest and checksums, then open the ONNX session.

        >>> scorer = SufficiencyScorer.load("bundles/sufficiency-v3", ScorerConfig(intra_op_threads=2))  # doctest: +SKIP
        """
        config = config or ScorerConfig()
        return cls(OnnxClassifier(path, config.runtime(), expected_task="sufficiency"), config)

    def __repr__(self) -> str:
        return (f"SufficiencyScorer(bundle={str(self._model.path)!r}, variant={self.variant!r}, "
                f"cpu={self._model.cpu.isa_class!r}, model_version={self.manifest.model_version!r})")

    # -- public API -------------------------------------------------------------------------
    @property
    def precision(self) -> str:
        return self._model.precision

    @property
    def variant(self) -> str:
        """The model variant in use, e.g. ``onnxruntime-int8`` or ``openvino-bf16``."""
        return self._model.variant

    @property
    def backend(self) -> str:
        return self._model.backend

    def describe(self) -> dict[str, Any]:
        """What runs: bundle, variant, CPU, the variants skipped and why, the parity-probe numbers."""
        return self._model.describe()

    @property
    def packer(self):
        return self._model.packer

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the bundle's tokenizer (no special tokens)."""
        return self._model.count_tokens(text)

    def level_for(self, score: float) -> str:
        """Map a score to a level with this scorer's thresholds.

        >>> scorer.level_for(0.85), scorer.level_for(0.6), scorer.level_for(0.1)  # doctest: +SKIP
        ('sufficient', 'partial', 'insufficient')
        """
        if score >= self.thresholds[SUFFICIENT]:
            return SUFFICIENT
        if score >= self.thresholds[PARTIAL]:
            return PARTIAL
        return INSUFFICIENT

    def score(self, question: str, passages: Any) -> SufficiencyResult:
        """Score one pair; passages are strings or ``{title, text}`` dicts (empty -> insufficient).

        >>> scorer.score("Who wrote Hamlet?", ["Hamlet is a tragedy by William Shakespeare."]).level  # doctest: +SKIP
        'sufficient'
        """
        return self.score_batch([question], [passages])[0]

    def score_batch(self, questions: Sequence[str], passages_list: Sequence[Any], batch_size: int | None = None) -> list[SufficiencyResult]:
        """Score many pairs, ``batch_size`` pairs per ONNX call.

        fp32 results equal one-by-one scoring (to float rounding). The int8 model quantises
        activations per tensor at run time, so a batch's other rows shift scores by ~1e-3.

        >>> [r.level for r in scorer.score_batch(["Q1?", "Q2?"], [["p1"], []])]  # doctest: +SKIP
        ['partial', 'insufficient']
        """
        out: list[SufficiencyResult] = []
        for chunk in self.iter_score_batches(questions, passages_list, batch_size):
            out.extend(chunk)
        return out

    def iter_score_batches(self, questions: Sequence[str], passages_list: Sequence[Any], batch_size: int | None = None) -> Iterator[list[SufficiencyResult]]:
        """Yield one list of results per batch, in input order (for streaming large inputs)."""
        if isinstance(questions, str):
            raise TypeError("score_batch takes a list of questions; use score() for a single question")
        if len(questions) != len(passages_list):
            raise ValueError(f"got {len(questions)} questions but {len(passages_list)} passage lists: give one list per question")
        bs = batch_size or self.config.batch_size
        if not isinstance(bs, int) or bs < 1:
            raise ValueError(f"batch_size={bs!r} must be a positive integer")
        for start in range(0, len(questions), bs):
            yield self._score_chunk(list(questions[start : start + bs]), list(passages_list[start : start + bs]))

    # -- internals --------------------------------------------------------------------------
    def _score_chunk(self, questions: list[str], passages_list: list[Any]) -> list[SufficiencyResult]:
        t0 = time.perf_counter()
        results: list[SufficiencyResult | None] = [None] * len(questions)
        norm = []
        todo: list[int] = []
        packed: list[PackedInput] = []
        for i, (q, ps) in enumerate(zip(questions, passages_list)):
            if not isinstance(q, str) or not q.strip():
                raise ValueError(f"question {i} must be a non-empty string, got {q!r}")
            pairs = [(t, x) for t, x in normalise_passages(ps) if x.strip()]
            norm.append(pairs)
            if not pairs:
                continue
            todo.append(i)
            packed.append(self._model.packer.pack(q, [{"title": t, "text": x} for t, x in pairs]))
        probs = None
        if packed:
            _, probs = self._model.predict_packed(packed)
        # the batch's time is shared by the rows the model scored; a row without context was never scored
        per_item_ms = (time.perf_counter() - t0) * 1e3 / max(1, len(todo))
        for row, i in enumerate(todo):
            p = probs[row]
            results[i] = self._explain(questions[i], norm[i], float(p[self._pos]), p, packed[row], per_item_ms)
        for i, r in enumerate(results):
            if r is None:
                results[i] = self._empty_result(questions[i], 0.0)
        return results  # type: ignore[return-value]

    def _empty_result(self, question: str, latency_ms: float) -> SufficiencyResult:
        return SufficiencyResult(
            score=0.0,
            level=INSUFFICIENT,
            missing_aspects=[f"any context: no passage text was given for '{question.strip()}'; retrieve passages first"],
            confidence_factors=[ConfidenceFactor("empty_context", "lowers", "no passages (or only empty ones) were given, so the model was not run")],
            latency_ms=latency_ms,
            probabilities={label: (1.0 if label != self.manifest.positive_label and k == 0 else 0.0)
                           for k, label in self.manifest.id2label.items()},
        )

    def _explain(self, question, pairs, score, probs, packed: PackedInput, latency_ms) -> SufficiencyResult:
        level = self.level_for(score)
        cov = keyword_coverage(question, [f"{t}. {x}" if t else x for t, x in pairs])
        factors = [ConfidenceFactor(
            "model", "raises" if score >= self.thresholds[PARTIAL] else "lowers",
            f"the model gives P({self.manifest.positive_label})={score:.2f} ({self.manifest.calibrator.describe()}, {self.precision})",
        )]
        if cov.n_terms:
            share = len(cov.covered) / cov.n_terms
            factors.append(ConfidenceFactor(
                "keyword_coverage", "raises" if share >= 0.8 else ("neutral" if share >= 0.5 else "lowers"),
                f"the passages mention {len(cov.covered)} of {cov.n_terms} question terms",
            ))
        if cov.missing_entities:
            factors.append(ConfidenceFactor("missing_entities", "lowers", "no passage names " + ", ".join(repr(e) for e in cov.missing_entities)))
        if packed.truncated:
            factors.append(ConfidenceFactor(
                "context_window", "lowers",
                f"the context ({packed.context_tokens_total} tokens) exceeds the {self.manifest.max_length}-token window: "
                f"'{packed.strategy}' kept {packed.context_tokens_kept} tokens, {packed.sentences_kept} of {packed.sentences_total} sentences",
            ))
        near = [name for name in (SUFFICIENT, PARTIAL) if abs(score - self.thresholds[name]) < self.config.borderline_margin]
        if near:
            factors.append(ConfidenceFactor("borderline", "neutral", f"the score is within {self.config.borderline_margin:g} of the '{near[0]}' threshold ({self.thresholds[near[0]]:g})"))
        missing = [] if level == SUFFICIENT else _missing_aspects(question, cov)
        return SufficiencyResult(
            score=score,
            level=level,
            missing_aspects=missing,
            confidence_factors=factors,
            latency_ms=latency_ms,
            probabilities={self.manifest.id2label[k]: float(probs[k]) for k in range(len(probs))},
        )


def _missing_aspects(question: str, cov: Coverage) -> list[str]:
    """Name the gaps in the question's own words: missing names first, then other missing terms."""
    out = [f"no passage mentions '{e}'" for e in cov.missing_entities]
    in_entities = {stem(w) for e in cov.missing_entities for w in tokenize_words(e)}
    surface: dict[str, str] = {}
    for w in tokenize_words(question):
        surface.setdefault(stem(w.lower()), w)
    terms = [surface.get(t, t) for t in cov.missing_words if t not in in_entities]
    if terms:
        out.append("nothing about " + ", ".join(f"'{t}'" for t in terms))
    if not out:
        out.append("a statement that answers the question: the passages mention its terms but do not settle it")
    return out
