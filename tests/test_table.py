from __future__ import annotations

import pytest
from sqlalchemy import text

from litellm_energy_router.table import BadRowError, Candidate, Run, TableError, make_query, open_store, schema


def _seed(store):
    store.write(
        [make_query("q1", "arc", "What is 2+2?"), make_query("q2", "arc", "Capital of France?")],
        [
            {
                "query_id": "q1",
                "candidate": "small",
                "source": "tournament",
                "score": 1,
                "energy_j": 10.0,
                "latency_s": 0.5,
            },
            {
                "query_id": "q1",
                "candidate": "big",
                "source": "tournament",
                "score": 1,
                "energy_j": 80.0,
                "latency_s": 1.5,
            },
            {
                "query_id": "q2",
                "candidate": "small",
                "source": "tournament",
                "score": 0,
                "energy_j": 12.0,
                "latency_s": 0.7,
            },
        ],
        candidates=[{"name": "small", "params_b": 7}, {"name": "big", "params_b": 70}],
    )


def _snapshot(store):
    return sorted((r["query_id"], r["candidate"], r["source"], r["score"], r["energy_j"]) for r in store.iter_runs())


def test_upsert_is_idempotent_and_updates(any_url):
    store = open_store(any_url)
    _seed(store)
    _seed(store)
    assert store.count_runs() == 3
    store.write(runs=[{"query_id": "q2", "candidate": "small", "source": "tournament", "score": 1, "energy_j": 11.0}])
    assert store.count_runs() == 3
    row = next(r for r in store.iter_runs() if r["query_id"] == "q2")
    assert (row["score"], row["energy_j"]) == (1.0, 11.0)
    # same pair, another source: a new row
    store.write(runs=[{"query_id": "q2", "candidate": "small", "source": "production", "energy_j": 9.0}])
    assert store.count_runs() == 4
    assert store.schema_version() == schema.SCHEMA_VERSION
    store.close()


def test_a_query_id_holding_another_query_is_refused_and_nothing_touched(any_url):
    """An upsert of a query whose id the table holds for another text or task would re-attach the stored runs to it:
    refused naming the id, the stored query and its runs unchanged; the same query again is fine."""
    store = open_store(any_url)
    _seed(store)
    before = _snapshot(store)
    run = {"query_id": "q1", "candidate": "small", "source": "tournament", "score": 0}
    for q, what in (
        (make_query("q1", "arc", "Something else entirely"), "its text differs"),
        (make_query("q1", "gsm8k", "What is 2+2?"), "field 'task' = 'gsm8k', stored 'arc'"),
    ):
        with pytest.raises(BadRowError, match=rf"^queries\[1\] \(id 'q1'\): the table holds another query .*{what}"):
            store.write([make_query("q9", "arc", "new"), q], [run])
    assert _snapshot(store) == before
    assert {(r["query_id"], r["task"], r["text"]) for r in store.iter_runs()} == {
        ("q1", "arc", "What is 2+2?"),
        ("q2", "arc", "Capital of France?"),
    }
    store.write([make_query("q1", "arc", "What is 2+2?")], [run])  # the same query: an idempotent re-import
    store.close()


def test_stats_per_candidate_and_task(any_url):
    store = open_store(any_url)
    _seed(store)
    by_cand = {s.candidate: s for s in store.stats()}
    assert by_cand["small"].rows == 2 and by_cand["small"].accuracy == pytest.approx(0.5)
    assert by_cand["small"].mean_energy_j == pytest.approx(11.0)
    assert by_cand["big"].mean_latency_s == pytest.approx(1.5)
    assert {(s.task, s.candidate) for s in store.stats(by_task=True)} == {("arc", "small"), ("arc", "big")}
    store.close()


