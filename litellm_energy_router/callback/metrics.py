"""Prometheus metrics of the callback and its writer (process-wide, default registry: the LiteLLM
proxy's or your own ``/metrics`` exposes them).

* ``energy_router_request_joules`` — histogram of joules per request, by candidate and energy method;
* ``energy_router_rows_total`` — production rows by energy method (``nvml_counter``, ``agent``,
  ``estimate``, ``none``...): the measured vs estimated share is
  ``sum(rate(energy_router_rows_total{method!~"estimate|none"}[5m])) / sum(rate(energy_router_rows_total[5m]))``;
  ``energy_router_measured_energy_ratio`` is that share since the process started;
* ``energy_router_writer_queue_depth`` — rows in memory (queue + waiting for energy);
* ``energy_router_spool_backlog_rows`` — rows in the local spool not yet in the table;
  ``energy_router_spooled_rows_total`` — rows ever spooled; ``energy_router_rows_written_total``;
  ``energy_router_rejected_rows_total``; ``energy_router_callback_errors_total``.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

JOULE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class _Metrics:
    def __init__(self) -> None:
        self.joules = Histogram("energy_router_request_joules", "GPU energy per request, J", ["candidate", "method"],
                                buckets=JOULE_BUCKETS)  # fmt: skip
        self.rows = Counter("energy_router_rows", "production rows by energy method", ["method"])
        self.measured_ratio = Gauge("energy_router_measured_energy_ratio", "share of rows with measured energy")
        self.queue_depth = Gauge("energy_router_writer_queue_depth", "rows held in memory by the writer")
        self.spooled = Gauge("energy_router_spool_backlog_rows", "rows in the local spool, not yet in the table")
        self.spooled_total = Counter("energy_router_spooled_rows", "rows written to the local spool")
        self.written = Counter("energy_router_rows_written", "rows written to the table")
        self.rejected = Counter("energy_router_rejected_rows", "rows the table rejected (kept in rejected.jsonl)")
        self.errors = Counter("energy_router_callback_errors", "callback events that could not be turned into a row")
        self._lock = threading.Lock()
        self._n = 0
        self._measured = 0

    def observe_row(self, candidate: str, method: str | None, energy_j: float | None) -> None:
        m = method or "none"
        self.rows.labels(m).inc()
        if energy_j is not None:
            self.joules.labels(candidate, m).observe(energy_j)
        with self._lock:
            self._n += 1
            self._measured += m not in ("estimate", "none")
            self.measured_ratio.set(self._measured / self._n)


@lru_cache(maxsize=1)
def metrics() -> Any:
    """The process-wide metrics (created once)."""
    return _Metrics()
