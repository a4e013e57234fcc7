"""``simulated``: a deterministic stand-in for a GPU energy counter, for tests and demos.

Not a measurement: rows it produces carry ``energy_method = "simulated"``. It integrates a power
function of time (W) exactly over the reading clock, so two readings differ by
``∫ power_w(t) dt`` (J). Tests drive it with a :class:`ManualClock`; by default it follows the wall
clock (``time.time``, Unix s).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from litellm_energy_router.energy.meter import EnergyReading

PowerFn = Callable[[float], float]


class ManualClock:
    """A clock tests advance by hand: ``clock()`` returns seconds; ``advance(dt)`` moves it."""

    def __init__(self, t0: float = 1_000_000.0) -> None:
        self.t = float(t0)

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


class SimulatedMeter:
    """Deterministic cumulative energy counter.

    Args:
        power_w: constant power (W) per GPU, or a function ``t -> W`` (t in the clock's seconds),
            integrated with the trapezoid rule at ``step_s``.
        gpus: number of simulated GPUs (each draws ``power_w``).
        clock: time source, seconds; default ``time.time``.
        step_s: integration step for a power function, s.
        gpu_name: reported GPU name.
    """

    name = "simulated"
    method = "simulated"

    def __init__(
        self,
        power_w: float | PowerFn = 300.0,
        *,
        gpus: int = 1,
        clock: Callable[[], float] = time.time,
        step_s: float = 0.001,
        gpu_name: str = "simulated GPU",
    ) -> None:
        self._power = power_w
        self._gpus = int(gpus)
        self._clock = clock
        self._step = float(step_s)
        self.gpu_name = gpu_name
        self._lock = threading.Lock()
        self._t = clock()
        self._j = 0.0  # per GPU

    def _integrate(self, t0: float, t1: float) -> float:
        if t1 <= t0:
            return 0.0
        p = self._power
        if not callable(p):
            return float(p) * (t1 - t0)
        n = max(1, int((t1 - t0) / self._step + 0.5))
        h = (t1 - t0) / n
        acc = 0.5 * (p(t0) + p(t1))
        for i in range(1, n):
            acc += p(t0 + i * h)
        return acc * h

    def read(self) -> EnergyReading:
        """Cumulative J per simulated GPU since construction."""
        with self._lock:
            now = self._clock()
            self._j += self._integrate(self._t, now)
            self._t = max(self._t, now)
            return EnergyReading(timestamp_s=now, joules={i: self._j for i in range(self._gpus)})

    def close(self) -> None:
        pass
