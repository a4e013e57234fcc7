"""Footprint of the router inside a real LiteLLM proxy process (used by ``bench_routing.py``).

Starts ``litellm --config`` twice on 127.0.0.1 against a local OpenAI-compatible backend: plain LiteLLM
(the same deployments, no callbacks, simple-shuffle), then with the energy router and the energy logger
(``checkpoint``'s serving scorer). For each: the time from spawning the process to the first answered
request (for the router: the first request the router routed, not the fail-open deployment) and the
proxy's resident memory (VmRSS, MiB) after ``n_requests`` more requests.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from proxy_process import ProxyProcess  # noqa: E402

KEY = "sk-energy-router-bench-0123456789"
FAIL_OPEN_ID = "fail-open"  # a deployment that is no candidate: the router's fallback
ROUTER_CALLBACK = "litellm_energy_router.litellm_glue.proxy_router.energy_router"
LOGGER_CALLBACK = "litellm_energy_router.litellm_glue.callback.proxy_logger.energy_logger"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _post(port: int, text: str) -> str | None:
    body = {"model": "chat", "messages": [{"role": "user", "content": text}]}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
        return r.headers.get("x-litellm-model-id")


def _config(candidates: list[str], base, with_router: bool) -> dict:
    deps = [
        {
            "model_name": "chat",
            "litellm_params": {"model": f"openai/c{j}", "api_base": base(f"c{j}"), "api_key": "k"},
            "model_info": {"id": f"dep-{j}", "energy_router_candidate": c},
        }
        for j, c in enumerate(candidates)
    ]
    deps.append(
        {
            "model_name": "chat",
            "litellm_params": {"model": "openai/fallback", "api_base": base("fallback"), "api_key": "k"},
            "model_info": {"id": FAIL_OPEN_ID},
        }
    )
    cfg = {"model_list": deps, "general_settings": {"master_key": KEY}}
    if with_router:
        cfg["litellm_settings"] = {"callbacks": [ROUTER_CALLBACK, LOGGER_CALLBACK]}
    else:
        cfg["router_settings"] = {"routing_strategy": "simple-shuffle"}
    return cfg


def run_proxy(checkpoint: Path | None, candidates: list[str], base, texts: list[str], n_requests: int = 200) -> dict:
    """Start one proxy (with the router when ``checkpoint`` is given), measure, stop it."""
    d = Path(tempfile.mkdtemp(prefix="er-proxy-bench-"))
    (d / "config.yaml").write_text(yaml.safe_dump(_config(candidates, base, checkpoint is not None)))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "LITELLM_LOG": "ERROR"}
    if checkpoint is not None:
        env.update(
            {
                "ENERGY_ROUTER_ROUTER__CHECKPOINT": str(checkpoint),
                "ENERGY_ROUTER_ROUTER__FALLBACK": FAIL_OPEN_ID,
                "ENERGY_ROUTER_KNOB__LAMBDA": "0.2",
                "ENERGY_ROUTER_TABLE__URL": f"sqlite:///{d / 'production.db'}",
                "ENERGY_ROUTER_WRITER__SPOOL_DIR": str(d / "spool"),
            }
        )
    server = ProxyProcess(d / "config.yaml", env, d)
    port, t0 = server.port, time.monotonic()
    proc = server.start(wait_ready=False).proc
    first_s, fail_open = None, 0
    try:
        while time.monotonic() - t0 < 300:
            if proc.poll() is not None:
                raise RuntimeError(f"proxy exited: {server.log_tail(2000)}")
            try:
                dep = _post(port, texts[0])
            except OSError:
                time.sleep(0.05)
                continue
            if dep != FAIL_OPEN_ID or checkpoint is None:
                first_s = time.monotonic() - t0
                break
            fail_open += 1
        for i in range(n_requests):
            _post(port, texts[(i + 1) % len(texts)] + f" #{i}")
        rss = _rss_mib(proc.pid)
    finally:
        server.stop(30)
    return {"first_routed_s": first_s, "rss_mib": rss, "fail_open_before_ready": fail_open}
