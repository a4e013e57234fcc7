"""Energy and carbon accounting through the real ``litellm`` proxy process (example config, custom auth with
two teams, local backends): a routed request returns the x-energy-router-* headers, ``/metrics`` shows the
accounting counters, ``energy-router report`` prints the ledger of that traffic, and a request whose
metadata names another team is charged to its own key's team; a key over its hard budget gets HTTP 429."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from litellm.integrations.custom_logger import CustomLogger
from prometheus_client.parser import text_string_to_metric_families
from proxy_process import ProxyProcess
from router_fixtures import train_planted
from typer.testing import CliRunner

from litellm_energy_router.demo.backend import LocalBackend as Backend
from litellm_energy_router.litellm_glue.litellm_compat import PROXY_CALLBACKS_MODULE, proxy_imports_installed_callbacks
from litellm_energy_router.router.checkpoint import point_to
from litellm_energy_router.table import open_store

pytestmark = pytest.mark.litellm_integration

ROOT = Path(__file__).resolve().parents[1]
# LiteLLM releases without the response-headers hook (1.80.x) send no energy headers (docs/compatibility.md)
HEADERS_HOOK = hasattr(CustomLogger, "async_post_call_response_headers_hook")
NAMES = ["mistralai/mistral-7b-chat", "zero-one-ai/Yi-34B-Chat", "meta/llama-2-70b-chat"]
AUTH = """
import hashlib

from fastapi import HTTPException
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

KEYS = {"sk-search-0123456789": ("svc-search", "team-search", "Search"),
        "sk-ads-0123456789": ("svc-ads", "team-ads", "Ads"),
        "sk-capped-0123456789": ("svc-capped", "team-capped", "Capped")}


async def user_api_key_auth(request, api_key):
    if api_key == "sk-master-0123456789":
        return UserAPIKeyAuth(api_key=api_key, user_role=LitellmUserRoles.PROXY_ADMIN)
    if api_key not in KEYS:
        raise HTTPException(status_code=401, detail="unknown key")
    alias, team, team_alias = KEYS[api_key]
    # api_key: the key's SHA-256, as LiteLLM's database-backed virtual keys carry it (user_api_key_hash)
    return UserAPIKeyAuth(api_key=hashlib.sha256(api_key.encode()).hexdigest(), key_alias=alias, team_id=team, team_alias=team_alias, user_id="u-" + alias)
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, example_plugin_dir):
    d = tmp_path_factory.mktemp("accounting_proxy")
    store = open_store(f"sqlite:///{d / 't.db'}")
    point_to(d / "current.json", train_planted(store, d / "v1", names=NAMES))
    store.close()
    cfg = yaml.safe_load((ROOT / "config_examples/proxy_config.yaml").read_text())
    cfg["general_settings"]["custom_auth"] = "acct_keys.user_api_key_auth"
    for dep, site in zip(cfg["model_list"], ["north", "north", "south"]):
        dep["model_info"]["energy_router_site"] = site
    if not proxy_imports_installed_callbacks():
        (d / "energy_router_callbacks.py").write_text(PROXY_CALLBACKS_MODULE)
        cfg["litellm_settings"]["callbacks"] = [
            "energy_router_callbacks." + c.rsplit(".", 1)[1] if c.startswith("litellm_energy_router.") else c
            for c in cfg["litellm_settings"]["callbacks"]
        ]
    (d / "proxy.yaml").write_text(yaml.safe_dump(cfg))
    (d / "acct_keys.py").write_text(AUTH)
    (d / "intensity.csv").write_text(
        "region,hour,g_co2e_per_kwh\n" + "".join(f"N,{h},120\nS,{h},480\n" for h in range(24))
    )
    # the routing it asserts is the checkpoint scorer's: online adaptation (blend toward the table's prior) off here
    er = {
        "router": {"checkpoint": str(d / "current.json"), "timeout_ms": 5000, "online": False},
        "knob": {"lambda": 0.05},
        "table": {"url": f"sqlite:///{d / 'production.db'}"},
        # a measured meter (the example plugin's ``fake-rocm`` stand-in, registered ``measured=True``): the ledger's
        # and the metrics' measured split are the meter registry's answer (the ``simulated`` meter's are estimated)
        "energy": {"meter": "fake-rocm"},
        "writer": {"spool_dir": str(d / "spool"), "flush_interval_s": 0.1},
        "carbon": {
            "intensity_csv": str(d / "intensity.csv"),
            "sites": {"north": {"pue": 1.1, "region": "N"}, "south": {"pue": 1.3, "region": "S"}},
        },
        "budgets": {"keys": {"svc-capped": {"limit": 1e-6, "mode": "hard"}}},
    }
    (d / "energy-router.yaml").write_text(yaml.safe_dump({"energy_router": er}))
    backend = Backend().start()
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": "sk-master-0123456789",
        "VLLM_API_KEY": "none",
        "SMALL_API_BASE": backend.base("small"),
        "MEDIUM_API_BASE": backend.base("medium"),
        "LARGE_API_BASE": backend.base("large"),
        "ENERGY_ROUTER_CONFIG": str(d / "energy-router.yaml"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(example_plugin_dir), os.environ.get("PYTHONPATH")) if p),
    }
    server = ProxyProcess(d / "proxy.yaml", env, d, ready_timeout_s=180)
    server.start()
    deadline = time.time() + 180
    # the router loads its checkpoint on first use; until then requests are not routed (no energy headers)
    while time.time() < deadline:
        status, _, dep = _post(server.port, "sk-search-0123456789", "Give a proof about chess")
        if dep is not None or (not HEADERS_HOOK and status == 200):
            break
        time.sleep(0.5)
    yield {"port": server.port, "dir": d, "db": f"sqlite:///{d / 'production.db'}"}
    server.stop(20)
    backend.stop()


