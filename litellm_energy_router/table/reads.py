"""The reads of a table store (:class:`TableReads`, mixed into :class:`~.store.SQLStore`): candidates, counts, the
runs of a call id, the streamed runs joined with their query and candidate, per-candidate statistics and the
ledger's sums. Each read opens its own connection; none holds the whole table in memory.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from sqlalchemy import Engine, func, or_, select

from litellm_energy_router.table import ledger as ledger_table
from litellm_energy_router.table import schema
from litellm_energy_router.table.interface import CandidateStats
from litellm_energy_router.table.rows import Candidate, Run
from litellm_energy_router.table.stats import group_quantiles

RUN_FIELDS = [c.name for c in schema.runs.columns if c.name not in ("id", "updated")]


class TableReads:
    """The read half of :class:`~.store.SQLStore` (its ``engine`` and ``dialect``, ``sqlite`` or ``postgresql``)."""

    engine: Engine
    dialect: str

    def candidates(self) -> list[Candidate]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(schema.candidates).order_by(schema.candidates.c.name)).mappings()
            return [Candidate(**dict(r)) for r in rows]

    def count_runs(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(schema.runs)).scalar_one())

    def count_labelled(
        self,
        *,
        since_id: int | None = None,
        since_updated: float | None = None,
        sources: Sequence[str] | None = None,
        seen: Mapping[int, float] | None = None,
    ) -> int:
        """Runs with a score and energy that are new since a training watermark: a run id above
        ``since_id``, or (when ``since_updated`` is given) updated after that Unix time, e.g. labelled
        later by feedback. ``seen``: run id → ``updated`` (s) of runs the watermark's scan read within its
        clock-skew margin; such a run counts only when its ``updated`` changed since."""
        r = schema.runs
        where = [r.c.score.is_not(None), r.c.energy_j.is_not(None), r.c.id > (since_id if since_id is not None else -1)]
        if since_updated is not None:
            where[-1] = or_(where[-1], r.c.updated > since_updated)
        if sources:
            where.append(r.c.source.in_(list(sources)))
        ids = sorted(seen or ())
        with self.engine.connect() as conn:
            n = int(conn.execute(select(func.count()).select_from(r).where(*where)).scalar_one())
            for i in range(0, len(ids), 500):
                rows = conn.execute(select(r.c.id, r.c.updated).where(*where, r.c.id.in_(ids[i : i + 500])))
                n -= sum(1 for rid, upd in rows if upd == seen[rid])  # type: ignore[index]
        return n

    def runs_for_call(self, call_id: str) -> list[Run]:
        """Runs recorded for one LiteLLM call id (production rows), oldest first."""
        cols = [schema.runs.c[n] for n in RUN_FIELDS]
        stmt = select(*cols).where(schema.runs.c.call_id == call_id).order_by(schema.runs.c.id)
        with self.engine.connect() as conn:
            return [Run(**dict(m)) for m in conn.execute(stmt).mappings()]

    def iter_runs(
        self, *, since_id: int | None = None, sources: Sequence[str] | None = None, batch: int = 5000
    ) -> Iterator[dict[str, Any]]:
        """Runs joined with their query (``task``, ``text``, ``text_hash``, ``reference``,
        ``query_source``, ``query_created``) and candidate (``model``, ``params_b``, ``active_params_b``, ``hardware``),
        ordered by run id. ``since_id`` keeps runs with a larger id (a training watermark).

        Read in chunks of ``batch`` rows: a server-side cursor on PostgreSQL, keyset pages on SQLite, so
        memory does not grow with the table (a consumer that keeps every row is what would)."""
        r, q, c = schema.runs, schema.queries, schema.candidates
        cols = [
            r.c.id,
            *[r.c[n] for n in RUN_FIELDS],
            r.c.updated,
            q.c.task,
            q.c.text,
            q.c.text_hash,
            q.c.reference,
            q.c.source.label("query_source"),
            q.c.created.label("query_created"),
            c.c.model,
            c.c.params_b,
            c.c.active_params_b,
            c.c.hardware,
        ]
        base = select(*cols).join(q, q.c.id == r.c.query_id).join(c, c.c.name == r.c.candidate)
        if sources:
            base = base.where(r.c.source.in_(list(sources)))
        last = since_id if since_id is not None else -1
        if self.dialect == "postgresql":  # one server-side cursor: ``batch`` rows in client memory at a time
            with self.engine.connect() as conn:
                res = conn.execution_options(stream_results=True, yield_per=batch).execute(
                    base.where(r.c.id > last).order_by(r.c.id)
                )
                for part in res.mappings().partitions():
                    yield from (dict(m) for m in part)
            return
        while True:  # SQLite: keyset pages, no read transaction held between pages
            stmt = base.where(r.c.id > last).order_by(r.c.id).limit(batch)
            with self.engine.connect() as conn:
                chunk = [dict(m) for m in conn.execute(stmt).mappings()]
            yield from chunk
            if len(chunk) < batch:
                return
            last = chunk[-1]["id"]

    def stats(
        self, *, by_task: bool = False, sources: Sequence[str] | None = None, by_version: bool = False
    ) -> list[CandidateStats]:
        """Per candidate (and task if ``by_task``, serving router version if ``by_version``): rows,
        accuracy, mean / median / p95 J and latency (s)."""
        r, q = schema.runs, schema.queries
        keys = [r.c.candidate] + ([q.c.task] if by_task else []) + ([r.c.router_version] if by_version else [])
        stmt = select(
            *keys,
            func.count(),
            func.count(r.c.score),
            func.avg(r.c.score),
            func.avg(r.c.energy_j),
            func.avg(r.c.latency_s),
        ).join(q, q.c.id == r.c.query_id)
        if sources:
            stmt = stmt.where(r.c.source.in_(list(sources)))
        stmt = stmt.group_by(*keys).order_by(*(reversed(keys) if by_task else keys))
        out = []
        with self.engine.connect() as conn:
            robust = group_quantiles(conn, keys, r, q, sources)
            for row in conn.execute(stmt):
                row = list(row)
                quant = robust.get(tuple(row[: len(keys)]), (None,) * 4)
                version = row.pop(2 if by_task else 1) if by_version else None
                task = row.pop(1) if by_task else None
                cand, n, n_lab, acc, e, lat = row
                f = lambda v: None if v is None else float(v)  # noqa: E731
                out.append(CandidateStats(cand, task, int(n), int(n_lab), f(acc), f(e), f(lat), version, *quant))
        return out

    def ledger(
        self, by: str, *, since: str | None = None, until: str | None = None, extra: str | None = None
    ) -> list[dict[str, Any]]:
        """Energy and carbon ledger sums grouped by ``by`` (:func:`.ledger.report`)."""
        with self.engine.connect() as conn:
            return ledger_table.report(conn, by, since=since, until=until, extra=extra)
