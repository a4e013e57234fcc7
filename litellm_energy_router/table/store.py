"""Table stores: :class:`SQLStore`, the SQL implementation of the one interface (:class:`TableStore`, in
:mod:`.interface`; re-exported here with :class:`CandidateStats` and :class:`WriteResult`).

``open_store(url)`` gives a store for ``sqlite:///path.db`` (WAL mode, the default) or
``postgresql+psycopg://...`` (several proxies sharing one table). Every write is one transaction:
a batch is validated completely first, so a bad row leaves the stored data untouched. The URL check
(:func:`check_table_url`), :class:`TableError` and the engine setup are in :mod:`.database`.
"""

from __future__ import annotations

import random
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.exc import DBAPIError, OperationalError

from litellm_energy_router.redact import redact_url
from litellm_energy_router.table import ledger as ledger_table
from litellm_energy_router.table import production, schema
from litellm_energy_router.table.database import (
    TableError,
    _add_missing_columns,
    _is_retryable,
    _sqlite_engine,
    check_table_url,
)
from litellm_energy_router.table.interface import CandidateStats as CandidateStats  # re-exported
from litellm_energy_router.table.interface import TableStore as TableStore  # re-exported
from litellm_energy_router.table.interface import WriteResult
from litellm_energy_router.table.reads import TableReads
from litellm_energy_router.table.rows import BadRowError, Candidate, Query, Run, check_references, validate_rows

_QUERY_FIELDS = [c.name for c in schema.queries.columns]
_CAND_FIELDS = [c.name for c in schema.candidates.columns]


