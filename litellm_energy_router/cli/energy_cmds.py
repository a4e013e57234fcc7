"""``energy-router agent`` (the GPU-node energy agent) and ``energy-router feedback ...``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from litellm_energy_router.cli.common import (
    ConfigOpt,
    DbOpt,
    console,
    db_url,
    err_console,
    fail,
    settings_or_fail,
)

feedback_app = typer.Typer(help="Quality labels for production rows, keyed by LiteLLM call id.", no_args_is_help=True)


def agent(
    host: str = typer.Option("127.0.0.1", "--host", help="bind address; anything but loopback needs --token"),
    port: int = typer.Option(9400, "--port", min=0, max=65535, help="TCP port (0: any free port)"),
    token: Optional[str] = typer.Option(
        None,
        "--token",
        envvar="ENERGY_ROUTER_AGENT_TOKEN",
        help="bearer token required on every endpoint (default: energy.agent_token)",
    ),
    meter: str = typer.Option(
        "nvml", "--meter", help="nvml | simulated | a plugin's meter (built with energy.options)"
    ),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU indices, e.g. 0,1 (default: energy.gpus or all)"),
    vllm_metrics_url: Optional[str] = typer.Option(
        None, "--vllm-metrics-url", help="vLLM /metrics, e.g. http://127.0.0.1:8000/metrics (token counters)"
    ),
    sample_hz: Optional[float] = typer.Option(
        None, "--sample-hz", help="meter samples per second (default: energy.sample_hz)"
    ),
    history_s: Optional[float] = typer.Option(
        None, "--history-s", help="seconds of history kept (default: energy.history_s)"
    ),
    simulated_power_w: float = typer.Option(300.0, "--simulated-power-w", help="power of the simulated meter, W"),
    tls_cert: Optional[Path] = typer.Option(
        None,
        "--tls-cert",
        exists=True,
        dir_okay=False,
        help="PEM certificate chain: serve https (default: energy.agent_tls_cert)",
    ),
    tls_key: Optional[Path] = typer.Option(
        None, "--tls-key", exists=True, dir_okay=False, help="PEM key of --tls-cert (default: energy.agent_tls_key)"
    ),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Run the GPU-node energy agent beside vLLM: samples the meter, attributes each interval's joules
    to the requests in flight by tokens, serves GET /v1/energy/{request_id} and /metrics."""
    from litellm_energy_router.agent.server import EnergyAgent

    s = settings_or_fail(config).energy
    opts = dict(
        host=host,
        port=port,
        token=token,
        sample_hz=sample_hz,
        history_s=history_s,
        vllm_metrics_url=vllm_metrics_url,
        tls_cert=tls_cert and str(tls_cert),
        tls_key=tls_key and str(tls_key),
    )
    cfg = _agent_config(s, opts)
    m = _agent_meter(s, meter, gpus, simulated_power_w)
    ag = EnergyAgent(m, cfg)
    _serve_agent(ag, m, cfg, host, port)


def _agent_meter(s: Any, meter: str, gpus: Optional[str], simulated_power_w: float) -> Any:
    """The agent's counter meter ``meter`` (``energy`` settings ``s`` give the GPUs and a plugin's options):
    exits with a one-line error when refused or unavailable."""
    from litellm_energy_router.energy import MeterError, make_meter

    if meter in ("estimate", "agent"):
        fail(
            f"--meter {meter!r}: the agent measures with a counter meter ('nvml', a plugin's, or 'simulated' for tests)"
        )
    try:
        idx = [int(x) for x in gpus.split(",") if x.strip()] if gpus else s.gpus
    except ValueError:
        fail(f"--gpus {gpus!r}: expected comma-separated GPU indices, e.g. 0,1")
    builtin = {"nvml": {"gpus": idx}, "simulated": {"power_w": simulated_power_w}}
    kwargs = builtin.get(meter, s.options if meter == s.meter else {})
    try:
        return make_meter(meter, **kwargs)
    except MeterError as e:
        fail(f"{getattr(e, 'reason', e)}; the agent runs on a GPU host (--meter simulated for a test run)")
    except Exception as e:  # noqa: BLE001 - unknown name, or a plugin's meter refusing its options
        fail(f"--meter {meter!r}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")


