"""The GPU-node agent: ``energy-router agent --host 127.0.0.1 --port 9400``.

Runs beside vLLM on each GPU host. Every ``1/sample_hz`` s it reads the energy meter (and, when
``vllm_metrics_url`` is set, vLLM's cumulative ``vllm:prompt_tokens_total`` /
``vllm:generation_tokens_total`` counters) and closes an interval; :mod:`.attribution` splits each
interval's joules across the requests in flight by tokens processed, with idle as its own line.

Requests become known to it by:

* **timings** — ``GET /v1/energy/{id}?start=&end=&first_token=&prompt_tokens=&completion_tokens=``
  (Unix s; what the proxy's ``agent`` meter sends for each finished request); with vLLM's token
  counters the answer is causal (settles one sample after the request ends);
* **live progress** — ``POST /v1/progress`` ``{"events": [{"request_id", "t", "prompt_tokens",
  "output_tokens", "finished"}]}`` (cumulative token counts at Unix time ``t``), for an engine hook.

Endpoints: ``GET /v1/energy/{request_id}``, ``GET /v1/energy`` (cumulative meter J per GPU and the
energy lines over the history), ``POST /v1/progress``, ``GET /metrics`` (Prometheus), ``GET /healthz``.

Security: binds 127.0.0.1 by default; any other address requires a bearer token, checked on every
endpoint but ``/healthz``. Memory: ``history_s`` seconds of intervals and requests.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import ClientSession, ClientTimeout, web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from .attribution import Attributor
from .meter import EnergyMeter

log = logging.getLogger("litellm_energy_router.agent")

VLLM_PROMPT = "vllm:prompt_tokens_total"
VLLM_GEN = "vllm:generation_tokens_total"


class BindError(ValueError):
    """Refused bind address (non-local without a token)."""


def is_local(host: str) -> bool:
    """True for loopback addresses and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Raise :class:`BindError` for a non-loopback bind without a bearer token."""
    if not is_local(host) and not token:
        raise BindError(
            f"agent: refusing to bind {host!r} without a bearer token (set --token, ENERGY_ROUTER_AGENT_TOKEN or "
            "energy.agent_token, or bind 127.0.0.1)"
        )


@dataclass
class AgentConfig:
    """Agent settings. Units: Hz, seconds, watts."""

    host: str = "127.0.0.1"
    port: int = 9400
    token: str | None = None
    sample_hz: float = 10.0
    history_s: float = 600.0
    prefill_weight: float = 0.125
    decode_weight: float = 1.0
    idle_power_w: float | str = 0.0
    vllm_metrics_url: str | None = None
    gpu: str | None = None


def parse_vllm_tokens(text: str) -> tuple[float, float] | None:
    """Sum vLLM's cumulative prompt and generation token counters over all label sets."""
    p = g = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == VLLM_PROMPT:
                p = (p or 0.0) + s.value
            elif s.name == VLLM_GEN:
                g = (g or 0.0) + s.value
    return (p, g) if p is not None and g is not None else None


def _norm(rid: str) -> str:
    for prefix in ("chatcmpl-", "cmpl-"):
        if rid.startswith(prefix):
            return rid[len(prefix) :]
    return rid


