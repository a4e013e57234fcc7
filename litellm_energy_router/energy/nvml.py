"""``nvml``: GPU energy from NVIDIA's management library (``nvidia-ml-py``, import name ``pynvml``).

* **Counter** (Volta and newer): ``nvmlDeviceGetTotalEnergyConsumption`` — millijoules (mJ) since the
  driver loaded, an unsigned 64-bit integer (no wrap in practice), updated every ~20–100 ms: windows
  shorter than the update period read 0 J. ``energy_method = "nvml_counter"``.
* **Power sampling** (older GPUs, or ``mode="power"``): a thread samples power at ``sample_hz``
  (≥ 10 Hz, i.e. every ≤ 100 ms) — ``NVML_FI_DEV_POWER_INSTANT`` (mW) when the driver has that field,
  else ``nvmlDeviceGetPowerUsage`` (mW; a 1 s average on Ampere-non-A100 and newer) — and integrates
  it, holding each sample until the next. ``energy_method = "power_sampling"``.

Without an NVIDIA driver ``nvmlInit`` fails; :class:`NvmlMeter` then raises :class:`MeterError`
naming the alternatives (``estimate``, ``agent``).
"""

from __future__ import annotations

import logging
import threading
import time
from types import ModuleType
from typing import Any, Iterable, Literal

from litellm_energy_router.energy.meter import EnergyReading, MeterError

log = logging.getLogger("litellm_energy_router")

Mode = Literal["auto", "counter", "power"]


def _import_pynvml() -> ModuleType:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise MeterError(f"energy meter 'nvml': cannot import pynvml ({e}); pip install nvidia-ml-py") from None
    return pynvml


def _name(nvml: ModuleType, h: Any) -> str:
    n = nvml.nvmlDeviceGetName(h)
    return n.decode() if isinstance(n, bytes) else str(n)


class NvmlMeter:
    """Cumulative GPU energy per GPU (J) from NVML.

    Args:
        gpus: GPU indices to read (default: all).
        mode: ``"auto"`` (counter when every GPU has it, else power sampling), ``"counter"`` or ``"power"``.
        sample_hz: power-sampling rate, Hz (≥ 10).
        nvml: the ``pynvml`` module (tests pass a stand-in with the same API).
    """

    name = "nvml"

    def __init__(
        self,
        gpus: Iterable[int] | None = None,
        *,
        mode: Mode = "auto",
        sample_hz: float = 10.0,
        nvml: ModuleType | None = None,
    ) -> None:
        self.nvml = nvml or _import_pynvml()
        if sample_hz < 10:
            raise ValueError(
                f"energy meter 'nvml': sample_hz = {sample_hz} must be >= 10 (power sampled every <= 100 ms)"
            )
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as e:
            reason = f"energy meter 'nvml': NVML unavailable ({type(e).__name__}: {e}) — no NVIDIA driver on this host"
            err = MeterError(f"{reason}; set energy.meter to 'estimate' (profile-based) or 'agent' (GPU-node agent)")
            err.reason = reason  # type: ignore[attr-defined]
            raise err from None
        count = self.nvml.nvmlDeviceGetCount()
        self.indices = list(range(count)) if gpus is None else [int(i) for i in gpus]
        bad = [i for i in self.indices if not 0 <= i < count]
        if bad or not self.indices:
            self.nvml.nvmlShutdown()
            raise MeterError(f"energy meter 'nvml': GPU index {bad or '[]'} not present (this host has {count} GPUs)")
        self.handles = {i: self.nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices}
        self.gpu_names = {i: _name(self.nvml, h) for i, h in self.handles.items()}
        has_counter = all(self._counter_supported(h) for h in self.handles.values())
        if mode == "counter" and not has_counter:
            self.nvml.nvmlShutdown()
            raise MeterError(
                "energy meter 'nvml': mode 'counter' but a GPU lacks nvmlDeviceGetTotalEnergyConsumption "
                "(pre-Volta); use mode 'auto' or 'power'"
            )
        self.method = "nvml_counter" if has_counter and mode != "power" else "power_sampling"
        self._sampler: _PowerIntegrator | None = None
        if self.method == "power_sampling":
            self._sampler = _PowerIntegrator(self.nvml, self.handles, sample_hz)

    @property
    def gpu(self) -> str:
        names = sorted(set(self.gpu_names.values()))
        return f"{len(self.indices)}x {names[0]}" if len(names) == 1 else ", ".join(names)

    def _counter_supported(self, h: Any) -> bool:
        try:
            self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)
            return True
        except self.nvml.NVMLError:
            return False

    def read(self) -> EnergyReading:
        """Cumulative J per GPU (counter: since driver load; sampling: since the meter started)."""
        if self._sampler is not None:
            return self._sampler.read()
        t = time.monotonic()
        return EnergyReading(
            timestamp_s=t,
            joules={i: self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0 for i, h in self.handles.items()},
        )

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


