"""What a ``suffice synth`` run did (:class:`SynthReport`: its printout and JSON) and its MLflow record.

>>> SynthReport(judged=8, disagree=1).disagreement_rate
0.125
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from suffice.training.autorater.labeling_config import LabelingConfig
from suffice.training.data.schema import SPLITS
from suffice.training.synth.config import SynthConfig
from suffice.training.synth.generate import GenerationAccounting


@dataclass
class SynthReport:
    """What a ``suffice synth`` run did: passages, questions, duplicates, the judge's disagreement, the cost."""

    generator: str = ""
    prompt_version: str = ""
    judge: str = ""
    mode: str = "single"
    per_passage: int = 0
    seeds: int = 0
    seeds_by_split: Counter = field(default_factory=Counter)
    not_generated: int = 0  # no stored reply (failed this run): the next run asks again
    unparsed: int = 0  # stored replies without questions (raw kept)
    questions: int = 0  # usable questions read from the replies
    invalid: Counter = field(default_factory=Counter)
    dup_existing: int = 0
    dup_batch: int = 0
    variants: int = 0
    candidates: int = 0
    judged: int = 0
    agree: int = 0
    disagree: int = 0
    judged_by_kind: Counter = field(default_factory=Counter)
    disagree_by_kind: Counter = field(default_factory=Counter)
    disagree_by_direction: Counter = field(default_factory=Counter)
    unjudged: int = 0
    parent_dropped: int = 0
    kept: int = 0
    kept_by_split: Counter = field(default_factory=Counter)
    kept_by_label: Counter = field(default_factory=Counter)
    kept_by_kind: Counter = field(default_factory=Counter)
    out_path: str | None = None
    generation: GenerationAccounting | None = None
    judging: Any = None  # the judge's runner.Accounting
    stopped: str | None = None
    elapsed_s: float = 0.0

    @property
    def disagreement_rate(self) -> float | None:
        """Share of judged items where the judge's label differs from the writer's (None before any verdict)."""
        return self.disagree / self.judged if self.judged else None

    @property
    def cost_usd(self) -> float:
        return sum(a.cost_usd for a in (self.generation, self.judging) if a is not None)

    def summary(self) -> dict[str, Any]:
        """Everything as plain JSON-ready values (what MLflow and ``--json`` get)."""
        return {
            "generator": self.generator, "prompt_version": self.prompt_version, "judge": self.judge, "mode": self.mode,
            "per_passage": self.per_passage, "passages": self.seeds, "passages_by_split": dict(sorted(self.seeds_by_split.items())),
            "not_generated": self.not_generated, "unparsed_replies": self.unparsed, "questions": self.questions,
            "invalid": dict(sorted(self.invalid.items())), "invalid_total": sum(self.invalid.values()),
            "duplicates_existing": self.dup_existing, "duplicates_batch": self.dup_batch,
            "duplicates_dropped": self.dup_existing + self.dup_batch, "variants": self.variants, "candidates": self.candidates,
            "judged": self.judged, "agree": self.agree, "disagree": self.disagree, "disagreement_rate": self.disagreement_rate,
            "disagree_by_kind": dict(sorted(self.disagree_by_kind.items())),
            "judged_by_kind": dict(sorted(self.judged_by_kind.items())),
            "disagree_by_direction": dict(sorted(self.disagree_by_direction.items())),
            "unjudged": self.unjudged, "parent_dropped": self.parent_dropped, "kept": self.kept,
            "kept_by_split": dict(sorted(self.kept_by_split.items())),
            "kept_by_label": {str(k): v for k, v in sorted(self.kept_by_label.items())},
            "kept_by_kind": dict(sorted(self.kept_by_kind.items())), "out": self.out_path,
            "generation": None if self.generation is None else self.generation.summary(),
            "judging": None if self.judging is None else self.judging.summary(),
            "cost_usd": round(self.cost_usd, 6), "stopped": self.stopped, "elapsed_s": round(self.elapsed_s, 3),
        }

    def format(self) -> str:
        """The closing printout."""
        g, j = self.generation, self.judging
        lines = [f"synth with {self.generator or 'imported questions'}"
                 + (f" (prompt {self.prompt_version}, {self.per_passage} per {'passage' if self.mode == 'single' else 'pair'})" if g else "")
                 + f", judged by {self.judge or 'nobody'}: {'stopped: ' + self.stopped if self.stopped else 'finished'} "
                 f"in {self.elapsed_s:.1f} s"]
        if g is not None:
            by_split = ", ".join(f"{s} {self.seeds_by_split[s]}" for s in SPLITS if self.seeds_by_split[s])
            unit = "passages" if self.mode == "single" else "pairs"
            lines += [
                f"  {unit:<10}: {self.seeds} ({by_split or 'none'}); {g.skipped} already generated (skipped), {g.to_label} asked",
                f"  generation: {g.stored_ok} replies stored, {g.stored_unparsed} unparsed (raw kept; --retry-unparsed asks again), "
                f"{g.failed} failed (not stored; re-run to retry)",
            ]
        reqs = [f"{name} {a.requests} ({a.retries} retries)" for name, a in (("generation", g), ("judging", j)) if a is not None]
        fails: Counter = Counter()
        tin = tout = est = 0
        for a in (g, j):
            if a is not None:
                fails.update(a.failures)
                tin, tout, est = tin + a.tokens_in, tout + a.tokens_out, est + a.usage_estimated
        lines += [f"  requests  : {', '.join(reqs) or 'none'}",
                  f"  failures  : {', '.join(f'{k} {v}' for k, v in sorted(fails.items())) or 'none'}",
                  f"  tokens    : {tin:,} in / {tout:,} out" + (f" (estimated for {est} replies without usage)" if est else "")]
        inv = ", ".join(f"{k} {v}" for k, v in sorted(self.invalid.items()))
        lines.append(f"  questions : {self.questions} usable" + (f", {sum(self.invalid.values())} invalid ({inv})" if inv else "")
                     + f"; {self.dup_existing + self.dup_batch} duplicates dropped ({self.dup_existing} of an existing question, "
                     f"{self.dup_batch} within the batch)" + (f"; {self.variants} partial variants" if self.variants else ""))
        rate = "n/a" if self.disagreement_rate is None else f"{self.disagreement_rate:.1%}"
        lines.append(f"  re-judged : {self.judged} of {self.candidates} ({self.unjudged} without a verdict; re-run to retry); "
                     f"{self.disagree} disagree with the writer: disagreement rate {rate} (the noise estimate)")
        if self.disagree:
            kinds = ", ".join(f"{k} {v}/{self.judged_by_kind[k]}" for k, v in sorted(self.disagree_by_kind.items()))
            dirs = ", ".join(f"{k}: {v}" for k, v in sorted(self.disagree_by_direction.items()))
            lines.append(f"              {dirs}; by kind: {kinds}")
        splits = ", ".join(f"{s} {self.kept_by_split[s]}" for s in SPLITS if self.kept_by_split[s])
        labels = ", ".join(f"label {k}: {self.kept_by_label[k]}" for k in (1, 0) if self.kept_by_label[k])
        dropped = f" ({self.parent_dropped} variants of dropped questions left out)" if self.parent_dropped else ""
        lines.append(f"  kept      : {self.kept}{dropped} -> {self.out_path or '(not written)'} ({splits or 'none'}; {labels or 'none'})")
        parts = " + ".join(f"{name} ${a.cost_usd:.4f}" for name, a in (("generation", g), ("judging", j)) if a is not None)
        lines.append(f"  cost est. : ${self.cost_usd:.4f}" + (f" ({parts})" if parts else ""))
        return "\n".join(lines)


