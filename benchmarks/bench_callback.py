"""Cost of the EnergyLogger on the serving path, and writer throughput, measured in one run.

    python benchmarks/bench_callback.py [--events 5000] [--rows 20000] [--requests 1000] [--pg URL] [--ledger-compare]

1. **Event-loop time per request** added by the callback: the time spent inside our hooks
   (``log_pre_api_call`` + ``async_log_success_event``) on the event loop, for ``--events`` events
   whose ``kwargs`` were captured from a real ``litellm.Router`` call to a local OpenAI-compatible
   backend (goal: p50 <= 0.2 ms), with the ``--meter`` energy meter (default ``simulated``: the
   in-process attributing path). Rows go to SQLite through the real writer; the last line compares
   what was sent with what is in the table.
2. **Router wall time with / without the callback**: ``--requests`` async requests (64 concurrent)
   through a Router without, with, and again without the EnergyLogger; with / mean(without).
3. **Writer throughput**: ``--rows`` rows submitted to the writer, time until all are in the table,
   on SQLite and PostgreSQL (``--pg``, skipped when unreachable). With ``--ledger-compare``: PostgreSQL
   again without / with / without the energy ledger (docs/accounting.md), and the ratio.

Last line: ``callback_p50_ms=<x> rows_expected=<n> rows_found=<m>``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _offline  # noqa: E402, F401  (before LiteLLM is imported)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import litellm  # noqa: E402
from litellm.integrations.custom_logger import CustomLogger  # noqa: E402
from router_fixtures import small_big_pool  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from litellm_energy_router.demo.backend import LocalBackend  # noqa: E402
from litellm_energy_router.energy.estimate import EstimateMeter  # noqa: E402
from litellm_energy_router.litellm_glue.callback import EnergyLogger, PendingRow, TableWriter  # noqa: E402
from litellm_energy_router.litellm_glue.callback.accounting import RowAccounting
from litellm_energy_router.settings import PrivacySettings, Settings, WriterSettings  # noqa: E402
from litellm_energy_router.table import open_store  # noqa: E402

CANDIDATES = [
    {"name": "mistralai/mistral-7b-chat", "deployment_id": "dep-small"},
    {"name": "meta/llama-2-70b-chat", "deployment_id": "dep-big"},
]


class _Capture(CustomLogger):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple] = []

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):  # noqa: ANN001
        self.events.append((kwargs, response_obj, start_time, end_time))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def capture_events(api_base: str, n: int) -> list[tuple]:
    cap = _Capture()
    litellm.callbacks = [cap]
    router = litellm.Router(model_list=small_big_pool(api_base))
    for i in range(n):
        await router.acompletion(
            model="pool", messages=[{"role": "user", "content": f"capture {i} " + "w " * (i % 30)}]
        )
    for _ in range(100):
        if len(cap.events) >= n:
            break
        await asyncio.sleep(0.05)
    litellm.logging_callback_manager._reset_all_callbacks()
    return cap.events


async def hook_cost(logger: EnergyLogger, templates: list[tuple], events: int) -> list[float]:
    """Per event: seconds inside log_pre_api_call + async_log_success_event (the loop's share)."""
    prepared = []
    for i in range(events):
        kw, resp, st, et = templates[i % len(templates)]
        kw = copy.copy(kw)
        slo = dict(kw["standard_logging_object"])
        cid = str(uuid.uuid4())
        slo["litellm_call_id"] = cid
        kw["standard_logging_object"] = slo
        kw["litellm_call_id"] = cid
        prepared.append((kw, resp, st, et))
    out = []
    for kw, resp, st, et in prepared:
        t0 = time.perf_counter()
        logger.log_pre_api_call(kw.get("model"), kw.get("messages"), kw)
        await logger.async_log_success_event(kw, resp, st, et)
        out.append(time.perf_counter() - t0)
        if len(out) % 64 == 0:
            await asyncio.sleep(0)  # let other tasks run, as in serving
    return out


async def router_burst(api_base: str, n: int, logger: EnergyLogger | None) -> float:
    litellm.logging_callback_manager._reset_all_callbacks()
    if logger is not None:
        litellm.callbacks = [logger]
    router = litellm.Router(model_list=small_big_pool(api_base))
    sem = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with sem:
            await router.acompletion(
                model="pool", messages=[{"role": "user", "content": f"burst {i} " + "w " * (i % 30)}]
            )

    await one(-1)  # warm-up
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    dt = time.perf_counter() - t0
    if logger is not None:
        for _ in range(400):
            if logger.writer.submitted >= n + 1:
                break
            await asyncio.sleep(0.05)
    litellm.logging_callback_manager._reset_all_callbacks()
    return dt


def writer_throughput(url: str, rows: int, spool: Path, ledger: bool = False) -> float:
    """Rows/s of the writer; ``ledger``: with the energy ledger kept (rows of 3 teams, 6 keys, 2 days)."""
    w = TableWriter(
        url,
        EstimateMeter(),
        writer=WriterSettings(spool_dir=spool, batch_size=1000, queue_size=rows + 1),
        privacy=PrivacySettings(),
        accounting=RowAccounting(keep_ledger=ledger),
    )
    t0 = time.perf_counter()
    for i in range(rows):
        w.submit(
            PendingRow(
                call_id=f"w{i}",
                candidate="mistralai/mistral-7b-chat",
                status="success",
                text=f"q {i}",
                start_s=1.0 + i * 8,
                end_s=2.0 + i * 8,
                first_token_s=None,
                prompt_tokens=20,
                completion_tokens=10,
                propensity=None,
                deployment_id="d",
                backend_id=None,
                key_hash=f"{i % 6:064d}",
                team=f"team-{i % 3}",
                model_group="chat",
                estimate_j=10.0,
                reference_j=30.0,
            )
        )
    assert w.flush(600)
    dt = time.perf_counter() - t0
    w.close()
    store = open_store(url)
    n = store.count_runs()
    store.close()
    assert n == rows, (n, rows)
    return rows / dt


def logger_settings(d: Path, name: str, meter: str) -> Settings:
    """The callback's settings: a SQLite table ``<d>/<name>.db`` and a spool beside it."""
    return Settings.model_validate(
        {
            "table": {"url": f"sqlite:///{d / f'{name}.db'}"},
            "candidates": CANDIDATES,
            "energy": {"meter": meter},
            "writer": {"spool_dir": str(d / f"spool-{name}")},
        }
    )


def hook_part(be: LocalBackend, d: Path, args: argparse.Namespace) -> tuple[list[float], int]:
    """1.: (event-loop seconds per event, rows found in the table), printed."""
    settings = logger_settings(d, "cb", args.meter)
    templates = asyncio.run(capture_events(be.base_url, 50))
    logger = EnergyLogger(settings)
    costs = asyncio.run(hook_cost(logger, templates, args.events))
    assert logger.flush(120)
    store = open_store(settings.table.url)
    found = store.count_runs()
    store.close()
    logger.close()
    p50, p99 = pct(costs, 0.5) * 1e3, pct(costs, 0.99) * 1e3
    print(f"meter: {args.meter}")
    print(
        f"callback event-loop time per request: p50 {p50:.4f} ms, p99 {p99:.4f} ms, mean "
        f"{statistics.fmean(costs) * 1e3:.4f} ms over {len(costs)} events (goal p50 <= 0.2 ms)"
    )
    return costs, found


def burst_part(be: LocalBackend, d: Path, args: argparse.Namespace) -> None:
    """2.: the router burst without / with / without the callback, printed."""
    base1 = asyncio.run(router_burst(be.base_url, args.requests, None))
    logger = EnergyLogger(logger_settings(d, "burst", args.meter))
    with_cb = asyncio.run(router_burst(be.base_url, args.requests, logger))
    logger.close()
    base2 = asyncio.run(router_burst(be.base_url, args.requests, None))
    base = (base1 + base2) / 2  # without / with / without: warm-up order effects cancel
    print(
        f"router burst {args.requests} requests, 64 concurrent: {base1:.2f} s and {base2:.2f} s without, "
        f"{with_cb:.2f} s with the callback; ratio {with_cb / base:.3f} (shared machine: +-10 % noise)"
    )


def postgres_part(d: Path, args: argparse.Namespace) -> str:
    """3. on PostgreSQL (a fresh database, dropped after), printed; returns the ledger comparison's fields."""
    try:
        admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text("select 1"))
    except Exception as e:  # noqa: BLE001
        print(f"writer throughput postgresql: skipped ({type(e).__name__}: unreachable at {args.pg})")
        return ""
    name = f"er_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(args.pg).set(database=name).render_as_string(hide_password=False)
        pg = writer_throughput(url, args.rows, d / "spool4")
        print(f"writer throughput postgresql: {pg:.0f} rows/s ({args.rows} rows)")
        return ledger_comparison(admin, args.pg, args.rows, d) if args.ledger_compare else ""
    finally:
        with admin.connect() as c:
            c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument(
        "--meter", default="simulated", help="energy meter of the callback (simulated: the attributing path)"
    )
    ap.add_argument(
        "--ledger-compare",
        action="store_true",
        help="PostgreSQL writer throughput without / with / without the energy ledger, in this run",
    )
    ap.add_argument(
        "--pg", default=os.environ.get("ENERGY_ROUTER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, LocalBackend(delay_s=0.005) as be:
        d = Path(d)
        costs, found = hook_part(be, d, args)
        burst_part(be, d, args)
        sq = writer_throughput(f"sqlite:///{d / 'w.db'}", args.rows, d / "spool3")
        print(f"writer throughput sqlite: {sq:.0f} rows/s ({args.rows} rows)")
        ledger_cmp = postgres_part(d, args)
    print(f"callback_p50_ms={pct(costs, 0.5) * 1e3:.4f} rows_expected={len(costs)} rows_found={found}{ledger_cmp}")


def ledger_comparison(admin: Any, pg: str, rows: int, d: Path) -> str:
    """Writer rows/s on fresh PostgreSQL databases: ledger off, on, off (order effects cancel)."""
    out = []
    for i, ledger in enumerate((False, True, False)):
        name = f"er_bench_{uuid.uuid4().hex[:10]}"
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = make_url(pg).set(database=name).render_as_string(hide_password=False)
            out.append(writer_throughput(url, rows, d / f"spool-ledger-{i}", ledger=ledger))
        finally:
            with admin.connect() as c:
                c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    off = (out[0] + out[2]) / 2
    print(
        f"writer throughput postgresql, ledger off {out[0]:.0f} and {out[2]:.0f} rows/s, on {out[1]:.0f} rows/s; "
        f"on / mean(off) {out[1] / off:.3f} ({rows} rows each; shared machine: noisy)"
    )
    return f" pg_rows_s_ledger_off={off:.0f} pg_rows_s_ledger_on={out[1]:.0f} ledger_ratio={out[1] / off:.3f}"


if __name__ == "__main__":
    main()
