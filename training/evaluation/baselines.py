"""Baselines scored on the same items as the model, so every number has something to beat.

``keyword_coverage``
    The lexical heuristic RAG gateways start with: the share of the question's content terms
    found in the context (suffice.serving.lexical.keyword_coverage); the decision threshold is
    the one with the best macro-F1 on the train split.
``answer_in_context``
    "The gold answer string appears in the context" (SQuAD-normalised substring match; items
    without a gold answer score 0). It reads the gold answers, which a deployed system never
    has: on SQuAD 2.0, whose unanswerable questions have no answer, it is close to an oracle.
``tfidf_lr``
    TF-IDF of the question and of the context (separate vocabularies, word 1-2 grams) into a
    class-balanced logistic regression trained on the same train split.

Each baseline gives a score in [0, 1] for the positive class and a binary decision.

>>> b = AnswerInContextBaseline()
>>> b.score(["Where?"], [[{"title": "", "text": "It is in Paris, France."}]], answers=[["paris"]]).tolist()
[1.0]
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from suffice.serving.jsonl import iter_jsonl
from suffice.serving.lexical import keyword_coverage

BASELINE_NAMES = ("keyword_coverage", "answer_in_context", "tfidf_lr")


def _passage_pairs(passages: Any) -> list[tuple[str, str]]:
    from suffice.serving.packing import normalise_passages

    return normalise_passages(passages)


def context_text(passages: Any) -> str:
    """``title: text`` of every passage joined (how the baselines read a context)."""
    return "\n".join(f"{t}: {x}" if t else x for t, x in _passage_pairs(passages))


def normalise_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces.

    >>> normalise_answer("The  Eiffel-Tower!")
    'eiffeltower'
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The decision threshold on ``scores`` with the best macro-F1 on (train) ``labels``.

    >>> best_threshold(np.array([0.1, 0.4, 0.6, 0.9]), np.array([0, 0, 1, 1]))
    0.6
    """
    from sklearn.metrics import f1_score

    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    best, best_f1 = 0.5, -1.0
    for t in np.unique(scores):
        f1 = f1_score(labels, (scores >= t).astype(int), average="macro", zero_division=0)
        if f1 > best_f1:
            best, best_f1 = float(t), f1
    return best


class KeywordCoverageBaseline:
    """Keyword coverage of the question by the context, threshold tuned on train."""

    name = "keyword_coverage"

    def __init__(self) -> None:
        self.threshold = 0.5

    def score(self, questions: Sequence[str], passages_list: Sequence[Any], answers: Sequence[Any] | None = None) -> np.ndarray:
        return np.array([keyword_coverage(q, [f"{t}. {x}" if t else x for t, x in _passage_pairs(p)]).score
                         for q, p in zip(questions, passages_list)], dtype=np.float64)

    def fit(self, questions: Sequence[str], passages_list: Sequence[Any], labels: np.ndarray, answers: Sequence[Any] | None = None) -> "KeywordCoverageBaseline":
        self.threshold = best_threshold(self.score(questions, passages_list), labels)
        return self

    def predict(self, scores: np.ndarray) -> np.ndarray:
        return (scores >= self.threshold).astype(np.int64)


class AnswerInContextBaseline:
    """1 when a normalised gold answer is a substring of the normalised context, else 0."""

    name = "answer_in_context"
    threshold = 0.5

    def fit(self, questions: Sequence[str], passages_list: Sequence[Any], labels: np.ndarray,
            answers: Sequence[Any] | None = None) -> "AnswerInContextBaseline":
        return self  # a fixed rule: nothing to fit

    def score(self, questions: Sequence[str], passages_list: Sequence[Any], answers: Sequence[Sequence[str] | None] | None = None) -> np.ndarray:
        if answers is None:
            raise ValueError("answer_in_context needs the gold answers: pass answers=[[...], ...] (one list per item)")
        out = []
        for p, ans in zip(passages_list, answers):
            ctx = normalise_answer(context_text(p))
            hits = [a for a in (ans or []) if normalise_answer(str(a)) and normalise_answer(str(a)) in ctx]
            out.append(1.0 if hits else 0.0)
        return np.array(out, dtype=np.float64)

    def predict(self, scores: np.ndarray) -> np.ndarray:
        return (scores >= self.threshold).astype(np.int64)


