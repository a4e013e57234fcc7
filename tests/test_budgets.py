"""Budgets per key and team (budgets.py): settings refused in one line, the multiplier's update against the
pace, spend read from the shared ledger (two writers, bounded staleness, no double count of this process's
own spend), and the hard cap through a real ``litellm.Router`` (HTTP 429, or the cheapest candidate)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from litellm import Router
from router_fixtures import CANDS, drain_litellm_logging, pool_deployments

from litellm_energy_router.budgets import (
    CHEAPEST_LAMBDA,
    Budget,
    BudgetBook,
    BudgetExceeded,
    BudgetSettings,
    elapsed_share,
)
from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.knob import Knob
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy
from litellm_energy_router.settings import ConfigError, Settings, load_settings
from litellm_energy_router.table import Query, Run, ledger, open_store, text_hash
from litellm_energy_router.table.production import query_id_for

DAY0 = 1_764_892_800.0  # 2025-12-05 00:00 UTC


def plant(
    url: str, call_id: str, joules: float, *, t: float = DAY0 + 3600, key_alias: str = "svc-a", team: str = "team-1"
) -> None:
    """One stored production run and its ledger increment (what a proxy's writer commits)."""
    attrs = {
        "key_hash": "a" * 64,
        "key_alias": key_alias,
        "team": team,
        "team_alias": None,
        "user_id": "",
        "model_group": "pool",
        "deployment": "dep-small",
    }
    q = Query(id=query_id_for(call_id), task="production", text_hash=text_hash(call_id), source="production", created=t)
    r = Run(
        query_id=q.id,
        candidate="small",
        source="production",
        energy_j=joules,
        energy_method="estimate",
        call_id=call_id,
        status="success",
        created=t,
        prompt_tokens=5,
        completion_tokens=7,
    )
    e = ledger.entry(
        attrs,
        t_s=t,
        request=True,
        prompt_tokens=5,
        completion_tokens=7,
        joules=joules,
        measured=False,
        router_estimate_j=None,
        reference_j=None,
        co2e_g=joules * 1e-4,
    )
    store = open_store(url)
    try:
        store.write(queries=[q], runs=[r], candidates=[{"name": "small"}], keep_first=True, ledger=[e])
    finally:
        store.close()


@pytest.mark.parametrize(
    "yaml_budget, field",
    [
        ("{limit: 0}", "budgets.teams.research.limit' = 0"),
        ("{limit: -5}", "budgets.teams.research.limit' = -5"),
        ("{limit: 10, unit: watts}", "budgets.teams.research.unit' = 'watts'"),
        ("{limit: 10, period: week}", "budgets.teams.research.period' = 'week'"),
        ("{limit: 10, pace: [1, 2]}", "budgets.teams.research.pace' = list"),
        ("{limit: 10, eta: -1}", "budgets.teams.research.eta' = -1"),
        ("{limit: 10, hard: true}", "unknown config key 'budgets.teams.research.hard'"),
        ("{limit: 10, unit: gco2e}", "budgets.teams.research: unit gco2e needs every deployment priced in grams"),
        # 24 finite weights whose sum is not: the pace was NaN and the budget never bound
        ("{limit: 10, pace: [" + ", ".join(["1e308"] * 24) + "]}", "budgets.teams.research.pace' = list"),
    ],
)
def test_bad_budget_is_one_line_naming_the_field(tmp_path, yaml_budget, field):
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"energy_router:\n  budgets:\n    teams:\n      research: {yaml_budget}\n")
    with pytest.raises(ConfigError) as e:
        load_settings(cfg, environ={})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(cfg)) and field in msg