PG_CONNECT_TIMEOUT_S = 10
PG_WRITE_LOCK_TIMEOUT_S = 10  # s a production write waits for another proxy's (one try; retried with backoff)
PG_WRITE_IDLE_TIMEOUT_S = 60  # s a production write's transaction may sit idle (a frozen proxy) before it is ended
PG_DDL_LOCK_TIMEOUT_S = 2  # s a schema upgrade's DDL waits for a table lock (one try; retried with backoff)
PG_CONNECT_ARGS = {
    "connect_timeout": PG_CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


class SQLStore(TableReads):
    """:class:`TableStore` over SQLAlchemy Core, for SQLite and PostgreSQL: schema, transactions and writes here,
    the reads in :class:`~.reads.TableReads`."""

    def __init__(self, url: str, *, create: bool = True, retries: int = 8) -> None:
        self.url = url
        self._retries = retries
        parsed = check_table_url(url)
        self.dialect = parsed.get_backend_name()
        if self.dialect == "sqlite":
            if not create and (parsed.database or ":memory:") != ":memory:" and not Path(parsed.database).exists():
                raise TableError(
                    f"table {self._safe_url()}: no such database file {parsed.database!r} (this command "
                    "reads an existing table and creates none)"
                )
            self.engine = _sqlite_engine(url)
        else:
            # a server that accepts the connection and never answers (overloaded, a proxy in the way) must not hold a
            # writer, a budget read or a call-id check for ever: connect within PG_CONNECT_TIMEOUT_S, and TCP
            # keepalives notice a peer that is gone
            self.engine = create_engine(
                url,
                pool_pre_ping=True,
                pool_size=4,
                max_overflow=4,
                connect_args={k: v for k, v in PG_CONNECT_ARGS.items() if k not in parsed.query},  # the URL's win
            )
        if not create:
            self._require_table()
        self._ensure_schema()

    # -- schema -----------------------------------------------------------------------------------
    def _ensure_schema(self) -> None:
        def create(conn: Any) -> None:
            if self.dialect == "postgresql":  # serialise concurrent first starts
                # an upgrade's ALTER TABLE queued behind a long read (an export, a retrain scan) blocked every write
                # to the table for as long as the read ran: each try waits at most this long, then backs off
                conn.execute(text(f"SET LOCAL lock_timeout = '{PG_DDL_LOCK_TIMEOUT_S}s'"))
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(b"energy-router-schema")})
            schema.metadata.create_all(conn)
            _add_missing_columns(conn)
            row = conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")).first()
            if row is None:
                conn.execute(schema.meta.insert().values(key="schema_version", value=str(schema.SCHEMA_VERSION)))
            elif int(row[0]) > schema.SCHEMA_VERSION:
                raise TableError(
                    f"table {self._safe_url()}: schema_version {row[0]} is newer than this package's "
                    f"{schema.SCHEMA_VERSION}; upgrade litellm-energy-router"
                )

        try:
            self._transaction(create)
        except DBAPIError as e:  # e.g. a file that is not a database: the user's URL, in one line
            first = str(e.orig or e).strip().splitlines()[0]
            raise TableError(f"table {self._safe_url()}: {first}") from None

    def _require_table(self) -> None:
        """Refuse a database that holds no table yet (``create=False``)."""
        from sqlalchemy import inspect

        try:
            with self.engine.connect() as conn:
                found = inspect(conn).has_table(schema.meta.name)
        except DBAPIError as e:
            first = str(e.orig or e).strip().splitlines()[0]
            raise TableError(f"table {self._safe_url()}: {first}") from None
        if not found:
            raise TableError(
                f"table {self._safe_url()}: holds no energy-router table (this command reads an "
                "existing table and creates none)"
            )

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")).scalar_one()
            )

    def _safe_url(self) -> str:
        return redact_url(self.url)

    # -- transactions -----------------------------------------------------------------------------
    def _transaction(self, fn: Any) -> Any:
        """Run ``fn(conn)`` in one write transaction, retrying lock/deadlock errors with backoff."""
        delay = 0.02
        for attempt in range(self._retries + 1):
            try:
                with self.engine.connect().execution_options(er_write=True) as conn:
                    with conn.begin():
                        return fn(conn)
            except DBAPIError as e:
                if _is_retryable(e) and attempt < self._retries:
                    time.sleep(delay * (1 + random.random()))
                    delay = min(delay * 2, 1.0)
                    continue
                if isinstance(e, OperationalError) and not _is_retryable(e):
                    first = str(e.orig or e).strip().splitlines()[0]
                    raise TableError(f"table {self._safe_url()}: {first}") from e
                raise

    def _upsert(self, table: Any, keys: Sequence[str], update: bool, keep_stored: bool = False) -> Any:
        """Insert, or on a taken key: nothing (``update`` False), the new values, or with ``keep_stored`` the new
        values that are not null (a stored value is never replaced by nothing)."""
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        stmt = insert(table)
        if not update:
            return stmt.on_conflict_do_nothing()  # any unique key already taken: the stored row stays
        cols = [c.name for c in table.columns if c.name not in keys and c.name not in ("id", "created")]
        new = {c: func.coalesce(stmt.excluded[c], table.c[c]) if keep_stored else stmt.excluded[c] for c in cols}
        return stmt.on_conflict_do_update(index_elements=list(keys), set_=new)

    # -- writes -----------------------------------------------------------------------------------
    def add_candidates(self, candidates: Iterable[Candidate | dict[str, Any]]) -> int:
        """Insert or update candidates (by name). Returns how many were given."""
        rows = validate_rows(Candidate, candidates, "candidates")
        self.write(candidates=rows)
        return len(rows)

    def write(
        self,
        queries: Iterable[Query | dict[str, Any]] = (),
        runs: Iterable[Run | dict[str, Any]] = (),
        candidates: Iterable[Candidate | dict[str, Any]] = (),
        *,
        keep_first: bool = False,
        ledger: Sequence[dict[str, Any] | None] | None = None,
    ) -> WriteResult:
        """Upsert candidates (by name), queries (by id) and runs (by query, candidate, source) in one
        transaction.

        Every row is validated before anything is written; a bad row raises
        :class:`~.rows.BadRowError` naming the row and field, and nothing is changed.

        ``keep_first``: production rows keyed by call id, ``queries[i]`` the query of ``runs[i]``; the
        first row of a call id is kept, never replaced (rules in :mod:`.production`). ``ledger[i]``: the
        ledger increments of ``runs[i]`` (:func:`.ledger.entry`, or ``None``), added in the same transaction
        for each run stored (a replay adds nothing; a retry of the same request adds its joules, not a request).
        """
        c_rows = validate_rows(Candidate, candidates, "candidates")
        q_rows = validate_rows(Query, queries, "queries")
        r_rows = validate_rows(Run, runs, "runs")
        if not q_rows and not r_rows and not c_rows:
            return WriteResult(0, 0)
        if keep_first:
            c_payload = sorted((c.model_dump() for c in c_rows), key=lambda d: d["name"])
            return self._write_keep_first(c_payload, _pairs(q_rows, r_rows), time.time(), ledger)
        return self._transaction(lambda conn: self._write_in(conn, c_rows, q_rows, r_rows, time.time()))

    def write_batches(
        self, batches: Callable[[], Iterable[tuple[list[Candidate], list[Query], list[Run]]]], *, keep_stored: bool
    ) -> WriteResult:
        """Upsert every ``(candidates, queries, runs)`` batch that ``batches()`` yields, in one transaction: all or
        nothing, one batch in memory at a time (``batches`` is called again if the transaction is retried).
        ``keep_stored``: a null value never replaces a stored one (an export of an earlier release, without a
        later column, imported over the table keeps what the table holds)."""

        def do(conn: Any) -> WriteResult:
            q = r = 0
            now = time.time()
            for c_rows, q_rows, r_rows in batches():
                done = self._write_in(conn, c_rows, q_rows, r_rows, now, keep_stored)
                q, r = q + done.queries, r + done.runs
            return WriteResult(q, r)

        return self._transaction(do)

    def _write_in(
        self,
        conn: Any,
        c_rows: list[Candidate],
        q_rows: list[Query],
        r_rows: list[Run],
        now: float,
        keep_stored: bool = False,
    ) -> WriteResult:
        """One validated batch upserted inside the caller's transaction (references checked first)."""
        c_payload = sorted((c.model_dump() for c in c_rows), key=lambda d: d["name"])
        q_payload = sorted((q.model_dump() for q in q_rows), key=lambda d: d["id"])
        r_payload = sorted(
            ({**r.model_dump(), "updated": now} for r in r_rows),
            key=lambda d: (d["query_id"], d["candidate"], d["source"]),
        )
        if c_payload:
            conn.execute(self._upsert(schema.candidates, ["name"], True, keep_stored), c_payload)
        if r_rows:
            known_c = {n for (n,) in conn.execute(select(schema.candidates.c.name))}
            new_q = {q.id for q in q_rows}
            known_q = set(new_q)
            for chunk in _chunks(sorted({r.query_id for r in r_rows} - new_q), 500):
                known_q.update(
                    i for (i,) in conn.execute(select(schema.queries.c.id).where(schema.queries.c.id.in_(chunk)))
                )
            check_references(r_rows, known_c, known_q)
        if q_payload:
            if self.dialect == "postgresql":
                # insert first: meeting another transaction's uncommitted query of the same id, it waits for that
                # commit, so the check below (a new snapshot) sees it; a check first did not, and the upsert then
                # overwrote the other writer's query (its runs re-attached to another text), both writes succeeding
                conn.execute(self._upsert(schema.queries, ["id"], False), q_payload)
            check_same_queries(conn, q_rows)
            conn.execute(self._upsert(schema.queries, ["id"], True, keep_stored), q_payload)
        if r_payload:
            conn.execute(self._upsert(schema.runs, list(schema.RUN_KEY), True, keep_stored), r_payload)
        return WriteResult(len(q_payload), len(r_payload))

    def _write_keep_first(
        self,
        c_payload: list[dict[str, Any]],
        pairs: list[tuple[Query, Run]],
        now: float,
        ledger: Sequence[dict[str, Any] | None] | None = None,
    ) -> WriteResult:
        def do(conn: Any) -> WriteResult:
            if c_payload:
                conn.execute(self._upsert(schema.candidates, ["name"], True), c_payload)
            if self.dialect == "postgresql":  # production writers of every proxy, one at a time
                # a frozen or partitioned proxy holding the lock stalled every proxy's writes with no timeout: a wait
                # over PG_WRITE_LOCK_TIMEOUT_S fails (retried, then spooled), and the server ends a transaction left
                # idle for a minute (releasing the lock)
                conn.execute(text(f"SET LOCAL lock_timeout = '{PG_WRITE_LOCK_TIMEOUT_S}s'"))
                conn.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = '{PG_WRITE_IDLE_TIMEOUT_S}s'"))
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(b"energy-router-production")})
                # the lookups below are by key; a table grown since its last ANALYZE (a spool backlog
                # replayed in one pass) would otherwise be sequentially scanned once per 500 ids
                conn.execute(text("SET LOCAL enable_seqscan = off"))
            plan = production.plan_rows(pairs, production.stored_calls(conn, production.lookup_ids(pairs)))
            known_c = {n for (n,) in conn.execute(select(schema.candidates.c.name))}
            check_references(
                plan.runs + plan.upgrades, known_c, {q.id for q, _ in pairs} | {q.id for q in plan.queries}
            )
            if plan.queries:
                q_payload = sorted((q.model_dump() for q in plan.queries), key=lambda d: d["id"])
                conn.execute(self._upsert(schema.queries, ["id"], False), q_payload)
            if plan.runs:
                r_payload = sorted(
                    ({**r.model_dump(), "updated": now} for r in plan.runs),
                    key=lambda d: (d["query_id"], d["candidate"], d["source"]),
                )
                conn.execute(self._upsert(schema.runs, list(schema.RUN_KEY), False), r_payload)
            production.apply_upgrades(conn, plan.upgrades, now)
            if ledger:
                ledger_table.apply(conn, self.dialect, _ledger_rows(ledger, plan.stored), now)
            n_runs = len(plan.runs) + len(plan.upgrades)
            return WriteResult(len(plan.queries), n_runs, tuple(plan.reassigned), plan.skipped)

        return self._transaction(do)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "SQLStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _pairs(queries: list[Query], runs: list[Run]) -> list[tuple[Query, Run]]:
    """(query, run) pairs of a keep-first write; the two lists must match one to one."""
    if len(queries) != len(runs):
        raise BadRowError(f"keep_first: {len(queries)} queries for {len(runs)} runs (one query per run)")
    for i, (q, r) in enumerate(zip(queries, runs)):
        if r.query_id != q.id or r.source != "production" or q.source != "production":
            raise BadRowError(
                f"keep_first: runs row {i} (query_id={r.query_id!r}) is not the production run of queries row {i}"
            )
    return list(zip(queries, runs))


