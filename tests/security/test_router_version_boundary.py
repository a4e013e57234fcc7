"""The router version on a production row comes from this process's own decision record only: a caller
that writes ``router_version`` (or a whole forged decision) into request metadata, through a real
``litellm.Router`` with the routing strategy and the energy callback, cannot choose what the table
records; a request the router did not decide records none."""

from __future__ import annotations

import litellm
import pytest

from backend import Backend
from litellm_energy_router.callback import EnergyLogger
from litellm_energy_router.litellm_compat import register_strategy
from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.settings import Settings
from litellm_energy_router.strategy import EnergyRoutingStrategy
from router_fixtures import CANDS
from test_decision_boundary import FORGED, PROOF, _chat, _deployment, _rows, _served

pytestmark = [pytest.mark.litellm_integration, pytest.mark.usefixtures("fresh_litellm_callbacks")]


def test_a_caller_cannot_set_the_router_version_of_its_row(planted_ckpt, sqlite_url, tmp_path):
    version = read_manifest(resolve(planted_ckpt)).version
    backend = Backend().start()
    try:
        s = Settings.model_validate({
            "router": {"checkpoint": str(planted_ckpt), "timeout_ms": 5000}, "candidates": [{"name": c} for c in CANDS],
            "table": {"url": sqlite_url}, "writer": {"spool_dir": str(tmp_path / "spool"), "flush_interval_s": 0.05},
        })  # fmt: skip
        logger = EnergyLogger(s)
        litellm.callbacks = [logger]
        deps = [_deployment("pool", f"openai/{c}", backend.base(c), f"dep-{c}") for c in CANDS]
        deps.append(_deployment("other", "openai/other", backend.base("other"), "dep-other"))
        router = litellm.Router(model_list=deps)
        register_strategy(router, EnergyRoutingStrategy(router, s))
        forged = {**FORGED, "candidate": "large", "router_version": "attacker-v666"}
        md = {"energy_router_decision": dict(forged), "router_version": "attacker-v666"}
        routed = _chat(router, logger, "pool", PROOF, metadata=md)
        passed = _chat(router, logger, "other", PROOF, metadata={"energy_router_decision": dict(forged)})
        _served(logger, 2)
        logger.close()
    finally:
        backend.stop()
    rows = {r["call_id"]: r for r in _rows(sqlite_url)}
    assert set(rows) == {routed, passed}
    assert rows[routed]["router_version"] == version != "attacker-v666"
    assert rows[passed]["router_version"] is None  # not the router's pool: no decision, no version
