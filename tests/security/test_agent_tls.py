"""The GPU-node agent over TLS: a self-signed certificate made here, verified by the client; plain HTTP to the TLS
port fails; a half-configured TLS is refused in one line; the CLI agent serves TLS from its settings."""

from __future__ import annotations

import os
import subprocess
import time

import httpx
import pytest
from agent_fixtures import AUTH, EXE, TOKEN, Served, make_cert, poll

from litellm_energy_router.agent.client import AgentMeter
from litellm_energy_router.agent.server import AgentConfig, BindError, EnergyAgent
from litellm_energy_router.energy import MeterError, RequestUsage
from litellm_energy_router.energy.simulated import SimulatedMeter
from litellm_energy_router.settings import ConfigError, load_settings


def test_tls_client_verifies_and_plain_http_to_the_tls_port_fails(tmp_path):
    cert, key = make_cert(tmp_path)
    other, _ = make_cert(tmp_path, "other")
    cfg = AgentConfig(port=0, token=TOKEN, sample_hz=20, tls_cert=str(cert), tls_key=str(key))
    with Served(EnergyAgent(SimulatedMeter(power_w=300.0), cfg)) as s:
        url = f"https://127.0.0.1:{s.port}"
        client = AgentMeter(url, token=TOKEN, ca_bundle=str(cert))
        assert poll(lambda: client.read().total_j > 0)
        time.sleep(0.6)  # history before the request
        t0 = time.time() - 0.4
        u = RequestUsage("tls-1", "m", t0, t0 + 0.2, t0 + 0.05, 30, 10)
        e = poll(lambda: client.energy_for_request(u))
        assert e is not None and e.method == "agent" and e.energy_j > 0
        client.close()
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port
            httpx.get(f"http://127.0.0.1:{s.port}/healthz", timeout=5)
        plain = AgentMeter(f"http://127.0.0.1:{s.port}", token=TOKEN)
        with pytest.raises(MeterError):
            plain.read()
        for ca in (None, str(other)):  # unverified certificate: refused, the token is never sent
            bad = AgentMeter(url, token=TOKEN, ca_bundle=ca)
            with pytest.raises(MeterError, match="CERTIFICATE_VERIFY_FAILED"):
                bad.read()
            assert bad.energy_for_request(u, final=True).energy_j is None
        assert httpx.get(f"{url}/metrics", headers=AUTH, verify=False).status_code == 200


def test_tls_misconfiguration_is_refused_in_one_line(tmp_path):
    cert, key = make_cert(tmp_path)
    cases = [
        ({"tls_cert": str(cert)}, "tls_key"),
        ({"tls_key": str(key)}, "tls_cert"),
        ({"tls_cert": str(tmp_path / "nope.crt"), "tls_key": str(key)}, "nope.crt"),
        ({"tls_cert": str(key), "tls_key": str(cert)}, "agent.key"),
    ]
    for kw, named in cases:
        with pytest.raises(BindError) as ei:
            EnergyAgent(SimulatedMeter(), AgentConfig(token=TOKEN, **kw))
        assert named in str(ei.value) and "\n" not in str(ei.value)
    env = {k: v for k, v in os.environ.items() if "AGENT_TOKEN" not in k}
    r = subprocess.run(
        [EXE, "agent", "--port", "0", "--meter", "simulated", "--tls-cert", str(cert)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2 and "tls_key" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    with pytest.raises(MeterError, match="agent_ca_bundle"):  # a CA bundle for a plain-HTTP URL: TLS was intended
        AgentMeter("http://gpu-node:9400", token=TOKEN, ca_bundle=str(cert))
    with pytest.raises(MeterError, match="nope.pem"):
        AgentMeter("https://gpu-node:9400", token=TOKEN, ca_bundle=str(tmp_path / "nope.pem"))


def test_cli_agent_over_tls_with_settings(tmp_path):
    cert, key = make_cert(tmp_path)
    cfg = tmp_path / "er.yaml"
    cfg.write_text(
        f"energy_router:\n energy:\n  agent_tls_cert: {cert}\n  agent_tls_key: {key}\n  agent_ca_bundle: {cert}\n"
    )
    env = {**{k: v for k, v in os.environ.items() if "AGENT_TOKEN" not in k}, "ENERGY_ROUTER_AGENT_TOKEN": TOKEN}
    p = subprocess.Popen(
        [EXE, "agent", "--port", "0", "--meter", "simulated", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = p.stdout.readline()
        assert "energy agent listening on https://127.0.0.1:" in line, p.stderr.read() if p.poll() is not None else line
        url = line.split()[4]
        s = load_settings(cfg, environ={})
        client = AgentMeter(url, token=TOKEN, ca_bundle=str(s.energy.agent_ca_bundle))
        assert poll(lambda: client.read().total_j > 0)
        client.close()
    finally:
        p.terminate()
        p.wait(10)


def test_agent_settings_are_validated(tmp_path):
    bad = [
        ("agent_tls_cert: /x.crt", "agent_tls_key"),
        ("agent_max_requests: 0", "agent_max_requests"),
        ("agent_stale_s: -1", "agent_stale_s"),
        ("agent_max_body_bytes: 10", "agent_max_body_bytes"),
        ("agent_max_clock_skew_s: .nan", "agent_max_clock_skew_s"),
    ]
    for text, named in bad:
        f = tmp_path / "c.yaml"
        f.write_text(f"energy_router:\n energy:\n  {text}\n")
        with pytest.raises(ConfigError) as ei:
            load_settings(f, environ={})
        assert named in str(ei.value) and "\n" not in str(ei.value)
