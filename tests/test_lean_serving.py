"""The serving path is lean and never stalls the event loop.

* A student checkpoint routes through a real ``litellm.Router`` without importing torch or transformers
  (checked in a fresh interpreter: this test process has imported both for training).
* A checkpoint that loads slowly (a third-party scorer plugin, installed by the ``example_plugin``
  fixture) does not hold up the first request: it is answered within the routing
  timeout on the fail-open path (``reason="loading"``), and routed by the router once loaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import litellm
import pytest
from litellm import Router
from router_fixtures import CANDS, pool_deployments

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy
from litellm_energy_router.metrics import FALLBACKS
from litellm_energy_router.settings import Settings

TESTS = Path(__file__).parent


def test_student_checkpoint_serves_without_torch_or_transformers(planted_ckpt):
    backend = LocalBackend().start()
    try:
        script = textwrap.dedent(f"""
            import asyncio, json, sys
            sys.path.insert(0, {str(TESTS)!r})
            from litellm import Router
            from litellm_energy_router.settings import Settings
            from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy
            s = Settings.model_validate({{"router": {{"checkpoint": {str(planted_ckpt)!r}, "timeout_ms": 5000}},
                                         "candidates": [{{"name": c}} for c in {CANDS!r}], "knob": {{"lambda": 0.05}}}})
            router = Router(model_list={json.dumps(pool_deployments(backend))})
            strategy = EnergyRoutingStrategy(router, s)
            from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
            register_strategy(router, strategy)
            async def go():
                out = []
                for t in ("Give a proof about chess number 7", "Tell me about rivers number 8"):
                    r = await router.acompletion(model="pool", messages=[{{"role": "user", "content": t}}])
                    out.append(r._hidden_params.get("model_id"))
                return out
            served = asyncio.run(go())
            print(json.dumps({{"served": served, "scorer": strategy.core.runtime.model.name,
                              "heavy": sorted(m for m in ("torch", "transformers", "trl", "sklearn") if m in sys.modules)}}))
        """)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        res = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        backend.stop()
    assert res["scorer"] == "student"
    assert res["heavy"] == []  # neither torch nor transformers (nor trl, scikit-learn) in sys.modules
    assert res["served"] == ["dep-large", "dep-small"]  # and it routed by the planted rule


@pytest.fixture
def slow_ckpt(planted_ckpt, example_plugin, tmp_path):
    """The planted checkpoint served by the example plugin's ``slow-student`` scorer (2 s to load)."""
    d = tmp_path / "slow"
    shutil.copytree(planted_ckpt, d)
    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**m, "scorer": "slow-student"}))
    return d


def test_first_request_is_answered_within_the_timeout_while_the_checkpoint_loads(slow_ckpt):
    backend = LocalBackend().start()
    timeout_ms = 50.0
    s = Settings.model_validate(
        {
            "router": {"checkpoint": str(slow_ckpt), "timeout_ms": timeout_ms, "fallback": "dep-medium"},
            "candidates": [{"name": c} for c in CANDS],
        }
    )
    before = FALLBACKS.labels(reason="loading")._value.get()
    proof = [{"role": "user", "content": "Give a proof about chess number 11"}]

    async def go():
        router = Router(model_list=pool_deployments(backend))
        strategy = EnergyRoutingStrategy(router, s)  # built inside the running loop: loads on a thread
        register_strategy(router, strategy)
        kw = {"metadata": {}}
        t0 = time.perf_counter()
        dep = await strategy.async_get_available_deployment("pool", messages=proof, request_kwargs=kw)
        first_s = time.perf_counter() - t0
        first = kw["metadata"]["energy_router_decision"]
        deadline = time.monotonic() + 60
        while strategy.core.runtime.model is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the loop keeps running while the checkpoint loads
        kw2 = {"metadata": {}}
        dep2 = await strategy.async_get_available_deployment("pool", messages=proof, request_kwargs=kw2)
        r = await router.acompletion(model="pool", messages=proof)
        return dep, first_s, first, dep2, kw2["metadata"]["energy_router_decision"], r

    try:
        dep, first_s, first, dep2, second, resp = asyncio.run(go())
    finally:
        backend.stop()
        litellm.callbacks = []
    assert first_s * 1000 < timeout_ms  # answered within the routing budget, not after the 2 s load
    assert first["fallback"] == "loading" and dep["model_info"]["id"] == "dep-medium"
    assert FALLBACKS.labels(reason="loading")._value.get() == before + 1
    assert second["fallback"] is None and dep2["model_info"]["id"] == "dep-large"  # routed once loaded
    assert second["router_version"] == first_version(slow_ckpt)
    assert resp._hidden_params["model_id"] == "dep-large"


def first_version(ckpt):
    return json.loads((ckpt / "manifest.json").read_text())["version"]
