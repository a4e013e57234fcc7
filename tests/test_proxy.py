"""The real `litellm` proxy process with config_examples/proxy_config.yaml, local backends, HTTP calls."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proxy_process import ProxyProcess
from router_fixtures import train_planted

from litellm_energy_router.demo.backend import LocalBackend, expected_usage, messages_text
from litellm_energy_router.litellm_glue.litellm_compat import PROXY_CALLBACKS_MODULE, proxy_imports_installed_callbacks
from litellm_energy_router.router.checkpoint import point_to
from litellm_energy_router.table import open_store

# Real LiteLLM (Router / proxy / completion): also run at the oldest supported LiteLLM (make test-litellm-oldest).
pytestmark = pytest.mark.litellm_integration

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["mistralai/mistral-7b-chat", "zero-one-ai/Yi-34B-Chat", "meta/llama-2-70b-chat"]
KEY = "sk-energy-router-test-0123456789"
PROOF = "Give a proof about chess number 4242"
EASY = "Tell me about rivers number 4242"


def _post(port, text, metadata=None):
    body = {"model": "chat", "messages": [{"role": "user", "content": text}]}
    if metadata:
        body["metadata"] = metadata
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read()), r.headers.get("x-litellm-model-id")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    d = tmp_path_factory.mktemp("proxy")
    store = open_store(f"sqlite:///{d / 't.db'}")
    v1 = train_planted(store, d / "v1", names=NAMES)
    store.close()
    pointer = d / "current.json"
    point_to(pointer, v1)
    backend = LocalBackend().start()
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": KEY,
        "VLLM_API_KEY": "none",
        "SMALL_API_BASE": backend.base("small"),
        "MEDIUM_API_BASE": backend.base("medium"),
        "LARGE_API_BASE": backend.base("large"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HF_HUB_OFFLINE": "1",
        "ENERGY_ROUTER_ROUTER__CHECKPOINT": str(pointer),
        "ENERGY_ROUTER_ROUTER__FALLBACK": "vllm-yi-34b",
        "ENERGY_ROUTER_ROUTER__TIMEOUT_MS": "5000",
        "ENERGY_ROUTER_KNOB__LAMBDA": "0.05",
        "ENERGY_ROUTER_TABLE__URL": f"sqlite:///{d / 'production.db'}",
        "ENERGY_ROUTER_WRITER__SPOOL_DIR": str(d / "spool"),
    }
    config = ROOT / "config_examples/proxy_config.yaml"
    if not proxy_imports_installed_callbacks():
        # An older LiteLLM proxy loads callbacks only from files next to config.yaml: the example config
        # with its callbacks moved into the documented module beside it (docs/compatibility.md).
        (d / "energy_router_callbacks.py").write_text(PROXY_CALLBACKS_MODULE)
        text = config.read_text()
        for dotted in (
            "litellm_energy_router.litellm_glue.proxy_router.energy_router",
            "litellm_energy_router.litellm_glue.callback.proxy_logger.energy_logger",
        ):
            assert dotted in text
            text = text.replace(dotted, "energy_router_callbacks." + dotted.rsplit(".", 1)[1])
        config = d / "proxy_config.yaml"
        config.write_text(text)
    server = ProxyProcess(config, env, d, ready_timeout_s=180)
    port = server.port
    server.start()
    _wait_router_ready(port)
    info = {"port": port, "backend": backend, "pointer": pointer, "v1": v1, "dir": d, "server": server}
    yield info
    server.stop(20)
    backend.stop()


def test_proxy_routing_knob_fallback_reload(proxy):
    port, b = proxy["port"], proxy["backend"]
    resp, dep = _post(port, PROOF)
    assert dep == "vllm-llama-70b" and resp["choices"][0]["message"]["content"] == "answer from large"
    _, dep = _post(port, EASY)
    assert dep == "vllm-mistral-7b"
    assert b.count("large") == 1 and b.count("small") == 1
    # per-request knob in the request metadata
    _, dep = _post(port, PROOF, metadata={"energy_router": {"lambda": 100}})
    assert dep == "vllm-mistral-7b"
    _, dep = _post(port, PROOF, metadata={"energy_router": {"target_accuracy": 0.8}})
    assert dep == "vllm-llama-70b"
    # checkpoint removed -> the configured fallback serves, the request still succeeds
    proxy["pointer"].unlink()
    time.sleep(1.5)
    resp, dep = _post(port, PROOF)
    assert dep == "vllm-yi-34b" and resp["choices"][0]["message"]["content"] == "answer from medium"
    # a new checkpoint appears behind the pointer -> hot reload, routing resumes
    v2 = proxy["dir"] / "v2"
    shutil.copytree(proxy["v1"], v2)
    point_to(proxy["pointer"], v2)
    deadline = time.time() + 60
    while time.time() < deadline:
        _, dep = _post(port, PROOF)
        if dep == "vllm-llama-70b":
            break
        time.sleep(1.0)
    assert dep == "vllm-llama-70b"


def _wait_router_ready(port, timeout_s=120):
    """The checkpoint loads on a thread from proxy start; until then requests fail open. Wait for the
    load (``energy_router_reloads_total{result="ok"}`` on the proxy's /metrics) so routing is asserted."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if _scrape(port).get(("energy_router_reloads_total", (("result", "ok"),)), 0) >= 1:
            return
        time.sleep(0.2)
    raise RuntimeError("the router did not load its checkpoint")


def _scrape(port, auth=True):
    headers = {"Authorization": f"Bearer {KEY}"} if auth else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(r.read().decode())
            for s in f.samples
        }