def test_one_outlier_moves_the_mean_not_the_median(any_url):
    store = open_store(any_url)
    qs = [make_query(f"o{i}", "arc", f"q{i}") for i in range(20)]
    runs = [
        {
            "query_id": f"o{i}",
            "candidate": "small",
            "source": "tournament",
            "score": 1,
            "energy_j": 24071.0 if i == 0 else 30.0 + i,
            "latency_s": 1.0,
        }
        for i in range(20)
    ]
    store.write(qs, runs, candidates=[{"name": "small", "params_b": 7}])
    s = {x.candidate: x for x in store.stats()}["small"]
    assert s.mean_energy_j > 1000 and s.median_energy_j == pytest.approx(40.5)
    assert s.p95_energy_j == pytest.approx(
        float(__import__("numpy").percentile([24071.0] + [30.0 + i for i in range(1, 20)], 95))
    )
    assert s.median_latency_s == s.p95_latency_s == 1.0
    by_task = store.stats(by_task=True, sources=["tournament"])
    assert by_task[0].median_energy_j == pytest.approx(40.5)
    store.close()


def test_read_only_open_refuses_a_missing_table(tmp_path):
    url = f"sqlite:///{tmp_path / 'typo.db'}"
    with pytest.raises(TableError, match="no such database file"):
        open_store(url, create=False)
    assert not (tmp_path / "typo.db").exists()
    open_store(url).close()
    open_store(url, create=False).close()  # an existing table opens
    with pytest.raises(TableError, match="three slashes before a relative path"):
        open_store("sqlite://energy_router_demo.db")


@pytest.mark.parametrize(
    "bad, field, fragment",
    [
        ({"energy_j": -1.0}, "energy_j", "greater than or equal to 0"),
        ({"score": 1.5}, "score", "less than or equal to 1"),
        ({"score": -0.1}, "score", "greater than or equal to 0"),
        ({"candidate": "nobody"}, "candidate", "unknown candidate"),
        ({"query_id": "q-missing"}, "query_id", "unknown query"),
        ({"energy_method": "NVML counter!"}, "energy_method", "should match pattern"),
        ({"source": "elsewhere"}, "source", "tournament"),
    ],
)
def test_bad_rows_rejected_and_nothing_touched(any_url, bad, field, fragment):
    store = open_store(any_url)
    _seed(store)
    before = _snapshot(store)
    good = {"query_id": "q2", "candidate": "big", "source": "tournament", "score": 1.0, "energy_j": 70.0}
    batch = [good, {**good, "query_id": "q1", "score": 0.0, **bad}]
    with pytest.raises(BadRowError) as ei:
        store.write([make_query("q3", "arc", "new query")], batch)
    msg = str(ei.value)
    assert "\n" not in msg
    assert "runs row 1" in msg and f"field '{field}'" in msg and fragment in msg
    assert _snapshot(store) == before  # the good row of the batch was not written either
    assert "q3" not in {r["query_id"] for r in store.iter_runs()}
    store.close()


def test_newer_schema_is_refused(sqlite_url):
    store = open_store(sqlite_url)
    with store.engine.begin() as c:
        c.execute(text("UPDATE er_meta SET value='99' WHERE key='schema_version'"))
    store.close()
    with pytest.raises(TableError, match="schema_version 99 is newer"):
        open_store(sqlite_url)


def test_sqlite_uses_wal(sqlite_url):
    store = open_store(sqlite_url)
    with store.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    store.close()


def test_unsupported_url():
    with pytest.raises(TableError, match="unsupported backend 'mysql'"):
        open_store("mysql://localhost/x")


def test_query_hash_only_when_text_not_stored():
    q = make_query("p1", "chat", "secret prompt \ud800", store_text=False, salt="s")
    assert q.text is None and len(q.text_hash) == 64
    assert Run(query_id="p1", candidate="c", source="production").score is None


def test_a_table_from_before_grade_note_gains_the_column(tmp_path):
    """A nullable column added within schema version 1 is added when an older table is opened."""
    import sqlite3

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    store = open_store(url)
    store.write(
        candidates=[Candidate(name="c")],
        queries=[make_query("q1", "mmlu", "x")],
        runs=[Run(query_id="q1", candidate="c", source="tournament", score=1.0)],
    )
    store.close()
    with sqlite3.connect(path) as db:  # as an earlier release made it: no grade_note
        db.execute("ALTER TABLE er_runs DROP COLUMN grade_note")
    store = open_store(url)
    assert [r["grade_note"] for r in store.iter_runs()] == [None]
    store.write(runs=[Run(query_id="q1", candidate="c", source="tournament", score=0.0, grade_note="n")])
    assert [(r["score"], r["grade_note"]) for r in store.iter_runs()] == [(0.0, "n")]
    store.close()
