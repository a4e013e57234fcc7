"""The GPU-node agent: bind policy, token, HTTP API, vLLM token counters, and the ``agent`` meter
(the proxy side) against a running agent."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from litellm_energy_router.agent.client import AgentMeter
from litellm_energy_router.agent.server import AgentConfig, BindError, EnergyAgent, check_bind, parse_vllm_tokens
from litellm_energy_router.energy import RequestUsage
from litellm_energy_router.energy.simulated import SimulatedMeter
from litellm_energy_router.threaded_app import ThreadedApp

EXE = str(Path(sys.executable).with_name("energy-router"))


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "gpu-node.example", "::"])
def test_non_local_bind_requires_token(host):
    with pytest.raises(BindError, match=f"refusing to bind '{host}' without a bearer token"):
        check_bind(host, None)
    with pytest.raises(BindError):
        EnergyAgent(SimulatedMeter(), AgentConfig(host=host))
    check_bind(host, "s3cret")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.5"])
def test_local_bind_needs_no_token(host):
    check_bind(host, None)


def test_cli_refuses_non_local_bind_without_token():
    env = {k: v for k, v in os.environ.items() if "AGENT_TOKEN" not in k}
    r = subprocess.run(
        [EXE, "agent", "--host", "0.0.0.0", "--meter", "simulated"], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 2
    assert "refusing to bind '0.0.0.0' without a bearer token" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_agent_serves_with_token():
    p = subprocess.Popen(
        [EXE, "agent", "--port", "0", "--meter", "simulated", "--token", "tok", "--sample-hz", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = p.stdout.readline()
        assert "energy agent listening on http://127.0.0.1:" in line, p.stderr.read() if p.poll() is not None else line
        url = line.split()[4]
        assert httpx.get(f"{url}/healthz").status_code == 200
        assert httpx.get(f"{url}/v1/energy").status_code == 401
        assert httpx.get(f"{url}/v1/energy", headers={"Authorization": "Bearer wrong"}).status_code == 401
        time.sleep(0.3)
        r = httpx.get(f"{url}/v1/energy", headers={"Authorization": "Bearer tok"})
        assert r.status_code == 200 and r.json()["joules"]["0"] > 0
        m = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer tok"}).text
        assert "energy_router_agent_samples_total" in m and 'energy_router_agent_window_joules{line="idle"}' in m
    finally:
        p.terminate()
        p.wait(10)


VLLM_METRICS = """# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="m"}} {p}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {g}
"""


def test_parse_vllm_tokens():
    assert parse_vllm_tokens(VLLM_METRICS.format(p=120.0, g=30.0)) == (120.0, 30.0)
    assert parse_vllm_tokens("# nothing here\n") is None


class FakeVLLM:
    """vLLM's /metrics with counters that grow like an engine decoding at a steady rate."""

    def __init__(self) -> None:
        self.t0 = time.time()

    def app(self) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            dt = time.time() - self.t0
            return web.Response(text=VLLM_METRICS.format(p=2000.0 * dt, g=400.0 * dt))

        a = web.Application()
        a.router.add_get("/metrics", metrics)
        return a


