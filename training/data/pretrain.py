"""Stage 0: pair-reading rows made for free from train questions whose answer is known.

A bi-encoder like all-MiniLM-L6-v2 has never read a (question, passage) *pair*; before the
teacher-labelled stage it can learn to by answering "is the answer in this passage?" on rows
that cost nothing. From every single-passage train row (real or teacher-written) whose gold answer
string occurs in its passage (and whose gold label, where it has one, is not "insufficient"):

``s0_own`` (label 1)
    the question with its own passage.
``s0_evidence`` (label 1)
    the question with only the answer-bearing sentence(s) and one sentence either side (emitted
    only when that is shorter than the passage): the answer survives losing most of the context.
``s0_answer_removed`` (label 0)
    the passage without every sentence that holds an answer string.
``s0_other_paragraph`` (label 0)
    another paragraph of the same article (same title) that holds no answer string; else a
    paragraph of another title. Paragraphs that also occur in a validation/test row are never used.
``s0_answer_sentence`` (label 1)
    the answer-bearing sentence(s) alone, without neighbours (emitted only when shorter than the
    passage): short positives, so that a one-sentence passage is not read as a cut-down negative.
``s0_other_sentence`` (label 0)
    one sentence of the same passage that holds no answer string: the one sharing the most terms with
    the question (a same-topic near miss, as short as ``s0_answer_sentence``).
``labelled`` (optional kind)
    every labelled train row stage 0 did not rebuild into constructed rows, as it is (its own label and label
    source): the real unanswerable questions, the teacher's minimal-pair edits and label-0
    questions, multi-passage items, constructed variants. With it stage 0 reads the question-side
    contrasts too, not only the context-side ones it constructs.
``weak`` (optional, ``pretrain_weak_file``)
    the train rows of a ``suffice weak --out FILE`` file labelled by its rules (label_source
    ``weak``: question edits = 0, answer-keeping context edits = 1), kept by their rule name.

Only train rows feed stage 0 (never a validation/test item, label or group); every row keeps its
parent's group and ``parent_id``; choices are deterministic per (seed, row id). The validation and
test splits stay the real prepared rows, so stage 0 early-stops and is scored on the same items
as every other run. ``DataConfig(pretrain=True)`` asks :func:`suffice.training.data.builder.build`
for this (``configs/pretrain.yaml``; ``suffice data prepare --pretrain=true`` to look at it).

>>> row = {"id": "q1", "question": "Where is Normandy?", "split": "train", "source": "squad2", "group": "g1",
...        "variant": "", "passages": [{"title": "Normans", "text": "Normandy is in France. It has cows. Rollo led them."}]}
>>> other = dict(row, id="q2", question="Who led?", group="g2",
...              passages=[{"title": "Normans", "text": "The Normans were Norse. Their leader was Rollo."}])
>>> out = stage0_rows([row, other], {"q1": ["France"], "q2": ["Rollo"]}, seed=13)
>>> sorted((r["variant"], r["label"]) for r in out if r["parent_id"] == "q1")
[('s0_answer_removed', 0), ('s0_evidence', 1), ('s0_other_paragraph', 0), ('s0_own', 1)]
>>> short = stage0_rows([row, other], {"q1": ["France"], "q2": ["Rollo"]}, seed=13, kinds=["s0_answer_sentence", "s0_other_sentence"])
>>> [(r["variant"], r["passages"][0]["text"]) for r in short if r["parent_id"] == "q1"]
[('s0_answer_sentence', 'Normandy is in France.'), ('s0_other_sentence', 'Rollo led them.')]
"""

from __future__ import annotations

import bisect
import random
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from suffice.serving.config import ConfigError
from suffice.serving.jsonl import iter_jsonl
from suffice.serving.lexical import content_terms
from suffice.serving.packing import split_sentences
from suffice.training.data.splits import hash_unit

KINDS = ("s0_own", "s0_evidence", "s0_answer_removed", "s0_other_paragraph", "s0_answer_sentence", "s0_other_sentence")
DEFAULT_KINDS = KINDS[:4]
"""The kinds a stage-0 build makes unless told (``DataConfig.pretrain_kinds``): the short-passage kinds are opt-in."""
LABELLED = "labelled"
LABEL = {"s0_own": 1, "s0_evidence": 1, "s0_answer_removed": 0, "s0_other_paragraph": 0, "s0_answer_sentence": 1,
         "s0_other_sentence": 0}
LABEL_SOURCE = "pretrain"


