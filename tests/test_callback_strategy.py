"""The energy callback behind the real routing strategy: the decision the strategy attaches to the
request (candidate, propensity) lands in the production rows."""

from __future__ import annotations

import asyncio
import time

import litellm
import pytest
from litellm import Router
from router_fixtures import loop_settings, pool_deployments

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.litellm_glue.callback import EnergyLogger
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy
from litellm_energy_router.table import open_store

# Real LiteLLM (Router / proxy / completion): also run at the oldest supported LiteLLM (make test-litellm-oldest).
pytestmark = [pytest.mark.litellm_integration, pytest.mark.usefixtures("fresh_litellm_callbacks")]


@pytest.mark.slow
def test_strategy_decisions_reach_the_table(tmp_path, sqlite_url, planted_ckpt):
    ckpt = planted_ckpt
    backend = LocalBackend(delay_s=0.01).start()
    try:
        s = loop_settings(ckpt, sqlite_url, tmp_path)
        model_list = pool_deployments(backend)
        router = Router(model_list=model_list)
        register_strategy(router, EnergyRoutingStrategy(router, s))
        logger = EnergyLogger(s)
        litellm.callbacks = [logger]
        texts = [
            f"Give a proof about chess number {i}" if i % 2 else f"Tell me about rivers number {i}" for i in range(40)
        ]
        served = {}

        async def go():
            async def one(t):
                r = await router.acompletion(model="pool", messages=[{"role": "user", "content": t}])
                served[r._hidden_params["litellm_call_id"]] = t

            await asyncio.gather(*(one(t) for t in texts))
            while logger.writer.submitted < len(texts):
                await asyncio.sleep(0.05)

        asyncio.run(go())
        time.sleep(0.3)
        assert logger.flush(30)
        logger.close()
    finally:
        backend.stop()
    store = open_store(sqlite_url)
    rows = {r["call_id"]: r for r in store.iter_runs()}
    store.close()
    assert set(rows) == set(served)
    for cid, text in served.items():
        r = rows[cid]
        assert r["candidate"] == ("large" if "proof" in text else "small")
        assert r["propensity"] == pytest.approx(1.0)  # epsilon 0: the policy picks it for sure
        assert r["energy_method"] == "simulated" and r["energy_j"] is not None
