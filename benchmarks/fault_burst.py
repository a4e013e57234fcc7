"""Faults under load: requests through a real LiteLLM proxy (energy router + energy logger, local
backend, PostgreSQL table reached through a TCP forwarder we control) while the database goes away for
a while and the proxy is killed with SIGKILL once, mid-outage, and restarted.

    python benchmarks/fault_burst.py            # 5,000 requests, database down 30 s
    python benchmarks/fault_burst.py --quick    # 500 requests, database down 5 s

The client paces requests (``--rate`` per second, ``--concurrency`` at once) and names each one with its
own LiteLLM call id (``x-litellm-call-id``), so every row in the table is matched to a request. Requests
refused while the proxy restarts wait for it and are sent again (they never reached it); requests in
flight at the kill are not resent and are counted apart. Printed: requests served vs rows in the table
(duplicates, served requests without a row and when they completed relative to the kill: a row lives
only in the writer's memory until its batch is spooled, ``writer.flush_interval_s``), spool files left,
and client-side latency p50/p99 before, during and after the outage. Needs PostgreSQL at
``$ENERGY_ROUTER_TEST_PG`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``); a database of
its own is created and dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import _offline  # noqa: E402, F401  (before LiteLLM is imported)
from proxy_footprint import FAIL_OPEN_ID, KEY, _config  # noqa: E402
from proxy_process import ProxyProcess  # noqa: E402
from router_fixtures import train_planted  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from tcp_proxy import TCPProxy  # noqa: E402

from litellm_energy_router.demo.backend import LocalBackend  # noqa: E402
from litellm_energy_router.table import open_store  # noqa: E402

NAMES = ["mistralai/mistral-7b-chat", "zero-one-ai/Yi-34B-Chat", "meta/llama-2-70b-chat"]
TEXTS = ["Give a proof about chess number {i}", "Tell me about rivers number {i}", "Explain music number {i}"]
PG_ADMIN = os.environ.get("ENERGY_ROUTER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
FLUSH_S = 0.1


@dataclass
class Run:
    """What the client saw. Times are seconds since the first request."""

    served: dict[str, tuple[float, float]] = field(default_factory=dict)  # call id -> (start, end)
    in_flight_at_kill: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    resent: int = 0
    t0: float = 0.0
    kill_at: float | None = None
    back_at: float | None = None
    down: tuple[float, float] | None = None


async def _one(session, proxy: ProxyProcess, run: Run, i: int, up: asyncio.Event) -> str | None:
    """One request (resent while the proxy restarts); the deployment that served it, if served."""
    import aiohttp

    call_id = f"fb-{uuid.uuid4().hex}"
    body = {"model": "chat", "messages": [{"role": "user", "content": TEXTS[i % len(TEXTS)].format(i=i)}]}
    headers = {"Authorization": f"Bearer {KEY}", "x-litellm-call-id": call_id}
    while True:
        await up.wait()
        start = time.monotonic() - run.t0
        try:
            async with session.post(
                f"http://127.0.0.1:{proxy.port}/v1/chat/completions", json=body, headers=headers
            ) as r:
                await r.read()
                if r.status != 200:
                    run.errors.append(f"HTTP {r.status}")
                    return None
                run.served[call_id] = (start, time.monotonic() - run.t0)
                return r.headers.get("x-litellm-model-id")
        except aiohttp.ClientConnectorError:  # refused: the proxy is restarting, the request never reached it
            run.resent += 1
            await asyncio.sleep(0.1)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            if run.kill_at is not None and start <= run.kill_at:
                run.in_flight_at_kill.add(call_id)
            else:
                run.errors.append(type(e).__name__)
            return None


async def drive(proxy: ProxyProcess, pg: TCPProxy, args: argparse.Namespace) -> Run:
    """Paced requests; the database down over [down_at, down_at + outage); SIGKILL at kill_at."""
    import aiohttp

    run = Run()
    up = asyncio.Event()
    up.set()
    sem = asyncio.Semaphore(args.concurrency)
    span = args.requests / args.rate
    down_at, kill_at = 0.25 * span, 0.25 * span + args.outage / 2

    async def paced(session, i: int) -> None:
        await asyncio.sleep(max(0.0, run.t0 + i / args.rate - time.monotonic()))
        async with sem:
            await _one(session, proxy, run, i, up)

    async def outage() -> None:
        await asyncio.sleep(down_at)
        await asyncio.to_thread(pg.pause)
        t_down = time.monotonic() - run.t0
        await asyncio.sleep(args.outage)
        await asyncio.to_thread(pg.resume)
        run.down = (t_down, time.monotonic() - run.t0)

    async def crash() -> None:
        await asyncio.sleep(kill_at)
        up.clear()
        run.kill_at = time.monotonic() - run.t0
        proxy.kill()
        await asyncio.to_thread(proxy.start)
        run.back_at = time.monotonic() - run.t0
        up.set()

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=args.concurrency)
    ) as session:
        run.t0 = time.monotonic()
        while await _one(session, proxy, run, -1, up) == FAIL_OPEN_ID:  # warm-up: until the router routes
            await asyncio.sleep(0.2)
        shift, run.t0 = time.monotonic() - run.t0, time.monotonic()  # warm-up requests: served, before t=0
        run.served = {c: (s - shift, e - shift) for c, (s, e) in run.served.items()}
        await asyncio.gather(outage(), crash(), *(paced(session, i) for i in range(args.requests)))
    return run


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000, q)) if xs else float("nan")


def _rows(url: str) -> tuple[int, dict[str, int]]:
    eng = create_engine(url)
    with eng.connect() as c:
        counts = dict(
            c.execute(text("select call_id, count(*) from er_runs where source = 'production' group by call_id")).all()
        )
        total = c.execute(text("select count(*) from er_runs where source = 'production'")).scalar_one()
    eng.dispose()
    return int(total), {k: int(v) for k, v in counts.items()}


def _wait_settled(url: str, expect: int, timeout: float = 180.0) -> None:
    """Until the table holds ``expect`` rows or stops growing for 10 s."""
    last, since, deadline = -1, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        n, _ = _rows(url)
        if n >= expect:
            return
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > 10:
            return
        time.sleep(0.5)


def report(run: Run, url: str, spool: Path, args: argparse.Namespace) -> bool:
    total, per_call = _rows(url)
    dups = sum(n - 1 for n in per_call.values() if n > 1)
    served = set(run.served)
    missing = sorted(served - set(per_call), key=lambda c: run.served[c][1])
    flight_rows = len(run.in_flight_at_kill & set(per_call))
    left = sorted(p.name for p in spool.glob("spool-*.jsonl"))
    down = run.down or (float("nan"), float("nan"))
    print(
        f"fault_burst: {args.requests} requests at {args.rate:g}/s, concurrency {args.concurrency}; table (PostgreSQL "
        f"via TCP forwarder) down {down[1] - down[0]:.1f} s (t={down[0]:.1f}..{down[1]:.1f} s); proxy SIGKILLed at "
        f"t={run.kill_at:.1f} s, serving again at t={run.back_at:.1f} s ({run.resent} refused attempts resent)"
    )
    n_warm = sum(1 for s, _ in run.served.values() if s < 0)
    print(
        f"served: {len(served)} ({n_warm} of them warm-up, until the router routed); in flight at the kill (no answer): {len(run.in_flight_at_kill)}, of which with a row: "
        f"{flight_rows}; other errors: {len(run.errors)} {sorted(set(run.errors))}"
    )
    print(
        f"table: {total} rows, {len(per_call)} distinct call ids, duplicates: {dups}; served with a row: "
        f"{len(served) - len(missing)}/{len(served)}; rows of no served request: {len(set(per_call) - served - run.in_flight_at_kill)}"
    )
    if missing:
        ends = [run.served[c][1] - (run.kill_at or 0) for c in missing]
        print(
            f"served without a row: {len(missing)}, answered {min(ends) * 1000:.0f}..{max(ends) * 1000:.0f} ms "
            f"relative to the kill (writer.flush_interval_s = {FLUSH_S * 1000:.0f} ms: rows not yet spooled)"
        )
    print(f"spool files left after the proxy's shutdown: {len(left)}")
    kill, settled = run.kill_at or 0.0, (run.back_at or 0.0) + 5.0
    phases = {
        "before the outage": lambda s: 0 <= s < down[0],
        "during the outage, before the kill": lambda s: down[0] <= s < kill,
        "restart (kill .. serving again + 5 s)": lambda s: kill <= s < settled,
        "during the outage, after the restart": lambda s: settled <= s < down[1],
        "after the outage": lambda s: s >= max(down[1], settled),
    }
    for name, inside in phases.items():
        lat = [e - s for s, e in run.served.values() if inside(s)]
        if lat:
            print(f"client latency {name}: n={len(lat)}, p50 {_pct(lat, 50):.1f} ms, p99 {_pct(lat, 99):.1f} ms")
    lost_ok = all(-1.0 <= run.served[c][1] - (run.kill_at or 0) <= FLUSH_S + 1.0 for c in missing)
    return dups == 0 and lost_ok and not left and not run.errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="500 requests, database down 5 s")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--outage", type=float, default=None, help="seconds the database is down")
    ap.add_argument("--rate", type=float, default=10.0, help="requests started per second (below the proxy's capacity)")
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    args.requests = args.requests or (500 if args.quick else 5000)
    args.outage = args.outage or (5.0 if args.quick else 30.0)

    d = Path(tempfile.mkdtemp(prefix="er-fault-burst-"))
    store = open_store(f"sqlite:///{d / 'train.db'}")
    ck = train_planted(store, d / "router", names=NAMES)
    store.close()
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    db = f"er_fault_burst_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{db}"'))
    u = make_url(PG_ADMIN).set(database=db)
    pg = TCPProxy(u.host or "127.0.0.1", u.port or 5432)
    url = u.render_as_string(hide_password=False)
    backend = LocalBackend().start()
    (d / "config.yaml").write_text(yaml.safe_dump(_config(NAMES, backend.base, True)))
    env = {
        **os.environ,
        "LITELLM_LOG": "ERROR",
        "ENERGY_ROUTER_ROUTER__CHECKPOINT": str(ck),
        "ENERGY_ROUTER_ROUTER__FALLBACK": FAIL_OPEN_ID,
        "ENERGY_ROUTER_ROUTER__TIMEOUT_MS": "1000",
        "ENERGY_ROUTER_TABLE__URL": u.set(host="127.0.0.1", port=pg.port).render_as_string(hide_password=False),
        "ENERGY_ROUTER_WRITER__SPOOL_DIR": str(d / "spool"),
        "ENERGY_ROUTER_WRITER__FLUSH_INTERVAL_S": str(FLUSH_S),
        "ENERGY_ROUTER_WRITER__RETRY_MAX_S": "1",
    }
    proxy = ProxyProcess(d / "config.yaml", env, d, ready_timeout_s=300)
    ok = False
    try:
        proxy.start()
        run = asyncio.run(drive(proxy, pg, args))
        _wait_settled(url, len(run.served))
        proxy.stop(60)  # SIGINT: the writer flushes what is left
        ok = report(run, url, d / "spool", args)
    finally:
        proxy.stop(60)
        backend.stop()
        pg.close()
        with admin.connect() as c:
            c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'"))
            c.execute(text(f'DROP DATABASE IF EXISTS "{db}"'))
        admin.dispose()
    print("OK" if ok else "CHECK FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
