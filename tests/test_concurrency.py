"""4 processes x 5,000 rows into one table: nothing lost, nothing raised (SQLite WAL and PostgreSQL)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from litellm_energy_router.table import make_query, open_store

PROCS, ROWS, BATCH = 4, 5000, 10


def _writer(url: str, proc: int, errors) -> None:
    try:
        store = open_store(url)  # every process races to create the schema too
        # all processes upsert the same shared candidate and query (contended keys) ...
        store.write(
            [make_query("shared", "t", "shared query")], candidates=[{"name": "shared-cand"}, {"name": f"c{proc}"}]
        )
        for start in range(0, ROWS, BATCH):
            ids = range(start, start + BATCH)
            queries = [make_query(f"p{proc}-{i}", "t", f"query {proc} {i}") for i in ids]
            runs = [
                {
                    "query_id": f"p{proc}-{i}",
                    "candidate": f"c{proc}",
                    "source": "tournament",
                    "score": i % 2,
                    "energy_j": float(i),
                }
                for i in ids
            ]
            # ... and each batch also rewrites a contended row
            runs.append(
                {"query_id": "shared", "candidate": "shared-cand", "source": "production", "energy_j": float(proc)}
            )
            store.write(queries, runs)
        store.close()
    except BaseException as e:  # noqa: BLE001
        errors.put(f"process {proc}: {type(e).__name__}: {e}")


@pytest.mark.slow
def test_four_processes_lose_nothing(any_url):
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(any_url, p, errors)) for p in range(PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    errs = []
    while not errors.empty():
        errs.append(errors.get())
    assert errs == []
    assert all(p.exitcode == 0 for p in procs)
    store = open_store(any_url)
    rows = list(store.iter_runs())
    per = {}
    for r in rows:
        per[r["candidate"]] = per.get(r["candidate"], 0) + 1
    assert per == {**{f"c{p}": ROWS for p in range(PROCS)}, "shared-cand": 1}
    assert len({(r["query_id"], r["candidate"], r["source"]) for r in rows}) == PROCS * ROWS + 1
    # every value arrived intact
    assert sum(r["energy_j"] for r in rows if r["candidate"] != "shared-cand") == PROCS * sum(range(ROWS))
    store.close()


def test_a_query_id_another_uncommitted_write_holds_is_still_refused(pg_url):
    """PostgreSQL, READ COMMITTED: an import's transaction holds query gsm8k-1 (uncommitted) while a tournament writes
    gsm8k-1 with another text. The check read before the upsert did not see it; the upsert waited, then overwrote the
    import's text and task (its runs now on another question), both writes succeeding. Now the second is refused."""
    import threading
    import time

    from litellm_energy_router.table.rows import BadRowError, Candidate, Run

    s0 = open_store(pg_url)
    s0.add_candidates([{"name": "small"}, {"name": "big"}])
    s0.close()
    started, results = threading.Event(), {}

    def importer():
        s = open_store(pg_url)

        def batches():
            q = [make_query("gsm8k-1", "math", "what is 2+2?")]
            yield [Candidate(name="small")], q, [Run(query_id="gsm8k-1", candidate="small", source="import", score=1.0)]
            started.set()
            time.sleep(2)  # the file's next batch: the transaction stays open
            yield [], [], []

        results["import"] = s.write_batches(batches, keep_stored=True).runs
        s.close()

    t = threading.Thread(target=importer)
    t.start()
    assert started.wait(30)
    s = open_store(pg_url)
    with pytest.raises(BadRowError, match="the table holds another query under this id"):
        s.write(
            [make_query("gsm8k-1", "code", "write fizzbuzz")],
            [{"query_id": "gsm8k-1", "candidate": "big", "source": "tournament", "score": 0.0}],
        )
    t.join(30)
    assert results["import"] == 1
    from sqlalchemy import text

    with s.engine.connect() as c:
        assert c.execute(text("select task, text from er_queries")).fetchall() == [("math", "what is 2+2?")]
    s.close()


def test_a_frozen_proxy_holding_the_production_lock_stalls_the_others_a_bounded_time(pg_url, monkeypatch):
    """A proxy frozen (SIGSTOP, a partition) inside its production write held the advisory lock every proxy's
    production writes take, with no timeout: the others' writers waited as long as it stayed frozen (about two hours
    for a host gone without a reset). Now the server ends a production write's transaction left idle, and the waits
    time out and retry."""
    import threading
    import time
    import zlib

    from sqlalchemy import text

    from litellm_energy_router.table import store as store_mod
    from litellm_energy_router.table.production import query_id_for
    from litellm_energy_router.table.rows import Run

    monkeypatch.setattr(store_mod, "PG_WRITE_LOCK_TIMEOUT_S", 1)
    monkeypatch.setattr(store_mod, "PG_WRITE_IDLE_TIMEOUT_S", 2)
    frozen = open_store(pg_url)
    frozen.add_candidates([{"name": "small"}])
    held = frozen.engine.connect()
    tx = held.begin()
    held.execute(text("SET LOCAL idle_in_transaction_session_timeout = '2s'"))  # as a frozen proxy's write set it
    held.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(b"energy-router-production")})
    safety = threading.Timer(30, lambda: tx.rollback())  # the old code would wait for this
    safety.start()
    other = open_store(pg_url)
    t0 = time.monotonic()
    qid = query_id_for("c1")
    res = other.write(
        [make_query(qid, "production", "hello", source="production")],
        [Run(query_id=qid, candidate="small", source="production", call_id="c1", status="success")],
        keep_first=True,
    )
    took = time.monotonic() - t0
    safety.cancel()
    assert res.runs == 1 and took < 15, took
    other.close()
    with pytest.raises(Exception, match="idle-in-transaction timeout"):  # the server ended the frozen one's
        held.close()
    frozen.close()
