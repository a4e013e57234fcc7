"""``agent``: the per-request meter that asks the GPU-node agent (``energy-router agent``) over HTTP.

``GET {agent_url}/v1/energy/{request_id}`` with the request's timings (Unix s) and token counts; the
agent attributes its sampled intervals to the request (see :mod:`.attribution`) and answers
``{"energy_j": J | null, "settled": bool, ...}``. ``energy_j: null`` means "not settled yet": the
writer asks again later. Rows carry ``energy_method = "agent"``.

An ``https://`` URL is verified against the system CAs, or only against ``ca_bundle``
(``energy.agent_ca_bundle``) when set; a CA bundle with a plain ``http://`` URL is refused (TLS was
meant), and a token sent in clear to a non-loopback host is warned about.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any
from urllib.parse import quote, urlsplit

from litellm_energy_router.agent.tls import TLSConfigError, client_context
from litellm_energy_router.energy.meter import (
    EnergyReading,
    MeterError,
    RequestEnergy,
    RequestUsage,
)
from litellm_energy_router.redact import redact, redact_url

log = logging.getLogger("litellm_energy_router.energy")


AGENT_BACKOFF_S = 10.0  # s without calls to an agent after a transport error (timeout, refused connection)


class AgentMeter:
    """HTTP client of the GPU-node agent.

    Args:
        url: agent base URL, e.g. ``http://gpu-node:9400``.
        token: bearer token (required by an agent bound to a non-local address).
        timeout_s: per-call timeout, seconds.
        ca_bundle: PEM file of the CA(s) an ``https`` agent's certificate must chain to (default:
            the system CAs).
    """

    name = "agent"
    method = "agent"

    def __init__(
        self, url: str | None, *, token: str | None = None, timeout_s: float = 2.0, ca_bundle: str | None = None
    ) -> None:
        if not url:
            raise MeterError("energy meter 'agent': energy.agent_url is not set (e.g. http://gpu-node:9400)")
        import httpx  # lazy: keeps `energy-router --help` and table commands fast

        from litellm_energy_router.agent.server import is_local

        self._httpx = httpx
        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https"):
            raise MeterError(
                f"energy meter 'agent': energy.agent_url {redact_url(url)!r} is not an http:// or https:// URL"
            )
        if ca_bundle is not None and parts.scheme != "https":
            raise MeterError(
                f"energy meter 'agent': energy.agent_ca_bundle is set but energy.agent_url {redact_url(url)!r} is not https://"
            )
        try:
            verify = client_context(ca_bundle) if parts.scheme == "https" else True
        except TLSConfigError as e:
            raise MeterError(f"energy meter 'agent': {e}") from None
        token = (token or "").strip()
        if token and parts.scheme == "http" and not is_local(parts.hostname or ""):
            log.warning(
                "energy agent %s: the bearer token travels in clear text (serve the agent with TLS, use https://)",
                redact_url(self.url),
            )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, verify=verify)
        self.gpu: str | None = None
        self._last_warn = 0.0
        self._down_until = 0.0  # monotonic s: no call before this after a transport error

    def _warn(self, msg: str) -> None:
        now = time.monotonic()
        if now - self._last_warn > 30:
            self._last_warn = now
            log.warning("energy agent %s: %s", redact_url(self.url), redact(msg))

    def read(self) -> EnergyReading:
        """The agent's cumulative meter reading (J per GPU)."""
        try:
            r = self._client.get("/v1/energy")
            r.raise_for_status()
        except self._httpx.HTTPError as e:
            raise MeterError(f"energy agent {redact_url(self.url)}: {type(e).__name__}: {redact(str(e))}") from None
        d = r.json()
        return EnergyReading(timestamp_s=time.monotonic(), joules={int(k): float(v) for k, v in d["joules"].items()})

    def request_started(self, request_id: str, t_s: float) -> None:
        pass

    def energy_for_request(self, usage: RequestUsage, *, final: bool = False) -> RequestEnergy | None:
        rid = usage.backend_id or usage.request_id
        params = {
            "start": repr(usage.start_s),
            "end": repr(usage.end_s),
            "prompt_tokens": str(usage.prompt_tokens),
            "completion_tokens": str(usage.completion_tokens),
            "final": "1" if final else "0",
        }
        if usage.first_token_s is not None:
            params["first_token"] = repr(usage.first_token_s)
        if time.monotonic() < self._down_until:  # the agent timed out or refused lately: not asked again yet
            return RequestEnergy.unavailable() if final else None
        try:
            r = self._client.get(f"/v1/energy/{quote(rid, safe='')}", params=params)
        except self._httpx.HTTPError as e:
            # a hung agent cost the table writer timeout_s per waiting row per pass (20 s for 10 rows): one failure
            # backs off for AGENT_BACKOFF_S, rows meanwhile wait and then take the estimate (fallback_to_estimate)
            self._down_until = time.monotonic() + AGENT_BACKOFF_S
            self._warn(f"{type(e).__name__}: {e} (not asked again for {AGENT_BACKOFF_S:g} s)")
            return RequestEnergy.unavailable() if final else None
        if r.status_code == 404:
            return RequestEnergy.unavailable()
        if r.status_code != 200:
            self._warn(f"HTTP {r.status_code}: {r.text[:200]}")
            return RequestEnergy.unavailable() if final else None
        try:  # what a 200 says is checked too (a proxy in the way, a wrong service): a bad answer is no figure
            d = r.json()
            j, w, gpu = d.get("energy_j"), d.get("avg_power_w"), d.get("gpu")
            if j is None:
                return RequestEnergy.unavailable() if final else None
            j, w = float(j), None if w is None else float(w)
            if not (math.isfinite(j) and j >= 0 and (w is None or (math.isfinite(w) and w >= 0))):
                raise ValueError(f"energy_j {j!r}, avg_power_w {w!r}")
        except (ValueError, TypeError, AttributeError) as e:
            self._warn(f"unusable answer: {str(e)[:200]}")
            return RequestEnergy.unavailable() if final else None
        return RequestEnergy(
            energy_j=j,
            method="agent",
            avg_power_w=w,
            gpu=str(gpu)[:200] if gpu else None,
            settled=bool(d.get("settled", True)),
        )

    def close(self) -> None:
        self._client.close()