def test_a_budget_that_could_never_see_its_spend_is_refused(tmp_path):
    """With the ledger off a budget reads 0 for ever: refused at load, one line, instead of never binding."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text("energy_router:\n  accounting: {ledger: false}\n  budgets:\n    keys:\n      svc-a: {limit: 10}\n")
    with pytest.raises(ConfigError, match=r"budgets.keys.svc-a: budgets read their spend from the ledger"):
        load_settings(cfg, environ={})
    cfg.write_text(
        "energy_router:\n  carbon: {default_site: lab, sites: {lab: {intensity_g_per_kwh: 350}}}\n"
        "  budgets:\n    keys:\n      svc-a: {limit: 10, unit: gco2e}\n"
    )
    assert load_settings(cfg, environ={}).budgets.keys["svc-a"].unit == "gco2e"


def test_settings_a_budget_could_never_bind_under_are_refused(tmp_path):
    """A carbon provider prices regions, it gives no deployment a site: a gCO2e budget without carbon.default_site
    counted 0 g for every deployment without one (accepted before). max_stale_s at or under refresh_s made a hard
    budget refuse between two healthy reads."""
    from litellm_energy_router.budgets import check_budget_sources

    budgets = BudgetSettings(keys={"svc": {"limit": 1.0, "unit": "gco2e", "mode": "hard"}})
    with pytest.raises(ValueError, match="budgets.keys.svc: unit gco2e needs every deployment priced in grams"):
        check_budget_sources(budgets, True, SimpleNamespace(default_site=None, provider="a-registered-provider"))
    cfg = tmp_path / "s.yaml"
    cfg.write_text("energy_router:\n  budgets: {refresh_s: 60, max_stale_s: 20, keys: {svc: {limit: 1}}}\n")
    with pytest.raises(ConfigError, match="budgets.max_stale_s = 20 must be more than budgets.refresh_s = 60"):
        load_settings(cfg, environ={})


def test_over_a_hard_cap_cheapest_is_cheapest_in_the_budget_s_unit(sqlite_url):
    """Over a hard joules budget with ``hard_action: cheapest`` the caller's ``objective: carbon`` (which the default
    policy allows) kept "cheapest" in gCO2e: a candidate in a clean site at 9x the joules was served."""
    cfg = BudgetSettings(
        keys={
            "j": {"limit": 40.0, "mode": "hard", "hard_action": "cheapest"},
            "g": {"limit": 1.0, "unit": "gco2e", "mode": "hard", "hard_action": "cheapest"},
        }
    )
    book = BudgetBook(cfg, sqlite_url, clock=lambda: DAY0 + 3600)
    book.tick()
    j, g = book.keys["j"], book.keys["g"]
    j.table, g.table = 50.0, 2.0  # both exhausted
    carbon = Knob.point(lambda_=0.1).model_copy(update={"objective": "carbon"})
    assert book.apply(carbon, [j]).objective == "joules" and book.apply(carbon, [j]).lambda_ == CHEAPEST_LAMBDA
    assert book.apply(Knob.point(lambda_=0.1), [g]).objective == "carbon"
    assert book.apply(carbon, [j, g]).objective == "joules"  # a joules cap over: no more joules than the cheapest
    book.close()


def test_a_failed_read_across_midnight_keeps_the_multiplier(sqlite_url):
    """The table down at 00:00:05: the step started the new day from 0 against yesterday's full sum, so μ jumped to
    about η (every request of the key to the cheapest model until the table came back); now μ is kept."""
    now = [DAY0 + 86400 - 600]
    book = BudgetBook(BudgetSettings(keys={"k": {"limit": 1000.0}}), sqlite_url, clock=lambda: now[0])
    st = book.keys["k"]
    up = [True]

    def read(t):  # the ledger's sum of the day: 990 of 1000 J by 23:50, on pace
        if not up[0]:
            raise OSError("connection refused")
        return {id(st): 990.0}

    book._read = read
    for _ in range(3):
        book.tick()
        now[0] += 5
    mu = st.mu
    up[0] = False
    now[0] = DAY0 + 86400 + 5
    book.tick()
    assert st.mu == mu and st.mu < 1.0
    book.close()


def test_cli_refuses_a_zero_budget_in_one_line(tmp_path, capsys, monkeypatch):
    from litellm_energy_router.cli import main

    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "s.yaml"
    cfg.write_text("energy_router:\n  budgets:\n    keys:\n      svc-a: {limit: 0, unit: gco2e}\n")
    with pytest.raises(SystemExit) as e:
        main(["table", "stats", "--config", str(cfg)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "budgets.keys.svc-a.limit' = 0" in err and str(cfg) in err, err


def test_pace_shares_follow_the_traffic_profile():
    assert elapsed_share(DAY0 + 6 * 3600, "day") == pytest.approx(0.25)
    night = [0.0] * 12 + [1.0] * 12  # no traffic expected before noon
    assert elapsed_share(DAY0 + 11 * 3600, "day", night) == 0.0
    assert elapsed_share(DAY0 + 18 * 3600, "day", night) == pytest.approx(0.5)
    assert elapsed_share(DAY0 + 12 * 3600, "month") == pytest.approx(4.5 / 31)  # 2025-12-05 noon: 4.5 of 31 days


def test_multiplier_rises_ahead_of_pace_and_decays_to_zero_behind(sqlite_url):
    now = [DAY0]
    cfg = BudgetSettings(teams={"team-1": {"limit": 1000.0, "eta": 4.0}})
    book = BudgetBook(cfg, sqlite_url, clock=lambda: now[0])
    st = book.teams["team-1"]
    base = Knob.point(lambda_=0.05)
    book.tick()
    assert st.mu == 0.0 and book.apply(base, [st]) is base
    plant(sqlite_url, "c1", 500.0)  # by 06:00 half the day's budget is spent; the pace allows a quarter
    now[0] = DAY0 + 6 * 3600
    book.tick()
    assert st.spent == pytest.approx(500.0)
    assert st.mu == pytest.approx(4.0 * (500 - 250) / 1000)
    assert book.apply(base, [st]).lambda_ == pytest.approx(0.05 + st.mu)
    now[0] = DAY0 + 9 * 3600  # closer to pace (500 of 375 at 09:00): lower
    book.tick()
    assert st.mu == pytest.approx(4.0 * (500 - 375) / 1000)
    now[0] = DAY0 + 18 * 3600  # behind pace (500 of 750): 0, the knob is the key's own
    book.tick()
    assert st.mu == 0.0 and book.apply(base, [st]) is base
    plant(sqlite_url, "c2", 200.0)  # 700 of 750 at 18:00: still behind, the underspend is banked
    book.tick()
    assert st.mu == 0.0
    plant(sqlite_url, "c3", 150.0)  # 850 of 750: ahead again
    book.tick()
    assert st.mu == pytest.approx(4.0 * (850 - 750) / 1000)
    now[0] = DAY0 + 86400 + 3600  # the next day: spend and pace from 0, μ carries over
    book.tick()
    assert st.period == "2025-12-06" and st.spent == 0.0
    assert st.mu == pytest.approx(4.0 * (850 - 750) / 1000 - 4.0 * 1000 / 24 / 1000)
    book.close()


def test_own_spend_counts_at_decision_and_once_after_the_write(sqlite_url):
    book = BudgetBook(  # pending_s 0: a charge drops at the first read after it (its row is written by then here)
        BudgetSettings(keys={"svc-a": {"limit": 100.0, "mode": "hard"}}, pending_s=0),
        sqlite_url,
        clock=lambda: DAY0 + 7200,
    )
    st = book.keys["svc-a"]
    [matched] = book.match([{"user_api_key_alias": "svc-a", "user_api_key_team_id": "team-1"}])
    assert matched is st and book.match([{"user_api_key_alias": "other"}]) == []
    book.tick()
    book.charge([st], {"joules_estimate": 60.0})  # routed here: counted before its row is written
    assert st.spent == pytest.approx(60.0)
    plant(sqlite_url, "c1", 61.0)  # its row (settled joules) reaches the ledger
    book.tick()
    assert st.spent == pytest.approx(61.0)  # the ledger's figure replaces the estimate: not counted twice
    book.charge([st], {"joules_estimate": 40.0})
    with pytest.raises(
        BudgetExceeded, match=r"^energy-router: budget keys\.svc-a exhausted: 101 of 100 J this day$"
    ) as e:
        book.apply(Knob.point(lambda_=0.0), [st])
    assert e.value.status_code == 429
    book.close()


def test_a_long_request_counts_until_its_row_can_be_in_the_ledger(sqlite_url, monkeypatch):
    """A stream of minutes: its row reaches the ledger when it ends, after several reads. Its decision-time estimate
    stays in the local spend for pending_s after the reads (it was dropped at the first one, so a capped key could
    keep long streams in flight unseen), then gives way to the ledger's figure."""
    from litellm_energy_router import budgets as budgets_mod

    now = [1000.0]
    monkeypatch.setattr(budgets_mod.time, "monotonic", lambda: now[0])
    book = BudgetBook(
        BudgetSettings(keys={"svc-a": {"limit": 100.0, "mode": "hard"}}), sqlite_url, clock=lambda: DAY0 + 7200
    )
    st = book.keys["svc-a"]
    book.tick()
    book.charge([st], {"joules_estimate": 60.0})  # the stream starts
    for _ in range(10):  # 50 s of reads while it streams: no row yet
        now[0] += 5.0
        book.tick()
    assert st.spent == pytest.approx(60.0)
    book.charge([st], {"joules_estimate": 45.0})
    with pytest.raises(BudgetExceeded):  # 105 of 100 J: the stream in flight counts
        book.apply(Knob.point(lambda_=0.0), [st])
    plant(sqlite_url, "s1", 62.0)  # the first stream ends: its row
    now[0] += 300.0
    book.tick()
    assert st.spent == pytest.approx(62.0 + 45.0)  # its estimate gave way to the row; the second still counts
    now[0] += 300.0
    book.tick()
    assert st.spent == pytest.approx(62.0) and st.local == 0.0
    book.close()


