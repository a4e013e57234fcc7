"""A request's context and the correctness prior learned per context: :class:`Context`, :class:`ContextPrior`.

**Context** (what the proxy knows of a request, never what a caller claims): LiteLLM's authenticated
``user_api_key_*`` fields (key hash or alias, team id, user id) and the authenticated key's tags
(``user_api_key_metadata.tags``: the key's own metadata, written by the proxy), the model group, and a hash of
the system prompt (the first :data:`MAX_SYSTEM_PROMPTS` an identity sends; later ones share ``other``). They
hash into one **context key** ``ctx:<16 hex>`` (no name, no prompt text kept). Below
it every request has a **text cluster** ``cl:<b>``: a SimHash bucket (:data:`CLUSTER_BITS` bits: the signs of
fixed random projections of the request's hashed byte-n-gram sketch, :func:`.length_model.sketch`), the same
in every process and after every retrain. Levels, most specific first: context key → cluster → pool. A request
with nothing but its model group known has no context key (the model group alone is the pool): cluster → pool.
Tournament rows have the context ``task:<task>`` → cluster → pool; shadow rows the context of the production query
they shadow (:func:`table_context`).

**ContextPrior**: per level key and candidate, the (weighted) count ``n`` and sum of correctness scores (in
[0, 1]). ``prior(context)[K]``: the pool's mean (``POOL_ALPHA`` pseudo-rows at 0.5), then each level from the
cluster down shrunk toward its parent by its row count: ``(sum + N0_CTX * (parent + δ)) / (n + N0_CTX)``, δ the
level's mean residual against its parent over all its rows, shrunk the same way (:func:`_shrink`). An unseen
key has ``n = 0`` and takes its parent's value; after ``n`` rows a context is ``n / (n + N0_CTX)`` its own (with
:data:`N0_CTX` = 10: 75 % after 30 rows). Fitted from tournament and production rows (:meth:`ContextPrior.fit_rows`,
streaming) and updated as labels arrive (:meth:`ContextPrior.update`). Thread-safe; memory bounded
(:data:`MAX_CONTEXTS` keys, least recently updated dropped). numpy only.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping  # typing's Mapping makes every isinstance check several calls
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from litellm_energy_router.router.length_model import SKETCH, text_sketch

N0_CTX = 10.0  # pseudo-rows of the parent level in a context's prior (a checkpoint may carry its own: Adaptation.bind)
POOL_ALPHA = 2.0  # pseudo-rows at 0.5 in the pool's prior
MAX_CONTEXTS = 20_000
CLUSTER_BITS = 4  # 16 text clusters
_PROJ = np.random.default_rng(20240522).standard_normal((SKETCH, CLUSTER_BITS)).astype(np.float32)
_BIT = 1 << np.arange(CLUSTER_BITS)  # a sign per projection → the bucket's bit
MAX_SYSTEM_PROMPTS = 32  # distinct system prompts one authenticated identity gets a context of its own for
MAX_IDENTITIES = 10_000  # identities whose system prompts are remembered (least recently seen dropped)
_AUTH_FIELDS = ("user_api_key_hash", "user_api_key_alias", "user_api_key_team_id", "user_api_key_user_id")


@dataclass(frozen=True)
class Context:
    """``key`` (``ctx:…``, ``task:…`` or None) and ``cluster`` (``cl:…``); :attr:`keys` most specific first."""

    key: str | None
    cluster: str

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key, self.cluster) if self.key else (self.cluster,)

    def __str__(self) -> str:  # what the table's ``context`` column and the decision's metadata hold
        return "|".join(self.keys)

    @classmethod
    def parse(cls, s: str | None) -> Context | None:
        parts = [p for p in (s or "").split("|") if p]
        if not parts or not parts[-1].startswith("cl:") or len(parts) > 2:
            return None
        return cls(parts[0] if len(parts) == 2 else None, parts[-1])


def text_cluster(text: str | None) -> str:
    """``cl:<b>``: the SimHash bucket of the text's byte-n-gram sketch."""
    return f"cl:{int((text_sketch(text or '') @ _PROJ > 0) @ _BIT)}"


def system_prompt(messages: Any) -> str | None:
    """The text of the first system (or developer) message, if any."""
    for m in messages if isinstance(messages, (list, tuple)) else ():
        if isinstance(m, Mapping) and m.get("role") in ("system", "developer"):
            c = m.get("content")
            if isinstance(c, list):
                c = " ".join(p.get("text", "") for p in c if isinstance(p, Mapping) and isinstance(p.get("text"), str))
            return c if isinstance(c, str) and c else None
    return None