def check_kinds(kinds: Sequence[str]) -> None:
    """Raise :class:`ConfigError` naming the unknown kinds (``pretrain_kinds`` of a DataConfig)."""
    bad = [k for k in kinds if k not in (*KINDS, LABELLED)]
    if bad or not kinds:
        raise ConfigError(f"pretrain_kinds={list(kinds)}: choose one or more of {[*KINDS, LABELLED]}")


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def holds_answer(text: str, answers: Sequence[str]) -> bool:
    """True when any answer string occurs in ``text`` as whole words (case and spacing ignored).

    >>> holds_answer("It began in 1992 in Paris.", ["1992"]), holds_answer("In 19921.", ["1992"])
    (True, False)
    """
    t = _norm(text)
    return any(re.search(rf"(?<!\w){re.escape(_norm(a))}(?!\w)", t) for a in answers if a.strip())


def _evidence(sents: list[str], answers: Sequence[str]) -> str | None:
    """The answer-bearing sentences with one neighbour either side, in order; None when that is all."""
    keep = set()
    for i, s in enumerate(sents):
        if holds_answer(s, answers):
            keep.update(j for j in (i - 1, i, i + 1) if 0 <= j < len(sents))
    return " ".join(sents[i] for i in sorted(keep)) if keep and len(keep) < len(sents) else None


def _row(parent: Mapping[str, Any], kind: str, title: str, text: str, label: int | None = None) -> dict[str, Any]:
    label = LABEL[kind] if label is None else label
    return {"id": f"{parent['id']}#{kind}", "question": parent["question"], "passages": [{"title": title, "text": text}],
            "label": label, "level": "sufficient" if label else "insufficient", "label_source": LABEL_SOURCE,
            "split": "train", "source": parent["source"], "group": parent["group"], "variant": kind,
            "parent_id": parent["id"], "gold_label": label, "kind": "", "generator": "", "answers": list(parent.get("answers") or [])}