def test_a_hard_budget_with_unknown_spend_fails_closed(sqlite_url, tmp_path, monkeypatch):
    """No ledger read yet (a proxy that just started), or none that succeeded for max_stale_s (the table lost): a
    hard budget refuses (or serves the cheapest) although its known spend is under the cap; a soft one is served."""
    cfg = BudgetSettings(
        keys={
            "svc-a": {"limit": 100.0, "mode": "hard"},
            "svc-c": {"limit": 100.0, "mode": "hard", "hard_action": "cheapest"},
        },
        teams={"soft": {"limit": 100.0}},
        max_stale_s=30,
    )
    book = BudgetBook(cfg, sqlite_url, clock=lambda: DAY0 + 7200)
    a, c, soft = book.keys["svc-a"], book.keys["svc-c"], book.teams["soft"]
    knob = Knob.point(lambda_=0.1)
    with pytest.raises(
        BudgetExceeded, match=r"^energy-router: budget keys\.svc-a spend unknown \(no ledger read in the last 30 s\)"
    ):
        book.apply(knob, [a])
    assert book.apply(knob, [c]).lambda_ == CHEAPEST_LAMBDA and book.apply(knob, [soft]) is knob
    book.tick()  # a read: spend 0 of 100
    assert book.apply(knob, [a]) is knob and book.apply(knob, [c]) is knob
    book.url = f"sqlite:///{tmp_path}/no/such/dir/t.db"  # the table is lost: reads fail from now on
    book._engine.dispose()
    book._engine = None
    book.tick()
    assert book.apply(knob, [a]) is knob  # within max_stale_s of the last good read: its view holds
    later = time.monotonic() + 31
    monkeypatch.setattr("litellm_energy_router.budgets.time.monotonic", lambda: later)
    with pytest.raises(BudgetExceeded, match="spend unknown"):
        book.apply(knob, [a])
    assert book.apply(knob, [soft]) is knob
    book.close()


