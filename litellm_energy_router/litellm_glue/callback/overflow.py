"""Rows that do not fit the writer's in-memory queue, spilled to the spool by a thread of their own.

``put`` (serving thread, O(1)) never touches the disk or the spool's lock, which the writer thread
may hold through a long fsync: a full queue never makes the serving event loop wait. The spill thread
(started on the first overflow) turns rows into spool records and appends them in batches. When the
spool cannot be written the records wait in memory and are retried; beyond ``bound`` rows (rows and
records together) the oldest are lost, counted and logged — as are any still held when the writer
closes past its deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable

from litellm_energy_router.litellm_glue.callback.pending_row import PendingRow
from litellm_energy_router.litellm_glue.callback.spool import Spool

log = logging.getLogger("litellm_energy_router.litellm_glue.callback")


class Overflow:
    """The spill path of :class:`~.writer.TableWriter`.

    Args:
        spool: where rows go.
        to_record: a row -> its ``{"k": "pending", ...}`` spool record (shadow sampling included).
        spooled: called with the number of rows appended to the spool.
        lost: called with the number of rows lost and why.
        bound: most rows held in memory.
    """

    def __init__(
        self,
        spool: Spool,
        to_record: Callable[[PendingRow], dict[str, Any]],
        spooled: Callable[[int], None],
        lost: Callable[[int, str], None],
        *,
        bound: int,
    ) -> None:
        self.spool, self.to_record, self.spooled, self.lost, self.bound = spool, to_record, spooled, lost, bound
        self._rows: deque[PendingRow] = deque()
        self._held: list[dict[str, Any]] = []  # records whose append failed; retried
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._deadline = float("inf")

    def put(self, row: PendingRow) -> None:
        """Take a row off the serving thread. Never blocks on I/O."""
        with self._lock:
            self._rows.append(row)
            # the oldest rows not yet turned into records go first (the held ones are trimmed by the spill thread)
            over = min(max(len(self._rows) + len(self._held) - self.bound, 0), len(self._rows))
            for _ in range(over):
                self._rows.popleft()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="energy-router-spill", daemon=True)
                self._thread.start()
        self._wake.set()
        if over > 0:
            self.lost(over, "the spool cannot be written and the in-memory bound is reached")

    def _run(self) -> None:
        while True:
            self._wake.wait(0.1)
            self._wake.clear()
            try:
                if not self._spill():
                    return
            except Exception:  # noqa: BLE001 - the spill thread must survive anything
                log.exception("energy-router: spill thread: unexpected error")
                time.sleep(0.1)

    def _spill(self) -> bool:
        """One round: append what is held. ``False`` once stopped and done."""
        with self._lock:
            rows = list(self._rows)
            self._rows.clear()
        records = [self.to_record(r) for r in rows]
        with self._lock:  # held records stay within the bound too: the oldest go while the spool cannot be written
            self._held.extend(records)
            drop = max(len(self._held) - self.bound, 0)
            del self._held[:drop]
        if drop:
            self.lost(drop, "the spool cannot be written and the in-memory bound is reached")
        if not self._held:
            return not self._stop
        try:
            self.spool.append(self._held)
        except OSError:  # counted and logged by the spool; kept and retried
            if not self._stop or time.monotonic() < self._deadline:
                time.sleep(0.05)
                return True
            n, self._held = len(self._held), []
            self.lost(n, "the spool could not be written before the writer closed")
            return False
        n, self._held = len(self._held), []
        self.spooled(n)
        return True

    def close(self, deadline: float) -> None:
        """Spill what is held (until ``deadline``, a ``time.monotonic()`` value) and stop."""
        with self._lock:
            thread = self._thread
            self._stop, self._deadline = True, deadline
        self._wake.set()
        if thread is not None:
            thread.join(max(deadline - time.monotonic(), 0) + 5)
