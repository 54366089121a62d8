"""Label a batch of items with a rater: bounded concurrency, resumable, every cost accounted.

:func:`label_items` skips what the store already holds for (rater, prompt version), runs at most
``concurrency`` items at once, commits each label as it arrives, and returns an
:class:`Accounting` (requests, retries, tokens, failures by kind, latency percentiles, estimated
cost, label distribution) that :meth:`Accounting.format` prints and :func:`log_to_mlflow` records.

>>> from suffice.training.autorater.raters import LexicalRater
>>> from suffice.training.autorater.store import LabelStore
>>> from suffice.training.data.schema import Item, Passage
>>> items = [Item(id="d:1", question="Where is Lima?", passages=[Passage("Lima", "Lima is in Peru.")])]
>>> with LabelStore(":memory:") as store:
...     acc = label_items(items, LexicalRater(), store, progress=False)
>>> acc.stored_ok, acc.labels[1]
(1, 1)
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from suffice.serving.bundle import LEVELS
from suffice.training.autorater.raters import Rater, RaterFatalError, Rating
from suffice.training.autorater.store import LabelRecord, LabelStore
from suffice.training.data.schema import Item

log = logging.getLogger("suffice.autorater")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Accounting:
    """What one labelling run did and cost."""

    rater_id: str
    prompt_version: str
    price_per_1k_input: float = 0.0
    price_per_1k_output: float = 0.0
    items_in_input: int = 0
    skipped: int = 0  # already in the store
    to_label: int = 0
    stored_ok: int = 0
    stored_unparsed: int = 0
    not_stored_duplicate: int = 0  # another process stored the same item first
    failed: int = 0  # no usable reply: not stored, retried by the next run
    requests: int = 0
    retries: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    usage_estimated: int = 0
    failures: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    labels: Counter = field(default_factory=Counter)
    levels: Counter = field(default_factory=Counter)
    elapsed_s: float = 0.0
    stopped: str | None = None  # why the run ended early (fatal server error, interrupt)

    @property
    def cost_usd(self) -> float:
        return self.tokens_in / 1000 * self.price_per_1k_input + self.tokens_out / 1000 * self.price_per_1k_output

    @property
    def done(self) -> int:
        return self.stored_ok + self.stored_unparsed + self.not_stored_duplicate + self.failed

    def add(self, rating: Rating) -> None:
        self.requests += rating.requests
        self.retries += rating.retries
        self.tokens_in += rating.tokens_in
        self.tokens_out += rating.tokens_out
        self.usage_estimated += rating.usage_estimated
        self.failures.update(rating.failures)
        if rating.status != "failed" and rating.requests:
            self.latencies.append(rating.latency_s)
        if rating.status == "ok":
            self.labels[rating.label] += 1
            if rating.level:
                self.levels[rating.level] += 1
        elif rating.status == "unparsed":
            self.failures["unparsed"] += 1

    def summary(self) -> dict[str, Any]:
        """Everything as plain JSON-ready values (what MLflow and ``--json`` get)."""
        return {
            "rater": self.rater_id, "prompt_version": self.prompt_version,
            "items_in_input": self.items_in_input, "skipped_already_stored": self.skipped, "to_label": self.to_label,
            "stored_ok": self.stored_ok, "stored_unparsed": self.stored_unparsed, "failed": self.failed,
            "not_stored_duplicate": self.not_stored_duplicate,
            "requests": self.requests, "retries": self.retries, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
            "usage_estimated_replies": self.usage_estimated,
            "failures": dict(sorted(self.failures.items())),
            "latency_p50_s": percentile(self.latencies, 50), "latency_p95_s": percentile(self.latencies, 95),
            "cost_usd": round(self.cost_usd, 6),
            "price_per_1k_input": self.price_per_1k_input, "price_per_1k_output": self.price_per_1k_output,
            "labels": {str(k): v for k, v in sorted(self.labels.items())},
            "levels": dict(sorted(self.levels.items())),
            "elapsed_s": round(self.elapsed_s, 3), "stopped": self.stopped,
        }

    def format(self) -> str:
        """The closing printout."""
        s = self.summary()
        rate = self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0
        fails = ", ".join(f"{k} {v}" for k, v in s["failures"].items()) or "none"
        p50, p95 = s["latency_p50_s"], s["latency_p95_s"]
        lat = "n/a" if p50 is None else f"p50 {p50:.3f} s, p95 {p95:.3f} s (per item, retries included)"
        n_lab = sum(self.labels.values())
        dist = ", ".join(f"{k}: {v} ({v / n_lab:.1%})" for k, v in sorted(self.labels.items(), reverse=True)) if n_lab else "none"
        if self.levels:
            dist += " | " + ", ".join(f"{k} {self.levels[k]}" for k in LEVELS if k in self.levels)
        est = f" (tokens estimated for {self.usage_estimated} replies without usage)" if self.usage_estimated else ""
        lines = [
            f"labelling with {self.rater_id} (prompt {self.prompt_version}) "
            f"{'stopped: ' + self.stopped if self.stopped else 'finished'} in {self.elapsed_s:.1f} s ({rate:.1f} items/s)",
            f"  items     : {self.items_in_input} in input, {self.skipped} already stored (skipped), {self.to_label} to label",
            f"  stored    : {self.stored_ok} labelled, {self.stored_unparsed} unparsed (raw reply kept), "
            f"{self.failed} failed (not stored; re-run to retry)"
            + (f", {self.not_stored_duplicate} already stored by another run" if self.not_stored_duplicate else ""),
            f"  requests  : {self.requests} ({self.retries} retries)",
            f"  failures  : {fails}",
            f"  tokens    : {self.tokens_in:,} in / {self.tokens_out:,} out{est}",
            f"  latency   : {lat}",
            f"  cost est. : ${self.cost_usd:.4f} at ${self.price_per_1k_input:g} / ${self.price_per_1k_output:g} per 1k tokens in / out",
            f"  labels    : {dist}",
        ]
        return "\n".join(lines)



async def run_bounded(todo: Sequence[Any], handle: Callable[[Any], Awaitable[None]], concurrency: int) -> None:
    """Run ``handle`` on every element of ``todo`` with at most ``concurrency`` in flight.

    The first exception stops the rest (pending handlers are cancelled) and is re-raised;
    cancellation cancels every worker. Shared by labelling and question generation.

    >>> seen = []
    >>> async def handle(x): seen.append(x)
    >>> asyncio.run(run_bounded([1, 2, 3], handle, concurrency=2)); sorted(seen)
    [1, 2, 3]
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for x in todo:
        queue.put_nowait(x)

    async def worker() -> None:
        while True:
            try:
                x = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await handle(x)

    tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(todo)))]
    if not tasks:
        return
    try:
        finished, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except (asyncio.CancelledError, KeyboardInterrupt):
        for t in tasks:
            t.cancel()
        raise
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in finished:
        if t.exception() is not None:
            raise t.exception()