def _post(port, key, text, metadata=None, stream=False):
    """(status, headers, routed deployment or None when the response carries no energy headers)."""
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
        **({"metadata": metadata} if metadata else {}),
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
        h = {k.lower(): v for k, v in r.headers.items()}
        return r.status, h, h.get("x-litellm-model-id") if "x-energy-router-joules-estimate" in h else None


def _requests(db):
    store = open_store(db)
    try:
        return {r["team"]: r["requests"] for r in store.ledger("team")}
    finally:
        store.close()


def test_headers_metrics_report_and_attribution(proxy):
    if not HEADERS_HOOK:
        pytest.skip(
            "this LiteLLM has no async_post_call_response_headers_hook: no energy headers (docs/compatibility.md)"
        )
    port = proxy["port"]
    time.sleep(1.0)
    before = _requests(proxy["db"])  # the fixture's warm-up requests (Search key)
    for i in range(3):
        status, h, dep = _post(port, "sk-search-0123456789", f"Give a proof about chess number {i}")
        assert status == 200 and dep == "vllm-llama-70b", h
        assert h["x-energy-router-site"] == "south" and float(h["x-energy-router-co2e-grams-estimate"]) > 0
        assert float(h["x-energy-router-joules-saved-estimate"]) == pytest.approx(
            0.0, abs=1e-6
        )  # the largest is the reference
    status, h, dep = _post(port, "sk-search-0123456789", "Tell me about rivers number 7")
    assert dep == "vllm-mistral-7b" and float(h["x-energy-router-joules-saved-estimate"]) > 0
    assert float(h["x-energy-router-joules-estimate"]) < float(h["x-energy-router-joules-reference-estimate"])
    # streaming: the headers go out before the first chunk
    status, h, dep = _post(port, "sk-search-0123456789", "Tell me about rivers number 8", stream=True)
    assert status == 200 and "x-energy-router-joules-estimate" in h
    # the Ads key's request names the Search team in its metadata: charged to Ads all the same
    spoof = {"user_api_key_team_id": "team-search", "user_api_key_team_alias": "Search", "user_api_key_hash": "0" * 64}
    _post(port, "sk-ads-0123456789", "Tell me about rivers number 9", metadata=spoof)
    deadline = time.time() + 60
    while time.time() < deadline and sum(_requests(proxy["db"]).values()) < sum(before.values()) + 6:
        time.sleep(0.3)
    store = open_store(proxy["db"])
    by_team = {r["team"]: r for r in store.ledger("team")}
    store.close()
    assert set(by_team) == {"team-search", "team-ads"}, by_team
    assert (
        by_team["team-search"]["requests"] == before.get("team-search", 0) + 5 and by_team["team-ads"]["requests"] == 1
    )
    assert by_team["team-ads"]["label"] == "Ads" and by_team["team-ads"]["joules_measured"] > 0
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer sk-master-0123456789"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(r.read().decode())
            for s in f.samples
        }
    joules = {k[1]: v for k, v in samples.items() if k[0] == "energy_router_joules_total"}
    assert joules[(("method", "measured"), ("model_group", "chat"), ("team", "Ads"))] == pytest.approx(
        by_team["team-ads"]["joules_measured"]
    )
    assert any(
        k[0] == "energy_router_co2e_grams_total" and ("team", "Search") in k[1] and v > 0 for k, v in samples.items()
    )
    assert any(
        k[0] == "energy_router_joules_saved_total" and ("team", "Search") in k[1] and v > 0 for k, v in samples.items()
    )
    from litellm_energy_router.cli import app

    r = CliRunner().invoke(app, ["report", "--db", proxy["db"], "--by", "team"])
    assert r.exit_code == 0 and "team-search" in r.output and "team-ads" in r.output and "Search" in r.output, r.output
    shutil.rmtree(proxy["dir"] / "spool", ignore_errors=True)


