"""The energy and carbon ledger (table/ledger.py): updated in the row's transaction, exactly once per stored
run, on SQLite and PostgreSQL; concurrent writers sharing one PostgreSQL never lose or double an increment;
an older table gains the new columns and the ledger table; ``energy-router report``."""

from __future__ import annotations

import json
import threading

import pytest
from sqlalchemy import inspect, text
from typer.testing import CliRunner

from litellm_energy_router.table import Query, Run, ledger, open_store, text_hash
from litellm_energy_router.table.production import query_id_for

T0 = 1_764_936_000.0  # 2025-12-05 12:00 UTC
ATTRS = {
    "key_hash": "a" * 64,
    "key_alias": "svc-a",
    "team": "team-1",
    "team_alias": "Search",
    "user_id": "u1",
    "model_group": "chat",
    "deployment": "dep-small",
}


def production(
    call_id: str,
    *,
    candidate="small",
    joules=10.0,
    method="nvml_counter",
    est=12.0,
    ref=40.0,
    co2e=0.5,
    t=T0,
    attrs=ATTRS,
    status="success",
):
    q = Query(id=query_id_for(call_id), task="production", text_hash=text_hash(call_id), source="production", created=t)
    r = Run(
        query_id=q.id,
        candidate=candidate,
        source="production",
        energy_j=joules,
        energy_method=method,
        call_id=call_id,
        status=status,
        created=t + 1,
        prompt_tokens=5,
        completion_tokens=7,
        energy_estimate_j=est,
        energy_reference_j=ref,
        co2e_g=co2e,
    )
    e = ledger.entry(
        attrs,
        t_s=t + 1,
        request=True,
        prompt_tokens=5,
        completion_tokens=7,
        joules=joules,
        measured=method != "estimate",
        router_estimate_j=est,
        reference_j=ref,
        co2e_g=co2e,
    )
    return q, r, e


def write(store, items):
    store.write(
        queries=[q for q, _, _ in items],
        runs=[r for _, r, _ in items],
        candidates=[{"name": "small"}, {"name": "big"}],
        keep_first=True,
        ledger=[e for _, _, e in items],
    )


def test_ledger_sums_once_per_stored_run(any_url):
    store = open_store(any_url)
    items = [production(f"c{i}") for i in range(5)] + [production("e1", method="estimate", joules=3.0)]
    items.append(production("other", attrs={**ATTRS, "team": "team-2", "team_alias": "Ads"}, t=T0 + 86400))
    write(store, items)
    write(store, items)  # a replay (spool after a lost acknowledgement): the rows and the ledger unchanged
    # a failed attempt then its successful retry of the same request: energy of both, one request
    fail = production("retry", status="failure", joules=2.0)
    write(store, [fail])
    ok = production("retry", joules=9.0)
    write(store, [(ok[0], ok[1].model_copy(update={"created": T0 + 5}), ok[2])])
    by_team = {r["team"]: r for r in store.ledger("team")}
    t1 = by_team["team-1"]
    assert t1["label"] == "Search"
    assert t1["requests"] == 7 and t1["requests_measured"] == 7 and t1["requests_estimated"] == 1
    assert t1["joules_measured"] == pytest.approx(5 * 10.0 + 2.0 + 9.0) and t1["joules_estimated"] == pytest.approx(3.0)
    assert t1["prompt_tokens"] == 8 * 5 and t1["completion_tokens"] == 8 * 7
    assert t1["joules_saved"] == pytest.approx(8 * 28.0) and t1["co2e_g"] == pytest.approx(8 * 0.5)
    assert by_team["team-2"]["requests"] == 1
    assert [r["day"] for r in store.ledger("day")] == ["2025-12-05", "2025-12-06"]
    assert [r["day"] for r in store.ledger("day", since="2025-12-06")] == ["2025-12-06"]
    assert store.ledger("key")[0]["label"] == "svc-a"
    rows = {r["call_id"]: r for r in store.iter_runs()}
    assert (
        rows["c0"]["co2e_g"] == 0.5
        and rows["c0"]["energy_estimate_j"] == 12.0
        and rows["c0"]["energy_reference_j"] == 40.0
    )
    store.close()