def log_to_mlflow(report: SynthReport, *, synth: SynthConfig, cfg: LabelingConfig, prompt_text: str | None = None,
                  judge_prompt_text: str | None = None) -> str:
    """Record a synth run in the MLflow experiment ``synth.experiment``: both configs as params (no secrets
    exist in them), generation and judging accounting, the disagreement rate, duplicates, the prompts.

    >>> log_to_mlflow(report, synth=synth, cfg=cfg)  # doctest: +SKIP
    '3f2a...'
    """
    import mlflow
    from mlflow.entities import Metric, Param, RunStatus
    from mlflow.tracking import MlflowClient

    from suffice.serving.config import config_to_dict
    from suffice.training.tracking import config_params, git_commit, setup

    exp_id = setup(experiment=synth.experiment)
    client = MlflowClient(tracking_uri=mlflow.get_tracking_uri())
    tags = {"generator": report.generator, "prompt_version": report.prompt_version, "judge": report.judge,
            "corpus": synth.corpus, "label_store": str(cfg.store_path()), "git_commit": git_commit() or "unknown"}
    if report.out_path:
        tags["output"] = report.out_path
    run = client.create_run(exp_id, run_name=f"{report.generator}@{report.prompt_version}", tags=tags)
    rid = run.info.run_id
    s = report.summary()
    metrics = {k: float(s[k]) for k in ("passages", "not_generated", "unparsed_replies", "questions", "invalid_total",
                                         "duplicates_existing", "duplicates_batch", "duplicates_dropped", "variants",
                                         "candidates", "judged", "agree", "disagree", "unjudged", "parent_dropped", "kept",
                                         "cost_usd", "elapsed_s")}
    if report.disagreement_rate is not None:
        metrics["disagreement_rate"] = report.disagreement_rate
    for prefix, counter in (("kept", report.kept_by_split), ("kept_kind", report.kept_by_kind), ("invalid", report.invalid),
                            ("disagree_kind", report.disagree_by_kind)):
        metrics.update({f"{prefix}.{k}": float(v) for k, v in counter.items()})
    metrics.update({f"kept_label.{k}": float(v) for k, v in report.kept_by_label.items()})
    for phase, acc in (("generation", report.generation), ("judging", report.judging)):
        if acc is None:
            continue
        a = acc.summary()
        for k in ("skipped_already_stored", "to_label", "stored_ok", "stored_unparsed", "failed", "requests", "retries",
                  "tokens_in", "tokens_out", "cost_usd", "latency_p50_s", "latency_p95_s"):
            if a.get(k) is not None:
                metrics[f"{phase}.{k}"] = float(a[k])
        metrics.update({f"{phase}.failures.{k}": float(v) for k, v in acc.failures.items()})
    params = [Param(k, v) for k, v in config_params(cfg).items()]
    params += [Param(f"synth.{k}", v) for k, v in config_params(synth).items()]
    now = int(time.time() * 1000)
    client.log_batch(rid, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()], params=params[:100])
    for i in range(100, len(params), 100):
        client.log_batch(rid, params=params[i: i + 100])
    client.log_dict(rid, s, "accounting.json")
    client.log_dict(rid, {"synth": config_to_dict(synth), "llm": config_to_dict(cfg)}, "resolved_config.json")
    if prompt_text:
        client.log_text(rid, prompt_text, "generation_prompt.md")
    if judge_prompt_text:
        client.log_text(rid, judge_prompt_text, "judge_prompt.md")
    client.set_terminated(rid, RunStatus.to_string(RunStatus.FINISHED if not report.stopped else RunStatus.FAILED))
    return rid