def test_proxy_metrics_endpoint(proxy):
    """The proxy's own /metrics (the `prometheus` callback in the config) carries the router's and the
    callback's energy_router_* series; it asks for the master key like any proxy route."""
    port = proxy["port"]
    for text in (PROOF + " metrics", EASY + " metrics"):
        _post(port, text)
    with pytest.raises(urllib.error.HTTPError) as e:
        _scrape(port, auth=False)
    assert e.value.code == 401
    large, small = (("candidate", "meta/llama-2-70b-chat"),), (("candidate", "mistralai/mistral-7b-chat"),)
    deadline = time.time() + 30
    while time.time() < deadline:  # the writer observes joules and writes rows off the serving path
        m = _scrape(port)
        joules = {k[1]: v for k, v in m.items() if k[0] == "energy_router_request_joules_sum"}
        if len(joules) >= 2 and m.get(("energy_router_rows_written_total", ())):
            break
        time.sleep(0.5)
    assert m[("energy_router_decisions_total", large)] > 0 and m[("energy_router_decisions_total", small)] > 0
    assert m[("energy_router_decision_seconds_count", ())] >= 2
    assert joules[(*large, ("method", "estimate"))] > 0 and joules[(*small, ("method", "estimate"))] > 0
    assert m[("energy_router_request_joules_count", (*small, ("method", "estimate")))] > 0
    assert m[("energy_router_rows_total", (("method", "estimate"),))] >= 2
    assert (
        m[("energy_router_rows_written_total", ())] > 0 and m[("energy_router_reloads_total", (("result", "ok"),))] > 0
    )
    for name in ("spool_backlog_rows", "writer_queue_depth", "checkpoint_load_seconds_count", "measured_energy_ratio"):
        assert (f"energy_router_{name}", ()) in m
    assert any(k[0].startswith("litellm_") for k in m)  # one registry, LiteLLM's own series beside ours


