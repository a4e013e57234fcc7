"""Prometheus metrics of the serving path (registered once per process, on the default registry so a
LiteLLM proxy's ``/metrics`` exposes them)."""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import REGISTRY, Counter, Histogram

_lock = threading.Lock()


def _get(cls, name, doc, labels=(), **kw):
    with _lock:
        existing = REGISTRY._names_to_collectors.get(name) or REGISTRY._names_to_collectors.get(name + "_total")
        if existing is not None:
            return existing
        return cls(name, doc, labels, **kw)


DECISIONS = _get(Counter, "energy_router_decisions", "Routing decisions per chosen candidate", ("candidate",))
DECISION_SECONDS = _get(
    Histogram, "energy_router_decision_seconds", "Decision time, seconds",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
)  # fmt: skip
FALLBACKS = _get(Counter, "energy_router_fallbacks", "Requests served by the fallback, per reason", ("reason",))
RELOADS = _get(Counter, "energy_router_reloads", "Checkpoint (re)loads, per result", ("result",))
CHECKPOINT_LOAD_SECONDS = _get(
    Histogram, "energy_router_checkpoint_load_seconds", "Time to load a router checkpoint, seconds",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)  # fmt: skip


class RateLimitedWarning:
    """Log a warning at most once per ``period_s`` seconds per key."""

    def __init__(self, logger: logging.Logger, period_s: float = 60.0) -> None:
        self.logger, self.period_s = logger, period_s
        self._last: dict[str, float] = {}

    def __call__(self, key: str, msg: str, *args: object) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, -1e18) < self.period_s:
            return False
        self._last[key] = now
        self.logger.warning(msg, *args)
        return True
