"""`energy-router replay-backend` as a subprocess: the printed proxy config's deployments answer a real
LiteLLM Router with the recorded RouterBench responses; a bad port or file is one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import litellm
import pytest
import yaml
from litellm_energy_router.profiling.routerbench import bundled_files, iter_records

EXE = str(Path(sys.executable).with_name("energy-router"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@pytest.mark.litellm_integration
def test_replay_backend_serves_the_printed_config():
    proc = subprocess.Popen(
        [EXE, "replay-backend", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
    )
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.strip().startswith("master_key:"):
                break
        cfg = yaml.safe_load("".join(lines))
        assert cfg["litellm_settings"]["callbacks"] == [
            "litellm_energy_router.litellm_glue.proxy_router.energy_router",
            "litellm_energy_router.litellm_glue.callback.proxy_logger.energy_logger",
            "prometheus",  # /metrics, as README's config
        ]
        deps = cfg["model_list"]
        by_id = {d["model_info"]["id"]: d["model_info"]["energy_router_candidate"] for d in deps}
        assert len(deps) == 6 and {d["model_name"] for d in deps} == {"chat"}
        assert all(d["litellm_params"]["model"] == "openai/" + by_id[d["model_info"]["id"]] for d in deps)
        rec = next(iter(iter_records(bundled_files()[:1])))
        router = litellm.Router(model_list=deps)
        for _ in range(3):
            resp = router.completion(model="chat", messages=[{"role": "user", "content": rec.prompt}])
            cand = by_id[resp._hidden_params["model_id"]]
            assert resp.choices[0].message.content == rec.answers[cand][1]  # the recorded answer of that candidate
            assert resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens > 0
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.parametrize(
    "args, says",
    [(["--port", "70000"], "--port 70000"), (["--data", "/nonexistent/rb.csv"], "/nonexistent/rb.csv: file not found")],
)
def test_replay_backend_bad_input_is_one_line(args, says):
    r = subprocess.run([EXE, "replay-backend", *args], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""
