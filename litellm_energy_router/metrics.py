"""Every ``energy_router_*`` Prometheus metric of the serving process (router and energy callback).

Each metric is defined once, here, at import (a module is imported once per process), on
prometheus_client's default registry: the LiteLLM proxy's ``/metrics`` serves that registry once its
``prometheus`` callback is enabled (see docs/metrics.md). Under ``PROMETHEUS_MULTIPROC_DIR`` (several
proxy workers) the values go to the shared directory like LiteLLM's own.

Router (strategy / proxy filter, router runtime):

* ``energy_router_decisions_total{candidate}`` — routed requests per chosen candidate;
* ``energy_router_decision_seconds`` — histogram of the routing decision time, seconds;
* ``energy_router_fallbacks_total{reason}`` — requests that failed open (``loading``: router not loaded
  yet; ``no_checkpoint``; ``timeout``; ``no_candidate``; ``error``);
* ``energy_router_reloads_total{result}`` — checkpoint (re)load attempts (``ok``, ``missing``, ``error``);
* ``energy_router_checkpoint_load_seconds`` — histogram of the time to load a checkpoint, seconds.

Energy callback and its table writer:

* ``energy_router_request_joules{candidate,method}`` — histogram of GPU energy per request, joules;
* ``energy_router_rows_total{method}`` — production rows by energy method (``nvml_counter``, ``agent``,
  ``estimate``, ``none``...); ``energy_router_measured_energy_ratio`` — share (0..1) of rows with
  measured (not estimated) energy since the process started;
* ``energy_router_writer_queue_depth`` — rows held in memory by the writer (queue + waiting for energy);
* ``energy_router_spool_backlog_rows`` — rows in the local spool not yet in the table;
* ``energy_router_spooled_rows_total``, ``energy_router_rows_written_total``,
  ``energy_router_rejected_rows_total`` (kept in ``rejected.jsonl``), ``energy_router_callback_errors_total``
  (callback events that could not be turned into a row) — rows;
* ``energy_router_spool_dropped_rows_total`` — rows dropped, oldest first, to keep the spool under
  ``writer.spool_max_mb``; ``energy_router_spool_write_errors_total`` — failed spool writes (disk full,
  permissions; the rows wait in memory); ``energy_router_rows_lost_total`` — rows lost because the spool
  could not be written and the in-memory bound was reached (or the process closed meanwhile).
* ``energy_router_call_ids_reassigned_total{reason}`` — production rows stored under a server-side call id
  instead of the caller's: ``taken`` (another request already holds that call id; the first row is kept),
  ``too_long`` (longer than the table's key: stored under its SHA-256).
* ``energy_router_knob_refusals_total{field}`` — request knob overrides refused with HTTP 400, per field
  (``lambda``, ``target_accuracy``, ``max_energy_j``, ``energy_router`` = the knob object, ``other``).

Energy and carbon accounting (docs/accounting.md):

* ``energy_router_joules_total{team,model_group,method}`` — GPU joules of served requests once settled
  (``method``: ``measured`` or ``estimate``); ``energy_router_co2e_grams_total{team,model_group}`` — gCO2e
  (joules x PUE x grid intensity); ``energy_router_joules_saved_total{team,model_group}`` — estimated joules
  saved against the reference deployment. ``team`` is the key's team alias (else id, else ``none``) and
  ``model_group`` LiteLLM's model group: each label keeps at most ``LABEL_CAP`` (50) values per process,
  later ones are reported as ``other``, so the series count stays bounded;
* ``energy_router_carbon_fallbacks_total{reason}`` — grid intensity lookups that used the last known value
  (``stale``, ``provider_error``, ``missing``) or the default site (``unknown_site``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, TypeVar

from prometheus_client import Counter, Gauge, Histogram

# -- router -----------------------------------------------------------------------------------------
DECISIONS = Counter("energy_router_decisions", "Routing decisions per chosen candidate", ["candidate"])
DECISION_SECONDS = Histogram(
    "energy_router_decision_seconds",
    "Decision time, seconds",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
)
DECISIONS_EVICTED = Counter(
    "energy_router_decisions_evicted",
    "decisions dropped from a bounded book before their request's callback read them (more requests in flight)",
    ["book"],
)
FALLBACKS = Counter("energy_router_fallbacks", "Requests served by the fallback, per reason", ["reason"])
RELOADS = Counter("energy_router_reloads", "Checkpoint (re)loads, per result", ["result"])
CHECKPOINT_LOAD_SECONDS = Histogram(
    "energy_router_checkpoint_load_seconds",
    "Time to load a router checkpoint, seconds",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)

# -- energy callback / table writer ------------------------------------------------------------------
JOULE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
REQUEST_JOULES = Histogram(
    "energy_router_request_joules", "GPU energy per request, J", ["candidate", "method"], buckets=JOULE_BUCKETS
)
ROWS = Counter("energy_router_rows", "production rows by energy method", ["method"])
MEASURED_ENERGY_RATIO = Gauge("energy_router_measured_energy_ratio", "share of rows with measured energy")
WRITER_QUEUE_DEPTH = Gauge(
    "energy_router_writer_queue_depth", "rows held in memory by the writer", multiprocess_mode="livesum"
)
SPOOL_BACKLOG_ROWS = Gauge(
    "energy_router_spool_backlog_rows", "rows in the local spool, not yet in the table", multiprocess_mode="livesum"
)
SPOOLED_ROWS = Counter("energy_router_spooled_rows", "rows written to the local spool")
ROWS_WRITTEN = Counter("energy_router_rows_written", "rows written to the table")
REJECTED_ROWS = Counter("energy_router_rejected_rows", "rows the table rejected (kept in rejected.jsonl)")
CALLBACK_ERRORS = Counter("energy_router_callback_errors", "callback events that could not be turned into a row")
SPOOL_DROPPED_ROWS = Counter(
    "energy_router_spool_dropped_rows", "rows dropped (oldest first) to keep the spool under its cap"
)
SPOOL_WRITE_ERRORS = Counter("energy_router_spool_write_errors", "failed writes to the local spool")
ROWS_LOST = Counter("energy_router_rows_lost", "rows lost: spool unwritable and the in-memory bound reached")
KNOB_REFUSALS = Counter(
    "energy_router_knob_refusals", "request knob overrides refused with HTTP 400, per field", ["field"]
)
CALL_IDS_REASSIGNED = Counter(
    "energy_router_call_ids_reassigned", "production rows stored under a server-side call id, per reason", ["reason"]
)

# -- energy and carbon accounting --------------------------------------------------------------------
JOULES_TOTAL = Counter("energy_router_joules", "GPU joules of served requests, J", ["team", "model_group", "method"])
CO2E_GRAMS_TOTAL = Counter("energy_router_co2e_grams", "CO2e of served requests, grams", ["team", "model_group"])
JOULES_SAVED_TOTAL = Counter(
    "energy_router_joules_saved", "estimated joules saved against the reference deployment, J", ["team", "model_group"]
)
CARBON_FALLBACKS = Counter(
    "energy_router_carbon_fallbacks", "grid intensity lookups served by a fallback, per reason", ["reason"]
)

LABEL_CAP = 50
_label_lock = threading.Lock()
_label_seen: dict[str, set[str]] = {}


def bounded_label(kind: str, value: str | None) -> str:
    """``value`` as a label of ``kind`` (``none`` when empty); past ``LABEL_CAP`` distinct values, ``other``."""
    v = (value or "none")[:64]
    with _label_lock:
        seen = _label_seen.setdefault(kind, set())
        if v in seen:
            return v
        if len(seen) >= LABEL_CAP:
            return "other"
        seen.add(v)
        return v


def observe_accounting(
    team: str | None,
    model_group: str | None,
    measured: bool,
    joules: float | None,
    co2e_g: float | None,
    saved_j: float | None,
) -> None:
    """Count one settled request's joules (J), gCO2e and estimated joules saved (J) by team and model group."""
    t, g = bounded_label("team", team), bounded_label("model_group", model_group)
    if joules is not None:
        JOULES_TOTAL.labels(t, g, "measured" if measured else "estimate").inc(joules)
    if co2e_g is not None:
        CO2E_GRAMS_TOTAL.labels(t, g).inc(co2e_g)
    if saved_j is not None:
        JOULES_SAVED_TOTAL.labels(t, g).inc(max(saved_j, 0.0))


