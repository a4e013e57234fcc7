"""The non-blocking table writer behind :class:`~.logger.EnergyLogger`.

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
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, IntegrityError

from ..energy.meter import RequestEnergy, RequestEnergyMeter, RequestUsage
from ..errors import one_line
from ..metrics import (CALL_IDS_REASSIGNED, REJECTED_ROWS, ROWS_LOST, ROWS_WRITTEN, SPOOL_BACKLOG_ROWS, SPOOLED_ROWS,
                       WRITER_QUEUE_DEPTH, RateLimitedWarning, observe_row)  # fmt: skip
from ..redact import redact, redact_url
from ..shadow_queue import ShadowQueue
from ..table import BadRowError, Query, Run, TableError, open_store, text_hash
from ..table.production import query_id_for, stored_call_id
from .accounting import RowAccounting
from .overflow import Overflow
from .pending_row import CandidateMap, PendingRow
from .private_files import load_or_create_salt
from .spool import Chunk, Spool

log = logging.getLogger("litellm_energy_router.callback")

_TRANSIENT = (TableError, DBAPIError, OSError, TimeoutError)


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
        self.meter = meter
        self.cfg = writer
        self.privacy = privacy
        self.cmap = cmap or CandidateMap()
        self.shadow = shadow
        self.settle_timeout_s = settle_timeout_s
        self.store_factory = store_factory
        self.accounting = accounting or RowAccounting()
        self.salt = privacy.salt or load_or_create_salt(privacy.salt_file or Path(writer.spool_dir) / "salt")
        self.spool = Spool(writer.spool_dir, max_bytes=int(writer.spool_max_mb * 2**20), keep_text=privacy.store_text,
                           salt=self.salt, retry_max_s=writer.retry_max_s)  # fmt: skip
        self._q: queue.Queue[PendingRow] = queue.Queue(maxsize=writer.queue_size)
        self._overflow = Overflow(self.spool, self._pending_record, self._spooled, self._lose,
                                  bound=max(4 * writer.queue_size, 10_000))  # fmt: skip
        self._lost_log = RateLimitedWarning(log, 30.0, logging.ERROR)
        self._pending: list[PendingRow] = []
        self._ready: list[dict[str, Any]] = []
        self._store: Any = None
        self._known: set[str] | None = None
        self._down_until = 0.0
        self._backoff = 0.1
        self._outage_logged = False
        self._warn = RateLimitedWarning(log, 60.0)
        self._last_commit = time.monotonic()
        self._last_orphan_scan = time.monotonic()
        self._count_lock = threading.Lock()
        self._cv = threading.Condition(self._count_lock)
        self.submitted = 0
        self.accounted = 0  # rows in the table or the spool
        self.written = 0
        self.spooled = 0
        self.replayed = 0
        self.lost = 0
        self.max_in_memory = 0
        self._flush_req = 0
        self._stop = threading.Event()
        self._close_deadline = float("inf")
        self._thread = threading.Thread(target=self._run, name="energy-router-writer", daemon=True)
        if start:
            self._thread.start()

    # -- serving side -----------------------------------------------------------------------------
    def submit(self, row: PendingRow) -> None:
        """Hand a row over. Never blocks, never raises: a full queue spills to the spool (off this thread)."""
        row.submitted_s = time.time()
        with self._count_lock:
            self.submitted += 1
        try:
            self._q.put_nowait(row)
        except queue.Full:
            self._overflow.put(row)

    def flush(self, timeout: float = 30.0) -> bool:
        """Write everything submitted so far to the table or the spool (energy resolved now, with
        what is known). Returns ``False`` on timeout."""
        with self._cv:
            target = self.submitted
            self._flush_req += 1
            ok = self._cv.wait_for(lambda: self.accounted >= target, timeout)
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
        self.spool.close()
        if self._store is not None:
            self._store.close()

    def _account(self, n: int, *, spooled: bool = False) -> None:
        with self._cv:
            self.accounted += n
            if spooled:
                self.spooled += n
            self._cv.notify_all()

    def _spooled(self, n: int) -> None:
        SPOOLED_ROWS.inc(n)
        SPOOL_BACKLOG_ROWS.set(self.spool.backlog_records())
        self._account(n, spooled=True)

    def _lose(self, n: int, why: str) -> None:
        """Rows that could be kept neither in the table, nor in the spool, nor in memory."""
        ROWS_LOST.inc(n)
        with self._count_lock:
            self.lost += n
        self._lost_log("lost", "energy-router: %d rows lost: %s (%d so far; energy_router_rows_lost_total)", n, why, self.lost)
        self._account(n)

    # -- writer thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            closing = self._stop.is_set()
            urgent = closing or self._flush_req > 0
            try:
                self._take(0.0 if urgent else (0.02 if self._pending or self._ready else self.cfg.flush_interval_s))
                self._resolve(final=urgent)
                due = time.monotonic() - self._last_commit >= self.cfg.flush_interval_s
                if self._ready and (urgent or due or len(self._ready) >= self.cfg.batch_size):
                    batch, self._ready = self._ready, []
                    self._commit(batch)
                self._maybe_replay(closing)
            except Exception:  # noqa: BLE001 - the writer thread must survive anything
                log.exception("energy-router writer: unexpected error")
                time.sleep(0.1)
            WRITER_QUEUE_DEPTH.set(self._q.qsize() + len(self._pending) + len(self._ready))
            if closing:
                idle = self._q.empty() and not self._pending and not self._ready
                if idle and (self._is_down() or not self.spool.has_backlog()):
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
            self._shadow(row)
        self._pending.extend(items)
        self.max_in_memory = max(self.max_in_memory, self._q.qsize() + len(self._pending) + len(self._ready))

    def _shadow(self, row: PendingRow) -> None:
        if self.shadow is None or row.status != "success":
            return
        try:
            cid = stored_call_id(row.call_id)
            self.shadow.maybe_enqueue(query_id_for(cid), self.cfg.task, row.text, cid, row.start_s)
        except OSError as e:
            log.warning("energy-router: shadow queue %s not writable: %s", self.shadow.path, e)

    def _energy(self, row: PendingRow, final: bool) -> RequestEnergy | None:
        usage = RequestUsage(
            request_id=row.call_id, candidate=row.candidate, start_s=row.start_s, end_s=row.end_s,
            first_token_s=row.first_token_s, prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens, backend_id=row.backend_id,
        )  # fmt: skip
        try:
            return self.meter.energy_for_request(usage, final=final)
        except Exception as e:  # noqa: BLE001 - a meter bug must not lose the row
            log.warning("energy-router: meter %s failed for %s: %s", getattr(self.meter, "name", "?"), row.call_id, e)
            return RequestEnergy.unavailable() if final else None

    def _resolve(self, final: bool) -> None:
        if not self._pending:
            return
        now = time.time()
        overflow = len(self._pending) - self.cfg.queue_size
        keep: list[PendingRow] = []
        for i, row in enumerate(self._pending):
            force = final or i < overflow or now - row.submitted_s > self.settle_timeout_s
            e = self._energy(row, force)
            if e is None:
                keep.append(row)
                continue
            rec = self._record(row, e)
            if rec is not None:
                self._ready.append(rec)
        self._pending = keep

    def _record(self, row: PendingRow, e: RequestEnergy, *, h: str | None = None,
                account_reject: bool = True) -> dict[str, Any] | None:  # fmt: skip
        """The row's table records (``h``: the text's salted hash when the text is not kept); a call id
        too long for the table's key is stored under its SHA-256."""
        call_id = stored_call_id(row.call_id)
        if call_id != row.call_id:
            CALL_IDS_REASSIGNED.labels(reason="too_long").inc()
        figures, ledger = self.accounting.settle(row, e)  # accounting: run columns + ledger increments
        try:
            q = Query(
                id=query_id_for(call_id), task=self.cfg.task, text=row.text if self.privacy.store_text else None,
                text_hash=h if row.text is None else text_hash(row.text, self.salt), source="production",
                created=row.start_s,
            )  # fmt: skip
            run = Run(
                query_id=q.id, candidate=row.candidate, source="production", score=None,
                latency_s=row.end_s - row.start_s,
                ttft_s=(row.first_token_s - row.start_s) if row.first_token_s is not None else None,
                prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens,
                energy_j=e.energy_j, avg_power_w=e.avg_power_w if e.energy_j is not None else None,
                energy_method=e.method, gpu=e.gpu, propensity=row.propensity, call_id=call_id,
                status=row.status, created=row.end_s, router_version=row.router_version, **figures,
            )  # fmt: skip
        except ValidationError as err:
            msg = one_line(err, f"row for call {row.call_id!r}")
            log.warning("energy-router: %s (kept in %s)", msg, self.spool.rejected_path)
            self.spool.reject([self._private_json(row, h)], msg)
            REJECTED_ROWS.inc()
            if account_reject:
                self._account(1)
            return None
        observe_row(row.candidate, e.method, e.energy_j)
        cand = {"name": row.candidate, **self.cmap.info.get(row.candidate, {})}
        return {"k": "row", "q": q.model_dump(), "r": run.model_dump(), "c": cand, "l": ledger}

    def _private_json(self, row: PendingRow, h: str | None = None) -> dict[str, Any]:
        """The row as JSON for the spool or ``rejected.jsonl``: the text replaced by its salted hash
        ``h`` unless ``privacy.store_text``."""
        d = row.to_json()
        if row.text is not None and not self.privacy.store_text:
            d["text"], h = None, text_hash(row.text, self.salt)
        if h is not None:
            d["h"] = h
        return d

    def _pending_record(self, row: PendingRow) -> dict[str, Any]:
        """The spool record of a row spilled before its energy was known (shadow-sampled now, while
        its text is at hand)."""
        self._shadow(row)
        return {"k": "pending", **self._private_json(row)}

    # -- table / spool ----------------------------------------------------------------------------
    def _is_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _mark_down(self, err: BaseException) -> None:
        if not self._outage_logged:
            first = (str(err).splitlines() or [type(err).__name__])[0][:300]
            log.warning("energy-router: table %s unreachable (%s); spooling to %s", redact_url(self.url), redact(first),
                        self.spool.dir)  # fmt: skip
            self._outage_logged = True
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # noqa: BLE001
                pass
            self._store = None
        self._down_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.cfg.retry_max_s)

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

    def _commit(self, records: list[dict[str, Any]]) -> None:
        """To the table, or behind a backlog / during an outage to the spool; when the spool refuses
        too, the rows wait in memory (a backlog is then overtaken: the table goes first)."""
        if (self.spool.has_backlog() or self._is_down()) and self._to_spool(records):
            return
        if self._is_down():
            self._hold(records)
            return
        try:
            self._write(records)
            self._mark_up()
            self._account(len(records))
        except Exception as e:  # noqa: BLE001 - unreachable table (or anything unforeseen): keep the rows
            if not isinstance(e, _TRANSIENT):
                log.exception("energy-router: unexpected error writing %d rows; spooling them", len(records))
            self._mark_down(e)
            if not self._to_spool(records):
                self._hold(records)
        self._last_commit = time.monotonic()

    def _to_spool(self, records: list[dict[str, Any]]) -> bool:
        """Append to the spool; ``False`` when it refuses (counted and logged by the spool)."""
        try:
            self.spool.append(records)
        except OSError:
            return False
        self._spooled(len(records))
        return True

    def _hold(self, records: list[dict[str, Any]]) -> None:
        """Keep records the spool refused in memory (first in line); beyond the bound the oldest are lost."""
        self._ready[:0] = records
        excess = len(self._ready) - (self.cfg.queue_size + self.cfg.batch_size)
        if excess > 0:
            del self._ready[:excess]
            self._lose(excess, "the spool cannot be written and the in-memory bound is reached")

    def _write(self, records: list[dict[str, Any]]) -> None:
        """One transaction; a row the table rejects is isolated (bisection) and kept in rejected.jsonl."""
        store = self._get_store()
        known = self._known or set()
        cands: dict[str, dict[str, Any]] = {}
        for r in records:
            if r["c"]["name"] not in known:
                cands[r["c"]["name"]] = r["c"]
        try:
            res = store.write(queries=[r["q"] for r in records], runs=[r["r"] for r in records],
                              candidates=list(cands.values()), keep_first=True,
                              ledger=[r.get("l") for r in records])  # fmt: skip
        except (BadRowError, IntegrityError) as e:
            self._known = None
            if len(records) == 1:
                msg = str(e).splitlines()[0][:300]
                log.warning("energy-router: table rejected a row (%s); kept in %s", msg, self.spool.rejected_path)
                self.spool.reject([records[0]], msg)
                REJECTED_ROWS.inc()
                return
            mid = len(records) // 2
            self._write(records[:mid])
            self._write(records[mid:])
            return
        known.update(cands)
        self._reassigned(res.reassigned)
        self.written += len(records)
        ROWS_WRITTEN.inc(len(records))

    def _reassigned(self, pairs: Any) -> None:
        if not pairs:
            return
        CALL_IDS_REASSIGNED.labels(reason="taken").inc(len(pairs))
        given, fresh = pairs[0]
        self._warn("taken", "energy-router: call id %r already has another request's row; this one is stored as %r "
                   "(%d such rows in this batch)", given[:80], fresh, len(pairs))  # fmt: skip

    def _maybe_replay(self, closing: bool) -> None:
        now = time.monotonic()
        if now - self._last_orphan_scan > 5.0:
            self._last_orphan_scan = now
            self.spool.scan()  # adopts files left by dead processes
        if self._is_down() or not self.spool.has_backlog():
            return
        budget = now + (5.0 if closing else 0.5)
        while time.monotonic() < budget:
            chunk = self.spool.read_chunk(self.cfg.batch_size)
            if chunk is None or not self._replay(chunk):
                break
        SPOOL_BACKLOG_ROWS.set(self.spool.backlog_records())

    def _resolve_spilled(self, chunk: Chunk) -> None:
        """Rows spilled before their energy was known get it now, once: the chunk keeps the converted
        records for a retry. They were shadow-sampled when spilled."""
        if all(r["k"] == "row" for r in chunk.records):
            return
        out = []
        for d in chunk.records:
            if d["k"] == "row":
                out.append(d)
                continue
            row = PendingRow.from_json(d)
            e = self._energy(row, True) or RequestEnergy.unavailable()
            rec = self._record(row, e, h=d.get("h"), account_reject=False)
            if rec is not None:
                out.append(rec)
        chunk.records = out

    def _replay(self, chunk: Chunk) -> bool:
        self._resolve_spilled(chunk)
        try:
            if chunk.records:
                self._write(chunk.records)
        except Exception as e:  # noqa: BLE001 - the chunk stays in the spool; retried after a backoff
            if not isinstance(e, _TRANSIENT):
                log.exception("energy-router: unexpected error replaying %s", chunk.path.name)
            self._mark_down(e)
            return False
        self._mark_up()
        self.spool.commit(chunk)
        self.replayed += len(chunk.records)
        return True

    def _spool_everything(self) -> None:
        """Close deadline passed: keep every in-memory row in the spool for the next process."""
        recs = list(self._ready) + [{"k": "pending", **self._private_json(p)} for p in self._pending]
        self._ready, self._pending = [], []
        while True:
            try:
                recs.append(self._pending_record(self._q.get_nowait()))
            except queue.Empty:
                break
        if recs and not self._to_spool(recs):
            time.sleep(min(max(self.spool.retry_at - time.monotonic(), 0.0), 1.0))  # one more try, after the backoff
            if not self._to_spool(recs):
                self._lose(len(recs), "the spool could not be written before the writer closed")
                return
        log.warning("energy-router: writer closed with %d rows in the spool %s", len(recs), self.spool.dir)
