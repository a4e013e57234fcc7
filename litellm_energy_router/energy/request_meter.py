"""One object per process answers "how many joules did this request cost?", whatever the meter.

:func:`open_request_meter` builds it from :class:`~litellm_energy_router.settings.EnergySettings`:

* ``estimate`` -> :class:`~.estimate.EstimateMeter` (tokens x profile);
* ``agent`` -> :class:`~litellm_energy_router.agent.client.AgentMeter` (asks the GPU-node agent);
* ``nvml`` / ``simulated`` / a plugin's meter -> :class:`AttributedMeter`: the counter is sampled in
  a thread at ``sample_hz`` and each interval is split across the requests in flight (:mod:`.attribution`).

Measured meters fall back to the estimate (``energy_method = "estimate"``) when they have no answer
(``fallback_to_estimate``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from litellm_energy_router.energy.attribution import Attributor
from litellm_energy_router.energy.estimate import EstimateMeter
from litellm_energy_router.energy.meter import (
    EnergyMeter,
    RequestEnergy,
    RequestEnergyMeter,
    RequestUsage,
    make_meter,
    meter_options,
)
from litellm_energy_router.metrics import RateLimitedWarning

log = logging.getLogger("litellm_energy_router.energy")


class AttributedMeter:
    """A cumulative counter meter turned into a per-request meter by token-weighted attribution.

    Args:
        meter: any :class:`EnergyMeter` (``nvml``, ``simulated``...).
        attributor: the attribution core (weights, idle line, history).
        sample_hz: sampling rate, Hz; ``0`` = no thread (call :meth:`sample` yourself).
        clock: Unix-seconds clock matching the request timestamps (``time.time``).
        monotonic: a monotonic clock (s) read with each sample, to tell a wall-clock step (NTP) from elapsed time
            (:meth:`.Attributor.add_sample`); default ``time.monotonic`` with the real ``time.time``, else none.
    """

    def __init__(
        self,
        meter: EnergyMeter,
        attributor: Attributor,
        *,
        sample_hz: float = 10.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.meter = meter
        self.attributor = attributor
        self.name = meter.name
        self.method = meter.method
        self.gpu = getattr(meter, "gpu", None) or getattr(meter, "gpu_name", None)
        self._clock = clock
        self._mono = monotonic if monotonic is not None else (time.monotonic if clock is time.time else None)
        self._stop = threading.Event()
        self._warn = RateLimitedWarning(log, 60.0)
        self._sample_or_gap()
        self._thread = None
        if sample_hz > 0:
            self._thread = threading.Thread(
                target=self._run, args=(1.0 / sample_hz,), name=f"{self.name}-sampler", daemon=True
            )
            self._thread.start()

    def sample(self) -> None:
        """Read the meter once and close an interval."""
        r = self.meter.read()
        self.attributor.add_sample(self._clock(), r.total_j, mono=self._mono() if self._mono is not None else None)

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            self._sample_or_gap()

    def _sample_or_gap(self) -> None:
        """:meth:`sample`; a read that fails (the first one too) is a gap: no figure across it, sampling goes on."""
        try:
            self.sample()
        except Exception as e:  # noqa: BLE001 - keep sampling through transient driver errors
            self.attributor.read_failed()
            self._warn("read", "energy meter %s: read failed (no figure across it): %s", self.name, e)

    def request_started(self, request_id: str, t_s: float) -> None:
        self.attributor.request_started(request_id, t_s)

    def energy_for_request(self, usage: RequestUsage, *, final: bool = False) -> RequestEnergy | None:
        if not self.attributor.covers(usage.end_s):
            self.attributor.discard(usage.request_id)  # never measured: it must not hold back the requests beside it
            return RequestEnergy.unavailable()  # before this meter started (or clocks disagree)
        self.attributor.add_request(
            usage.request_id,
            usage.start_s,
            usage.end_s,
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.first_token_s,
        )
        a = self.attributor.energy(usage.request_id, final=final)
        if a is None:
            return RequestEnergy.unavailable() if final else None
        return RequestEnergy(a.energy_j, self.method, a.avg_power_w, self.gpu, a.settled)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.meter.close()


class FallbackMeter:
    """``primary``, or the profile estimate when the primary has no energy for a request."""

    def __init__(self, primary: RequestEnergyMeter, fallback: EstimateMeter) -> None:
        self.primary = primary
        self.fallback = fallback
        self.name = primary.name
        self.method = primary.method

    def request_started(self, request_id: str, t_s: float) -> None:
        self.primary.request_started(request_id, t_s)

    def energy_for_request(self, usage: RequestUsage, *, final: bool = False) -> RequestEnergy | None:
        e = self.primary.energy_for_request(usage, final=final)
        if e is not None and e.energy_j is None:
            return self.fallback.energy_for_request(usage, final=True)
        return e

    def close(self) -> None:
        self.primary.close()
        self.fallback.close()


def open_request_meter(
    energy: Any, *, clock: Callable[[], float] = time.time, **meter_kwargs: Any
) -> RequestEnergyMeter:
    """Build the per-request meter described by ``energy`` (an ``EnergySettings``).

    ``energy.options``, then ``meter_kwargs``, go to the meter's factory (e.g. ``power_w`` for
    ``simulated``). Raises :class:`~.meter.MeterError` when the meter cannot work here (e.g. no NVIDIA
    driver).
    """
    meter_kwargs = {**getattr(energy, "options", {}), **meter_kwargs}
    estimate = EstimateMeter(energy.profile)
    if energy.meter == "estimate":
        return estimate
    if energy.meter == "agent":
        from litellm_energy_router.agent.client import AgentMeters

        primary: RequestEnergyMeter = AgentMeters(
            energy.agent_url,
            dict(getattr(energy, "agent_urls", None) or {}),
            token=energy.agent_token,
            timeout_s=energy.agent_timeout_s,
            ca_bundle=str(energy.agent_ca_bundle) if energy.agent_ca_bundle else None,
            **meter_kwargs,
        )
    else:
        for k, v in meter_options(energy.meter, energy).items():  # device options the meter asks for (e.g. gpus)
            meter_kwargs.setdefault(k, v)
        if energy.meter == "simulated":
            meter_kwargs.setdefault("clock", clock)
        counter = make_meter(energy.meter, **meter_kwargs)
        attributor = Attributor(
            prefill_weight=energy.prefill_weight,
            decode_weight=energy.decode_weight,
            idle_power_w=energy.idle_power_w,
            history_s=energy.history_s,
            max_requests=energy.agent_max_requests,  # bounds as the agent's: a request started that never ends
            stale_s=energy.agent_stale_s,  # (no row: a cancelled stream, a failed callback) expires, not blocks
        )
        primary = AttributedMeter(counter, attributor, sample_hz=energy.sample_hz, clock=clock)
    return FallbackMeter(primary, estimate) if energy.fallback_to_estimate else primary