_rows_lock = threading.Lock()
_rows_seen = [0, 0]  # rows, rows with measured energy


def observe_row(candidate: str, method: str | None, energy_j: float | None, measured: bool) -> None:
    """Count one production row (energy in joules, ``None`` when unknown) and its energy method; ``measured``: the
    meter registry says the method's joules are measured (:func:`~litellm_energy_router.energy.meter.is_measured`)."""
    m = method or "none"
    ROWS.labels(m).inc()
    if energy_j is not None:
        # bounded: with a wildcard deployment the served model string (the candidate of a row no candidate maps) is
        # the caller's to choose
        REQUEST_JOULES.labels(bounded_label("candidate", candidate), m).observe(energy_j)
    with _rows_lock:
        _rows_seen[0] += 1
        _rows_seen[1] += bool(measured)
        MEASURED_ENERGY_RATIO.set(_rows_seen[1] / _rows_seen[0])


_F = TypeVar("_F", bound=Callable[..., Any])


def counts_knob_refusals(fields: Callable[[], tuple[str, ...]]) -> Callable[[_F], _F]:
    """Decorate the knob resolver: each refusal it raises (an error with ``status_code`` 400 and a
    ``field``) is counted in ``energy_router_knob_refusals_total{field}``, the field one of ``fields()``
    (the knob's request fields and its metadata key, read from ``knob.py``) or ``other`` (a caller-chosen
    unknown name): bounded label values."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                field = getattr(e, "field", None)
                if getattr(e, "status_code", None) == 400 and isinstance(field, str):
                    KNOB_REFUSALS.labels(field if field in fields() else "other").inc()
                raise

        return wrapper  # type: ignore[return-value]

    return decorate


class RateLimitedWarning:
    """Log a warning (or a record of ``level``) at most once per ``period_s`` seconds per key. At most ``max_keys``
    keys are remembered (the least recently logged go first): a key a caller chooses cannot grow it without bound;
    callers still key on a bounded set where a caller could choose the key (each new key is a line)."""

    def __init__(
        self, logger: logging.Logger, period_s: float = 60.0, level: int = logging.WARNING, max_keys: int = 1024
    ) -> None:
        self.logger, self.period_s, self.level, self.max_keys = logger, period_s, level, max_keys
        self._last: OrderedDict[str, float] = OrderedDict()

    def __call__(self, key: str, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log ``msg % args`` (with the exception being handled when ``exc_info``) unless ``key`` was logged less than
        ``period_s`` ago; whether it was logged."""
        now = time.monotonic()
        if now - self._last.get(key, -1e18) < self.period_s:
            return False
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > self.max_keys:
            self._last.popitem(last=False)
        self.logger.log(self.level, msg, *args, exc_info=exc_info)
        return True