class _SystemPrompts:
    """Per authenticated identity, the first :data:`MAX_SYSTEM_PROMPTS` system-prompt hashes it sent; a later one
    is ``other``: the system prompt is the caller's to write, so one key cannot mint contexts without bound and
    push every other tenant's learned state out of the bounded stores. Thread-safe, bounded."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, set[str]] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, identity: str, digest: str) -> str:
        with self._lock:
            known = self._seen.pop(identity, None) or set()
            self._seen[identity] = known
            while len(self._seen) > MAX_IDENTITIES:
                self._seen.popitem(last=False)
            if digest in known or len(known) < MAX_SYSTEM_PROMPTS:
                known.add(digest)
                return digest
            return "other"


_SYSTEMS = _SystemPrompts()


def request_context(
    text: str | None, metadata: Sequence[Mapping[str, Any]] = (), model_group: str | None = None, messages: Any = None
) -> Context:
    """The context of a request: ``metadata`` are its metadata dicts (only the authenticated ``user_api_key_*``
    fields are read, and the tags of the key's own metadata), ``model_group`` the group routed, ``messages``
    its messages (for the system prompt)."""
    parts = []
    for md in metadata:
        for f in _AUTH_FIELDS:
            v = md.get(f)
            if v not in (None, ""):
                parts.append(f"{f}={str(v)[:200]}")
        key_md = md.get("user_api_key_metadata")
        tags = key_md.get("tags") if isinstance(key_md, Mapping) else None
        if isinstance(tags, (list, tuple)):
            parts.append("tags=" + ",".join(sorted(str(t)[:100] for t in tags[:20])))
    sp = system_prompt(messages)
    if sp:
        digest = hashlib.sha256(sp[:8192].encode("utf-8", "replace")).hexdigest()
        parts.append("system=" + (_SYSTEMS.admit("\x00".join(parts), digest) if parts else digest))  # no identity: SDK
    key = None
    if parts:
        parts.append(f"group={model_group or ''}")
        key = "ctx:" + hashlib.sha256("\x00".join(parts).encode("utf-8", "replace")).hexdigest()[:16]
    return Context(key, text_cluster(text))


def table_context(row: Mapping[str, Any]) -> Context | None:
    """The context of a table row: a production row's stored ``context``, and a shadow row's (the context of the
    production query it shadows, copied by the shadow tournament); any other row ``task:<task>`` and the cluster of
    its text (None: a row with neither)."""
    if row.get("source") == "production" or (row.get("source") == "shadow" and row.get("context")):
        return Context.parse(row.get("context"))
    text, task = row.get("text"), row.get("task")
    if not text:
        return None
    return Context(f"task:{task}" if task else None, text_cluster(text))


MAX_COUNTED = 200_000  # (query, candidate) pairs remembered by ContextPrior.fit_rows (one row per pair)


class ContextPrior:
    """The hierarchical correctness prior per context (module docstring).

    Args:
        candidates: names, in the order of :meth:`prior`'s output.
        n0: pseudo-rows of the parent level (:data:`N0_CTX`).
    """

    def __init__(self, candidates: Sequence[str], *, n0: float = N0_CTX, max_keys: int = MAX_CONTEXTS) -> None:
        self.candidates = tuple(candidates)
        self.ix = {c: i for i, c in enumerate(self.candidates)}
        self.n0, self.max_keys = float(n0), max_keys
        K = len(self.candidates)
        self._pool = np.zeros((2, K))  # [n, sum]
        self._keys: OrderedDict[str, np.ndarray] = OrderedDict()
        self._counted: OrderedDict[tuple[str, str], tuple[bool, Context, float]] = OrderedDict()  # :meth:`_counts`
        self._lock = threading.Lock()

    def update(
        self, context: Context | Sequence[str] | str | None, candidate: str, correct: float, weight: float = 1.0
    ) -> bool:
        """Add one labelled row (``correct`` in [0, 1], ``weight`` ≥ 0, e.g. an inverse propensity) to the pool
        and to every level of ``context``. False for an unknown candidate or a bad number."""
        k = self.ix.get(candidate)
        if k is None or not (0.0 <= float(correct) <= 1.0) or not (weight >= 0 and np.isfinite(weight)):
            return False
        self._add(context, k, weight, float(correct))
        return True

    def _add(self, context: Context | Sequence[str] | str | None, k: int, weight: float, correct: float) -> None:
        """``weight`` rows of ``correct`` on candidate ``k`` at the pool and every level of ``context``; a negative
        ``weight`` takes a row back (from the levels still kept only)."""
        with self._lock:
            self._pool[:, k] += (weight, weight * correct)
            for key in _keys(context):
                a = self._keys.pop(key, None)
                if a is None and weight < 0:
                    continue
                a = np.zeros((2, len(self.candidates))) if a is None else a
                a[:, k] += (weight, weight * correct)
                self._keys[key] = a
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)

    def detail(self, context: Context | Sequence[str] | str | None) -> tuple[np.ndarray, np.ndarray, str]:
        """(``prior[K]`` in [0, 1], rows of the most specific level that has any ``[K]``, that level's key or "pool")."""
        with self._lock:
            n, s = self._pool
            p = (s + POOL_ALPHA * 0.5) / (n + POOL_ALPHA)
            own, level = n.copy(), "pool"
            for key in reversed(_keys(context)):  # from the cluster down to the context key
                a = self._keys.get(key)
                if a is None:
                    continue
                p = _shrink(a, p, self.n0)
                own, level = a[0].copy(), key
        return p, own, level

    def on_top(self, parent: np.ndarray, key: str | None) -> tuple[np.ndarray, np.ndarray]:
        """(``P[K]``: the context ``key``'s own labelled rows shrunk toward ``parent`` (a scorer's ``P``),
        ``(sum + n0 * parent) / (n + n0)``; its rows ``n[K]``). No key, or no rows: ``parent`` unchanged."""
        with self._lock:
            a = self._keys.get(key) if key else None
            a = None if a is None else a.copy()
        if a is None:
            return parent, np.zeros(len(self.candidates))
        return _shrink(a, np.asarray(parent, dtype=float), self.n0), a[0]

    def prior(self, context: Context | Sequence[str] | str | None) -> np.ndarray:
        """``prior[K]``: each candidate's expected correctness in this context (an unseen one: its parent's)."""
        return self.detail(context)[0]

    def fit_rows(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Add table rows (dicts as :meth:`~litellm_energy_router.table.SQLStore.iter_runs` yields them, read one
        at a time): those with a score and a context (:func:`table_context`). Returns the rows used."""
        used = 0
        for r in rows:
            if r.get("score") is None or r.get("status") == "failure":
                continue
            ctx = table_context(r)
            if ctx is None or str(r.get("candidate")) not in self.ix:
                continue
            if self._counts(r, ctx) and self.update(ctx, str(r.get("candidate")), float(r["score"])):
                used += 1
        return used

    def _counts(self, r: Mapping[str, Any], ctx: Context) -> bool:
        """Whether row ``r`` adds to the prior: one row per (query, candidate), as training's pairs keep it. A shadow,
        tournament or import row wins over the production row of its pair (the row counted first is taken back); a
        production row whose pair already counts is left out (a labelled production query that a shadow tournament
        also ran counted the served candidate twice). Remembered for the last :data:`MAX_COUNTED` pairs."""
        pair = (str(r.get("query_id")), str(r.get("candidate")))
        unbiased = r.get("source") != "production"
        with self._lock:
            before = self._counted.pop(pair, None)
            if before is not None and before[0] and not unbiased:
                self._counted[pair] = before
                return False
            self._counted[pair] = (unbiased, ctx, float(r["score"]))
            while len(self._counted) > MAX_COUNTED:
                self._counted.popitem(last=False)
        if before is not None:
            self._add(before[1], self.ix[pair[1]], -1.0, before[2])
        return True

    @property
    def rows(self) -> float:
        """Labelled rows (weighted) in the pool, all candidates."""
        return float(self._pool[0].sum())

    @property
    def n_keys(self) -> int:
        return len(self._keys)


def _shrink(a: np.ndarray, parent: np.ndarray, n0: float) -> np.ndarray:
    """A level's prior ``[K]`` from its rows ``a = [n, sum]`` and its parent's ``[K]``: ``(sum + n0 · (parent + δ)) /
    (n + n0)``, where ``δ = Σ (sum − n · parent) / (Σ n + n0)`` is the level's mean residual over all its rows,
    shrunk: a context harder (or easier) than its parent for the candidates it has rows of moves every candidate,
    the ones without rows included, so that labels on the served candidate alone do not make an unexplored one
    look better than it is."""
    n, s = a
    m = float(n.sum())
    delta = float((s - n * parent).sum()) / (m + n0) if m > 0 else 0.0
    return (s + n0 * np.clip(parent + delta, 0.0, 1.0)) / (n + n0)


def _keys(context: Context | Sequence[str] | str | None) -> tuple[str, ...]:
    if context is None:
        return ()
    if isinstance(context, Context):
        return context.keys
    if isinstance(context, str):
        c = Context.parse(context)
        return c.keys if c is not None else (context,)
    return tuple(context)
