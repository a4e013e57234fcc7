"""Caller-chosen call ids in the proxy: one request per call id, or an HTTP 409 before any backend call.

A caller may choose a request's call id (header ``x-litellm-call-id``); production rows and feedback are keyed
by it. The table keeps the first row of a call id and stores a later request's row under a fresh ``dup-`` id
(:mod:`~litellm_energy_router.table.production`), but that request's response still names the caller's id, so
feedback sent for that response would label the first request's row. The energy logger's pre-call hook
therefore refuses a request whose caller-chosen call id already names one: claimed earlier in this process
(rows still in the writer's queue included), or held by a production row of the table (looked up off the
event loop). Every answered request's ``x-litellm-call-id`` is then the id its row is stored under (an id over
the table's key length: its ``sha256-`` form, which the feedback endpoint resolves too).

Left to the table's keep-first rule: two proxies sharing a table that receive the same new id within one
writer flush (neither sees the other's row yet); a table that cannot be read (the request is served, fail-open).
LiteLLM-assigned ids (random UUIDs) are never looked up.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Mapping

from litellm_energy_router.metrics import RateLimitedWarning
from litellm_energy_router.table.production import stored_call_id

log = logging.getLogger("litellm_energy_router.litellm_glue.callback")
HEADER = "x-litellm-call-id"


CHECK_TIMEOUT_S = 0.5  # s a request waits for the table's answer on its call id (fail open after)
SKIP_AFTER_TIMEOUT_S = 10.0  # s without table checks after one timed out


class CallIdTaken(ValueError):
    """A caller-chosen call id that already names another request. LiteLLM reads ``status_code``."""

    status_code = 409
    type = "invalid_request_error"
    energy_router_refusal = True  # litellm_compat.quiet_refusals: our WARNING line, not the proxy's ERROR line

    def __init__(self, call_id: str) -> None:
        self.param = HEADER
        shown = "".join(ch if ch.isprintable() else "?" for ch in call_id[:64])
        self.message = (
            f"energy-router: call id {shown!r} already names another request; send a new {HEADER} "
            "(or none: the proxy assigns one)"
        )
        super().__init__(self.message)


def caller_chosen(data: Mapping[str, Any]) -> str | None:
    """The request's call id when the caller sent it (``x-litellm-call-id``), else None (LiteLLM's own)."""
    cid = data.get("litellm_call_id")
    headers = (data.get("proxy_server_request") or {}).get("headers") or {}
    if not isinstance(cid, str) or not cid or not isinstance(headers, Mapping):
        return None
    sent = next((v for k, v in headers.items() if isinstance(k, str) and k.lower() == HEADER), None)
    return cid if sent == cid else None


class CallIdGuard:
    """Claims caller-chosen call ids: in this process (the last ``size`` of them), then in the table."""

    def __init__(self, table_url: str, size: int = 65536) -> None:
        self.table_url, self.size = table_url, size
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._store: Any = None
        self._warn = RateLimitedWarning(log, 60.0)
        self._skip_until = 0.0  # monotonic s: table checks skipped until then (it timed out)
        self._open_lock = threading.Lock()

    def _claim(self, cid: str) -> bool:
        with self._lock:
            if cid in self._seen:
                return False
            self._seen[cid] = None
            if len(self._seen) > self.size:
                self._seen.popitem(last=False)
            return True

    def _in_table(self, cid: str) -> bool:
        with self._open_lock:  # concurrent first checks open one store, not one each
            if self._store is None:
                from litellm_energy_router.table import open_store

                self._store = open_store(self.table_url, create=False)
        return any(r.source == "production" for r in self._store.runs_for_call(stored_call_id(cid)))

    async def check(self, data: Mapping[str, Any]) -> None:
        """Raise :class:`CallIdTaken` when the request's caller-chosen call id already names a request."""
        cid = caller_chosen(data)
        if cid is None:
            return
        if not self._claim(cid):
            raise CallIdTaken(cid)
        if time.monotonic() < self._skip_until:  # the table hung lately: checked in this process only
            return
        try:
            taken = await asyncio.wait_for(asyncio.to_thread(self._in_table, cid), CHECK_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - an unreadable table must not fail the request (keep-first still holds)
            if isinstance(e, asyncio.TimeoutError):  # a table that hangs held every such request (and a loop thread)
                self._skip_until = time.monotonic() + SKIP_AFTER_TIMEOUT_S
                e = TimeoutError(f"no answer in {CHECK_TIMEOUT_S:g} s; not asked for {SKIP_AFTER_TIMEOUT_S:g} s")
            self._warn(
                "table",
                "energy-router: call id check skipped (table not readable: %s)",
                str(e).splitlines()[0] if str(e) else e,
            )
            return
        if taken:
            raise CallIdTaken(cid)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
