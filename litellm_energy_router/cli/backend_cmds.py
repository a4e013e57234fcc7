"""``energy-router replay-backend``: the demo's local OpenAI-compatible backend on its own, and the LiteLLM
proxy config that routes a pool of its deployments by energy (try the proxy on a laptop, no GPU, no code)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Optional

import typer

from litellm_energy_router.cli.common import err_console, fail

GROUP = "chat"


def proxy_config(api_base: str, candidates: list[str], group: str = GROUP) -> dict[str, Any]:
    """A LiteLLM proxy config: one deployment per candidate at ``api_base`` (tagged
    ``energy_router_candidate``) in the model group ``group``, the energy router and the energy logger as
    callbacks, the master key from ``LITELLM_MASTER_KEY``."""
    from litellm_energy_router.demo.backend import model_list

    return {
        "model_list": model_list(api_base, candidates, group=group),
        "litellm_settings": {
            "callbacks": [
                "litellm_energy_router.litellm_glue.proxy_router.energy_router",
                "litellm_energy_router.litellm_glue.callback.proxy_logger.energy_logger",
                "prometheus",  # /metrics, ours included (docs/metrics.md)
            ]
        },
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }


def replay_backend(
    port: int = typer.Option(8000, "--port", help="TCP port on 127.0.0.1 (0: a free one)"),
    data: Optional[list[Path]] = typer.Option(
        None, "--data", help="RouterBench CSV(.gz) file to replay (repeatable; default: the bundled rows)"
    ),
    group: str = typer.Option(GROUP, "--group", help="model group of the printed deployments"),
) -> None:
    """Serve RouterBench's recorded answers as an OpenAI-compatible backend on 127.0.0.1 (model = a
    candidate name, e.g. openai/mistralai/mistral-7b-chat), and print (stdout, YAML) the LiteLLM proxy
    config that routes a pool of its deployments by energy. Runs until Ctrl-C."""
    import yaml

    from litellm_energy_router.demo.backend import LocalBackend, ReplayAnswers
    from litellm_energy_router.profiling.routerbench import (
        ImportFormatError,
        bundled_files,
        iter_records,
    )

    if not 0 <= port <= 65535:
        fail(f"--port {port}: not a TCP port (0-65535)")
    try:
        answers = ReplayAnswers(iter_records(data or bundled_files()))
    except ImportFormatError as e:
        fail(str(e))
        raise  # unreachable
    try:
        backend = LocalBackend(answers, port=port).start()
    except RuntimeError as e:
        fail(f"--port {port}: {e}" + (" (--port 0 picks a free one)" if "in use" in str(e) else ""))
        raise  # unreachable
    head = (
        f"# energy-router replay-backend: {len(answers.candidates)} candidates replaying recorded answers at {backend.base_url}\n"
        "# Save as proxy_config.yaml, then (the checkpoint: the one `energy-router demo` promotes, run from the same\n"
        "# directory: energy_router_demo/router.json (make demo-quick: .ci-demo/work/router.json); without one each\n"
        "# request fails open to LiteLLM's own choice; rows go to energy_router.db in the proxy's directory):\n"
        "#   ENERGY_ROUTER_ROUTER__CHECKPOINT=energy_router_demo/router.json LITELLM_MASTER_KEY=sk-local-key \\\n"
        "#     litellm --config proxy_config.yaml --host 127.0.0.1 --port 4000\n"
    )
    print(head + yaml.safe_dump(proxy_config(backend.base_url, answers.candidates, group), sort_keys=False), flush=True)
    err_console.print(f"replay backend serving at {backend.base_url} (Ctrl-C stops)", highlight=False, soft_wrap=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        backend.stop()
