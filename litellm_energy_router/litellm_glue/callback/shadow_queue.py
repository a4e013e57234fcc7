"""Shadow sampling: queue a fraction of production queries for a later shadow tournament (every
candidate + grader/judge; run by the profiler).

The queue file format is fixed by :class:`~litellm_energy_router.settings.ShadowSettings` — JSON
Lines, append-only, one object per query::

    {"query_id": str, "task": str, "text": str, "call_id": str | null, "created": float (Unix s)}

Sampling is a deterministic function of the call id (SHA-256 -> [0, 1) < ``fraction``), so a query
replayed from the writer's spool is never sampled twice with different outcomes. With
``new_context_requests`` = N, the first N requests this process serves for each context key (an app: its
authenticated key, team, tags or system prompt, :mod:`.router.context`) are queued as well, whatever the
fraction: a shadow tournament of them labels every candidate for the app, which the context prior learns from
(docs/unseen_traffic.md). An authenticated key gets at most N queued this way over all its contexts (the system
prompt is the caller's to vary; without a key hash: its alias, team or user), and so do all requests with no identity
together, as do all requests of a proxy that checks no keys (:func:`.litellm_compat.proxy_checks_keys`: it logs the
hash of whatever bearer token a caller sends): one caller could otherwise mint contexts, each queued query run on every
candidate. The counts live in the process (at most :data:`MAX_KEYS` keys, least recent
dropped): each worker of a proxy counts its own, and after a restart a context may get up to N more.

The file holds query text: it is created 0600 (an existing one with wider permissions is narrowed).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

from litellm_energy_router.litellm_glue.callback.private_files import append_durably, private_dir
from litellm_energy_router.litellm_glue.litellm_compat import proxy_checks_keys
from litellm_energy_router.metrics import RateLimitedWarning
from litellm_energy_router.router.context import Context

MAX_KEYS = 20_000  # context keys counted for ``new_context_requests``
ANONYMOUS = "owner:"  # the one owner of every request without an authenticated key


def sampled(key: str, fraction: float, secret: str = "") -> bool:
    """True for about ``fraction`` of keys, always the same answer for one key and ``secret``. With a ``secret``
    (the writer's salt) the answer is an HMAC's: a caller who chooses its call ids cannot find ones that are
    always sampled (each sampled query runs on every candidate), and a replayed row gets the same answer."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    data = key.encode("utf-8", "surrogatepass")
    d = hmac.new(secret.encode(), data, hashlib.sha256).digest() if secret else hashlib.sha256(data).digest()
    return int.from_bytes(d[:8], "big") / 2**64 < fraction


log = logging.getLogger("litellm_energy_router.litellm_glue.callback")

DEFAULT_MAX_MB = 64.0  # the queue file's bound (MB); settings shadow.max_mb


class ShadowQueue:
    """Appends sampled queries to the JSONL queue at ``path`` (thread-safe; one line per write, 0600):
    ``fraction`` of them (by call id), and the first ``new_context_requests`` of each context key."""

    def __init__(
        self, path: str | Path, fraction: float, new_context_requests: int = 0, max_mb: float = DEFAULT_MAX_MB
    ) -> None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"shadow.fraction = {fraction}: must be in [0, 1]")
        if new_context_requests < 0:
            raise ValueError(f"shadow.new_context_requests = {new_context_requests}: must be >= 0")
        self.path = Path(path)
        self.fraction = float(fraction)
        self.new_context_requests = int(new_context_requests)
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, int] = OrderedDict()  # context or owner key -> requests queued as new
        self.enqueued = 0
        self.max_bytes = int(max_mb * 2**20)
        self.dropped = 0  # sampled while the file was at max_mb: not queued
        self._warn = RateLimitedWarning(log, 60.0)

    def maybe_enqueue(
        self,
        query_id: str,
        task: str,
        text: str,
        call_id: str | None,
        created: float | None = None,
        context: str | None = None,
        owner: str | None = None,
        secret: str = "",
    ) -> bool:
        """Queue the query when its call id (else query id) is sampled, or when it is among the first
        ``new_context_requests`` queued as new of its ``context`` (the row's stored context: keys of
        :class:`~litellm_energy_router.router.context.Context`) and its ``owner`` (the authenticated key's hash, else
        the request's other identity; None: every request with no identity, one owner) has had fewer than that many
        queued this way (a caller that varies its system prompt, part of the context key, gets no more). ``secret``:
        :func:`sampled`'s. Returns whether it was queued."""
        slots = self._new_context(context, owner)
        if not (sampled(call_id or query_id, self.fraction, secret) or slots):
            return False
        try:
            self.enqueue(query_id, task, text, call_id, created)
        except BaseException:
            # a write that failed used no new-context slot: a later request gets it (a failure after the line was
            # written, in the fsync, may so queue one more than N: the queue errs toward labelling)
            self._give_back(slots)
            raise
        return True

    def _new_context(self, context: str | None, owner: str | None) -> tuple[str, ...]:
        """The keys whose new-context slot this request takes: ``context``'s key and its owner's while
        that key has had fewer than ``new_context_requests`` queued this way and ``owner`` too; else ``()`` (a
        request with no context key, only its text cluster: always). Only a slot taken is counted: a request turned
        away (its key's or its owner's N reached) uses none."""
        ctx = Context.parse(context) if self.new_context_requests else None
        if ctx is None or ctx.key is None:
            return ()
        # on a proxy that checks no keys the key (hash) is the caller's to choose: every request is one owner's
        keys = (ctx.key, ANONYMOUS if owner is None or not proxy_checks_keys() else f"owner:{owner}")
        with self._lock:
            if any(self._seen.get(k, 0) >= self.new_context_requests for k in keys):
                return ()
            for k in keys:
                self._count(k)
        return keys

    def _give_back(self, keys: tuple[str, ...]) -> None:
        """One less for each of ``keys`` (slots taken by :meth:`_new_context` for a request that was not queued)."""
        with self._lock:
            for k in keys:
                if self._seen.get(k, 0) > 0:
                    self._seen[k] -= 1

    def _count(self, key: str) -> None:
        """One more for ``key`` (most recent last; the least recent of :data:`MAX_KEYS` dropped)."""
        self._seen[key] = self._seen.pop(key, 0) + 1
        while len(self._seen) > MAX_KEYS:
            self._seen.popitem(last=False)

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
                private_dir(self.path.parent)  # 0700: the queue holds query text
            try:
                full = self.path.stat().st_size + len(line) + 1 > self.max_bytes
            except FileNotFoundError:
                full = False
            if full:  # bounded: the queue holds prompt text; a shadow tournament takes what it ran out of it
                self.dropped += 1
                self._warn(
                    "full", "energy-router: shadow queue %s is at shadow.max_mb: sampled query not queued", self.path
                )
                return
            append_durably(self.path, (line + "\n").encode("utf-8"))
            self.enqueued += 1