def pending(unique: Sequence[Any], done: set[str], acc: Accounting) -> list[Any]:
    """The units of ``unique`` (each with an ``id``) whose id is not in ``done`` (already stored), in order;
    counts them into ``acc`` (``items_in_input``, ``skipped``, ``to_label``).

    >>> from types import SimpleNamespace as U
    >>> acc = Accounting("r", "v")
    >>> [u.id for u in pending([U(id="a"), U(id="b")], {"a"}, acc)], acc.skipped
    (['b'], 1)
    """
    acc.items_in_input = len(unique)
    todo = [u for u in unique if u.id not in done]
    acc.skipped, acc.to_label = len(unique) - len(todo), len(todo)
    return todo


async def run_resumable(todo: Sequence[Any], call: Callable[[Any], Awaitable[Rating]], store: Callable[[Any, Rating], bool],
                        acc: Accounting, *, concurrency: int, desc: str, unit: str, progress: bool,
                        aclose: Callable[[], Awaitable[None]]) -> Accounting:
    """The resumable worker loop of labelling and question generation: ``call`` every unit of ``todo``
    (at most ``concurrency`` at once), count its result into ``acc``, and ``store(unit, result)`` each
    ``ok``/``unparsed`` result as it arrives (False: another run stored it first); failed results are
    not stored, so the next run retries them. A :class:`RaterFatalError` stops the run with what was done
    attached as ``e.accounting``; ``aclose`` runs at the end whatever happens.

    >>> acc = asyncio.run(run_resumable(todo, rater.rate, put, acc, concurrency=4, desc="label r", unit="item",  # doctest: +SKIP
    ...                                 progress=False, aclose=rater.aclose))
    """
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=desc, unit=unit, disable=not progress, file=sys.stderr, dynamic_ncols=True, smoothing=0.1)
    started = time.monotonic()

    async def handle(unit_: Any) -> None:
        result = await call(unit_)
        acc.add(result)
        if result.status == "failed":
            acc.failed += 1
        elif store(unit_, result):
            if result.status == "ok":
                acc.stored_ok += 1
            else:
                acc.stored_unparsed += 1
        else:
            acc.not_stored_duplicate += 1
        bar.update(1)
        bar.set_postfix(cost=f"${acc.cost_usd:.4f}", unparsed=acc.stored_unparsed, failed=acc.failed, refresh=False)

    try:
        await run_bounded(todo, handle, concurrency)
    except RaterFatalError as e:
        acc.stopped = str(e)
        e.accounting = acc  # the caller still prints and logs what was done before the stop
        raise
    except (asyncio.CancelledError, KeyboardInterrupt):
        acc.stopped = "interrupted"
        raise
    finally:
        acc.elapsed_s = time.monotonic() - started
        bar.close()
        await aclose()
    return acc