def test_replays_after_a_retry_or_a_move_count_nothing(any_url):
    """The spool may replay a chunk again (a crash between the table's commit and the offset's save, a lost offset
    file): a failed attempt replayed after its retry replaced it, and a row that was moved off a taken call id
    (another text under it), change neither the runs nor the ledger (each was stored again before: a `dup-` row and
    one more request per replay)."""
    store = open_store(any_url)
    fail = production("retry", status="failure", joules=2.0)
    ok = production("retry", joules=9.0)
    ok = (ok[0], ok[1].model_copy(update={"created": T0 + 5}), ok[2])
    taken = production("taken")
    other = production("taken", t=T0 + 10)
    other = (other[0].model_copy(update={"text_hash": text_hash("another text")}), *other[1:])
    write(store, [fail, ok, taken, other])

    def state():
        runs = sorted((r["call_id"], r["status"], r["created"]) for r in store.iter_runs())
        return runs, [(r["team"], r["requests"], r["joules_measured"]) for r in store.ledger("team")]

    before = state()
    assert len(before[0]) == 3 and sum(c.startswith("dup-") for c, _, _ in before[0]) == 1
    for _ in range(2):
        write(store, [fail, ok, taken, other])  # the whole chunk again
        write(store, [fail])  # or the failed attempt alone
        write(store, [other])  # or the moved row alone
        assert state() == before
    store.close()


def test_concurrent_writers_on_postgresql_never_lose_or_double(pg_url):
    """Four writers (own engines, as four proxies) add 4 x 40 batches of 10 rows, all to the same ledger keys."""
    open_store(pg_url).close()
    errors = []

    def writer(w: int) -> None:
        store = open_store(pg_url)
        try:
            for b in range(40):
                write(store, [production(f"w{w}-b{b}-{i}", joules=1.0 + i, t=T0 + (i % 2) * 86400) for i in range(10)])
                if b % 10 == 0:  # and replays of an earlier batch: nothing added
                    write(
                        store, [production(f"w{w}-b0-{i}", joules=1.0 + i, t=T0 + (i % 2) * 86400) for i in range(10)]
                    )
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        finally:
            store.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store = open_store(pg_url)
    days = {r["day"]: r for r in store.ledger("day")}
    assert store.count_runs() == 1600
    assert sum(r["requests"] for r in days.values()) == 1600
    assert days["2025-12-05"]["joules_measured"] == pytest.approx(4 * 40 * sum(1.0 + i for i in range(0, 10, 2)))
    assert days["2025-12-06"]["joules_measured"] == pytest.approx(4 * 40 * sum(1.0 + i for i in range(1, 10, 2)))
    store.close()


def test_older_table_gains_columns_and_ledger(sqlite_url):
    store = open_store(sqlite_url)
    with store.engine.begin() as c:
        for col in ("energy_estimate_j", "energy_reference_j", "co2e_g", "site"):
            c.execute(text(f'ALTER TABLE er_runs DROP COLUMN "{col}"'))
        c.execute(text("DROP TABLE er_ledger"))
    store.close()
    store = open_store(sqlite_url)
    insp = inspect(store.engine)
    assert {"energy_estimate_j", "co2e_g", "site"} <= {c["name"] for c in insp.get_columns("er_runs")}
    assert "er_ledger" in insp.get_table_names()
    write(store, [production("x")])
    assert store.ledger("team")[0]["requests"] == 1
    store.close()