def stage0_rows(train_rows: Iterable[Mapping[str, Any]], answers: Mapping[str, Sequence[str]], seed: int = 13,
                kinds: Sequence[str] = DEFAULT_KINDS, held_out_texts: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Stage-0 rows (the prepared-data columns) from ``train_rows``; see the module docstring.

    Only rows with split ``train``, no variant, one passage, a gold label that is not 0 and a known
    answer found in the passage are parents. ``held_out_texts``: passage texts of validation/test rows, never used as negatives.
    """
    check_kinds(kinds)
    held_out = set(held_out_texts)
    parents = [r for r in train_rows if r.get("split", "train") == "train" and not r.get("variant") and len(r["passages"]) == 1
               and int(r.get("gold_label", -1)) != 0]  # QED keeps an answer string when its passage does not explain it
    by_title: dict[str, list[str]] = defaultdict(list)
    for r in parents:
        p = r["passages"][0]
        if p["text"] not in held_out and p["text"] not in by_title[p["title"]]:
            by_title[p["title"]].append(p["text"])
    titles = sorted(t for t, texts in by_title.items() if texts)
    out: list[dict[str, Any]] = []
    for r in parents:
        ans = [a for a in answers.get(r["id"], ()) if a and a.strip()]
        title, text = r["passages"][0]["title"], r["passages"][0]["text"]
        if not ans or not holds_answer(text, ans):
            continue
        rng = random.Random(f"{seed}:s0:{r['id']}")
        sents = split_sentences(text)
        made: dict[str, tuple[str, str]] = {"s0_own": (title, text)}
        ev = _evidence(sents, ans)
        if ev:
            made["s0_evidence"] = (title, ev)
        kept = [s for s in sents if not holds_answer(s, ans)]
        if kept and len(kept) < len(sents):
            made["s0_answer_removed"] = (title, " ".join(kept))
            made["s0_answer_sentence"] = (title, " ".join(s for s in sents if holds_answer(s, ans)))
            q_terms = set(content_terms(r["question"]))
            overlap = [len(q_terms & set(content_terms(s))) for s in kept]
            best = [s for s, o in zip(kept, overlap) if o == max(overlap)]
            made["s0_other_sentence"] = (title, best[rng.randrange(len(best))])
        same = [t for t in by_title.get(title, ()) if t != text and not holds_answer(t, ans)]
        if same:
            made["s0_other_paragraph"] = (title, same[rng.randrange(len(same))])
        elif len(titles) > 1:
            own = bisect.bisect_left(titles, title)
            has_own = own < len(titles) and titles[own] == title
            for _ in range(8):  # a paragraph of another title that does not hold the answer either
                k = rng.randrange(len(titles) - has_own)
                t = titles[k + (has_own and k >= own)]
                cand = by_title[t][rng.randrange(len(by_title[t]))]
                if not holds_answer(cand, ans):
                    made["s0_other_paragraph"] = (t, cand)
                    break
        out += [_row(r, k, *made[k]) for k in KINDS if k in made and k in kinds]
    return out


def weak_rows(path: str | Path, held_out_groups: set[str]) -> tuple[list[dict[str, Any]], int]:
    """The rule-labelled train rows of a ``suffice weak --out`` file, as prepared-data rows, and how
    many were left out because their group is in a validation/test split of this build."""
    out, dropped = [], 0
    for _, d in iter_jsonl(path, "a weak-supervision row (suffice weak --out)"):
        if d.get("split") != "train" or d.get("label_source") != "weak":
            continue
        if d["group"] in held_out_groups:
            dropped += 1
            continue
        label = int(d["label"])
        out.append({"id": d["id"], "question": d["question"], "passages": [{"title": p.get("title") or "", "text": p.get("text") or ""}
                    for p in d["passages"]], "label": label, "level": "sufficient" if label else "insufficient",
                    "label_source": "weak", "split": "train", "source": d["source"], "group": d["group"],
                    "variant": d.get("variant") or "weak", "parent_id": d.get("parent_id") or "", "gold_label": label,
                    "kind": "", "generator": "", "answers": []})
    return out, dropped


def kept_share(rows: list[dict[str, Any]], share: Mapping[str, float], seed: int) -> list[dict[str, Any]]:
    """The rows with, for each kind named in ``share`` (a row's ``variant``, or ``labelled`` for the rows
    kept as they are), a seeded share of that kind kept (by a hash of the row id: the same in every process).

    >>> rows = [{"id": f"r{i}", "variant": "s0_own", "label_source": "pretrain"} for i in range(1000)]
    >>> 450 < len(kept_share(rows, {"s0_own": 0.5}, 13)) < 550
    True
    """
    if not share:
        return rows
    out = []
    for r in rows:
        kind = r["variant"] if r.get("label_source") == LABEL_SOURCE else LABELLED
        s = share.get(kind, 1.0)
        if s >= 1.0 or hash_unit(f"{seed}:share:{r['id']}") < s:
            out.append(r)
    return out


def pretrain_rows(rows: Sequence[Mapping[str, Any]], seed: int, kinds: Sequence[str] = DEFAULT_KINDS,
                  weak_file: str | None = None, kind_share: Mapping[str, float] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All rows of a stage-0 build: the validation/test rows of ``rows`` unchanged, the train rows
    replaced by :func:`stage0_rows` (+ the ``labelled`` rows when asked, + :func:`weak_rows` of
    ``weak_file``), each kind thinned to its ``kind_share`` (:func:`kept_share`), and a report for the
    manifest. Answers come from each row's ``answers`` column.
    """
    answers = {r["id"]: list(r.get("answers") or []) for r in rows}
    train = [r for r in rows if r["split"] == "train"]
    held = [dict(r) for r in rows if r["split"] != "train"]
    made = [k for k in kinds if k != LABELLED]
    out = stage0_rows(train, answers, seed, made, (p["text"] for r in held for p in r["passages"])) if made else []
    if LABELLED in kinds:
        own = {r["parent_id"] for r in out}
        out += [dict(r) for r in train if int(r["label"]) >= 0 and r["id"] not in own]
    dropped_weak = 0
    if weak_file:
        if not Path(weak_file).is_file():
            raise FileNotFoundError(f"pretrain_weak_file={weak_file} does not exist: build it with "
                                    "`suffice weak --config configs/sufficiency.yaml --out FILE`, or leave the option out")
        weak, dropped_weak = weak_rows(weak_file, {r["group"] for r in held})
        out += weak
    out = kept_share(out, kind_share or {}, seed)
    if not out:
        raise ConfigError("stage 0 found no train row with a known answer in its passage: check the data: section "
                          "(sources, include_synthetic) and that items carry gold answers")
    report = {"parents": len({r["parent_id"] for r in out if r["label_source"] == LABEL_SOURCE}), "train_rows_before": len(train),
              "rows_by_kind": dict(sorted(Counter(r["variant"] for r in out).items())),
              "rows_by_label": dict(sorted(Counter(str(r["label"]) for r in out).items())),
              "weak_rows_dropped_held_out_group": dropped_weak, "kinds": list(kinds), "kind_share": dict(kind_share or {}),
              "weak_file": weak_file}
    return held + out, report
