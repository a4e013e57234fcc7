"""The GPU-node agent: ``energy-router agent --host 127.0.0.1 --port 9400``.

Runs beside vLLM on each GPU host. Every ``1/sample_hz`` s it reads the energy meter (and, when
``vllm_metrics_url`` is set, vLLM's cumulative ``vllm:prompt_tokens_total`` /
``vllm:generation_tokens_total`` counters) and closes an interval; :mod:`.attribution` splits each
interval's joules across the requests in flight by tokens processed, with idle as its own line.

Requests become known to it by:

* **timings** — ``GET /v1/energy/{id}?start=&end=&first_token=&prompt_tokens=&completion_tokens=``
  (Unix s; what the proxy's ``agent`` meter sends for each finished request); with vLLM's token
  counters the answer is causal (settles one sample after the request ends). Without them (and without
  progress events) a request still running is unknown when another one ends, so each interval's joules go to
  the requests in the order their answers settle: a settled share is never given again (the answers add up to
  the meter, not more), but the split between concurrent requests follows that order, not their tokens;
* **live progress** — ``POST /v1/progress`` ``{"events": [{"request_id", "t", "prompt_tokens",
  "output_tokens", "finished"}]}`` (cumulative token counts at Unix time ``t``), for an engine hook.

Endpoints: ``GET /v1/energy/{request_id}``, ``GET /v1/energy`` (cumulative meter J per GPU and the
energy lines over the history), ``POST /v1/progress``, ``GET /metrics`` (Prometheus), ``GET /healthz``.

Security (see ``docs/security.md``): binds 127.0.0.1 by default; any other address requires a
non-blank bearer token (:mod:`.config`: the settings and this bind policy), checked (in constant time) on every endpoint but ``/healthz``. TLS when
``tls_cert``/``tls_key`` are set. Callers' input is validated and bounded (:mod:`.api`): 400
naming the field, 413 for a body over ``max_body_bytes``. Memory: ``history_s`` seconds of intervals
and requests, at most ``max_requests`` requests and ``max_segments`` token segments (oldest dropped
first); an unfinished request silent for ``stale_s`` expires. Drops and refusals are counted in
``/metrics``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import ssl
import time
from typing import Any, Callable

from aiohttp import ClientSession, ClientTimeout, web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from litellm_energy_router.agent.api import (
    ApiError,
    TimeWindow,
    parse_progress,
    parse_request_id,
    parse_timings,
    read_body,
)
from litellm_energy_router.agent.config import (  # noqa: F401 (re-exported)
    FROM_ENERGY,
    AgentConfig,
    BindError,
    check_bind,
    is_local,
)
from litellm_energy_router.agent.tls import TLSConfigError, server_context
from litellm_energy_router.energy.attribution import Attributor
from litellm_energy_router.energy.meter import EnergyMeter
from litellm_energy_router.metrics import RateLimitedWarning

PROGRESS_TURN_S = 0.005  # the longest a progress batch holds the event loop before letting it turn, s
log = logging.getLogger("litellm_energy_router.agent")

VLLM_PROMPT = "vllm:prompt_tokens_total"
VLLM_GEN = "vllm:generation_tokens_total"


def parse_vllm_tokens(text: str) -> tuple[float, float] | None:
    """Sum vLLM's cumulative prompt and generation token counters over all label sets. A non-finite or
    negative counter raises ``ValueError`` (a bad scrape, never fed to attribution)."""
    p = g = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in (VLLM_PROMPT, VLLM_GEN) and not (math.isfinite(s.value) and s.value >= 0):
                raise ValueError(f"{s.name} = {s.value!r}: not a finite, non-negative count")
            if s.name == VLLM_PROMPT:
                p = (p or 0.0) + s.value
            elif s.name == VLLM_GEN:
                g = (g or 0.0) + s.value
    return (p, g) if p is not None and g is not None else None


def _norm(rid: str) -> str:
    for prefix in ("chatcmpl-", "cmpl-"):
        if rid.startswith(prefix) and len(rid) > len(prefix):
            return rid[len(prefix) :]
    return rid


class EnergyAgent:
    """Sampler + attribution + HTTP API. Use :meth:`app` with any aiohttp runner, or :func:`serve`."""

    def __init__(self, meter: EnergyMeter, cfg: AgentConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.ssl_context = self.check(cfg)
        self.meter = meter
        self.cfg = cfg
        self.clock = clock
        self._mono = time.monotonic if clock is time.time else None  # tells a wall-clock step from elapsed time
        token = (cfg.token or "").strip()
        self._expected_auth = hashlib.sha256(f"Bearer {token}".encode()).digest() if token else None
        self.attributor = Attributor(
            prefill_weight=cfg.prefill_weight,
            decode_weight=cfg.decode_weight,
            idle_power_w=cfg.idle_power_w,
            history_s=cfg.history_s,
            max_requests=cfg.max_requests,
            max_segments=cfg.max_segments,
            stale_s=cfg.stale_s,
        )
        self.gpu = cfg.gpu or getattr(meter, "gpu", None) or getattr(meter, "gpu_name", None)
        if not cfg.vllm_metrics_url:
            log.warning(
                "agent: no vllm_metrics_url: concurrent requests' joules are split in the order their answers "
                "settle, not by tokens (their sum is the meter's); set it to vLLM's /metrics for a split by tokens"
            )
        self._task: asyncio.Task | None = None
        self._session: ClientSession | None = None
        self._last_reading: dict[int, float] = {}
        self._last_power_w = 0.0
        self._prev: tuple[float, float] | None = None
        self._warn = RateLimitedWarning(log, 60.0)  # one line a minute through an outage, not sample_hz lines a second
        self.registry = CollectorRegistry()
        self.m_samples = Counter("energy_router_agent_samples", "meter samples taken", registry=self.registry)
        self.m_scrape_err = Counter(
            "energy_router_agent_vllm_scrape_errors", "failed vLLM /metrics scrapes", registry=self.registry
        )
        self.m_meter = Gauge(
            "energy_router_agent_meter_joules", "cumulative meter reading, J", ["gpu"], registry=self.registry
        )
        self.m_power = Gauge(
            "energy_router_agent_power_watts", "power over the last interval, W", registry=self.registry
        )
        self.m_lines = Gauge(
            "energy_router_agent_window_joules",
            "energy lines over the kept history, J",
            ["line"],
            registry=self.registry,
        )
        self.m_inflight = Gauge(
            "energy_router_agent_requests_in_flight", "requests known and not finished", registry=self.registry
        )
        self.m_floor = Gauge(
            "energy_router_agent_idle_floor_watts", "idle (static) power line, W", registry=self.registry
        )
        self.m_tracked = Gauge(
            "energy_router_agent_requests_tracked", "requests tracked (finished or not)", registry=self.registry
        )
        self.m_dropped = Counter(
            "energy_router_agent_requests_dropped",
            "requests dropped before their history ended",
            ["reason"],
            registry=self.registry,
        )
        self.m_rejected = Counter(
            "energy_router_agent_http_rejected", "refused HTTP requests", ["status"], registry=self.registry
        )
        self._dropped_seen: dict[str, int] = {}
        for reason in self.attributor.dropped():
            self.m_dropped.labels(reason)

    @staticmethod
    def check(cfg: AgentConfig) -> ssl.SSLContext | None:
        """Apply the bind policy and load TLS: the server's TLS context (``None``: plain HTTP), or
        :class:`BindError` with one line naming the problem."""
        check_bind(cfg.host, cfg.token)
        try:
            return server_context(cfg.tls_cert, cfg.tls_key)
        except TLSConfigError as e:
            raise BindError(str(e)) from None

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
        t, mono = self.clock(), self._mono() if self._mono is not None else None
        tokens = await self._scrape_vllm()
        e = reading.total_j
        if tokens is None:
            self.attributor.add_sample(t, e, mono=mono)
        else:
            self.attributor.add_sample(t, e, tokens[0], tokens[1], mono=mono)
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
            await self._tick_or_gap()
            nxt += period
            await asyncio.sleep(max(0.0, nxt - loop.time()))

    async def _tick_or_gap(self) -> None:
        """:meth:`tick`; a read that fails (the first one too) is a gap: no figure across it, sampling goes on."""
        try:
            await self.tick()
        except Exception as e:  # noqa: BLE001
            self.attributor.read_failed()
            self._warn("read", "agent: meter read failed (no figure across it): %s", e)

    async def start(self) -> None:
        await self._tick_or_gap()
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
        if self._expected_auth is not None and request.path != "/healthz":
            # SHA-256 of both sides: constant time whatever the length; raw bytes, never a decode error
            got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(hashlib.sha256(got).digest(), self._expected_auth):
                self.m_rejected.labels("401").inc()
                return web.json_response(
                    {"error": "missing or wrong bearer token"},
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="energy-router agent"'},
                )
        return await handler(request)

    def _refuse(self, e: ApiError) -> web.Response:
        self.m_rejected.labels(str(e.status)).inc()
        return web.json_response({"error": str(e)}, status=e.status)

    def _window(self) -> TimeWindow:
        return TimeWindow.around(self.clock(), self.cfg.history_s, self.cfg.max_clock_skew_s)

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True, "last_sample_t": self.attributor.last_sample_t()})

    async def _metrics(self, _: web.Request) -> web.Response:
        tot = self.attributor.totals()
        for line, v in (
            ("meter", tot.meter_j),
            ("requests", tot.requests_j),
            ("idle", tot.idle_j),
            ("unattributed", tot.unattributed_j),
        ):
            self.m_lines.labels(line).set(v)
        self.m_inflight.set(self.attributor.in_flight())
        self.m_tracked.set(self.attributor.tracked())
        self.m_floor.set(self.attributor.idle_power_floor_w())
        for reason, n in self.attributor.dropped().items():
            if n > self._dropped_seen.get(reason, 0):
                self.m_dropped.labels(reason).inc(n - self._dropped_seen.get(reason, 0))
                self._dropped_seen[reason] = n
        return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")

    async def _energy_all(self, _: web.Request) -> web.Response:
        tot = self.attributor.totals()
        return web.json_response(
            {
                "joules": {str(k): v for k, v in self._last_reading.items()},
                "power_w": self._last_power_w,
                "gpu": self.gpu,
                "window": {
                    "t0": tot.t0,
                    "t1": tot.t1,
                    "meter_j": tot.meter_j,
                    "requests_j": tot.requests_j,
                    "idle_j": tot.idle_j,
                    "unattributed_j": tot.unattributed_j,
                },
            }
        )

    async def _energy_one(self, request: web.Request) -> web.Response:
        try:
            rid = _norm(parse_request_id(request.match_info["request_id"]))
            q = parse_timings(request.query, self._window())
        except ApiError as e:
            return self._refuse(e)
        if q.start is not None and q.end is not None:  # the caller's timings: a request known from progress events
            # that lag is finished at its reported end (add_request keeps the first finish of a request)
            self.attributor.add_request(rid, q.start, q.end, q.prompt_tokens, q.completion_tokens, q.first_token)
        a = self.attributor.energy(rid, final=q.final)
        if a is None:
            if not self.attributor.knows(rid):
                return web.json_response({"error": f"unknown request id {rid!r}"}, status=404)
            return web.json_response({"request_id": rid, "energy_j": None, "settled": False})
        return web.json_response(
            {
                "request_id": rid,
                "energy_j": a.energy_j,
                "settled": a.settled,
                "start": a.start_s,
                "end": a.end_s,
                "avg_power_w": a.avg_power_w,
                "gpu": self.gpu,
                "method": "agent",
            }
        )

    async def _progress(self, request: web.Request) -> web.Response:
        try:
            body = parse_progress(await read_body(request, self.cfg.max_body_bytes), self._window())
        except ApiError as e:
            return self._refuse(e)
        turn = time.perf_counter()
        for ev in body.events:  # validated as a whole: a bad event refuses the batch
            self.attributor.add_progress(_norm(ev.request_id), ev.t, ev.prompt_tokens, ev.output_tokens, ev.finished)
            if time.perf_counter() - turn > PROGRESS_TURN_S:  # an event over a long history walks its intervals:
                await asyncio.sleep(0)  # sampling and other callers go on between events
                turn = time.perf_counter()
        return web.json_response({"accepted": len(body.events)})


async def serve(agent: EnergyAgent, *, ready: Callable[[int], None] | None = None) -> None:
    """Serve until cancelled (https when the agent has a TLS context). ``ready(port)`` is called once listening."""
    runner = web.AppRunner(agent.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, agent.cfg.host, agent.cfg.port, ssl_context=agent.ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1] if site._server else agent.cfg.port  # type: ignore[union-attr]
    if ready:
        ready(port)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