def _serve_agent(ag: Any, m: Any, cfg: Any, host: str, port: int) -> None:
    """Serve the agent ``ag`` until stopped (a warning first when plain HTTP leaves loopback); the meter
    ``m`` is closed after."""
    import asyncio

    from litellm_energy_router.agent.server import is_local, serve

    scheme = "https" if ag.ssl_context else "http"
    if scheme == "http" and not is_local(host):
        err_console.print(
            f"agent: warning: serving {host} over plain HTTP: the bearer token travels in clear text "
            "(--tls-cert/--tls-key)",
            highlight=False,
            soft_wrap=True,
        )

    def ready(p: int) -> None:
        console.print(
            f"energy agent listening on {scheme}://{host}:{p} (meter {m.name}, {cfg.sample_hz:g} Hz)",
            highlight=False,
            soft_wrap=True,
        )
        console.file.flush()

    try:
        asyncio.run(serve(ag, ready=ready))
    except OSError as e:
        fail(f"agent: cannot listen on {host}:{port}: {e.strerror or e}")
    finally:
        m.close()


def _agent_config(s: Any, opts: dict[str, Any]) -> Any:
    """The agent's config from command-line ``opts`` (``None``: the setting) and ``energy`` settings ``s``,
    with the bind policy and TLS files checked: exits with a one-line error when refused."""
    from pydantic import ValidationError

    from litellm_energy_router.agent.server import AgentConfig, BindError, EnergyAgent
    from litellm_energy_router.errors import one_line

    try:
        cfg = AgentConfig.from_energy(s, **opts)
        EnergyAgent.check(cfg)
    except ValidationError as e:
        fail(one_line(e, "agent", key="option"))
    except BindError as e:
        fail(str(e))
    return cfg


@feedback_app.command("set")
def feedback_set(
    call_id: str = typer.Argument(..., help="LiteLLM call id (x-litellm-call-id / response._hidden_params)"),
    score: str = typer.Argument(..., help="correctness in [0, 1]"),
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Score one production answer."""
    from litellm_energy_router.feedback import apply_feedback
    from litellm_energy_router.table import open_store

    store = open_store(db_url(db, config), create=False)  # labels rows of an existing table, creates none
    try:
        n = apply_feedback(store, call_id, score)
    finally:
        store.close()
    if n == 0:
        console.print(f"call {call_id} already has score {float(score):g}: nothing written", highlight=False)
    else:
        console.print(f"scored {n} run(s) of call {call_id} = {float(score):g}", highlight=False)


@feedback_app.command("serve")
def feedback_serve(
    host: Optional[str] = typer.Option(None, "--host", help="bind address (default: feedback.host)"),
    port: Optional[int] = typer.Option(
        None, "--port", min=0, max=65535, help="TCP port (default: feedback.port; 0: any free port)"
    ),
    token: Optional[str] = typer.Option(
        None, "--token", envvar="ENERGY_ROUTER_FEEDBACK_TOKEN", help="operator bearer token (default: feedback.token)"
    ),
    caller_keys: Optional[bool] = typer.Option(
        None,
        "--caller-keys/--no-caller-keys",
        help="a LiteLLM virtual key labels the calls made with it (default: feedback.caller_keys)",
    ),
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Serve POST /v1/feedback {"call_id", "score"} (the operator's token, or a caller's own LiteLLM key)."""
    import asyncio

    from aiohttp import web

    from litellm_energy_router.feedback import feedback_app as make_app
    from litellm_energy_router.table import open_store

    s = settings_or_fail(config)
    token = token or s.feedback.token
    caller_keys = s.feedback.caller_keys if caller_keys is None else caller_keys
    if not token and not caller_keys:
        fail(
            "feedback serve: a bearer token is required (--token, ENERGY_ROUTER_FEEDBACK_TOKEN or feedback.token), "
            "or --caller-keys"
        )
    host = host or s.feedback.host
    port = s.feedback.port if port is None else port
    store = open_store(db or s.table.url, create=False)

    async def main() -> None:
        runner = web.AppRunner(make_app(store, token, caller_keys=caller_keys), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        p = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        console.print(f"feedback endpoint listening on http://{host}:{p}/v1/feedback", highlight=False, soft_wrap=True)
        console.file.flush()
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except OSError as e:
        fail(f"feedback serve: cannot listen on {host}:{port}: {e.strerror or e}")
    finally:
        store.close()
