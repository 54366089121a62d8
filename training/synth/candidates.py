"""From stored generation replies to candidate items, and from kept items to output rows.

Each usable, new question becomes an :class:`Item` inheriting its seed's split and group (so a test
passage never feeds training); in multi mode it is followed by its variants without one passage.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Sequence

from suffice.training.data.records import write_jsonl_atomic
from suffice.training.data.schema import SYNTHETIC_SUFFIX, Item, is_synthetic_source
from suffice.training.synth.corpus import normalize_question
from suffice.training.synth.generate import Seed
from suffice.training.synth.prompt import GenerationPrompt
from suffice.training.synth.questions import validate_question
from suffice.training.synth.report import SynthReport


def _synthetic_source(source: str) -> str:
    return source if is_synthetic_source(source) else f"{source}{SYNTHETIC_SUFFIX}"


def build_candidates(seeds: Sequence[Seed], generations: dict[str, Any], prompt: GenerationPrompt, generator_id: str,
                     existing: set[str], report: SynthReport) -> list[Item]:
    """The items to judge, in seed order: each usable, new question as an :class:`Item` inheriting its
    seed's split and group; in multi mode each is followed by its variants without one passage."""
    seen: set[str] = set()
    out: list[Item] = []
    for seed in seeds:
        rec = generations.get(seed.id)
        if rec is None:
            report.not_generated += 1
            continue
        if rec.status != "ok":
            report.unparsed += 1
            continue
        for obj in rec.questions:
            q, why = validate_question(obj, prompt.kinds)
            if q is None:
                report.invalid[why] += 1
                continue
            report.questions += 1
            key = normalize_question(q.question)
            if key in existing:
                report.dup_existing += 1
                continue
            if key in seen:
                report.dup_batch += 1
                continue
            seen.add(key)
            src = seed.source.removesuffix(SYNTHETIC_SUFFIX)
            digest = hashlib.sha256(f"{generator_id}\x1f{seed.id}\x1f{q.question}".encode("utf-8")).hexdigest()[:16]
            meta = {"kind": q.kind, "answer": q.answer, "generator": generator_id, "generator_prompt": prompt.version}
            parent = Item(id=f"{src}-synth:{digest}", question=q.question, passages=list(seed.passages), label=q.label,
                          level=q.level, label_source="synthetic", split=seed.split, source=_synthetic_source(src),
                          group=seed.group, meta=meta)
            out.append(parent)
            if prompt.mode == "multi":
                for i in range(len(seed.passages)):
                    kept = [ps for k, ps in enumerate(seed.passages) if k != i]
                    out.append(dataclasses.replace(
                        parent, id=f"{parent.id}#drop_passage-{i + 1}", passages=kept, label=0, level="partial",
                        variant="drop_passage", parent_id=parent.id, meta={**meta, "answer": None, "dropped": seed.passages[i].title}))
                    report.variants += 1
    report.candidates = len(out)
    return out




def synthetic_row(it: Item, judge: str | None) -> dict[str, Any]:
    """One output line: the items.jsonl schema plus label, level, label_source, kind, answer, generator."""
    row: dict[str, Any] = {"id": it.id, "source": it.source, "split": it.split, "group": it.group, "question": it.question,
                           "passages": [p.to_dict() for p in it.passages], "label": it.label, "level": it.level,
                           "label_source": "synthetic", "kind": it.meta.get("kind"), "answer": it.meta.get("answer"),
                           "generator": it.meta.get("generator")}
    if it.meta.get("generator_prompt"):
        row["generator_prompt"] = it.meta["generator_prompt"]
    if judge:
        row["judge"] = judge
    if it.variant:
        row.update(variant=it.variant, parent_id=it.parent_id, dropped=it.meta.get("dropped"))
    return row


def write_jsonl(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write atomically (a killed run never leaves half a file)."""
    write_jsonl_atomic(rows, path)
