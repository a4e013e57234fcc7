"""``agent``: the per-request meter that asks the GPU-node agent (``energy-router agent``) over HTTP.

``GET {agent_url}/v1/energy/{request_id}`` with the request's timings (Unix s) and token counts; the
agent attributes its sampled intervals to the request (see :mod:`.attribution`) and answers
``{"energy_j": J | null, "settled": bool, ...}``. ``energy_j: null`` means "not settled yet": the
writer asks again later. Rows carry ``energy_method = "agent"``.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import quote

from .meter import EnergyReading, MeterError, RequestEnergy, RequestUsage

log = logging.getLogger("litellm_energy_router.energy")


class AgentMeter:
    """HTTP client of the GPU-node agent.

    Args:
        url: agent base URL, e.g. ``http://gpu-node:9400``.
        token: bearer token (required by an agent bound to a non-local address).
        timeout_s: per-call timeout, seconds.
    """

    name = "agent"
    method = "agent"

    def __init__(self, url: str | None, *, token: str | None = None, timeout_s: float = 2.0) -> None:
        if not url:
            raise MeterError("energy meter 'agent': energy.agent_url is not set (e.g. http://gpu-node:9400)")
        import httpx  # lazy: keeps `energy-router --help` and table commands fast

        self._httpx = httpx
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self.gpu: str | None = None
        self._last_warn = 0.0

    def _warn(self, msg: str) -> None:
        now = time.monotonic()
        if now - self._last_warn > 30:
            self._last_warn = now
            log.warning("energy agent %s: %s", self.url, msg)

    def read(self) -> EnergyReading:
        """The agent's cumulative meter reading (J per GPU)."""
        try:
            r = self._client.get("/v1/energy")
            r.raise_for_status()
        except self._httpx.HTTPError as e:
            raise MeterError(f"energy agent {self.url}: {type(e).__name__}: {e}") from None
        d = r.json()
        return EnergyReading(timestamp_s=time.monotonic(), joules={int(k): float(v) for k, v in d["joules"].items()})

    def request_started(self, request_id: str, t_s: float) -> None:
        pass

    def energy_for_request(self, usage: RequestUsage, *, final: bool = False) -> RequestEnergy | None:
        rid = usage.backend_id or usage.request_id
        params = {
            "start": repr(usage.start_s), "end": repr(usage.end_s),
            "prompt_tokens": str(usage.prompt_tokens), "completion_tokens": str(usage.completion_tokens),
            "final": "1" if final else "0",
        }  # fmt: skip
        if usage.first_token_s is not None:
            params["first_token"] = repr(usage.first_token_s)
        try:
            r = self._client.get(f"/v1/energy/{quote(rid, safe='')}", params=params)
        except self._httpx.HTTPError as e:
            self._warn(f"{type(e).__name__}: {e}")
            return RequestEnergy.unavailable() if final else None
        if r.status_code == 404:
            return RequestEnergy.unavailable()
        if r.status_code != 200:
            self._warn(f"HTTP {r.status_code}: {r.text[:200]}")
            return RequestEnergy.unavailable() if final else None
        d = r.json()
        if d.get("energy_j") is None:
            return RequestEnergy.unavailable() if final else None
        return RequestEnergy(
            energy_j=float(d["energy_j"]), method="agent", avg_power_w=d.get("avg_power_w"),
            gpu=d.get("gpu"), settled=bool(d.get("settled", True)),
        )  # fmt: skip

    def close(self) -> None:
        self._client.close()
