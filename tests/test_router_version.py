"""``er_runs.router_version``: a table made before the column existed gains it (and its index) when a
store opens it, on SQLite and PostgreSQL; the version of the checkpoint that decided reaches the
production row through a real ``litellm.Router`` + routing strategy + energy callback; off-policy
evaluation reports and separates rows by logging version."""

from __future__ import annotations

import asyncio
import time

import litellm
import pytest
from litellm_energy_router.training.ope import estimate_policy, evaluate_checkpoint_on_log, logged_rows, version_counts
from router_fixtures import loop_settings, planted_rows, pool_deployments
from sqlalchemy import create_engine, inspect, text

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.knob import Knob
from litellm_energy_router.litellm_glue.callback import EnergyLogger
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy
from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.table import Run, open_store, schema

pytestmark = pytest.mark.usefixtures("fresh_litellm_callbacks")


def _strip_router_version(url: str) -> None:
    """Make the table look like one written by the release before ``router_version``."""
    eng = create_engine(url)
    with eng.begin() as conn:
        conn.execute(text("DROP INDEX ix_er_runs_router_version"))
        conn.execute(text("ALTER TABLE er_runs DROP COLUMN router_version"))
    eng.dispose()


def _has_column_and_index(url: str) -> tuple[bool, bool]:
    eng = create_engine(url)
    with eng.connect() as conn:
        insp = inspect(conn)
        cols = {c["name"] for c in insp.get_columns("er_runs")}
        idx = {i["name"]: i["column_names"] for i in insp.get_indexes("er_runs")}
    eng.dispose()
    return "router_version" in cols, idx.get("ix_er_runs_router_version") == ["router_version"]


def test_an_old_table_gains_router_version_and_its_index_and_keeps_its_rows(any_url):
    cands, queries, runs = planted_rows(6, prefix="old")
    store = open_store(any_url)
    store.write(queries, runs, candidates=cands)
    store.close()
    _strip_router_version(any_url)
    assert _has_column_and_index(any_url) == (False, False)

    store = open_store(any_url)  # the migration runs here
    try:
        assert _has_column_and_index(any_url) == (True, True)
        assert store.schema_version() == schema.SCHEMA_VERSION == 1  # additive: no version bump
        old = list(store.iter_runs())
        assert len(old) == len(runs) and all(r["router_version"] is None for r in old)
        q = queries[0].model_copy(update={"id": "prod-c1", "source": "production"})
        r = Run(
            **{
                **runs[0],
                "query_id": q.id,
                "source": "production",
                "call_id": "c1",
                "propensity": 0.9,
                "status": "success",
                "router_version": "v-new",
            }
        )
        store.write([q], [r], keep_first=True)
        new = [x for x in store.iter_runs() if x["call_id"] == "c1"]
        assert [x["router_version"] for x in new] == ["v-new"]
        assert [x.router_version for x in store.runs_for_call("c1")] == ["v-new"]
    finally:
        store.close()
    open_store(any_url).close()  # opening a migrated table again changes nothing
    assert _has_column_and_index(any_url) == (True, True)


@pytest.mark.slow
@pytest.mark.litellm_integration
def test_router_version_reaches_the_row_through_router_strategy_and_callback(tmp_path, sqlite_url, planted_ckpt):
    version = read_manifest(resolve(planted_ckpt)).version
    backend = LocalBackend(delay_s=0.0).start()
    try:
        s = loop_settings(planted_ckpt, sqlite_url, tmp_path, router={"epsilon": 0.3})
        model_list = pool_deployments(backend)
        router = litellm.Router(model_list=model_list)
        register_strategy(router, EnergyRoutingStrategy(router, s))
        logger = EnergyLogger(s)
        litellm.callbacks = [logger]
        texts = [
            f"Give a proof about chess number {i}" if i % 2 else f"Tell me about rivers number {i}" for i in range(30)
        ]

        store = open_store(sqlite_url)

        async def go():
            out = await asyncio.gather(
                *(router.acompletion(model="pool", messages=[{"role": "user", "content": t}]) for t in texts)
            )
            ours = {r._hidden_params["litellm_call_id"] for r in out}
            # wait for this test's rows by their call ids with the loop still running, so LiteLLM's logging
            # tasks for the last requests run (a count of submitted events also counts an earlier test's
            # queued logging, and the loop closed under them before)
            deadline = time.monotonic() + 60
            while True:
                assert await asyncio.to_thread(logger.flush, 30)
                rows = [r for r in await asyncio.to_thread(lambda: list(store.iter_runs())) if r["call_id"] in ours]
                if len(rows) >= len(texts) or time.monotonic() > deadline:
                    return rows
                await asyncio.sleep(0.1)

        rows = asyncio.run(go())
        store.close()
        logger.close()
    finally:
        backend.stop()
    assert len(rows) == len(texts)
    assert {r["router_version"] for r in rows} == {version}
    assert all(0 < r["propensity"] <= 1 for r in rows)
    assert any(r["propensity"] < 0.9 for r in rows)  # exploration on: some choices were the explored ones