async def label_items_async(items: Sequence[Item], rater: Rater, store: LabelStore, *, concurrency: int = 8,
                            limit: int | None = None, progress: bool = True, retry_unparsed: bool = False,
                            price_per_1k_input: float = 0.0, price_per_1k_output: float = 0.0) -> Accounting:
    """Async core of :func:`label_items` (use it when an event loop is already running)."""
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency} must be >= 1")
    if limit is not None and limit < 0:
        raise ValueError(f"limit={limit} must be >= 0")
    acc = Accounting(rater.id, rater.prompt_version, price_per_1k_input, price_per_1k_output)
    chosen = list(items if limit is None else items[:limit])
    seen: set[str] = set()
    unique = []
    for it in chosen:  # the loaders refuse duplicate ids; guard anyway so one id is never rated twice
        if it.id not in seen:
            seen.add(it.id)
            unique.append(it)
    store.register_rater(rater.id, rater.prompt_version, **rater.describe())
    todo = pending(unique, store.done_ids(rater.id, rater.prompt_version, include_unparsed=not retry_unparsed), acc)

    def put(item: Item, rating: Rating) -> bool:
        return store.put(rater.id, rater.prompt_version, item.id, LabelRecord.from_rating(rating), replace_unparsed=retry_unparsed)

    return await run_resumable(todo, rater.rate, put, acc, concurrency=concurrency, desc=f"label {rater.id}", unit="item",
                               progress=progress, aclose=rater.aclose)


def label_items(items: Sequence[Item], rater: Rater, store: LabelStore, *, concurrency: int = 8,
                limit: int | None = None, progress: bool = True, retry_unparsed: bool = False,
                price_per_1k_input: float = 0.0, price_per_1k_output: float = 0.0) -> Accounting:
    """Label ``items`` (the first ``limit`` of them) with ``rater`` into ``store``; returns the accounting.

    Items the store already holds for (rater.id, rater.prompt_version) are skipped (unparsed ones too,
    unless ``retry_unparsed``). Raises :class:`RaterFatalError` when the server refuses every request;
    labels stored before that are kept. The rater is closed when the run ends (its HTTP client
    belongs to this run's event loop): build a new one for the next run.

    >>> acc = label_items(items, LexicalRater(), store, concurrency=1, progress=False)  # doctest: +SKIP
    >>> print(acc.format())  # doctest: +SKIP
    """
    return asyncio.run(label_items_async(items, rater, store, concurrency=concurrency, limit=limit, progress=progress,
                                         retry_unparsed=retry_unparsed, price_per_1k_input=price_per_1k_input,
                                         price_per_1k_output=price_per_1k_output))


def log_to_mlflow(acc: Accounting, *, config: Any, experiment: str = "labeling", input_path: str | None = None,
                  prompt_text: str | None = None, store_path: str | None = None) -> str:
    """Record a labelling run in MLflow: config params (no secrets exist in it), accounting metrics,
    the label distribution, the prompt text. Returns the run id.

    >>> log_to_mlflow(acc, config=cfg)  # doctest: +SKIP
    '3f2a...'
    """
    from suffice.training.tracking import config_params, git_commit, setup

    exp_id = setup(experiment=experiment)
    from mlflow.entities import Metric, Param, RunStatus
    from mlflow.tracking import MlflowClient
    import mlflow

    client = MlflowClient(tracking_uri=mlflow.get_tracking_uri())
    tags = {"rater": acc.rater_id, "prompt_version": acc.prompt_version, "git_commit": git_commit() or "unknown"}
    if input_path:
        tags["input"] = str(input_path)
    if store_path:
        tags["label_store"] = str(store_path)
    run = client.create_run(exp_id, run_name=f"{acc.rater_id}@{acc.prompt_version}", tags=tags)
    rid = run.info.run_id
    s = acc.summary()
    now = int(time.time() * 1000)
    metrics = {k: float(s[k]) for k in ("items_in_input", "skipped_already_stored", "to_label", "stored_ok", "stored_unparsed",
                                         "failed", "requests", "retries", "tokens_in", "tokens_out", "cost_usd", "elapsed_s")}
    for k in ("latency_p50_s", "latency_p95_s"):
        if s[k] is not None:
            metrics[k] = float(s[k])
    metrics.update({f"failures.{k}": float(v) for k, v in acc.failures.items()})
    n_lab = sum(acc.labels.values())
    metrics.update({f"labels.{k}": float(v) for k, v in acc.labels.items()})
    metrics.update({f"levels.{k}": float(v) for k, v in acc.levels.items()})
    if n_lab:
        metrics["share_sufficient"] = acc.labels.get(1, 0) / n_lab
    params = [Param(k, v) for k, v in config_params(config).items()]
    client.log_batch(rid, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()], params=params[:100])
    for i in range(100, len(params), 100):
        client.log_batch(rid, params=params[i : i + 100])
    client.log_dict(rid, s, "accounting.json")
    client.log_dict(rid, {"labels": s["labels"], "levels": s["levels"]}, "label_distribution.json")
    if prompt_text:
        client.log_text(rid, prompt_text, "prompt.md")
    client.set_terminated(rid, RunStatus.to_string(RunStatus.FINISHED if not acc.stopped else RunStatus.FAILED))
    return rid


def accounting_json(acc: Accounting) -> str:
    return json.dumps(acc.summary(), indent=2, sort_keys=True)
