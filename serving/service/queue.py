"""Backpressure: a bounded queue of model work in front of a thread pool (503 when it is full)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable

from suffice.serving.service.metrics import ServiceMetrics


class QueueFullError(Exception):
    pass


class ModelQueue:
    """A bounded queue of model work in front of a thread pool.

    At most ``capacity`` jobs wait or run; one more is refused at once (QueueFullError -> 503)
    instead of waiting behind an unbounded backlog. A slot is released when the job itself ends,
    not when its client goes away, so abandoned jobs still count against the bound.
    """

    def __init__(self, workers: int, capacity: int, metrics: ServiceMetrics | None = None):
        self.capacity = capacity
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="suffice-model")
        self._pending = 0
        self._lock = threading.Lock()
        self._metrics = metrics

    @property
    def depth(self) -> int:
        return self._pending

    def _release(self, _f: Any = None) -> None:
        with self._lock:
            self._pending -= 1
            depth = self._pending
        if self._metrics:
            self._metrics.queue_depth.set(depth)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            if self._pending >= self.capacity:
                if self._metrics:
                    self._metrics.queue_rejections.inc()
                raise QueueFullError()
            self._pending += 1
            depth = self._pending
        if self._metrics:
            self._metrics.queue_depth.set(depth)
        try:
            cf = self._executor.submit(fn, *args)
        except RuntimeError:  # executor shut down
            self._release()
            raise QueueFullError() from None
        cf.add_done_callback(self._release)
        return await asyncio.wrap_future(cf)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)