class _PowerIntegrator:
    """Samples power (mW) per GPU every ``1/hz`` s in a daemon thread and integrates it (J). A read after no
    good sample for ``stale_s`` (max(1 s, 10 periods): NVML failing) raises instead of extending the last power
    over the gap: its caller records no measurement rather than a made-up one."""

    def __init__(self, nvml: ModuleType, handles: dict[int, Any], hz: float) -> None:
        self.nvml = nvml
        self.handles = handles
        self.period = 1.0 / hz
        self.stale_s = max(1.0, 10.0 * self.period)  # s
        self.errors = 0  # failed samples (NVML errors)
        self._gap: float | None = None  # s: a gap in the samples no read has reported yet
        self._instant = {i: True for i in handles}  # try NVML_FI_DEV_POWER_INSTANT first
        self._lock = threading.Lock()
        t = time.monotonic()
        self._last_t = t
        self._last_w = self._power_w()
        self._j = {i: 0.0 for i in handles}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-power-sampler", daemon=True)
        self._thread.start()

    def _power_one(self, i: int, h: Any) -> float:
        nv = self.nvml
        if self._instant[i]:
            try:
                v = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT])[0]
                if v.nvmlReturn == nv.NVML_SUCCESS:
                    return float(v.value.uiVal) / 1000.0
            except nv.NVMLError:
                pass
            self._instant[i] = False  # field not supported: fall back for good
        return float(nv.nvmlDeviceGetPowerUsage(h)) / 1000.0

    def _power_w(self) -> dict[int, float]:
        return {i: self._power_one(i, h) for i, h in self.handles.items()}

    def sample(self) -> None:
        p = self._power_w()
        t = time.monotonic()
        with self._lock:
            dt = t - self._last_t
            if dt > self.stale_s:  # samples failed over a gap: nothing is invented for it, the next read says so
                self._gap = dt
            else:
                for i in self._j:
                    self._j[i] += self._last_w[i] * dt  # hold each sample until the next: readings stay monotone
            self._last_t, self._last_w = t, p

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 - a transient NVML error must not kill the sampler
                self.errors += 1
                if self.errors == 1:
                    log.warning("NVML power sample failed (sampling goes on; stale readings refused): %s", e)

    def read(self) -> EnergyReading:
        with self._lock:
            t = time.monotonic()
            tail = t - self._last_t  # extend with the last power so readings stay monotone
            if self._gap is not None:  # a window across it has no figure (the tournament ledger drops it)
                gap, self._gap = self._gap, None
                raise RuntimeError(f"NVML power samples had a gap of {gap:.1f} s ({self.errors} failed samples)")
            if tail > self.stale_s:
                raise RuntimeError(f"NVML power samples stale for {tail:.1f} s ({self.errors} failed samples)")
            return EnergyReading(timestamp_s=t, joules={i: j + self._last_w[i] * tail for i, j in self._j.items()})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
