"""The non-blocking table writer behind :class:`~.logger.EnergyLogger`: a queue and a thread running
three stages, settle energy (:mod:`.settle`) -> build the record (:mod:`.record`) -> write or spool
(:mod:`.sink`).

Flow: ``submit`` (serving thread, O(1), never blocks) -> bounded in-memory queue -> writer thread:
energy from the per-request meter (rows wait up to ``settle_timeout_s`` for it) -> validated
``Query``/``Run`` rows -> one table transaction per batch. When the table is unreachable, batches are
appended to the local :class:`~.spool.Spool` and replayed, exactly once, when it returns; while a
backlog exists new batches queue behind it, so rows reach the table in order. A full queue spills to
the spool too, from a thread of its own (:class:`~.overflow.Overflow`): memory stays bounded and the
serving thread never waits on the disk. When the spool cannot be written either, rows wait in memory
(bounded; beyond it they are counted as lost). ``close`` flushes everything (to the table, else the
spool).

Privacy: unless ``privacy.store_text``, no prompt text reaches the table, the spool or
``rejected.jsonl`` — only its SHA-256 salted with ``privacy.salt``, or when that is empty with a random
salt generated once and kept in ``privacy.salt_file`` (default ``<spool_dir>/salt``, 0600). Inserts
never replace an existing row (a replayed duplicate keeps the first one and its feedback).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

from litellm_energy_router.budgets import WRITER_LAG
from litellm_energy_router.energy.meter import RequestEnergy, RequestEnergyMeter
from litellm_energy_router.errors import UserError
from litellm_energy_router.litellm_glue.callback.accounting import RowAccounting
from litellm_energy_router.litellm_glue.callback.overflow import Overflow
from litellm_energy_router.litellm_glue.callback.pending_row import (
    CandidateMap,
    PendingRow,
)
from litellm_energy_router.litellm_glue.callback.private_files import (
    query_salt,
)
from litellm_energy_router.litellm_glue.callback.record import RecordBuilder
from litellm_energy_router.litellm_glue.callback.settle import EnergySettler
from litellm_energy_router.litellm_glue.callback.shadow_queue import ShadowQueue
from litellm_energy_router.litellm_glue.callback.sink import TableSink, Tally
from litellm_energy_router.litellm_glue.callback.spool import Chunk, Spool
from litellm_energy_router.metrics import WRITER_QUEUE_DEPTH, RateLimitedWarning
from litellm_energy_router.router.adapt import ADAPT
from litellm_energy_router.table import open_store

log = logging.getLogger("litellm_energy_router.litellm_glue.callback")


class SpoolDirError(UserError, OSError):
    """``writer.spool_dir`` cannot be created or written: one line naming it."""


class TableWriter:
    """Batched, spooling writer of production rows.

    Args:
        url: table URL.
        meter: the per-request energy meter.
        writer: ``WriterSettings`` (queue size, batch size, flush interval, spool dir and cap, backoff, task).
        privacy: ``PrivacySettings`` (store text or only its salted hash; the salt or its file).
        cmap: candidate metadata for candidate rows.
        shadow: shadow-sampling queue, or ``None``.
        settle_timeout_s: max seconds a row waits for settled energy, s.
        store_factory: opens the table (tests inject failures).
        accounting: carbon and ledger figures of each row (default: no sites, ledger kept).
    """

    def __init__(
        self,
        url: str,
        meter: RequestEnergyMeter,
        *,
        writer: Any,
        privacy: Any,
        cmap: CandidateMap | None = None,
        shadow: ShadowQueue | None = None,
        settle_timeout_s: float = 30.0,
        store_factory: Callable[[str], Any] = open_store,
        start: bool = True,
        accounting: RowAccounting | None = None,
    ) -> None:
        self.url = url
        self.cfg = writer
        try:
            self.salt = query_salt(privacy, writer.spool_dir) or ""
            self.spool = Spool(
                writer.spool_dir,
                max_bytes=int(writer.spool_max_mb * 2**20),
                keep_text=privacy.store_text,
                salt=self.salt,
                retry_max_s=writer.retry_max_s,
            )
        except OSError as e:  # a typo'd or read-only path: one line naming the setting, not a traceback
            raise SpoolDirError(
                f"writer.spool_dir {str(writer.spool_dir)!r}: cannot be used ({e.strerror or e}: {e.filename or ''})"
            ) from None
        self.settler = EnergySettler(meter, settle_timeout_s, max_waiting=writer.queue_size)
        self.builder = RecordBuilder(
            writer.task, privacy, self.salt, cmap or CandidateMap(), self.spool, shadow, accounting or RowAccounting()
        )
        self.tally = Tally(self.spool)
        self.sink = TableSink(
            url,
            self.spool,
            self.tally,
            batch_size=writer.batch_size,
            retry_max_s=writer.retry_max_s,
            store_factory=store_factory,
            prepare_chunk=self._complete_chunk,
        )
        self._q: queue.Queue[PendingRow] = queue.Queue(maxsize=writer.queue_size)
        self._overflow = Overflow(
            self.spool,
            self.builder.pending_record,
            self.tally.spooled_rows,
            self.tally.lose,
            bound=max(4 * writer.queue_size, 10_000),
        )
        self._pending: list[PendingRow] = []
        self._ready: list[dict[str, Any]] = []
        self.max_in_memory = 0
        self._flush_req = 0
        self._stop = threading.Event()
        self._errors = RateLimitedWarning(log, 60.0, logging.ERROR)  # a traceback once a minute, not ten a second
        self._close_deadline = float("inf")
        self._inflight: list[dict[str, Any]] = []  # the batch being written to the table now
        self._thread = threading.Thread(target=self._run, name="energy-router-writer", daemon=True)
        if start:
            self._thread.start()

    # where the rows went (see :class:`~.sink.Tally`)
    submitted = property(lambda self: self.tally.submitted)
    accounted = property(lambda self: self.tally.accounted)
    written = property(lambda self: self.tally.written)
    spooled = property(lambda self: self.tally.spooled)
    replayed = property(lambda self: self.tally.replayed)
    lost = property(lambda self: self.tally.lost)

    # -- serving side -----------------------------------------------------------------------------
    def submit(self, row: PendingRow) -> None:
        """Hand a row over. Never blocks, never raises: a full queue spills to the spool (off this thread)."""
        row.submitted_s = time.time()
        with self.tally.cv:
            self.tally.submitted += 1
        try:
            self._q.put_nowait(row)
        except queue.Full:
            self._overflow.put(row)

    def flush(self, timeout: float = 30.0) -> bool:
        """Write everything submitted so far to the table or the spool (energy resolved now, with
        what is known). Returns ``False`` on timeout."""
        t = self.tally
        with t.cv:
            target = t.submitted
            self._flush_req += 1
            ok = t.cv.wait_for(lambda: t.accounted >= target, timeout)
            self._flush_req -= 1
        return ok

    def wait_replayed(self, timeout: float = 60.0) -> bool:
        """Wait until the spool backlog is in the table (for tests and shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.spool.has_backlog():
                return True
            time.sleep(0.05)
        return False

    def close(self, timeout: float = 30.0) -> None:
        """Flush and stop. Rows the table cannot take in ``timeout`` s stay in the spool."""
        self._close_deadline = time.monotonic() + timeout
        self._overflow.close(self._close_deadline)
        if not self._thread.is_alive():
            self.spool.close()
            return
        self._stop.set()
        self._thread.join(timeout + 5)
        if self._thread.is_alive():  # blocked in a table that hangs (a locked SQLite, a PostgreSQL that never answers)
            self._abandon()
        self.spool.close()
        self.sink.close()

    def _abandon(self) -> None:
        """The writer thread is stuck in the table past the close deadline: its batch in flight and every row still
        in memory go to the spool from here (a duplicate of a row the table takes later is harmless: the first stored
        is kept, and a replay adds nothing to the ledger), instead of being lost with the process, uncounted."""
        inflight, self._inflight = self._inflight, []
        self._ready = inflight + self._ready
        self._spool_everything()

    def _complete_chunk(self, chunk: Chunk) -> None:
        self.builder.complete_chunk(chunk, lambda row: self.settler.energy(row, True) or RequestEnergy.unavailable())

    # -- writer thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            closing = self._stop.is_set()
            urgent = closing or self._flush_req > 0
            try:
                self._take(0.0 if urgent else (0.02 if self._pending or self._ready else self.cfg.flush_interval_s))
                self._resolve(final=urgent)
                due = time.monotonic() - self.sink.last_commit >= self.cfg.flush_interval_s
                if self._ready and (urgent or due or len(self._ready) >= self.cfg.batch_size):
                    batch, self._ready = self._ready, []
                    self._inflight = batch  # a table that hangs holds it here: close() spools it
                    WRITER_LAG.behind()  # its rows are not in the ledger yet: the budgets keep their charges
                    try:
                        self._hold(self.sink.commit(batch))
                    finally:
                        self._inflight = []
                self.sink.maybe_replay(closing)
                if not self._ready and not self.spool.has_backlog():
                    WRITER_LAG.caught_up()
            except Exception:  # noqa: BLE001 - the writer thread must survive anything
                self._errors(
                    "loop", "energy-router writer: unexpected error (repeats logged once a minute)", exc_info=True
                )
                time.sleep(0.1)
            WRITER_QUEUE_DEPTH.set(self._q.qsize() + len(self._pending) + len(self._ready))
            if closing:
                idle = self._q.empty() and not self._pending and not self._ready
                if idle and (self.sink.is_down() or not self.spool.has_backlog()):
                    return
                if time.monotonic() > self._close_deadline:
                    self._spool_everything()
                    return

    def _take(self, timeout: float) -> None:
        try:
            first = self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
        except queue.Empty:
            return
        items = [first]
        while len(items) < 2 * self.cfg.batch_size:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                break
        for row in items:
            self.builder.sample_shadow(row)
        self._pending.extend(items)
        self.max_in_memory = max(self.max_in_memory, self._q.qsize() + len(self._pending) + len(self._ready))

    def _resolve(self, final: bool) -> None:
        """Stages 1 and 2 for the waiting rows: settled ones become records (invalid ones are accounted)."""
        if not self._pending:
            return
        settled, self._pending = self.settler.settle(self._pending, final=final)
        for row, e in settled:
            try:
                if row.status == "success":  # the serving router's online energy state (router/adapt.py)
                    ADAPT.observe(
                        row.candidate,
                        row.prompt_tokens,
                        row.completion_tokens,
                        e.energy_j,
                        row.context,
                        row.checkpoint_j,
                        row.router_version,
                    )
            except Exception as err:  # noqa: BLE001 - routing quality only: the row is written all the same
                self._errors("adapt", "energy-router: online energy state not updated: %s", err)
            rec = self.builder.record(row, e)  # a row it cannot build is rejected alone (kept in rejected.jsonl)
            if rec is not None:
                self._ready.append(rec)
            else:
                self.tally.account(1)

    def _hold(self, records: list[dict[str, Any]]) -> None:
        """Keep records the spool refused in memory (first in line); beyond the bound the oldest are lost."""
        if not records:
            return
        self._ready[:0] = records
        excess = len(self._ready) - (self.cfg.queue_size + self.cfg.batch_size)
        if excess > 0:
            del self._ready[:excess]
            self.tally.lose(excess, "the spool cannot be written and the in-memory bound is reached")

    def _spool_everything(self) -> None:
        """Close deadline passed: keep every in-memory row in the spool for the next process."""
        recs = list(self._ready) + [{"k": "pending", **self.builder.private_json(p)} for p in self._pending]
        self._ready, self._pending = [], []
        while True:
            try:
                recs.append(self.builder.pending_record(self._q.get_nowait()))
            except queue.Empty:
                break
        if recs and not self.sink.to_spool(recs):
            time.sleep(min(max(self.spool.retry_at - time.monotonic(), 0.0), 1.0))  # one more try, after the backoff
            if not self.sink.to_spool(recs):
                self.tally.lose(len(recs), "the spool could not be written before the writer closed")
                return
        log.warning("energy-router: writer closed with %d rows in the spool %s", len(recs), self.spool.dir)
