"""Stage 3 of the table writer: write a batch of records to the table, or spool it.

One table transaction per batch; a row the table rejects is isolated by bisection and kept in
``rejected.jsonl``. When the table is unreachable the batch goes to the local :class:`~.spool.Spool`
(retried after a doubling backoff) and is replayed, exactly once, when the table returns; while a backlog
exists new batches queue behind it, so rows reach the table in order. :class:`Tally` counts where every
row went (the writer's ``flush`` waits on it).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

from litellm_energy_router.litellm_glue.callback.spool import Chunk, Spool
from litellm_energy_router.metrics import (
    CALL_IDS_REASSIGNED,
    REJECTED_ROWS,
    ROWS_LOST,
    ROWS_WRITTEN,
    SPOOL_BACKLOG_ROWS,
    SPOOLED_ROWS,
    RateLimitedWarning,
)
from litellm_energy_router.redact import redact, redact_url
from litellm_energy_router.table import TableError

log = logging.getLogger("litellm_energy_router.litellm_glue.callback")

_TRANSIENT = (TableError, DBAPIError, OSError, TimeoutError)
#: what a row's own values raise in a write (the driver's encoding, the ledger's merge): isolated, not retried
_BAD_ROW = (ValueError, TypeError, ArithmeticError, LookupError, IntegrityError, DataError)


class Tally:
    """Rows submitted, and accounted for: in the table (``written``, ``replayed`` from the spool), in the
    spool (``spooled``) or ``lost``. ``accounted`` counts every row whose fate is settled."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.cv = threading.Condition(threading.Lock())
        self.submitted = self.accounted = self.written = self.spooled = self.replayed = self.lost = 0
        self._lost_log = RateLimitedWarning(log, 30.0, logging.ERROR)

    def account(self, n: int, *, spooled: bool = False) -> None:
        with self.cv:
            self.accounted += n
            if spooled:
                self.spooled += n
            self.cv.notify_all()

    def spooled_rows(self, n: int) -> None:
        SPOOLED_ROWS.inc(n)
        SPOOL_BACKLOG_ROWS.set(self.spool.backlog_records())
        self.account(n, spooled=True)

    def lose(self, n: int, why: str) -> None:
        """Rows that could be kept neither in the table, nor in the spool, nor in memory."""
        ROWS_LOST.inc(n)
        with self.cv:
            self.lost += n
        self._lost_log(
            "lost", "energy-router: %d rows lost: %s (%d so far; energy_router_rows_lost_total)", n, why, self.lost
        )
        self.account(n)