def test_agent_meter_against_running_agent():
    vllm = FakeVLLM()
    with ThreadedApp(vllm.app) as v:
        meter = SimulatedMeter(power_w=350.0)
        cfg = AgentConfig(token="tok", sample_hz=20, vllm_metrics_url=f"{v.url}/metrics", idle_power_w=50.0)
        agent = EnergyAgent(meter, cfg)
        with ThreadedApp(agent.app) as srv:
            client = AgentMeter(srv.url, token="tok", timeout_s=2.0)
            t0 = time.time()
            time.sleep(0.5)
            t1 = time.time()
            u = RequestUsage("chatcmpl-abc", "m", t0 + 0.05, t1 - 0.05, t0 + 0.1, 100, 40)
            e = None
            for _ in range(40):  # settles one sample after its end
                e = client.energy_for_request(u)
                if e is not None:
                    break
                time.sleep(0.05)
            assert e is not None and e.method == "agent" and e.settled and e.energy_j > 0
            # the request processed part of the engine's tokens: it gets at most the dynamic energy
            assert e.energy_j < (350.0 - 50.0) * (t1 - t0)
            # vLLM's response id "chatcmpl-<id>" and the bare id name the same request
            again = httpx.get(f"{srv.url}/v1/energy/abc", headers={"Authorization": "Bearer tok"}).json()
            assert again["energy_j"] == pytest.approx(e.energy_j)
            # unknown id without timings -> 404
            r = httpx.get(f"{srv.url}/v1/energy/nope", headers={"Authorization": "Bearer tok"})
            assert r.status_code == 404 and "unknown request id" in r.json()["error"]
            # the meter always sends timings: a request without tokens costs nothing
            time.sleep(0.15)
            assert (
                client.energy_for_request(RequestUsage("nope", "m", t0, t0 + 0.01, None, 0, 0), final=True).energy_j
                == 0.0
            )
            bad = httpx.get(
                f"{srv.url}/v1/energy/x", params={"start": "a", "end": "1"}, headers={"Authorization": "Bearer tok"}
            )
            assert bad.status_code == 400 and "bad query parameter" in bad.json()["error"]
            # live progress from an engine hook
            now = time.time()
            ev = [
                {"request_id": "live-1", "t": now - 0.2, "prompt_tokens": 0, "output_tokens": 0},
                {"request_id": "live-1", "t": now - 0.1, "prompt_tokens": 50, "output_tokens": 1},
                {"request_id": "live-1", "t": now, "prompt_tokens": 50, "output_tokens": 9, "finished": True},
            ]
            r = httpx.post(f"{srv.url}/v1/progress", json={"events": ev}, headers={"Authorization": "Bearer tok"})
            assert r.json() == {"accepted": 3}
            r = httpx.post(
                f"{srv.url}/v1/progress", json={"events": [{"t": 1}]}, headers={"Authorization": "Bearer tok"}
            )
            assert r.status_code == 400 and "events[0]" in r.json()["error"]
            w = httpx.get(f"{srv.url}/v1/energy", headers={"Authorization": "Bearer tok"}).json()["window"]
            assert w["requests_j"] + w["idle_j"] + w["unattributed_j"] == pytest.approx(w["meter_j"], rel=1e-9)
            assert w["unattributed_j"] > 0  # the engine's other tokens belong to requests we were not told about
            assert client.read().total_j > 0
            client.close()


def test_a_pool_over_two_gpu_nodes_asks_each_nodes_agent(tmp_path):
    """A pool whose candidates run on two GPU nodes (one agent each): there was one ``energy.agent_url``, so every
    request was charged the joules of that one node as measured. ``energy.agent_urls`` names each candidate's node:
    the same request gets the 100 W node's joules when ``small`` served it and the 400 W node's when ``large`` did; a
    candidate no agent covers gets no figure (the estimate's with ``fallback_to_estimate``)."""
    from litellm_energy_router.energy.request_meter import open_request_meter
    from litellm_energy_router.settings import EnergySettings

    nodes = [
        EnergyAgent(SimulatedMeter(power_w=w), AgentConfig(token="tok", sample_hz=20, idle_power_w=0.0))
        for w in (100.0, 400.0)
    ]
    with ThreadedApp(nodes[0].app) as a, ThreadedApp(nodes[1].app) as b:
        energy = EnergySettings(
            meter="agent", agent_token="tok", agent_urls={"small": a.url, "large": b.url}, fallback_to_estimate=False
        )
        meter = open_request_meter(energy)
        t0 = time.time()
        time.sleep(0.6)
        got = {}
        for cand in ("small", "large", "medium"):
            u = RequestUsage(f"r-{cand}", cand, t0 + 0.05, t0 + 0.45, t0 + 0.1, 100, 40)
            got[cand] = meter.energy_for_request(u, final=True)
        meter.close()
    assert got["medium"] is None
    assert got["small"].method == "agent" and got["large"].method == "agent"
    assert got["large"].energy_j == pytest.approx(4 * got["small"].energy_j, rel=0.15)  # each its own node's joules


def test_the_agent_starts_through_a_failing_first_read(caplog):
    """The first meter read at start was unguarded: an NVML error then (GPU lost) killed the agent with a traceback;
    now it is a gap and a warning, as every later read, and sampling goes on."""
    import asyncio

    class FlakyMeter(SimulatedMeter):
        reads = 0

        def read(self):
            FlakyMeter.reads += 1
            if FlakyMeter.reads == 1:
                raise RuntimeError("NVML: GPU is lost")
            return super().read()

    async def go():
        agent = EnergyAgent(FlakyMeter(), AgentConfig(sample_hz=50))
        await agent.start()
        await asyncio.sleep(0.3)
        await agent.stop()
        return agent

    with caplog.at_level("WARNING", logger="litellm_energy_router"):
        agent = asyncio.run(go())
    assert FlakyMeter.reads > 3 and agent.attributor.last_sample_t() is not None
    assert any("GPU is lost" in r.getMessage() for r in caplog.records)