def _ledger_rows(ledger: Sequence[dict[str, Any] | None], stored: list[tuple[int, bool]]) -> list[dict[str, Any]]:
    """The ledger increments of the stored runs (a run that is not a new request adds no request)."""
    out = []
    for i, new in stored:
        e = ledger[i] if i < len(ledger) else None
        if e is not None:
            out.append(e if new or not e["requests"] else {**e, "requests": 0})
    return out


def _chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def open_store(url: str, *, create: bool = True) -> SQLStore:
    """Open the table at ``url``, creating it unless ``create=False`` (then a database, or SQLite file,
    that holds no table yet is refused with :class:`TableError`: what read-only commands use). An
    existing table of an earlier release of the schema version gets its missing columns either way."""
    return SQLStore(url, create=create)


def check_same_queries(conn: Any, q_rows: Sequence[Query]) -> None:
    """Raise :class:`~.rows.BadRowError` for a query whose id the table already holds for another query (another
    text or task): a query id names one query, and an upsert would re-attach the stored runs of the old query to
    the new text. Writing the same query again (an import run twice, a resumed tournament) is allowed."""
    by_id = {q.id: (i, q) for i, q in enumerate(q_rows)}
    cols = (schema.queries.c.id, schema.queries.c.text_hash, schema.queries.c.task)
    for chunk in _chunks(sorted(by_id), 500):
        for qid, h, task in conn.execute(select(*cols).where(schema.queries.c.id.in_(chunk))):
            i, q = by_id[qid]
            if h != q.text_hash or task != q.task:
                what = f"field 'task' = {q.task!r}, stored {task!r}" if h == q.text_hash else "its text differs"
                err = BadRowError(
                    f"queries[{i}] (id {qid!r}): the table holds another query under this id ({what}); "
                    "not written (give the new query another id)"
                )
                err.index = i  # the caller may name the file and line of queries[i]
                raise err
