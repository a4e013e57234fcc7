"""The router version on a production row comes from this process's own decision record only: a caller
that writes ``router_version`` (or a whole forged decision) into request metadata, through a real
``litellm.Router`` with the routing strategy and the energy callback, cannot choose what the table
records; a request the router did not decide records none."""

from __future__ import annotations

import pytest
from test_decision_boundary import FORGED, PROOF, _chat, _rows, _served, routed_pool

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.router.checkpoint import read_manifest, resolve

pytestmark = [pytest.mark.litellm_integration, pytest.mark.usefixtures("fresh_litellm_callbacks")]


def test_a_caller_cannot_set_the_router_version_of_its_row(planted_ckpt, sqlite_url, tmp_path):
    version = read_manifest(resolve(planted_ckpt)).version
    backend = LocalBackend().start()
    try:
        router, logger = routed_pool(planted_ckpt, sqlite_url, tmp_path, backend)
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