def trim_queue(path: str | Path, done: set[str], grace_s: float = 1.0) -> int:
    """Take the entries a shadow tournament ran (``done``: their query ids) out of the queue file at ``path``: the
    prompts it holds do not stay on disk once labelled, and the file does not grow for ever. The rest, and whatever
    the proxies append meanwhile, stay: the file is renamed aside (a proxy's next append starts a new one), read after
    ``grace_s`` s (an append that opened it before the rename has landed by then), and its other complete lines are
    appended back. A failure half way leaves the aside file (``<name>.trim-<pid>``) for the operator; nothing is lost.
    Returns the entries taken out."""
    p = Path(path)
    if not done or not p.exists():
        return 0
    aside = p.with_name(f"{p.name}.trim-{os.getpid()}")
    os.replace(p, aside)
    time.sleep(grace_s)
    kept, taken = [], 0
    for line in aside.read_bytes().split(b"\n")[:-1]:  # the last piece: "" or a torn append (read_queue skips it)
        try:
            qid = json.loads(line).get("query_id")
        except (ValueError, AttributeError):
            qid = None  # kept as it is: read_queue names it
        if qid in done:
            taken += 1
        else:
            kept.append(line + b"\n")
    if kept:
        append_durably(p, b"".join(kept))
    aside.unlink()
    return taken