def _call(port, text, call_id=None):
    """(status, JSON body, the response's x-litellm-call-id) of a chat request, with a caller-chosen call id."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    if call_id:
        headers["x-litellm-call-id"] = call_id
    body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read()), r.headers.get("x-litellm-call-id")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), e.headers.get("x-litellm-call-id")


def _production_rows(d, call_id=None, timeout_s=0.0):
    deadline = time.time() + timeout_s
    while True:
        store = open_store(f"sqlite:///{d / 'production.db'}")
        rows = [r for r in store.iter_runs() if r["source"] == "production" and call_id in (None, r["call_id"])]
        store.close()
        if rows or time.time() >= deadline:
            return rows
        time.sleep(0.2)


def test_proxy_refuses_a_reused_call_id_and_each_answer_names_its_row(proxy):
    """A caller chooses its call id (x-litellm-call-id). A second request under an id that already names one is
    refused (409) before any backend call: whether the first is still in the writer's queue or in the table (as
    another proxy sharing it would have written it). So every answer's call id is the one its row is stored under,
    and feedback for it labels that row only."""
    from litellm_energy_router.energy.estimate import EstimateMeter
    from litellm_energy_router.feedback import apply_feedback
    from litellm_energy_router.litellm_glue.callback import PendingRow, TableWriter
    from litellm_energy_router.settings import PrivacySettings, WriterSettings

    port, b, d = proxy["port"], proxy["backend"], proxy["dir"]
    served = lambda: sum(b.count(c) for c in ("small", "medium", "large"))  # noqa: E731
    status, _, cid = _call(port, EASY + " first asker", "client-42")
    assert status == 200 and cid == "client-42"
    before = served()
    status, body, _ = _call(port, PROOF + " second asker", "client-42")  # the first row may still be queued
    assert status == 409 and "client-42" in body["error"]["message"], body
    assert served() == before
    (first,) = _production_rows(d, "client-42", timeout_s=30)
    # another proxy sharing the table stored a request under an id this one never saw: refused from the table
    w = TableWriter(
        f"sqlite:///{d / 'production.db'}",
        EstimateMeter(),
        privacy=PrivacySettings(),
        writer=WriterSettings(spool_dir=d / "other-spool", flush_interval_s=0.05),
    )
    w.submit(
        PendingRow(
            call_id="other-proxy-7",
            candidate=NAMES[0],
            status="success",
            text="elsewhere",
            start_s=1.0,
            end_s=2.0,
            first_token_s=None,
            prompt_tokens=3,
            completion_tokens=2,
            propensity=None,
            deployment_id=None,
            backend_id=None,
        )
    )
    w.close()
    status, body, _ = _call(port, EASY + " third asker", "other-proxy-7")
    assert status == 409 and "other-proxy-7" in body["error"]["message"] and served() == before, body
    # no caller id: the answer names the id LiteLLM assigned, and its row is stored under it
    status, _, auto = _call(port, EASY + " fourth asker")
    assert status == 200 and auto and _production_rows(d, auto, timeout_s=30)
    store = open_store(f"sqlite:///{d / 'production.db'}")
    assert apply_feedback(store, "client-42", 1.0) == 1  # labels the first asker's row, the only one under its id
    store.close()
    rows = _production_rows(d)
    assert [r["id"] for r in rows if r["call_id"] == "client-42"] == [first["id"]]
    assert not any(r["call_id"].startswith("dup-") for r in rows)  # nothing was stored under another id


def test_proxy_energy_logger_writes_production_rows(proxy):
    """The callback in the same config records every served request (source=production); shutdown flushes."""
    port = proxy["port"]
    _post(port, EASY + " logged")
    proxy["server"].stop(30)
    store = open_store(f"sqlite:///{proxy['dir'] / 'production.db'}")
    rows = [
        r for r in store.iter_runs() if r["source"] == "production" and r["call_id"] != "other-proxy-7"
    ]  # that one:
    store.close()  # another proxy's row, written by the call id test
    assert len(rows) >= 8  # every request of both tests, fallback included
    assert {r["candidate"] for r in rows} >= {
        "mistralai/mistral-7b-chat",
        "meta/llama-2-70b-chat",
        "zero-one-ai/Yi-34B-Chat",
    }
    assert all(r["energy_j"] and r["energy_j"] > 0 and r["energy_method"] == "estimate" for r in rows)
    # the token counts the backend reported for what it received
    usages = {
        expected_usage(messages_text(x["body"]["messages"])) for got in proxy["backend"].received.values() for x in got
    }
    assert all(r["latency_s"] is not None and (r["prompt_tokens"], r["completion_tokens"]) in usages for r in rows)
    routed = [r for r in rows if r["propensity"] is not None]
    assert routed and all(0 < r["propensity"] <= 1 for r in routed)


def test_bad_settings_are_one_line_and_the_proxy_still_serves(tmp_path):
    """A typo in energy-router.yaml: the router said "requests fail open", then the logger's import raised and the
    proxy died with a 400-line startup traceback (exit 3). Now the logger logs one line and records nothing."""
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("energy_router:\n  router: {timeout: 50}\n")
    code = (
        "import litellm_energy_router.litellm_glue.callback.proxy_logger as m\nprint(type(m.energy_logger).__name__)\n"
    )
    env = {**os.environ, "ENERGY_ROUTER_CONFIG": str(bad)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "CustomLogger", r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "energy-router" in ln]
    assert len(lines) == 1 and "energy logger not started" in lines[0] and "router.timeout" in lines[0], r.stderr
