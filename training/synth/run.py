"""The runs of ``suffice synth``: write and judge (:func:`synthesize`), judge already written questions
(:func:`rejudge`), and bring the shipped questions into the label store (:func:`import_synthetic`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Awaitable, Callable

from suffice.training.autorater.labeling_config import LabelingConfig
from suffice.training.autorater.raters import CACHED_VERSION, RaterFatalError
from suffice.training.autorater.store import LabelRecord
from suffice.training.data.loaders import load_items
from suffice.training.data.schema import DataFormatError, Item
from suffice.training.synth.candidates import build_candidates, synthetic_row, write_jsonl
from suffice.training.synth.config import SynthConfig
from suffice.training.synth.corpus import existing_questions, load_corpus, make_seeds
from suffice.training.synth.generate import QuestionGenerator, generate_async
from suffice.training.synth.judge import build_judge, judge_candidates
from suffice.training.synth.prompt import GenerationPrompt
from suffice.training.synth.report import SynthReport
from suffice.training.synth.store import SynthStore

SHIPPED_GENERATOR = "llm-generator-v1"


def _in_store(cfg: LabelingConfig, run: Callable[[SynthStore], Awaitable[list[Item] | None]]) -> list[Item] | None:
    with SynthStore(cfg.store_path()) as store:
        return asyncio.run(run(store))


def synthesize(synth: SynthConfig, cfg: LabelingConfig, *, progress: bool = True) -> SynthReport:
    """Write, re-judge, deduplicate and save synthetic questions for ``synth.corpus``; returns the report.

    Raises :class:`~suffice.training.autorater.raters.RaterConfigError` (no API key...) before any request;
    a server that refuses every request ends the run with ``report.stopped`` set (what was stored stays).

    >>> report = synthesize(SynthConfig(corpus="passages.txt", per_passage=4),  # doctest: +SKIP
    ...                     LabelingConfig(rater="openai-compatible", model="m", api_key_env=""))
    >>> report.kept, report.disagreement_rate  # doctest: +SKIP
    (7, 0.125)
    """
    started = time.monotonic()
    entries = load_corpus(synth.corpus, synth.format, split=synth.split, source=synth.source)
    seeds = make_seeds(entries, synth.mode)
    if not seeds:
        need = "an item with two passages, or two plain passages" if synth.mode == "multi" else "a non-empty passage"
        raise DataFormatError(f"the corpus holds no {'pairs' if synth.mode == 'multi' else 'passages'} to write about "
                              f"(need {need})", path=synth.corpus)
    if synth.splits:
        seeds = [s for s in seeds if s.split in synth.splits]
    if synth.limit is not None:
        seeds = seeds[: synth.limit]
    existing = existing_questions(entries, synth.existing)
    prompt = GenerationPrompt(mode=synth.mode, kinds=synth.resolved_kinds(), per_passage=synth.per_passage)
    generator = QuestionGenerator(cfg, prompt, generator_id=synth.generator_id)
    judge = build_judge(synth.judge, cfg)
    report = SynthReport(generator=generator.id, prompt_version=prompt.version, mode=synth.mode, per_passage=synth.per_passage,
                         seeds=len(seeds), seeds_by_split=Counter(s.split for s in seeds))
    out_path = synth.out_path(generator.id)

    async def run(store: SynthStore) -> list[Item] | None:
        try:
            report.generation = await generate_async(
                seeds, generator, store, concurrency=cfg.concurrency, progress=progress, retry_unparsed=synth.retry_unparsed,
                price_per_1k_input=cfg.price_per_1k_input, price_per_1k_output=cfg.price_per_1k_output)
        except RaterFatalError as e:
            report.generation, report.stopped = e.accounting, str(e)
            await judge.aclose()
            return None
        candidates = build_candidates(seeds, store.generations(generator.id, prompt.version), prompt, generator.id, existing, report)
        return await judge_candidates(candidates, judge, store, cfg, synth, progress, report)

    kept = _in_store(cfg, run)
    if kept is not None:
        write_jsonl([synthetic_row(it, report.judge) for it in kept], out_path)
        report.out_path = str(out_path)
    report.elapsed_s = time.monotonic() - started
    return report


def rejudge(path: str | Path, synth: SynthConfig, cfg: LabelingConfig, *, progress: bool = True) -> SynthReport:
    """Re-judge already written synthetic questions (the shipped ``squad2-questions.jsonl``, an earlier
    output) and keep those the judge labels as their writer did.

    >>> rejudge("../shared/data/synthetic/squad2-questions.jsonl", synth, cfg).disagreement_rate  # doctest: +SKIP
    0.04
    """
    started = time.monotonic()
    items = list(load_items(path, "canonical"))
    unlabelled = [it.id for it in items if it.label is None]
    if unlabelled:
        raise DataFormatError(f"{len(unlabelled)} question(s) carry no writer label (first: {unlabelled[0]!r}): "
                              "only labelled synthetic questions can be re-judged", path=str(path), field="label")
    report = SynthReport(generator=", ".join(sorted({str(it.meta.get('generator') or '?') for it in items})), mode="imported",
                         questions=len(items), candidates=len(items))
    judge = build_judge(synth.judge, cfg)

    async def run(store: SynthStore) -> list[Item] | None:
        return await judge_candidates(items, judge, store, cfg, synth, progress, report)

    kept = _in_store(cfg, run)
    if kept is not None:
        out = Path(synth.out) if synth.out else Path(path).with_name(Path(path).stem + ".judged.jsonl")
        write_jsonl([{**synthetic_row(it, report.judge), **{k: v for k, v in it.meta.items() if k not in ("generator_prompt",)}}
                     for it in kept], out)
        report.out_path = str(out)
    report.elapsed_s = time.monotonic() - started
    return report


def import_synthetic(path: str | Path, cfg: LabelingConfig) -> list[tuple[str, int, int]]:
    """Bring already written synthetic questions (the shipped ``synthetic/squad2-questions.jsonl``) into
    the label store as their writer's labels, rater ``<generator>@shipped``, like ``suffice label import``
    does for the teacher's labels. Returns ``(rater, read, new)`` per writer; importing twice adds nothing.

    >>> import_synthetic("tests/fixtures/shared/synthetic/squad2-questions.jsonl", LabelingConfig(store="/tmp/s.sqlite"))  # doctest: +SKIP
    [('llm-generator-v1', 3, 3)]
    """
    items = load_items(path, "canonical")
    by_writer: dict[str, list[tuple[str, LabelRecord]]] = defaultdict(list)
    for it in items:
        if it.label is None:
            raise DataFormatError(f"question {it.id!r} carries no label: a synthetic question needs its writer's label "
                                  "(label 0/1 or level)", path=str(path), field="label")
        writer = cfg.rater_id or str(it.meta.get("generator") or SHIPPED_GENERATOR)
        why = f"synthetic {it.meta.get('kind') or '?'}" + (f"; answer: {it.meta['answer']}" if it.meta.get("answer") else "")
        by_writer[writer].append((it.id, LabelRecord(status="ok", label=int(it.label), level=it.level, rationale=why, attempts=0)))
    out = []
    with SynthStore(cfg.store_path()) as store:
        for writer, rows in sorted(by_writer.items()):
            store.register_rater(writer, CACHED_VERSION, kind="synthetic", scheme="three_level",
                                 prompt_text=f"synthetic questions imported from {path}")
            out.append((writer, len(rows), store.put_many(writer, CACHED_VERSION, rows)))
    return out
