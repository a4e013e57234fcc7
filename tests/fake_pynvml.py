"""A stand-in for the ``pynvml`` module (nvidia-ml-py) on machines without an NVIDIA GPU.

It reuses the real module's constants, error classes and ctypes structures and replaces only the
driver calls, reproducing the documented behaviour:

* ``nvmlDeviceGetTotalEnergyConsumption`` — unsigned 64-bit millijoules since "driver load" (the
  counter starts at a large offset, beyond 32 bits), updated only every ``update_s`` (~100 ms):
  reads inside one update period return the same value. Pre-Volta GPUs raise
  ``NVMLError_NotSupported``.
* ``nvmlDeviceGetPowerUsage`` — milliwatts averaged over the last 1 s (Ampere-non-A100 behaviour).
* ``nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_POWER_INSTANT])`` — instantaneous mW, or a per-field
  ``NVML_ERROR_NOT_SUPPORTED`` return code on GPUs without the field.
* Calls before ``nvmlInit`` raise ``NVMLError_Uninitialized``.
"""

from __future__ import annotations

import math
import time
import types
from dataclasses import dataclass, field
from typing import Callable

import pynvml as _real


@dataclass
class FakeGPU:
    name: str = "NVIDIA H100 80GB HBM3"
    power_w: Callable[[float], float] | float = 300.0  # W: a constant or a function of the clock
    has_counter: bool = True
    has_instant_field: bool = True
    counter_offset_mj: int = 3 * 2**40 + 123_456  # > 32 bits: catches 32-bit truncation
    update_s: float = 0.1
    avg_window_s: float = 1.0
    integ_step_s: float = 0.001
    _t0: float = field(default=0.0)

    def energy_j(self, t: float) -> float:
        """Exact ∫ power from t0 to t, J (midpoint rule at integ_step_s)."""
        if isinstance(self.power_w, (int, float)):
            return float(self.power_w) * max(0.0, t - self._t0)
        n = max(0, round((t - self._t0) / self.integ_step_s))
        h = self.integ_step_s
        return sum(self.power(self._t0 + (i + 0.5) * h) for i in range(n)) * h

    def power(self, t: float) -> float:
        return float(self.power_w) if isinstance(self.power_w, (int, float)) else self.power_w(t)

    def counter_mj(self, t: float) -> int:
        k = math.floor((t - self._t0) / self.update_s + 1e-9)  # last update tick
        return self.counter_offset_mj + int(self.energy_j(self._t0 + k * self.update_s) * 1000)


def make_fake_pynvml(gpus: list[FakeGPU], clock: Callable[[], float] = time.monotonic) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    for k, v in vars(_real).items():
        if not k.startswith("__"):
            setattr(m, k, v)
    state = {"init": False}
    t0 = clock()
    for g in gpus:
        g._t0 = t0

    def err(code: int) -> Exception:
        return _real.NVMLError(code)

    def need_init() -> None:
        if not state["init"]:
            raise err(_real.NVML_ERROR_UNINITIALIZED)

    def gpu(h: object) -> FakeGPU:
        need_init()
        if not isinstance(h, int) or not 0 <= h < len(gpus):
            raise err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpus[h]

    def nvmlInit() -> None:
        state["init"] = True

    def nvmlShutdown() -> None:
        need_init()
        state["init"] = False

    def nvmlDeviceGetCount() -> int:
        need_init()
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(i: int) -> int:
        need_init()
        if not 0 <= i < len(gpus):
            raise err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetName(h: int) -> str:
        return gpu(h).name

    def nvmlDeviceGetTotalEnergyConsumption(h: int) -> int:
        g = gpu(h)
        if not g.has_counter:
            raise err(_real.NVML_ERROR_NOT_SUPPORTED)
        return g.counter_mj(clock()) & (2**64 - 1)

    def nvmlDeviceGetPowerUsage(h: int) -> int:
        g = gpu(h)
        t = clock()
        lo = max(g._t0, t - g.avg_window_s)
        if t - lo < 1e-6:
            return int(g.power(t) * 1000)
        return int((g.energy_j(t) - g.energy_j(lo)) / (t - lo) * 1000)

    def nvmlDeviceGetFieldValues(h: int, field_ids: list) -> object:
        g = gpu(h)
        values = (_real.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            if fid == _real.NVML_FI_DEV_POWER_INSTANT and g.has_instant_field:
                values[i].nvmlReturn = _real.NVML_SUCCESS
                values[i].valueType = _real.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = int(g.power(clock()) * 1000)
            else:
                values[i].nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return values

    for f in (
        nvmlInit,
        nvmlShutdown,
        nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetName,
        nvmlDeviceGetTotalEnergyConsumption,
        nvmlDeviceGetPowerUsage,
        nvmlDeviceGetFieldValues,
    ):
        setattr(m, f.__name__, f)
    return m
