"""Production rows, keyed by LiteLLM call id: the first row of a call id is kept.

A caller chooses its call id (proxy header ``x-litellm-call-id``, SDK ``litellm_call_id``), so a call id
names a request without proving it. :meth:`SQLStore.write(..., keep_first=True)
<litellm_energy_router.table.store.SQLStore.write>` applies these rules to production (query, run)
pairs, in batch order, in one transaction that no other production write interleaves with:

* a row equal to a stored one (same query, candidate, source and ``created``) is a replay (the writer's
  spool after a lost acknowledgement, a duplicated event): skipped;
* a row whose call id already holds another request — another text (``text_hash``), another key (``key_hash``:
  a retry comes from the key that made the call), or a successful run already — is stored under a server-side
  call id derived from the row (:func:`dup_call_id`; a random ``dup-<uuid4>`` when another request holds that one),
  never over the first, and its replay finds it there; feedback for the original call id keeps reaching only the
  first request's row;
* a failed attempt older than the call's latest run of the same text and key is skipped when the call holds a run
  of its candidate (replayed after its retry replaced it; a same-candidate attempt first arriving after its retry
  looks the same, and its joules are not counted); another candidate's is added to the request (its joules were
  spent, no new request);
* otherwise it belongs to the same request (LiteLLM's retries of one call): a new candidate's run is
  added; a success replaces that candidate's failed run (its score untouched); anything else keeps the
  first row.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from sqlalchemy import and_, select, update

from litellm_energy_router.table import schema
from litellm_energy_router.table.rows import Query, Run


def query_id_for(call_id: str) -> str:
    """Production rows get one query per served request (the run key is (query_id, candidate,
    source), so repeats of the same text stay separate rows); the text's salted hash is ``text_hash``."""
    return f"prod-{call_id}"


def stored_call_id(call_id: str) -> str:
    """The call id a production row is stored under: the caller's, or, when ``query_id_for`` of it would
    not fit the table's 200-character key (LiteLLM accepts 256), ``sha256-`` + its SHA-256 (hex)."""
    if len(query_id_for(call_id)) <= 200:
        return call_id
    return "sha256-" + hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()


def fresh_call_id() -> str:
    """A server-side call id for a row whose caller-chosen one is taken (or unusable)."""
    return f"dup-{uuid.uuid4().hex}"


def dup_call_id(q: Query, r: Run) -> str:
    """The call id a row moved off a taken id is stored under: a digest of the row (its call id, candidate, time and
    salted text hash), so a replay of the row (the spool after a lost acknowledgement) finds it there and is skipped
    instead of stored again under another fresh id."""
    key = "\x00".join((r.call_id or "", r.candidate, repr(r.created), q.text_hash))
    return "dup-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def lookup_ids(pairs: Sequence[tuple[Query, Run]]) -> list[str]:
    """The query ids :func:`plan_rows` reads: each row's, and the one it would move to (:func:`dup_call_id`)."""
    return [q.id for q, _ in pairs] + [query_id_for(dup_call_id(q, r)) for q, r in pairs]


@dataclass
class _Call:
    """What the table holds (or this batch adds) for one production query."""

    text_hash: str
    runs: dict[str, tuple[str | None, float]] = field(default_factory=dict)  # candidate -> (status, created)
    owner: str | None = None  # the key_hash of its first run: the key that made the call

    def succeeded(self) -> bool:
        return any(status == "success" for status, _ in self.runs.values())


@dataclass
class Plan:
    """What a keep-first write does: new queries and runs, failed runs replaced by a success, rows moved
    to a fresh call id (``(given, fresh)`` pairs), replays skipped."""

    queries: list[Query] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    upgrades: list[Run] = field(default_factory=list)
    reassigned: list[tuple[str, str]] = field(default_factory=list)
    skipped: int = 0
    stored: list[tuple[int, bool]] = field(default_factory=list)  # (pair index, a new request): runs the ledger adds


