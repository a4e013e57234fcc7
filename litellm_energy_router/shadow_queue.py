"""Shadow sampling: queue a fraction of production queries for a later shadow tournament (every
candidate + grader/judge; run by the profiler).

The queue file format is fixed by :class:`~litellm_energy_router.settings.ShadowSettings` — JSON
Lines, append-only, one object per query::

    {"query_id": str, "task": str, "text": str, "call_id": str | null, "created": float (Unix s)}

Sampling is a deterministic function of the call id (SHA-256 -> [0, 1) < ``fraction``), so a query
replayed from the writer's spool is never sampled twice with different outcomes.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path


def sampled(key: str, fraction: float) -> bool:
    """True for about ``fraction`` of keys, always the same answer for one key."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big")
    return h / 2**64 < fraction


class ShadowQueue:
    """Appends sampled queries to the JSONL queue at ``path`` (thread-safe; one line per write)."""

    def __init__(self, path: str | Path, fraction: float) -> None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"shadow.fraction = {fraction}: must be in [0, 1]")
        self.path = Path(path)
        self.fraction = float(fraction)
        self._lock = threading.Lock()
        self.enqueued = 0

    def maybe_enqueue(
        self, query_id: str, task: str, text: str, call_id: str | None, created: float | None = None
    ) -> bool:
        """Queue the query when its call id (else query id) is sampled. Returns whether it was queued."""
        if not sampled(call_id or query_id, self.fraction):
            return False
        self.enqueue(query_id, task, text, call_id, created)
        return True

    def enqueue(self, query_id: str, task: str, text: str, call_id: str | None, created: float | None = None) -> None:
        line = json.dumps(
            {
                "query_id": query_id,
                "task": task,
                "text": text,
                "call_id": call_id,
                "created": float(created if created is not None else time.time()),
            },
        )
        with self._lock:
            if self.path.parent and not self.path.parent.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.enqueued += 1