def test_report_command(sqlite_url, tmp_path):
    from litellm_energy_router.cli import app

    store = open_store(sqlite_url)
    write(
        store,
        [production(f"c{i}") for i in range(3)] + [production("d", attrs={**ATTRS, "team": "team-2"}, t=T0 + 86400)],
    )
    store.close()
    run = CliRunner().invoke
    r = run(app, ["report", "--db", sqlite_url, "--by", "team", "--format", "json"])
    assert r.exit_code == 0, r.output
    got = {d["team"]: d for d in json.loads(r.output)}
    assert got["team-1"]["requests"] == 3 and got["team-1"]["saved_pct"] == pytest.approx(70.0)
    r = run(app, ["report", "--db", sqlite_url, "--by", "day", "--format", "csv", "--since", "2025-12-06"])
    assert r.exit_code == 0 and r.output.splitlines()[0].startswith("day,") and len(r.output.splitlines()) == 2
    png = tmp_path / "ledger.png"
    r = run(app, ["report", "--db", sqlite_url, "--by", "model", "--plot", str(png)])
    assert r.exit_code == 0 and "chat" in r.output and "J measured" in r.output
    assert png.stat().st_size > 5000
    r = run(app, ["report", "--db", sqlite_url, "--by", "planet"])
    assert r.exit_code == 2 and "--by 'planet'" in r.output
    r = run(app, ["report", "--db", sqlite_url, "--until", "2026-13-01"])
    assert r.exit_code == 2 and "--until '2026-13-01'" in r.output and "--since" not in r.output
    r = run(app, ["report", "--db", sqlite_url, "--since", "2026-02-01", "--until", "2026-01-01"])
    assert r.exit_code == 2 and "--since 2026-02-01 is after --until 2026-01-01" in r.output


def test_a_failed_retry_of_a_failed_run_still_adds_its_joules(any_url):
    """LiteLLM retries a request on the same candidate and it fails again: the retry's joules were spent and reach
    the ledger (no second request; they were dropped), the run holds the latest attempt, and a replay of either
    attempt adds nothing."""
    store = open_store(any_url)
    first = production("flaky", status="failure", joules=4.0)
    write(store, [first])
    again = production("flaky", status="failure", joules=6.0)
    retry = (again[0], again[1].model_copy(update={"created": T0 + 3}), again[2])
    write(store, [retry])
    write(store, [retry])  # the same row again (a spool replay): skipped, nothing added
    write(store, [first])  # the first attempt replayed late: older than the run, skipped
    (t1,) = store.ledger("team")
    assert t1["requests"] == 1 and t1["joules_measured"] == pytest.approx(4.0 + 6.0)
    assert [r["energy_j"] for r in store.iter_runs()] == [6.0]
    store.close()


def test_another_candidates_failed_attempt_arriving_after_the_retry_counts_its_joules(any_url):
    """LiteLLM tried ``big`` (failed, 2 J), then ``small`` (succeeded, 9 J); the failed attempt's row reaches the writer
    last (its event was slower): its joules join the same request, as they do in order (it was skipped as a replay),
    and a replay of it adds nothing."""
    store = open_store(any_url)
    fail = production("late", candidate="big", status="failure", joules=2.0)
    ok = production("late", joules=9.0)
    ok = (ok[0], ok[1].model_copy(update={"created": T0 + 5}), ok[2])
    write(store, [ok])
    for _ in range(2):
        write(store, [fail])
        (t1,) = store.ledger("team")
        assert (t1["requests"], t1["joules_measured"]) == (1, pytest.approx(11.0))
        assert sorted((r["candidate"], r["status"]) for r in store.iter_runs()) == [
            ("big", "failure"),
            ("small", "success"),
        ]
    store.close()


def test_report_shows_no_carbon_as_unknown_not_zero(sqlite_url):
    """Without carbon settings no request is priced in grams: the table showed gCO2e 0.000 (and an empty panel)."""
    from litellm_energy_router.cli import app

    store = open_store(sqlite_url)
    write(store, [production(f"c{i}", co2e=None) for i in range(2)])
    store.close()
    r = CliRunner().invoke(app, ["report", "--db", sqlite_url, "--by", "team"])
    assert r.exit_code == 0 and "carbon.sites not configured" in r.output and "0.000" not in r.output, r.output
    store = open_store(sqlite_url)
    write(store, [production("c9")])  # one priced request: grams shown
    store.close()
    r = CliRunner().invoke(app, ["report", "--db", sqlite_url, "--by", "team"])
    assert r.exit_code == 0 and "carbon.sites not configured" not in r.output and "0.500" in r.output, r.output