def _logged(version, candidate, score, p):
    return {
        "source": "production",
        "status": "success",
        "candidate": candidate,
        "propensity": p,
        "score": score,
        "energy_j": 2.0 if candidate == "small" else 20.0,
        "router_version": version,
        "text": "q",
    }


def test_ope_counts_and_separates_logging_versions():
    rows = [_logged("v1", "small", 1.0, 0.9) for _ in range(6)] + [_logged("v2", "large", 0.0, 0.5) for _ in range(4)]
    rows += [_logged(None, "small", 0.0, 0.5) for _ in range(2)]
    assert version_counts(rows) == {"v1": 6, "v2": 4, "unknown": 2}
    pe = estimate_policy(rows, ["small"] * len(rows), ["small", "large"])
    assert pe.logging_versions == {"v1": 6, "v2": 4, "unknown": 2}
    assert pe.by_version["v1"]["accuracy_snips"].value == pytest.approx(1.0)
    assert pe.by_version["unknown"]["accuracy_snips"].value == pytest.approx(0.0)
    assert (
        pe.by_version["v2"]["accuracy_snips"].value != pe.by_version["v2"]["accuracy_snips"].value
    )  # nan: never agrees
    assert "v1 (6 rows)" in "\n".join(pe.lines("x"))
    assert pe.as_dict()["by_version"]["v1"]["accuracy_snips"]["value"] == pytest.approx(1.0)
    single = estimate_policy(rows[:6], ["small"] * 6, ["small", "large"])
    assert single.by_version == {} and single.logging_versions == {"v1": 6}


def test_ope_on_a_checkpoint_keeps_only_the_chosen_logging_versions(planted_ckpt):
    rows = [
        {**_logged("v1" if i % 2 else "v2", "small", 1.0, 0.5), "text": f"Tell me about rivers {i}", "prompt_tokens": 5}
        for i in range(10)
    ]
    assert logged_rows(rows) == rows
    both = evaluate_checkpoint_on_log(None, planted_ckpt, knob=Knob(**{"lambda": 0.05}), rows=rows)
    only = evaluate_checkpoint_on_log(
        None, planted_ckpt, knob=Knob(**{"lambda": 0.05}), rows=rows, logging_versions=["v1"]
    )
    assert both.n == 10 and both.logging_versions == {"v1": 5, "v2": 5}
    assert only.n == 5 and only.logging_versions == {"v1": 5}


def test_stats_by_router_version_in_the_store_and_the_cli(sqlite_url):
    import os
    import subprocess
    import sys

    cands, queries, runs = planted_rows(4, prefix="s")
    store = open_store(sqlite_url)
    store.write(queries, runs, candidates=cands)
    prod = []
    for i, v in enumerate(["v1", "v1", "v2"]):
        q = queries[i].model_copy(update={"id": f"prod-c{i}", "source": "production"})
        prod.append(
            (
                q,
                Run(
                    **{
                        **runs[3 * i],
                        "query_id": q.id,
                        "source": "production",
                        "call_id": f"c{i}",
                        "status": "success",
                        "router_version": v,
                    }
                ),
            )
        )
    store.write([q for q, _ in prod], [r for _, r in prod], keep_first=True)
    st = store.stats(by_version=True, sources=["production"])
    store.close()
    assert sorted((s.candidate, s.router_version, s.rows) for s in st) == [("small", "v1", 2), ("small", "v2", 1)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "litellm_energy_router.cli",
            "table",
            "stats",
            "--db",
            sqlite_url,
            "--by-version",
            "--by-task",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any("v1" in ln and "small" in ln for ln in lines) and any("v2" in ln for ln in lines), r.stdout
