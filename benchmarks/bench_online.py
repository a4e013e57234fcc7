"""Decision cost of the online adaptation (router/adapt.py), measured in one run: the same planted student
checkpoint served by two cores, ``router.online`` true (context prior fitted from the table, energy state with
300 rows) and false, in alternating blocks of 150 uncached requests (so load from other processes falls on both).

    python benchmarks/bench_online.py

Last line: ``ratio_on_off_p50=<x>``.
"""

import pathlib as _p
import sys as _s

import _offline  # noqa: E402, F401  (before LiteLLM is imported)

_s.path.insert(0, str(_p.Path(__file__).resolve().parents[1] / "tests"))
import asyncio
import pathlib
import tempfile
import time

import numpy as np
from router_fixtures import CANDS, train_planted

from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore
from litellm_energy_router.settings import Settings
from litellm_energy_router.table import open_store

d = pathlib.Path(tempfile.mkdtemp())
store = open_store(f"sqlite:///{d / 't.db'}")
ck = train_planted(store, d / "router")
store.close()


def core(online):
    return EnergyRouterCore(
        Settings.model_validate(
            {
                "router": {
                    "checkpoint": str(ck),
                    "cache_size": 0,
                    "timeout_ms": 10000,
                    "online": online,
                    "context_refresh_s": 0,
                },
                "candidates": [{"name": c} for c in CANDS],
                "table": {"url": f"sqlite:///{d / 't.db'}"},
            }
        )
    )


texts = texts0 = [f"Tell me about topic {i} and explain how it works in practice " * (1 + i % 4) for i in range(4000)]
on, off = core(True), core(False)
from litellm_energy_router.router.adapt import ADAPT  # noqa: E402

ADAPT.bind(on.runtime.model)
st = open_store(f"sqlite:///{d / 't.db'}")
print("prior rows", ADAPT.refresh_from(st.iter_runs()))
st.close()
from litellm_energy_router.router.context import request_context  # noqa: E402

for i in range(300):
    ADAPT.energy.update(
        CANDS[i % 3],
        10,
        20,
        30.0,
        request_context(texts[i] if "texts" in dir() else "x", [{"user_api_key_alias": "a"}], "pool").key,
    )
deps = [
    {"model_name": "pool", "litellm_params": {"model": f"openai/{c}"}, "model_info": {"id": f"dep-{c}"}} for c in CANDS
]
res = {"on": [], "off": []}


async def main():
    for b in range(10):
        for name, c in (("on", on), ("off", off)) if b % 2 == 0 else (("off", off), ("on", on)):
            for i in range(150):
                t = texts[(b * 150 + i) % 4000]
                t0 = time.perf_counter()
                await c.choose(
                    deps, [{"role": "user", "content": t}], request_kwargs={"metadata": {"user_api_key_alias": "a"}}
                )
                res[name].append(time.perf_counter() - t0)


asyncio.run(main())
for k, v in res.items():
    v = np.array(v[150:]) * 1000
    bl = [np.median(v[j * 150 : (j + 1) * 150]) for j in range(len(v) // 150)]
    print(
        f"online={k}: decision p50 {np.median(v):.3f} ms (block medians {min(bl):.3f}-{max(bl):.3f}), p99 {np.percentile(v, 99):.3f} ms, n={len(v)}"
    )
print(f"ratio_on_off_p50={np.median(res['on'][150:]) / np.median(res['off'][150:]):.3f}")
