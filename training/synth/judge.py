"""The second look of ``suffice synth``: a judge (the LLM with the autorater prompt, or the lexical
baseline) re-labels every candidate; items where writer and judge disagree are dropped and counted.

>>> r = SynthReport()
>>> items = [Item(id="a", question="q?", passages=[], label=1, meta={"kind": "direct"})]
>>> [it.id for it in apply_verdicts(items, {"a": 0}, r)], r.disagree
([], 1)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from suffice.training.autorater.labeling_config import LabelingConfig
from suffice.training.autorater.raters import LexicalRater, OpenAICompatibleRater, RaterFatalError
from suffice.training.autorater.runner import label_items_async
from suffice.training.data.schema import Item
from suffice.training.synth.config import SynthConfig
from suffice.training.synth.report import SynthReport
from suffice.training.synth.store import SynthStore


def build_judge(judge: str, cfg: LabelingConfig):
    """The rater that re-judges every item: the LLM with the autorater prompt, or the lexical baseline."""
    if judge == "lexical":
        return LexicalRater(dataclasses.replace(cfg, rater_id=None))  # rater_id names the LLM, not the baseline
    return OpenAICompatibleRater(cfg)


async def judge_candidates(candidates: Sequence[Item], judge: Any, store: SynthStore, cfg: LabelingConfig, synth: SynthConfig,
                           progress: bool, report: SynthReport) -> list[Item] | None:
    """Label ``candidates`` with ``judge`` into ``store`` and keep those it agrees with; None when the server
    stopped the run (``report.stopped`` says why, ``report.judging`` holds what was done)."""
    report.judge = f"{judge.id}@{judge.prompt_version}"
    try:
        report.judging = await label_items_async(candidates, judge, store, concurrency=cfg.concurrency, progress=progress,
                                                 retry_unparsed=synth.retry_unparsed, price_per_1k_input=cfg.price_per_1k_input,
                                                 price_per_1k_output=cfg.price_per_1k_output)
    except RaterFatalError as e:
        report.judging, report.stopped = e.accounting, str(e)
        return None
    ids = {it.id for it in candidates}
    verdicts = {r.item_id: r.label for r in store.rows(judge.id, judge.prompt_version, status="ok") if r.item_id in ids}
    return apply_verdicts(candidates, verdicts, report)


def apply_verdicts(candidates: Sequence[Item], verdicts: dict[str, int], report: SynthReport) -> list[Item]:
    """Keep the items the judge labels as their writer did; count the disagreements (the noise estimate).
    A variant is kept only with its question (a partial variant of a bad question proves nothing).
    """
    kept_ids: set[str] = set()
    out = []
    for it in candidates:
        kind = str(it.meta.get("kind") or "")
        judged = verdicts.get(it.id)
        if judged is None:
            report.unjudged += 1
            continue
        report.judged += 1
        report.judged_by_kind[kind] += 1
        if judged != it.label:
            report.disagree += 1
            report.disagree_by_kind[kind] += 1
            report.disagree_by_direction[f"writer {it.label} / judge {judged}"] += 1
            continue
        report.agree += 1
        if it.parent_id and it.parent_id not in kept_ids:
            report.parent_dropped += 1
            continue
        kept_ids.add(it.id)
        out.append(it)
    report.kept = len(out)
    for it in out:
        report.kept_by_split[it.split] += 1
        report.kept_by_label[it.label] += 1
        report.kept_by_kind[str(it.meta.get("kind") or "")] += 1
    return out