def test_a_hard_budget_is_refused_while_the_router_cannot_start(sqlite_url, monkeypatch):
    """The proxy filter's core cannot be built (any error: here its accounting): the pre-call hook still refuses the
    requests of a hard budget (HTTP 429; its spend is unknown) and lets the others through."""
    from litellm_energy_router.litellm_glue import core as core_mod
    from litellm_energy_router.litellm_glue.strategy import EnergyRouterFilter

    def broken(*a, **k):
        raise RuntimeError("accounting: cannot start")

    monkeypatch.setattr(core_mod, "Accounting", broken)
    s = Settings.model_validate(
        {"table": {"url": sqlite_url}, "budgets": {"keys": {"svc-a": {"limit": 1e9, "mode": "hard"}}}}
    )
    f = EnergyRouterFilter(s)
    f.start()  # logs the error; requests fail open from here, except a hard budget's
    assert f._core is None

    def pre(alias):
        data = {"metadata": {"user_api_key_alias": alias}, "messages": [{"role": "user", "content": "hi"}]}
        return asyncio.run(f.async_pre_call_hook(None, None, data, "completion"))

    with pytest.raises(BudgetExceeded, match="keys.svc-a spend unknown") as e:
        pre("svc-a")
    assert e.value.status_code == 429
    assert pre("other") is None


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_budgets import plant
    for i in range(5):
        plant({url!r}, f"b{{i}}", 7.0, team="shared")