class TfidfLogisticBaseline:
    """TF-IDF (question | context) + class-balanced logistic regression."""

    name = "tfidf_lr"
    threshold = 0.5

    def __init__(self, max_features: int = 50_000, C: float = 1.0, seed: int = 0) -> None:
        self.max_features, self.C, self.seed = max_features, C, seed
        self._q = self._c = self._lr = None

    def _features(self, questions, passages_list, fit: bool):
        from scipy.sparse import hstack
        from sklearn.feature_extraction.text import TfidfVectorizer

        ctx = [context_text(p) for p in passages_list]
        if fit:
            kw = dict(sublinear_tf=True, ngram_range=(1, 2), min_df=2, max_features=self.max_features, strip_accents="unicode")
            self._q, self._c = TfidfVectorizer(**kw), TfidfVectorizer(**kw)
            return hstack([self._q.fit_transform(questions), self._c.fit_transform(ctx)]).tocsr()
        return hstack([self._q.transform(questions), self._c.transform(ctx)]).tocsr()

    def fit(self, questions: Sequence[str], passages_list: Sequence[Any], labels: np.ndarray, answers: Sequence[Any] | None = None) -> "TfidfLogisticBaseline":
        from sklearn.linear_model import LogisticRegression

        labels = np.asarray(labels, dtype=np.int64)
        if len(np.unique(labels)) < 2:
            raise ValueError(f"tfidf_lr needs both classes in the train split, got only {np.unique(labels).tolist()}")
        x = self._features(list(questions), passages_list, fit=True)
        self._lr = LogisticRegression(C=self.C, class_weight="balanced", max_iter=2000, random_state=self.seed).fit(x, labels)
        return self

    def score(self, questions: Sequence[str], passages_list: Sequence[Any], answers: Sequence[Any] | None = None) -> np.ndarray:
        if self._lr is None:
            raise RuntimeError("tfidf_lr is not fitted: call fit(train questions, passages, labels) first")
        return self._lr.predict_proba(self._features(list(questions), passages_list, fit=False))[:, 1]

    def predict(self, scores: np.ndarray) -> np.ndarray:
        return (scores >= self.threshold).astype(np.int64)


BASELINES = {"keyword_coverage": KeywordCoverageBaseline, "answer_in_context": AnswerInContextBaseline, "tfidf_lr": TfidfLogisticBaseline}


@dataclass
class BaselineRun:
    """One baseline's output on the evaluated items: positive scores, binary decisions, threshold."""

    name: str
    scores: np.ndarray
    predictions: np.ndarray
    threshold: float


def run_baselines(
    names: Sequence[str],
    train: Mapping[str, Sequence[Any]],
    test: Mapping[str, Sequence[Any]],
) -> dict[str, BaselineRun]:
    """Fit each named baseline on ``train`` and score ``test``.

    ``train`` / ``test`` hold ``question``, ``passages``, ``label`` (binary: positive vs not) and
    optionally ``answers`` (lists of gold answer strings; ``answer_in_context`` is skipped
    without them).

    >>> tr = {"question": ["Who?", "Where?"] * 4, "passages": [["Ann did it."], ["No idea."]] * 4, "label": [1, 0] * 4}
    >>> sorted(run_baselines(["keyword_coverage", "tfidf_lr"], tr, tr))
    ['keyword_coverage', 'tfidf_lr']
    """
    out: dict[str, BaselineRun] = {}
    for name in names:
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r}: choose from {list(BASELINES)}")
        if name == "answer_in_context" and test.get("answers") is None:
            continue
        b = BASELINES[name]()
        b.fit(train["question"], train["passages"], np.asarray(train["label"]), answers=train.get("answers"))
        scores = b.score(test["question"], test["passages"], answers=test.get("answers"))
        out[name] = BaselineRun(name, scores, b.predict(scores), float(b.threshold))
    return out


def load_gold_answers(items_path: str | Path) -> dict[str, list[str]]:
    """``id -> gold answers`` from a canonical items file (``gold.answers``; [] when unanswerable) or a
    synthetic-questions file (``answer``).

    >>> load_gold_answers("../shared/data/items.jsonl")["squad2:68cf05f67fd29c6f129fe2fb9"]  # doctest: +SKIP
    ['France']
    """
    out: dict[str, list[str]] = {}
    for _, d in iter_jsonl(items_path, "an item or a synthetic question"):
        gold = d.get("gold") or {}
        if "answers" in gold:
            out[str(d["id"])] = [str(a) for a in gold.get("answers") or []]
        elif d.get("answer"):  # teacher-written synthetic questions carry their one answer at the top level
            out[str(d["id"])] = [str(d["answer"])]
    return out