def test_key_over_its_hard_budget_gets_429(proxy):
    """svc-capped's first request spends its budget (1 µJ); the next is refused before any backend call."""
    port = proxy["port"]
    assert _post(port, "sk-capped-0123456789", "Tell me about rivers number 11")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(port, "sk-capped-0123456789", "Tell me about rivers number 12")
    assert e.value.code == 429
    msg = json.loads(e.value.read())["error"]["message"]
    assert "energy-router: budget keys.svc-capped exhausted:" in msg and "of 1e-06 J this day" in msg, msg
    assert _post(port, "sk-search-0123456789", "Tell me about rivers number 13")[0] == 200  # another key is not capped


def test_a_key_labels_its_own_calls_through_the_feedback_endpoint(proxy):
    """Each production row records the authenticated key's hash (never one the request's metadata claims); with
    feedback.caller_keys that key, as the bearer, labels its own call and no other key's."""
    from litellm_energy_router.feedback import feedback_app
    from litellm_energy_router.threaded_app import ThreadedApp

    port, search, ads = proxy["port"], "sk-search-0123456789", "sk-ads-0123456789"
    ids = {}
    for key in (search, ads):
        spoof = {"user_api_key_hash": hashlib.sha256(search.encode()).hexdigest()}  # the Ads call claims Search's
        ids[key] = _post(port, key, f"Tell me about lakes, {key[3:6]}", metadata=spoof)[1]["x-litellm-call-id"]
    store = open_store(proxy["db"])
    deadline = time.time() + 60
    while time.time() < deadline and len([r for r in store.iter_runs() if r["call_id"] in ids.values()]) < 2:
        time.sleep(0.3)
    owners = {r["call_id"]: r["key_hash"] for r in store.iter_runs() if r["call_id"] in ids.values()}
    assert owners == {ids[k]: hashlib.sha256(k.encode()).hexdigest() for k in (search, ads)}
    with ThreadedApp(lambda: feedback_app(store, None, caller_keys=True)) as srv:

        def label(key, cid):
            body = json.dumps({"call_id": cid, "score": 1.0}).encode()
            req = urllib.request.Request(
                f"{srv.url}/v1/feedback", data=body, headers={"Authorization": f"Bearer {key}"}, method="POST"
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        assert label(search, ids[ads]) == 404 and label(ads, ids[search]) == 404
        assert label(ads, ids[ads]) == 200
    scores = {r["call_id"]: r["score"] for r in store.iter_runs() if r["call_id"] in ids.values()}
    store.close()
    assert scores == {ids[search]: None, ids[ads]: 1.0}
