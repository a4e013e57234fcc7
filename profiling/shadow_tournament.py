"""Shadow tournaments: label production queries by running them against every candidate.

The serving callback appends a sample of production queries to the shadow queue (JSON Lines, format
fixed in :class:`~litellm_energy_router.settings.ShadowSettings`)::

    {"query_id": str, "task": str, "text": str, "call_id": str | null, "created": float (Unix s)}

:func:`shadow_jobs` turns the queue into runner jobs; the runner writes the runs with
``source="shadow"`` and the production ``query_id``, so the production row and its shadow rows join
on one query. Production queries have no reference answer, so every shadow run is graded by the
judge deployment (reference-free MT-Bench prompt, 1–10 mapped to [0, 1]). Entries already run for a
candidate are skipped (resume), so the queue can be processed again at any time; a trailing line
without its newline (an append in progress) is left for the next run.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from litellm_energy_router.errors import UserError, one_line
from litellm_energy_router.settings import PrivacySettings
from litellm_energy_router.table import TableStore, make_query

from .runner import Job
from .tasks import Grade, GradeContext, HFSource, Task, TaskError, TaskItem

log = logging.getLogger(__name__)


class QueueError(UserError, ValueError):
    """A malformed queue line; the message names the file, line and field."""


class ShadowEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query_id: str = Field(min_length=1, max_length=200)
    task: str = Field(min_length=1, max_length=64)
    text: str
    call_id: str | None = Field(None, max_length=200)
    created: float = Field(ge=0, description="Unix seconds")


def read_queue(path: str | Path) -> list[ShadowEntry]:
    """Entries of the queue file, first occurrence of each query_id, in file order ([] if absent)."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as e:
        raise QueueError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    lines = raw.split("\n")
    lines = lines[:-1]  # the last element is "" or an incomplete append
    out: dict[str, ShadowEntry] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = ShadowEntry.model_validate(json.loads(line))
        except json.JSONDecodeError as e:
            raise QueueError(f"{p} line {n}: not valid JSON ({e.msg})") from None
        except ValidationError as e:
            raise QueueError(one_line(e, f"{p} line {n}", whole="<line>")) from None
        out.setdefault(entry.query_id, entry)
    return list(out.values())


class OpenQuestion(Task):
    """A production query graded by the judge without a reference (not in the task registry)."""

    name = "shadow"
    hf = HFSource("", None, "")
    max_tokens: ClassVar[int] = 512

    def from_record(self, record: Mapping[str, Any], index: int) -> TaskItem:
        e = ShadowEntry.model_validate(record)
        return TaskItem(e.task, e.query_id, e.text, None, {}, key=e.query_id)

    async def grade(self, item: TaskItem, answer: str, ctx: GradeContext) -> Grade:
        if ctx.judge is None:
            raise TaskError("a shadow tournament needs a judge deployment ('judge:' in the tournament config)")
        return await ctx.judge.rate(item.prompt, answer)


def existing_queries(store: TableStore, ids: Iterable[str]) -> dict[str, tuple[float, str | None]]:
    """Which of ``ids`` already have a query row: query id → (its ``created``, Unix s; the context its earliest
    production run stored, None: no production run, or one without a context)."""
    want = set(ids)
    found: dict[str, tuple[float, str | None]] = {}
    engine = getattr(store, "engine", None)
    if engine is None:
        for r in store.iter_runs():
            if r["query_id"] in want:
                prod = r.get("context") if r.get("source") == "production" else None
                old = found.get(r["query_id"], (r["query_created"], None))
                found[r["query_id"]] = (old[0], old[1] or prod)
        return found
    from sqlalchemy import and_, select

    from litellm_energy_router.table import schema

    q, r = schema.queries, schema.runs
    on, wanted = and_(r.c.query_id == q.c.id, r.c.source == "production"), sorted(want)
    with engine.connect() as conn:
        for i in range(0, len(wanted), 500):
            stmt = (
                select(q.c.id, q.c.created, r.c.context)
                .select_from(q.outerjoin(r, on))
                .where(q.c.id.in_(wanted[i : i + 500]))
                .order_by(q.c.id, r.c.id)
            )
            for qid, created, ctx in conn.execute(stmt):
                old = found.get(qid, (float(created), None))
                found[qid] = (old[0], old[1] or ctx)
    return found


DEFER_S = 3600.0  # an entry younger than this whose production row is not in the table yet waits for a later run


def shadow_jobs(
    entries: list[ShadowEntry],
    store: TableStore,
    privacy: PrivacySettings,
    max_tokens: int | None = None,
    now: float | None = None,
    salt: str | None = None,
) -> list[Job]:
    """Jobs for queued production queries. A query row is written only when the callback has not
    written it yet (as a production query, honouring the privacy settings). Each job's runs carry the context
    its production run stored (what the proxy attributed from LiteLLM's authenticated fields; never read from the
    queue file), so a shadow tournament teaches the context prior of the app whose traffic it ran. An entry whose
    query the table does not hold yet (the writer may still be flushing or spooling it) waits for a later run while
    it is younger than :data:`DEFER_S` (``now``: Unix s, default the clock); an older one runs without a context. An entry
    whose query id holds a query of another time (``created``: the request's start, the same in the queue and the
    table) is another request's, whose id was used twice: skipped, never run or labelled under that query. ``salt``: the
    proxies' query-hash salt (:func:`~litellm_energy_router.litellm_glue.callback.private_files.query_salt`; default
    ``privacy.salt``); without one a query the table does not hold is not written (an unsalted hash of a short
    prompt can be guessed, and would not match the production row's): the entry waits."""
    task = OpenQuestion()
    salt = privacy.salt if salt is None else salt
    have = existing_queries(store, (e.query_id for e in entries))
    jobs, other, waiting, bare = [], 0, 0, 0
    now = time.time() if now is None else now
    for e in entries:
        known = have.get(e.query_id)
        if known is not None and abs(known[0] - e.created) > 1e-3:
            other += 1  # the table's query of that id is another request's (a call id used twice): not this one
            continue
        if known is None and (now - e.created < DEFER_S or not salt):
            waiting += 1
            continue
        bare += known is None or known[1] is None
        item = TaskItem(e.task, e.query_id, e.text, None, {}, key=e.query_id)
        query = (
            None
            if known is not None
            else make_query(
                e.query_id,
                e.task,
                e.text,
                store_text=privacy.store_text,
                salt=salt,
                source="production",
                created=e.created,
            )
        )
        ctx = known[1] if known is not None else None
        jobs.append(Job(task, item, query, max_tokens or task.max_tokens, call_id=e.call_id, context=ctx))
    if other:
        log.warning("shadow queue: %d entries skipped: their query id holds another request's row", other)
    if waiting:
        log.info(
            "shadow queue: %d entries wait for their production row (a later run takes them)%s",
            waiting,
            "" if salt else "; without the proxies' salt (privacy.salt or privacy.salt_file) none is written here",
        )
    if bare:
        log.info("shadow queue: %d entries without a production run's context (not written yet, or none)", bare)
    return jobs