def stored_calls(conn: Any, query_ids: Sequence[str]) -> dict[str, _Call]:
    """The stored production queries among ``query_ids`` with their production runs."""
    q, r = schema.queries, schema.runs
    out: dict[str, _Call] = {}
    ids = sorted(set(query_ids))
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for qid, h in conn.execute(select(q.c.id, q.c.text_hash).where(q.c.id.in_(chunk))):
            out[qid] = _Call(h)
        stmt = select(r.c.query_id, r.c.candidate, r.c.status, r.c.created, r.c.key_hash)
        where = stmt.where(r.c.query_id.in_(chunk), r.c.source == "production").order_by(r.c.id)
        for qid, cand, status, created, key in conn.execute(where):
            if qid in out:
                if not out[qid].runs:
                    out[qid].owner = key
                out[qid].runs[cand] = (status, created)
    return out


def plan_rows(pairs: Sequence[tuple[Query, Run]], calls: dict[str, _Call]) -> Plan:
    """Apply the keep-first rules to ``pairs`` (in order) against ``calls`` (updated in place)."""
    plan = Plan()
    for i, (q, r) in enumerate(pairs):
        call = calls.get(q.id)
        if call is None or (not call.runs and call.text_hash == q.text_hash):
            # new; or its query written first by a shadow tournament (the row was spooled through an outage): the
            # request's first production row, adopted with its owner (it was moved to a dup- id no label reached)
            if call is None:
                plan.queries.append(q)
            calls[q.id] = _Call(q.text_hash, {r.candidate: (r.status, r.created)}, r.key_hash)
            plan.runs.append(r)
            plan.stored.append((i, True))
            continue
        had = call.runs.get(r.candidate)
        same = call.text_hash == q.text_hash and call.owner == r.key_hash
        if had is not None and had[1] == r.created:
            plan.skipped += 1  # the same row again
        elif same and r.status == "failure" and call.succeeded() and r.created < max(t for _, t in call.runs.values()):
            if had is None:  # another candidate's earlier attempt, first arriving after the retry: joules spent too
                call.runs[r.candidate] = (r.status, r.created)
                plan.runs.append(r)
                plan.stored.append((i, False))
            else:
                plan.skipped += 1  # an attempt before the call's latest run (replayed after its retry replaced it)
        elif not same or call.succeeded():
            moved = _move(plan, q, r, calls)
            if moved is None:
                plan.skipped += 1  # moved before: its replay
            else:
                plan.reassigned.append((r.call_id or "", moved))
                plan.stored.append((i, True))
        elif had is None:
            call.runs[r.candidate] = (r.status, r.created)
            plan.runs.append(r)
            plan.stored.append((i, False))  # another candidate's attempt of the same request
        elif had[0] == "failure" and (r.status == "success" or (r.created or 0) > (had[1] or 0)):
            # its successful retry, or a later failed attempt (its joules were spent too): the run holds the latest,
            # so a replay of it is skipped
            call.runs[r.candidate] = (r.status, r.created)
            plan.upgrades.append(r)
            plan.stored.append((i, False))
        else:
            plan.skipped += 1
    return plan


def _move(plan: Plan, q: Query, r: Run, calls: dict[str, _Call]) -> str | None:
    """Store the row under :func:`dup_call_id` (a random id when another request holds that one); None when it is
    stored there already (a replay)."""
    fresh = dup_call_id(q, r)
    there = calls.get(query_id_for(fresh))
    if there is not None:
        if there.text_hash == q.text_hash and there.runs.get(r.candidate, (None, None))[1] == r.created:
            return None
        fresh = fresh_call_id()
    q2 = q.model_copy(update={"id": query_id_for(fresh)})
    calls[q2.id] = _Call(q.text_hash, {r.candidate: (r.status, r.created)}, r.key_hash)
    plan.queries.append(q2)
    plan.runs.append(r.model_copy(update={"query_id": q2.id, "call_id": fresh}))
    return fresh


def apply_upgrades(conn: Any, runs: Sequence[Run], now: float) -> None:
    """Replace each named candidate's failed production run by its retry (a success, or a later failed attempt;
    score untouched)."""
    t = schema.runs
    keep = {"query_id", "candidate", "source", "score", "key_hash"}
    for run in runs:
        values = {k: v for k, v in run.model_dump().items() if k not in keep}
        where = and_(
            t.c.query_id == run.query_id,
            t.c.candidate == run.candidate,
            t.c.source == "production",
            t.c.status == "failure",
        )
        conn.execute(update(t).where(where).values(**values, updated=now))