class EnergyAgent:
    """Sampler + attribution + HTTP API. Use :meth:`app` with any aiohttp runner, or :func:`serve`."""

    def __init__(self, meter: EnergyMeter, cfg: AgentConfig, *, clock: Callable[[], float] = time.time) -> None:
        check_bind(cfg.host, cfg.token)
        self.meter = meter
        self.cfg = cfg
        self.clock = clock
        self.attributor = Attributor(
            prefill_weight=cfg.prefill_weight, decode_weight=cfg.decode_weight,
            idle_power_w=cfg.idle_power_w, history_s=cfg.history_s,  # type: ignore[arg-type]
        )  # fmt: skip
        self.gpu = cfg.gpu or getattr(meter, "gpu", None) or getattr(meter, "gpu_name", None)
        self._task: asyncio.Task | None = None
        self._session: ClientSession | None = None
        self._last_reading: dict[int, float] = {}
        self._last_power_w = 0.0
        self._prev: tuple[float, float] | None = None
        self.registry = CollectorRegistry()
        self.m_samples = Counter("energy_router_agent_samples", "meter samples taken", registry=self.registry)
        self.m_scrape_err = Counter("energy_router_agent_vllm_scrape_errors", "failed vLLM /metrics scrapes", registry=self.registry)
        self.m_meter = Gauge("energy_router_agent_meter_joules", "cumulative meter reading, J", ["gpu"], registry=self.registry)
        self.m_power = Gauge("energy_router_agent_power_watts", "power over the last interval, W", registry=self.registry)
        self.m_lines = Gauge("energy_router_agent_window_joules", "energy lines over the kept history, J", ["line"], registry=self.registry)
        self.m_inflight = Gauge("energy_router_agent_requests_in_flight", "requests known and not finished", registry=self.registry)
        self.m_floor = Gauge("energy_router_agent_idle_floor_watts", "idle (static) power line, W", registry=self.registry)

    # -- sampling ---------------------------------------------------------------------------------
    async def _scrape_vllm(self) -> tuple[float, float] | None:
        if not self.cfg.vllm_metrics_url:
            return None
        if self._session is None:
            self._session = ClientSession(timeout=ClientTimeout(total=max(0.05, 0.8 / self.cfg.sample_hz)))
        try:
            async with self._session.get(self.cfg.vllm_metrics_url) as r:
                r.raise_for_status()
                return parse_vllm_tokens(await r.text())
        except Exception as e:  # noqa: BLE001 - vLLM restarting: sample energy anyway
            self.m_scrape_err.inc()
            log.debug("vLLM metrics scrape failed: %s", e)
            return None

    async def tick(self) -> None:
        """Take one sample (meter + optional vLLM counters)."""
        reading = self.meter.read()
        t = self.clock()
        tokens = await self._scrape_vllm()
        e = reading.total_j
        if tokens is None:
            self.attributor.add_sample(t, e)
        else:
            self.attributor.add_sample(t, e, tokens[0], tokens[1])
        self.m_samples.inc()
        self._last_reading = dict(reading.joules)
        for i, j in reading.joules.items():
            self.m_meter.labels(str(i)).set(j)
        if self._prev is not None and t > self._prev[0]:
            self._last_power_w = (e - self._prev[1]) / (t - self._prev[0])
            self.m_power.set(self._last_power_w)
        self._prev = (t, e)

    async def _run(self) -> None:
        period = 1.0 / self.cfg.sample_hz
        loop = asyncio.get_running_loop()
        nxt = loop.time()
        while True:
            try:
                await self.tick()
            except Exception as e:  # noqa: BLE001
                log.warning("agent: meter read failed: %s", e)
            nxt += period
            await asyncio.sleep(max(0.0, nxt - loop.time()))

    async def start(self) -> None:
        await self.tick()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- HTTP -------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/energy", self._energy_all)
        app.router.add_get("/v1/energy/{request_id}", self._energy_one)
        app.router.add_post("/v1/progress", self._progress)

        async def on_startup(_: web.Application) -> None:
            await self.start()

        async def on_cleanup(_: web.Application) -> None:
            await self.stop()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.cfg.token and request.path != "/healthz":
            got = request.headers.get("Authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {self.cfg.token}".encode()):
                return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        return await handler(request)

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True, "last_sample_t": self.attributor.last_sample_t()})

    async def _metrics(self, _: web.Request) -> web.Response:
        tot = self.attributor.totals()
        for line, v in (("meter", tot.meter_j), ("requests", tot.requests_j), ("idle", tot.idle_j), ("unattributed", tot.unattributed_j)):
            self.m_lines.labels(line).set(v)
        self.m_inflight.set(self.attributor.in_flight())
        self.m_floor.set(self.attributor.idle_power_floor_w())
        return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")

    async def _energy_all(self, _: web.Request) -> web.Response:
        tot = self.attributor.totals()
        return web.json_response({
            "joules": {str(k): v for k, v in self._last_reading.items()},
            "power_w": self._last_power_w, "gpu": self.gpu,
            "window": {"t0": tot.t0, "t1": tot.t1, "meter_j": tot.meter_j, "requests_j": tot.requests_j,
                       "idle_j": tot.idle_j, "unattributed_j": tot.unattributed_j},
        })  # fmt: skip

    async def _energy_one(self, request: web.Request) -> web.Response:
        rid = _norm(request.match_info["request_id"])
        q = request.query
        try:
            final = q.get("final", "0") in ("1", "true")
            if "start" in q and "end" in q:
                start, end = float(q["start"]), float(q["end"])
                ft = float(q["first_token"]) if q.get("first_token") else None
                pt, ct = int(q.get("prompt_tokens", 0)), int(q.get("completion_tokens", 0))
                if not all(math.isfinite(x) for x in (start, end)) or end < start or pt < 0 or ct < 0:
                    raise ValueError("need finite start <= end and non-negative token counts")
                if not self.attributor.knows(rid):
                    self.attributor.add_request(rid, start, end, pt, ct, ft)
        except ValueError as e:
            return web.json_response({"error": f"bad query parameter: {e}"}, status=400)
        a = self.attributor.energy(rid, final=final)
        if a is None:
            if not self.attributor.knows(rid):
                return web.json_response({"error": f"unknown request id {rid!r}"}, status=404)
            return web.json_response({"request_id": rid, "energy_j": None, "settled": False})
        return web.json_response({
            "request_id": rid, "energy_j": a.energy_j, "settled": a.settled, "start": a.start_s, "end": a.end_s,
            "avg_power_w": a.avg_power_w, "gpu": self.gpu, "method": "agent",
        })  # fmt: skip

    async def _progress(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            events = body["events"]
            parsed = []
            for i, ev in enumerate(events):
                try:
                    parsed.append((_norm(str(ev["request_id"])), float(ev["t"]), float(ev.get("prompt_tokens", 0)),
                                   float(ev.get("output_tokens", 0)), bool(ev.get("finished", False))))  # fmt: skip
                except (KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"events[{i}]: {type(e).__name__}: {e}") from None
        except (ValueError, KeyError, TypeError) as e:
            return web.json_response({"error": f"bad progress body: {e}"}, status=400)
        for rid, t, p, o, fin in parsed:
            self.attributor.add_progress(rid, t, p, o, fin)
        return web.json_response({"accepted": len(parsed)})


async def serve(agent: EnergyAgent, *, ready: Callable[[int], None] | None = None) -> None:
    """Serve until cancelled. ``ready(port)`` is called once listening."""
    runner = web.AppRunner(agent.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, agent.cfg.host, agent.cfg.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1] if site._server else agent.cfg.port  # type: ignore[union-attr]
    if ready:
        ready(port)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