""")


def test_two_writers_share_one_budget_within_one_refresh(pg_url, tmp_path):
    """Proxy A's view of a team budget that proxy B (another process) spends: not before A's next ledger read,
    always after the first read that starts after B's commit (the staleness bound: refresh_s + B's flush)."""
    plant(pg_url, "a0", 3.0, team="shared")  # A's own request, already in the ledger
    cfg = BudgetSettings(refresh_s=0.2, teams={"shared": {"limit": 1000.0}})
    manual = BudgetBook(cfg, pg_url, clock=lambda: DAY0 + 3600)
    manual.tick()
    assert manual.teams["shared"].spent == pytest.approx(3.0)
    live = BudgetBook(cfg, pg_url, clock=lambda: DAY0 + 3600).start()
    writer = WRITER.format(tests=str(Path(__file__).parent), url=pg_url)
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=120)
    committed = time.monotonic()
    assert manual.teams["shared"].spent == pytest.approx(3.0)  # not yet read
    manual.tick()
    assert manual.teams["shared"].spent == pytest.approx(3.0 + 5 * 7.0)
    st = live.teams["shared"]
    while not (live.read_started > committed and st.reads >= 2 and live._lock.acquire(timeout=1)):
        time.sleep(0.02)
    started, reads = live.read_started, st.reads
    live._lock.release()
    while st.reads == reads:  # the read that started after the commit has finished
        time.sleep(0.02)
    assert started > committed and st.spent == pytest.approx(3.0 + 5 * 7.0)
    live.close()
    manual.close()


# -- the hard cap through a real litellm.Router -------------------------------------------------------------


def _router(backend, s):
    ml = pool_deployments(backend)
    router = Router(model_list=ml, num_retries=2)
    strategy = EnergyRoutingStrategy(router, s)
    register_strategy(router, strategy)
    book = strategy.core.budgets
    while book.states[0].reads < 1:  # the refresher's first ledger read
        time.sleep(0.02)
    return router, strategy


@pytest.mark.litellm_integration
@pytest.mark.parametrize("action", ["refuse", "cheapest"])
def test_hard_cap_through_a_real_router(planted_ckpt, sqlite_url, action):
    plant(sqlite_url, "spent", 50.0, t=time.time(), key_alias="svc-a")  # today, over svc-a's cap of 40 J
    s = Settings.model_validate(
        {
            "router": {"checkpoint": str(planted_ckpt), "timeout_ms": 5000},
            "candidates": [{"name": c} for c in CANDS],
            "table": {"url": sqlite_url},
            "budgets": {"keys": {"svc-a": {"limit": 40.0, "mode": "hard", "hard_action": action}}},
        }
    )
    proof = [{"role": "user", "content": "Give a proof about chess number 77"}]  # only `large` solves it

    def call(key):  # LiteLLM's logging of the call runs on this loop, not on a later test's
        async def go():
            try:
                return await router.acompletion(model="pool", messages=proof, metadata={"user_api_key_alias": key})
            finally:
                await drain_litellm_logging()

        return asyncio.run(go())

    with LocalBackend() as backend:
        router, strategy = _router(backend, s)
        other = call("svc-b")
        assert other._hidden_params["model_id"] == "dep-large"  # no budget: the router's own choice
        if action == "refuse":
            with pytest.raises(Exception) as e:
                call("svc-a")
            assert getattr(e.value, "status_code", None) == 429
            assert "energy-router: budget keys.svc-a exhausted: 50 of 40 J this day" in str(e.value)
            assert backend.count("large") == 1 and backend.count("small") == 0  # nothing reached a backend
        else:
            r = call("svc-a")
            assert r._hidden_params["model_id"] == "dep-small"  # the cheapest candidate
        strategy.core.budgets.close()
        strategy.core.runtime.close()


def test_the_docs_budgets_example_is_valid_settings():
    import re

    import yaml

    text = (Path(__file__).resolve().parents[1] / "docs/accounting.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "budgets:" in b)
    s = Settings.model_validate(yaml.safe_load(block)["energy_router"])
    assert s.budgets.teams["research"].unit == "gco2e" and s.budgets.keys["svc-batch"].mode == "hard"
    assert (
        s.budgets.refresh_s == BudgetSettings().refresh_s
        and s.budgets.teams["research"].eta == Budget.model_fields["eta"].default
    )


def _lm_core(ckpt, url, limit_j):
    from litellm_energy_router.litellm_glue.core import EnergyRouterCore

    s = Settings.model_validate(
        {
            "router": {"checkpoint": str(ckpt), "timeout_ms": 30_000, "scorer": "lm", "cache_size": 0},
            "candidates": [{"name": c} for c in CANDS],
            "table": {"url": url},
            "budgets": {"keys": {"svc-a": {"limit": limit_j, "mode": "hard"}}},
        }
    )
    core = EnergyRouterCore(s)
    core.runtime.wait_ready()
    while core.budgets.states[0].reads < 1:  # the refresher's first ledger read (an empty ledger: 0 J)
        time.sleep(0.02)
    return core


def test_requests_admitted_while_others_are_scored_count_against_a_hard_cap(planted_ckpt, sqlite_url):
    """The LM scores on a thread: 8 requests of a capped key admitted together all passed the check before the
    first was decided and charged. Each now counts at the budget's typical charge while it is scored, so the cap
    admits what fits: 10 J spent, a typical 10 J per request, a 35 J cap → 3 of the 8."""
    core = _lm_core(planted_ckpt, sqlite_url, 35.0)
    book, md = core.budgets, {"metadata": {"user_api_key_alias": "svc-a"}}
    book.charge(book.match([md["metadata"]]), {"joules_estimate": 10.0})  # one earlier request of 10 J
    deps = pool_deployments(SimpleNamespace(base=lambda c: f"http://127.0.0.1:9/{c}"))
    msgs = [{"role": "user", "content": "Tell me about rivers"}]

    async def burst():
        return await asyncio.gather(
            *[core.choose(deps, msgs, request_kwargs=md) for _ in range(8)], return_exceptions=True
        )

    out = asyncio.run(burst())
    refused = [r for r in out if isinstance(r, BudgetExceeded)]
    assert len(out) - len(refused) == 3 and len(refused) == 5, out
    st = book.keys["svc-a"]
    assert st.held == 0.0 and st.local > 10.0  # every hold released; the 3 decisions charged
    book.close()
    core.runtime.close()


def test_a_request_that_fails_open_counts_at_the_typical_charge(planted_ckpt, sqlite_url, monkeypatch):
    """A request the router cannot decide (its scorer failed: LiteLLM picks) spends all the same: its budget's local
    spend grows by the typical charge until its row lands."""
    core = _lm_core(planted_ckpt, sqlite_url, 1e6)
    book, md = core.budgets, {"metadata": {"user_api_key_alias": "svc-a"}}
    book.charge(book.match([md["metadata"]]), {"joules_estimate": 10.0})

    async def broken(text):  # a stand-in for a scorer failure (the fail-open path)
        raise RuntimeError("scorer down")

    monkeypatch.setattr(core.runtime, "score", broken)
    deps = pool_deployments(SimpleNamespace(base=lambda c: f"http://127.0.0.1:9/{c}"))
    dep, decision = asyncio.run(core.choose(deps, [{"role": "user", "content": "hi"}], request_kwargs=md))
    assert dep is None and decision.fallback is not None
    assert book.keys["svc-a"].local == pytest.approx(20.0) and book.keys["svc-a"].held == 0.0
    book.close()
    core.runtime.close()


def test_a_request_s_budgets_are_matched_once(planted_ckpt, sqlite_url):
    """Its knob, its hold while scored and its charge count against the same budgets: matched once per request (three
    matches before, which a budget reload between them could split)."""
    core = _lm_core(planted_ckpt, sqlite_url, 1e6)
    book, md = core.budgets, {"metadata": {"user_api_key_alias": "svc-a"}}
    calls = []
    match = book.match
    book.match = lambda mds: calls.append(1) or match(mds)
    deps = pool_deployments(SimpleNamespace(base=lambda c: f"http://127.0.0.1:9/{c}"))
    dep, decision = asyncio.run(core.choose(deps, [{"role": "user", "content": "hi"}], request_kwargs=md))
    assert decision is not None and decision.fallback is None and len(calls) == 1
    assert book.keys["svc-a"].local > 0 and book.keys["svc-a"].held == 0.0
    book.close()
    core.runtime.close()


def test_charges_stay_while_this_process_s_writer_is_behind(sqlite_url, tmp_path):
    """A writer stalled (behind another proxy's lock, an outage: its rows not in the ledger) while the ledger reads
    kept succeeding: after pending_s the budget dropped its local charges as if their rows were read, and a hard cap
    admitted 6 x 60 J under 100 J. Charges now stay until the writer has caught up."""
    import threading

    from router_fixtures import served_row, store_with_write

    from litellm_energy_router.energy.estimate import EstimateMeter
    from litellm_energy_router.litellm_glue.callback import TableWriter
    from litellm_energy_router.settings import PrivacySettings, WriterSettings

    release = threading.Event()
    stalled = store_with_write(lambda: release.wait(30))

    book = BudgetBook(BudgetSettings(pending_s=1.0, keys={"svc": {"limit": 100.0, "mode": "hard"}}), sqlite_url)
    book.tick()
    st = book.keys["svc"]
    cfg = WriterSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.05)
    w = TableWriter(sqlite_url, EstimateMeter(), writer=cfg, privacy=PrivacySettings(), store_factory=stalled)
    try:
        book.charge([st], {"joules_estimate": 60.0})
        w.submit(served_row(1))
        deadline = time.monotonic() + 10
        while not w._inflight and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.2)  # past pending_s
        book.tick()
        assert st.local == pytest.approx(60.0)  # its row is not in the ledger: still counted
        with pytest.raises(BudgetExceeded):
            book.charge([st], {"joules_estimate": 60.0})
            book.apply(Knob.point(lambda_=0.1), [st])
    finally:
        release.set()
        w.close(timeout=10)
    time.sleep(1.2)
    book.tick()
    assert st.local == 0.0  # caught up: dropped once its row can be in the ledger
    book.close()
