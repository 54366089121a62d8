"""Prometheus metrics of one service instance, in its own registry (two apps never share counters).

>>> m = ServiceMetrics()
>>> m.observe_sufficiency(0.9, "sufficient", 0.004)
>>> b"sufficient_context_level_total{level=\\"sufficient\\"} 1.0" in m.render()[0]
True
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from suffice.serving.bundle import LEVELS
from suffice.serving.gates.retrieval import RETRIEVE, SKIP

GATE_DECISIONS = (RETRIEVE, SKIP)
SCORE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServiceMetrics:
    """The counters and histograms ``GET /metrics`` exposes.

    sufficient_context_score / _level_total{level} / _latency_seconds: one observation per
    scored (question, passages) pair (the latency is the model's time for that pair).
    retrieval_gate_decisions_total{decision}; http_requests_total{route, method, status} and
    http_request_duration_seconds{route} for every request (unknown paths are route="other", so
    a flood of random URLs cannot blow up the label space); the model queue's depth and
    rejections; upstream failures by kind; chat_verdict_cache_total{result} (hit = a repeated chat
    request reused its verdict instead of being scored again).
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.score = Histogram("sufficient_context_score", "Calibrated sufficiency score of each scored pair",
                               buckets=SCORE_BUCKETS, registry=r)
        self.level = Counter("sufficient_context_level", "Scored pairs by sufficiency level", ["level"], registry=r)
        self.latency = Histogram("sufficient_context_latency_seconds", "Model time per scored pair",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.gate = Counter("retrieval_gate_decisions", "Retrieval-gate decisions", ["decision"], registry=r)
        self.requests = Counter("http_requests", "HTTP requests by route, method and status", ["route", "method", "status"], registry=r)
        self.request_latency = Histogram("http_request_duration_seconds", "Request wall time by route", ["route"],
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("sufficient_context_queue_depth", "Requests waiting for or running on the model", registry=r)
        self.queue_rejections = Counter("sufficient_context_queue_rejections", "Requests refused with 503 because the model queue was full", registry=r)
        self.upstream_errors = Counter("upstream_errors", "Upstream LLM failures by kind", ["kind"], registry=r)
        self.chat_outcomes = Counter("chat_gateway_outcomes", "Chat gateway outcomes once answered (forwarded, forwarded_with_caveat, declined, "
                                     "unscored; upstream_failed when the upstream call failed)", ["outcome"], registry=r)
        self.verdict_cache = Counter("chat_verdict_cache", "Chat verdict cache lookups (hit = not scored again)", ["result"], registry=r)
        for level in LEVELS:
            self.level.labels(level=level)
        for d in GATE_DECISIONS:
            self.gate.labels(decision=d)

    def observe_sufficiency(self, score: float, level: str, latency_s: float) -> None:
        self.score.observe(score)
        self.level.labels(level=level).inc()
        self.latency.observe(max(0.0, latency_s))

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, method=method, status=str(status)).inc()
        self.request_latency.labels(route=route).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """(exposition text, content type) for ``GET /metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