class TableSink:
    """Args: ``url`` (table URL), ``spool``, ``tally``, ``batch_size`` (rows per replayed chunk),
    ``retry_max_s`` (longest backoff, s), ``store_factory`` (opens the table; tests inject failures),
    ``prepare_chunk`` (completes a spooled chunk's records before replay: energy of spilled rows)."""

    def __init__(
        self,
        url: str,
        spool: Spool,
        tally: Tally,
        *,
        batch_size: int,
        retry_max_s: float,
        store_factory: Callable[[str], Any],
        prepare_chunk: Callable[[Chunk], None],
    ) -> None:
        self.url, self.spool, self.tally = url, spool, tally
        self.batch_size, self.retry_max_s = batch_size, retry_max_s
        self.store_factory, self.prepare_chunk = store_factory, prepare_chunk
        self.last_commit = time.monotonic()
        self._store: Any = None
        self._known: set[str] | None = None
        self._down_until = 0.0
        self._backoff = 0.1
        self._outage_logged = False
        self._warn = RateLimitedWarning(log, 60.0)
        self._last_orphan_scan = time.monotonic()

    # -- table health -------------------------------------------------------------------------------
    def is_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _mark_down(self, err: BaseException) -> None:
        if not self._outage_logged:
            first = (str(err).splitlines() or [type(err).__name__])[0][:300]
            log.warning(
                "energy-router: table %s unreachable (%s); spooling to %s",
                redact_url(self.url),
                redact(first),
                self.spool.dir,
            )
            self._outage_logged = True
        self.close()
        self._down_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max_s)

    def _mark_up(self) -> None:
        if self._outage_logged:
            log.warning("energy-router: table %s reachable again", redact_url(self.url))
        self._outage_logged = False
        self._backoff = 0.1

    def _get_store(self) -> Any:
        if self._store is None:
            self._store = self.store_factory(self.url)
            self._known = None
        if self._known is None:
            self._known = {c.name for c in self._store.candidates()}
        return self._store

    def close(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # noqa: BLE001
                pass
            self._store = None

    # -- batches ------------------------------------------------------------------------------------
    def commit(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """To the table, or behind a backlog / during an outage to the spool. Returns the records
        neither took (the spool refused them too): the caller keeps them in memory, first in line."""
        if (self.spool.has_backlog() or self.is_down()) and self.to_spool(records):
            return []
        if self.is_down():
            return records
        held: list[dict[str, Any]] = []
        try:
            self.write(records)
            self._mark_up()
            self.tally.account(len(records))
        except Exception as e:  # noqa: BLE001 - unreachable table (or anything unforeseen): keep the rows
            if not isinstance(e, _TRANSIENT):
                log.exception("energy-router: unexpected error writing %d rows; spooling them", len(records))
            self._mark_down(e)
            if not self.to_spool(records):
                held = records
        self.last_commit = time.monotonic()
        return held

    def to_spool(self, records: list[dict[str, Any]]) -> bool:
        """Append to the spool; ``False`` when it refuses (counted and logged by the spool)."""
        try:
            self.spool.append(records)
        except OSError:
            return False
        self.tally.spooled_rows(len(records))
        return True

    def write(self, records: list[dict[str, Any]]) -> None:
        """One transaction; a row the table rejects is isolated (bisection) and kept in rejected.jsonl."""
        store = self._get_store()
        known = self._known or set()
        cands: dict[str, dict[str, Any]] = {}
        for r in records:
            if r["c"]["name"] not in known:
                cands[r["c"]["name"]] = r["c"]
        try:
            res = store.write(
                queries=[r["q"] for r in records],
                runs=[r["r"] for r in records],
                candidates=list(cands.values()),
                keep_first=True,
                ledger=[r.get("l") for r in records],
            )
        except _BAD_ROW as e:  # a row the table cannot take (BadRowError, a value the driver cannot encode: SQLite's
            # OverflowError for an int over 2**63, a damaged spooled ledger part's KeyError), not the table's state:
            # isolated by bisection and kept in rejected.jsonl; anything else (down, locked, a timeout, the unforeseen)
            # is spooled and retried. An OverflowError or a KeyError used to be retried for ever, every row after it
            # queued behind it in the spool.
            self._known = None
            if len(records) == 1:
                msg = str(e).splitlines()[0][:300]
                log.warning("energy-router: table rejected a row (%s); kept in %s", msg, self.spool.rejected_path)
                self.spool.reject([records[0]], msg)
                REJECTED_ROWS.inc()
                return
            mid = len(records) // 2
            self.write(records[:mid])
            self.write(records[mid:])
            return
        known.update(cands)
        self._reassigned(res.reassigned)
        self.tally.written += len(records)
        ROWS_WRITTEN.inc(len(records))

    def _reassigned(self, pairs: Any) -> None:
        if not pairs:
            return
        CALL_IDS_REASSIGNED.labels(reason="taken").inc(len(pairs))
        given, fresh = pairs[0]
        self._warn(
            "taken",
            "energy-router: call id %r already has another request's row; this one is stored as %r "
            "(%d such rows in this batch)",
            given[:80],
            fresh,
            len(pairs),
        )

    # -- spool replay -------------------------------------------------------------------------------
    def maybe_replay(self, closing: bool) -> None:
        """Adopt spool files of dead processes (every 5 s); replay the backlog for up to 0.5 s (5 s
        when closing) unless the table is down."""
        now = time.monotonic()
        if now - self._last_orphan_scan > 5.0:
            self._last_orphan_scan = now
            self.spool.scan()
        if self.is_down() or not self.spool.has_backlog():
            return
        budget = now + (5.0 if closing else 0.5)
        while time.monotonic() < budget:
            chunk = self.spool.read_chunk(self.batch_size)
            if chunk is None or not self._replay(chunk):
                break
        SPOOL_BACKLOG_ROWS.set(self.spool.backlog_records())

    def _replay(self, chunk: Chunk) -> bool:
        self.prepare_chunk(chunk)
        try:
            if chunk.records:
                self.write(chunk.records)
        except Exception as e:  # noqa: BLE001 - the chunk stays in the spool; retried after a backoff
            if not isinstance(e, _TRANSIENT):
                log.exception("energy-router: unexpected error replaying %s", chunk.path.name)
            self._mark_down(e)
            return False
        self._mark_up()
        self.spool.commit(chunk)
        self.tally.replayed += len(chunk.records)
        return True
