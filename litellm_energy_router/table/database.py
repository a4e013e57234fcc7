"""The database under a table: the URL check (:func:`check_table_url`), the SQLite engine (WAL mode,
busy timeout in ms, ``BEGIN IMMEDIATE`` for writers), the upgrade of a table made by an earlier release
(missing nullable columns and indexes), which database errors a write retries, and :class:`TableError`.

:class:`~.store.SQLStore` uses these; :mod:`.store` re-exports :class:`TableError` and
:func:`check_table_url`.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError

from litellm_energy_router.errors import UserError
from litellm_energy_router.redact import redact_url
from litellm_energy_router.table import schema


class TableError(UserError, RuntimeError):
    """The table cannot be used (unreachable, newer schema, unsupported URL)."""


def _is_retryable(err: DBAPIError) -> bool:
    msg = str(err.orig).lower() if err.orig is not None else str(err).lower()
    return any(
        s in msg for s in ("database is locked", "deadlock detected", "could not serialize", "busy", "lock timeout")
    )


def _add_missing_columns(conn: Any) -> None:
    """Add the nullable columns, and the indexes, that a table made by an earlier release of this schema
    version lacks (``create_all`` creates missing tables only). On PostgreSQL the index build locks
    writes to that table for its duration (once, at the first start of the newer release)."""
    from sqlalchemy import inspect

    insp = inspect(conn)
    for table in schema.metadata.sorted_tables:
        have = {c["name"] for c in insp.get_columns(table.name)}
        for col in table.columns:
            if col.name not in have and col.nullable:
                ddl = col.type.compile(dialect=conn.dialect)
                conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {ddl}'))
        indexed = {ix["name"] for ix in insp.get_indexes(table.name)}
        for ix in sorted(table.indexes, key=lambda i: str(i.name)):
            if ix.name not in indexed:
                ix.create(conn, checkfirst=True)


def _sqlite_engine(url: str) -> Engine:
    _create_private(make_url(url).database)
    engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the lock up front: a deferred transaction that upgrades to a write can fail
        # with SQLITE_BUSY in WAL mode without waiting on the busy handler.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("er_write") else "BEGIN")

    return engine


def _create_private(path: str | None) -> None:
    """Create a new SQLite file 0600 (SQLite gives its ``-wal`` and ``-shm`` files the same mode): it holds key hashes,
    aliases, the ledger and, with ``privacy.store_text``, the prompts; sqlite3 alone creates it 0644. An existing file
    keeps the mode its owner gave it."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600))
    except OSError:  # there already; or a missing directory, no permission: sqlite3 says so when it connects
        pass


def check_table_url(url: str) -> URL:
    """``url`` parsed, when it names a table this package can open (``sqlite:///relative.db``,
    ``sqlite:////absolute.db``, ``postgresql+psycopg://...``); else :class:`TableError`, one line naming it."""
    try:
        parsed = make_url(url)
    except Exception:
        raise TableError(
            f"table url {redact_url(url)!r}: not a valid SQLAlchemy URL (e.g. sqlite:///file.db or "
            "postgresql+psycopg://host/db)"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise TableError(f"table url {redact_url(url)!r}: unsupported backend {backend!r} (use sqlite or postgresql)")
    if backend == "sqlite" and (parsed.host or parsed.username or parsed.port):
        raise TableError(
            f"table url {redact_url(url)!r}: a SQLite URL has three slashes before a relative path "
            f"(sqlite:///{parsed.host}{'/' + parsed.database if parsed.database else ''}) and four before "
            "an absolute one"
        )
    return parsed