class AgentMeters:
    """One :class:`AgentMeter` per GPU node of the pool: a request asks the agent of the node that served it, by its
    candidate (``energy.agent_urls``: candidate → URL), else ``energy.agent_url``; with neither, no figure (the
    estimate's, with ``energy.fallback_to_estimate``). One agent only knows its own node's joules: asking one agent
    for every node's requests charged them that node's energy as measured.

    Args: ``default`` (URL or None), ``by_candidate`` (candidate → URL), and :class:`AgentMeter`'s keyword arguments.
    """

    name = "agent"
    method = "agent"

    def __init__(self, default: str | None, by_candidate: dict[str, str], **kwargs: Any) -> None:
        if not default and not by_candidate:
            raise MeterError("energy meter 'agent': energy.agent_url is not set (e.g. http://gpu-node:9400)")
        urls = {u for u in [default, *by_candidate.values()] if u}
        self._meters = {u: AgentMeter(u, **kwargs) for u in sorted(urls)}
        self._default = self._meters[default] if default else None
        self._by_candidate = {c: self._meters[u] for c, u in by_candidate.items()}

    def request_started(self, request_id: str, t_s: float) -> None:
        pass

    def energy_for_request(self, usage: RequestUsage, *, final: bool = False) -> RequestEnergy | None:
        meter = self._by_candidate.get(usage.candidate, self._default)
        return meter.energy_for_request(usage, final=final) if meter is not None else None

    def close(self) -> None:
        for m in self._meters.values():
            m.close()
