"""Tournament throughput (pairs/s) against the local OpenAI-compatible backend, measured in one run.

    python benchmarks/bench_tournament.py [--ttft-ms 100] [--per-token-ms 10] [--levels 1,8,32]

The backend (``litellm_energy_router/demo/backend.py`` with ``demo/task_answers.py``, aiohttp on
127.0.0.1) answers the committed task files (7 tasks x 8 items) for 3 candidates, with a simulated time to first token and per-token delay; it
runs in its own process so it does not share the client's interpreter lock.
Each concurrency level (requests in flight per candidate) runs the full tournament into a fresh
SQLite table: 168 (query, candidate) pairs through LiteLLM's Router (streaming), graded (MBPP in the
sandbox, MT-Bench by the judge deployment) and written. A warm-up run first pays LiteLLM's lazy
imports. ``complete`` is true when every level wrote all pairs and every grade matched the answer
the backend meant to give. Last line: ``pairs_per_s_c1=<x> pairs_per_s_c32=<y> complete=<true|false>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _offline  # noqa: E402, F401  (before LiteLLM is imported)

ROOT = Path(__file__).resolve().parents[1]

from litellm_energy_router.profiling.config import parse_tournament_config  # noqa: E402
from litellm_energy_router.profiling.runner import Tournament, build_jobs  # noqa: E402

from litellm_energy_router.demo.backend import fetch_log  # noqa: E402
from litellm_energy_router.table import open_store  # noqa: E402

TASKS = ["mmlu", "arc_challenge", "hellaswag", "winogrande", "gsm8k", "mbpp", "mt_bench"]
ACC = {"small": 0.4, "medium": 0.65, "large": 0.85}
KEYS = {"small": "mistralai/mistral-7b-chat", "medium": "mistralai/mixtral-8x7b-chat", "large": "meta/llama-2-70b-chat"}


def deployment(url: str, name: str, **extra):
    return {"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_base": url, "api_key": "x"}, **extra}


def config(url: str, concurrency: int, tasks: list[str]):
    return parse_tournament_config(
        {
            "candidates": [deployment(url, c, energy_profile_key=KEYS[c]) for c in ACC],
            "tasks": [{"name": t, "source": str(ROOT / "tests/data/tasks" / f"{t}.jsonl")} for t in tasks],
            "judge": deployment(url, "judge-model") | {"model_name": "judge"},
            "concurrency": concurrency,
            "generation": {"num_retries": 0},
        }
    )


def one_level(url: str, concurrency: int, tasks: list[str], workdir: Path) -> tuple[float, bool]:
    cfg = config(url, concurrency, tasks)
    store = open_store(f"sqlite:///{workdir / f'c{concurrency}.db'}")
    jobs = build_jobs(cfg)
    mark = len(fetch_log(url))
    t = Tournament(cfg, store)
    t0 = time.perf_counter()
    summary = asyncio.run(t.run(jobs))
    seconds = time.perf_counter() - t0
    t.close()
    intended = {(m, q): ok for m, q, ok in fetch_log(url, since=mark)}
    rows = list(store.iter_runs())
    ok = (
        summary.complete
        and len(rows) == len(jobs) * len(ACC)
        and all(r["score"] == (1.0 if intended.get((r["candidate"], r["query_id"])) else 0.0) for r in rows)
    )
    store.close()
    return len(rows) / seconds, ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttft-ms", type=float, default=100.0, help="backend time to first token, ms")
    ap.add_argument("--per-token-ms", type=float, default=10.0, help="backend delay per streamed token, ms")
    ap.add_argument("--levels", default="1,8,32", help="concurrency levels (requests in flight per candidate)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    levels = [int(x) for x in args.levels.split(",")]
    acc = {c: {t: p for t in [*TASKS, "open"]} for c, p in ACC.items()}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "litellm_energy_router.demo.task_answers",
            json.dumps(acc),
            str(ROOT / "tests/data/tasks"),
            str(args.ttft_ms / 1000),
            str(args.per_token_ms / 1000),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    url = server.stdout.readline().strip()  # type: ignore[union-attr]
    rates: dict[int, float] = {}
    complete = True
    try:
        with tempfile.TemporaryDirectory() as tmp:
            warm = Path(tmp) / "warm"
            warm.mkdir()
            one_level(url, 4, ["mmlu", "mbpp", "mt_bench"], warm)  # LiteLLM's lazy imports, sandbox probe
            for c in levels:
                rates[c], ok = one_level(url, c, TASKS, Path(tmp))
                complete &= ok
                print(f"concurrency={c:<3d} pairs=168 pairs_per_s={rates[c]:.1f} grades_match={ok}", flush=True)
    finally:
        server.terminate()
        server.wait(10)
    lo, hi = rates.get(1, float("nan")), rates.get(max(levels), float("nan"))
    print(
        f"speed-up c{max(levels)}/c1: {hi / lo:.2f}x (backend ttft {args.ttft_ms:g} ms, {args.per_token_ms:g} ms/token, "
        f"{os.cpu_count()} CPUs)"
    )
    print(f"pairs_per_s_c1={lo:.1f} pairs_per_s_c32={rates.get(32, hi):.1f} complete={'true' if complete else 'false'}")


if __name__ == "__main__":
    main()
