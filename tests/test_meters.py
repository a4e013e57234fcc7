"""Energy meters behind the one Protocol: nvml (against a pynvml stand-in reproducing the real
counter), estimate, simulated; the per-request API all of them serve."""

from __future__ import annotations

import time

import pytest
from fake_pynvml import FakeGPU, make_fake_pynvml

from litellm_energy_router.energy import (
    AttributedMeter,
    EnergyMeter,
    FallbackMeter,
    MeterError,
    RequestEnergyMeter,
    RequestUsage,
    make_meter,
    open_request_meter,
    registered_meters,
)
from litellm_energy_router.energy.attribution import Attributor
from litellm_energy_router.energy.estimate import EstimateMeter
from litellm_energy_router.energy.nvml import NvmlMeter
from litellm_energy_router.energy.simulated import ManualClock, SimulatedMeter
from litellm_energy_router.settings import EnergySettings


def _has_driver() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except pynvml.NVMLError:
        return False


def test_registry_lists_all_meters():
    assert {"agent", "estimate", "nvml", "simulated"} <= set(registered_meters())  # tests may register more
    with pytest.raises(ValueError, match=r"'nope' is not registered \(known: .*agent, estimate, nvml, .*simulated"):
        make_meter("nope")


@pytest.mark.skipif(_has_driver(), reason="an NVIDIA driver is present")
def test_real_pynvml_without_driver_names_the_fallback():
    with pytest.raises(MeterError) as e:
        NvmlMeter()
    msg = str(e.value)
    assert "NVMLError_LibraryNotFound" in msg and "'estimate'" in msg and "'agent'" in msg
    assert "\n" not in msg


def test_nvml_counter_units_granularity_and_64bit():
    clock = ManualClock(100.0)
    fake = make_fake_pynvml([FakeGPU(power_w=lambda t: 300.0), FakeGPU(power_w=lambda t: 100.0)], clock=clock)
    m = NvmlMeter(nvml=fake)
    assert isinstance(m, EnergyMeter)
    assert m.method == "nvml_counter"
    assert m.gpu == "2x NVIDIA H100 80GB HBM3"
    a = m.read()
    assert a.joules[0] > 2**32 / 1000  # the 64-bit mJ counter is not truncated
    clock.advance(0.05)  # inside one ~100 ms update period: the counter has not moved
    b = m.read()
    assert b.total_j - a.total_j == 0.0
    clock.advance(0.30)  # 0.35 s after start: last update at 0.3 s
    c = m.read()
    assert c.joules[0] - a.joules[0] == pytest.approx(300.0 * 0.3, abs=0.01)  # mJ -> J
    assert c.joules[1] - a.joules[1] == pytest.approx(100.0 * 0.3, abs=0.01)
    m.close()


def test_nvml_gpu_selection_and_bad_index():
    clock = ManualClock()
    fake = make_fake_pynvml([FakeGPU(), FakeGPU(name="NVIDIA A100-SXM4-80GB")], clock=clock)
    m = NvmlMeter([1], nvml=fake)
    assert list(m.read().joules) == [1]
    assert m.gpu == "1x NVIDIA A100-SXM4-80GB"
    m.close()
    with pytest.raises(MeterError, match=r"GPU index \[5\] not present \(this host has 2 GPUs\)"):
        NvmlMeter([5], nvml=make_fake_pynvml([FakeGPU(), FakeGPU()], clock=clock))


@pytest.mark.parametrize("instant", [True, False])
def test_nvml_power_sampling_fallback(instant):
    """Pre-Volta: no energy counter -> integrate power sampled every 100 ms (instant field when the
    driver has it, else the 1 s-averaged power)."""
    g = FakeGPU(power_w=lambda t: 250.0, has_counter=False, has_instant_field=instant)
    fake = make_fake_pynvml([g])
    m = NvmlMeter(nvml=fake, sample_hz=20)
    assert m.method == "power_sampling"
    a = m.read()
    time.sleep(0.6)
    b = m.read()
    dt = b.timestamp_s - a.timestamp_s
    assert (b.total_j - a.total_j) == pytest.approx(250.0 * dt, rel=0.1)
    assert m._sampler._instant[0] is instant
    m.close()


def test_nvml_counter_mode_on_pre_volta_is_an_error():
    fake = make_fake_pynvml([FakeGPU(has_counter=False)])
    with pytest.raises(MeterError, match="mode 'counter' but a GPU lacks nvmlDeviceGetTotalEnergyConsumption"):
        NvmlMeter(nvml=fake, mode="counter")
    with pytest.raises(ValueError, match="sample_hz = 2 must be >= 10"):
        NvmlMeter(nvml=fake, sample_hz=2)


def test_estimate_meter_matches_profile_and_accumulates():
    m = EstimateMeter()
    assert isinstance(m, RequestEnergyMeter)
    u = RequestUsage("c1", "mistralai/mistral-7b-chat", 10.0, 12.0, None, 100, 50)
    e = m.energy_for_request(u)
    assert e.method == "estimate"
    assert e.energy_j == pytest.approx(100 * 0.019818 + 50 * 0.156493)
    assert e.avg_power_w == pytest.approx(e.energy_j / 2.0)
    assert m.read().total_j == pytest.approx(e.energy_j)
    unknown = m.energy_for_request(RequestUsage("c2", "no-such-model", 0, 1, None, 1, 1))
    assert unknown.energy_j is None and unknown.method is None
    assert "no-such-model" in m.unknown


def test_simulated_meter_is_deterministic():
    clock = ManualClock(0.0)
    m = SimulatedMeter(power_w=lambda t: 100.0 + 100.0 * t, clock=clock, gpus=2)
    a = m.read()
    clock.advance(2.0)
    b = m.read()
    assert b.joules[0] - a.joules[0] == pytest.approx(100 * 2 + 50 * 4, rel=1e-6)
    assert b.total_j - a.total_j == pytest.approx(2 * 400.0, rel=1e-6)
    assert m.method == "simulated"


def test_attributed_nvml_meter_splits_the_counter():
    clock = ManualClock(1000.0)
    fake = make_fake_pynvml([FakeGPU(power_w=lambda t: 200.0)], clock=clock)
    am = AttributedMeter(NvmlMeter(nvml=fake), Attributor(idle_power_w=0.0), sample_hz=0, clock=clock)
    am.request_started("a", 1000.0)
    am.request_started("b", 1000.0)
    for _ in range(10):
        clock.advance(0.1)
        am.sample()
    ua = RequestUsage("a", "m", 1000.0, 1001.0, None, 0, 30)
    ub = RequestUsage("b", "m", 1000.0, 1001.0, None, 0, 10)
    assert am.energy_for_request(ua) is None  # b's share is not known yet
    for _ in range(2):
        clock.advance(0.1)
        am.sample()
    eb = am.energy_for_request(ub)
    ea = am.energy_for_request(ua)
    assert ea.method == "nvml_counter" and ea.settled and ea.gpu == "1x NVIDIA H100 80GB HBM3"
    tot = am.attributor.totals(1000.0, 1001.0 + 1e-6)  # the counter over the requests' span
    assert 180.0 <= tot.meter_j <= 200.0  # 200 W for 1 s, read through a 100 ms-granular counter
    # no TTFT: the first 10 % of each request is its (here empty) prefill, so that interval is idle
    assert ea.energy_j + eb.energy_j + tot.idle_j == pytest.approx(tot.meter_j, rel=1e-9)
    assert ea.energy_j + eb.energy_j >= 0.85 * tot.meter_j
    assert ea.energy_j == pytest.approx(3 * eb.energy_j, rel=1e-6)
    am.close()


def test_open_request_meter_per_setting():
    assert isinstance(open_request_meter(EnergySettings()), EstimateMeter)
    clock = ManualClock(50.0)
    m = open_request_meter(EnergySettings(meter="simulated", sample_hz=10), clock=clock, power_w=100.0)
    assert isinstance(m, FallbackMeter) and isinstance(m.primary, AttributedMeter)
    # nothing sampled after the request: final answer falls back to the profile estimate
    u = RequestUsage("x", "mistralai/mistral-7b-chat", 49.0, 49.5, None, 10, 10)
    e = m.energy_for_request(u, final=True)
    assert e.method == "estimate" and e.energy_j == pytest.approx(10 * 0.019818 + 10 * 0.156493)
    m.close()
    m = open_request_meter(EnergySettings(meter="simulated", fallback_to_estimate=False), clock=clock)
    assert isinstance(m, AttributedMeter)
    m.close()
    with pytest.raises(MeterError, match="energy.agent_url is not set"):
        open_request_meter(EnergySettings(meter="agent"))
    if not _has_driver():
        with pytest.raises(MeterError, match="NVML unavailable"):
            open_request_meter(EnergySettings(meter="nvml"))


def test_a_request_started_that_never_ends_expires_instead_of_holding_back_settling():
    """The proxy's own meter: a call started (log_pre_api_call) that never gets a row (a cancelled stream) blocks the
    settling of every later request until it expires after energy.agent_stale_s, not for the whole history."""
    clock = ManualClock(1_000_000.0)
    t0 = clock.t
    m = open_request_meter(
        EnergySettings(meter="simulated", sample_hz=10, agent_stale_s=5.0, fallback_to_estimate=False), clock=clock
    )
    m.request_started("orphan", t0 + 0.01)
    m.request_started("a", t0 + 0.02)
    u = RequestUsage("a", "small", t0 + 0.02, t0 + 0.5, t0 + 0.1, 100, 20)
    while clock.t < t0 + 2:
        clock.advance(0.1)
        m.sample()
    assert m.energy_for_request(u) is None  # the orphan may still claim these intervals
    while clock.t < t0 + 6:
        clock.advance(0.1)
        m.sample()
    e = m.energy_for_request(u)
    assert e is not None and e.settled and e.energy_j > 0
    m.close()


def test_a_meter_that_stopped_reading_gives_no_measured_joules_and_nan_readings_are_skipped():
    """Reads that stop before a request ends (a lost GPU): the forced answer is the estimate, not the part of the
    request the meter saw; a NaN or inf reading is no reading (it does not poison the intervals around it)."""
    clock = ManualClock(100.0)
    m = open_request_meter(EnergySettings(meter="simulated", sample_hz=10), clock=clock, power_w=100.0)
    u = RequestUsage("x", "mistralai/mistral-7b-chat", 100.0, 103.0, None, 10, 10)
    m.request_started("x", 100.0)
    for _ in range(10):  # one second read, then the meter goes silent
        clock.advance(0.1)
        m.primary.sample()
    clock.advance(5.0)
    e = m.energy_for_request(u, final=True)
    assert e.method == "estimate" and e.energy_j == pytest.approx(10 * 0.019818 + 10 * 0.156493)
    m.close()
    att = Attributor(prefill_weight=0.125, idle_power_w=0.0)
    for t, j in ((0.0, 0.0), (1.0, 100.0), (2.0, float("nan")), (3.0, float("inf")), (4.0, 400.0), (5.0, 500.0)):
        att.add_sample(t, j)
    assert att.totals().meter_j == pytest.approx(500.0)
    att.add_request("r", 1.5, 4.5, 0, 10)
    assert att.energy("r", final=True).energy_j == pytest.approx(400.0)  # the two intervals it overlaps, all theirs


def test_gpu_check_script_on_fake_nvml(monkeypatch, capsys):
    """benchmarks/check_nvml_gpu.py end to end on the stand-in (the real run needs a GPU)."""
    import importlib.util
    import sys
    from pathlib import Path

    fake = make_fake_pynvml([FakeGPU(power_w=220.0)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "check_nvml_gpu.py"
    spec = importlib.util.spec_from_file_location("check_nvml_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(sys, "argv", ["check_nvml_gpu.py", "--seconds", "1.5"])
    assert mod.main() == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    fields = dict(kv.split("=") for kv in last.split())
    assert 90 <= float(fields["counter_update_ms"]) <= 110  # the ~100 ms counter granularity is seen
    assert float(fields["counter_j"]) == pytest.approx(220.0 * float(fields["window_s"]), rel=0.15)
    assert float(fields["rel_diff"]) < 0.15
    assert float(fields["conservation_err"]) < 0.01


def _flaky_power_meter():
    """A 250 W GPU without an energy counter (power sampling at 20 Hz) whose samples fail while ``failing["on"]``."""
    import pynvml

    failing = {"on": False}

    def power(t):
        if failing["on"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return 250.0

    g = FakeGPU(power_w=power, has_counter=False, has_instant_field=False)
    return NvmlMeter(nvml=make_fake_pynvml([g]), sample_hz=20), failing


def test_nvml_power_sampling_refuses_a_stale_reading_when_the_driver_fails():
    """NVML power samples failing: a read no longer extends the last power over the gap (a made-up figure), it
    raises once no good sample came for ``stale_s``, so the request's joules are unknown, not invented."""
    m, failing = _flaky_power_meter()
    m.read()
    failing["on"] = True
    time.sleep(m._sampler.stale_s + 0.3)
    with pytest.raises(RuntimeError, match="stale"):
        m.read()
    assert m._sampler.errors > 0
    failing["on"] = False
    time.sleep(0.3)
    with pytest.raises(RuntimeError, match="gap"):  # once: a window across the gap has no figure
        m.read()
    a = m.read()
    time.sleep(0.3)
    assert m.read().total_j - a.total_j == pytest.approx(250.0 * 0.3, rel=0.3)  # sampling recovered
    m.close()


def test_nvml_power_sampling_invents_no_joules_for_a_gap_no_read_saw():
    """Samples fail for longer than stale_s while nobody reads: the recovery does not hold the last power over the
    gap; the first read after it raises, so a window that straddles the gap is not measured."""
    m, failing = _flaky_power_meter()
    before = m.read().total_j
    failing["on"] = True
    time.sleep(m._sampler.stale_s + 0.3)
    failing["on"] = False
    time.sleep(0.2)  # recovered before anyone read
    with pytest.raises(RuntimeError, match="gap"):
        m.read()
    assert m.read().total_j - before < 250.0 * 0.6  # not 250 W x the whole gap
    m.close()


def test_the_tournament_ledger_gives_no_joules_to_a_window_open_across_a_failed_read():
    """A failed meter read while a window is open: that window's joules are None (its share of the next delta
    would span the failure); a window opened after the recovery is measured as before."""
    from litellm_energy_router.profiling.metering import EnergyLedger

    from litellm_energy_router.energy.meter import EnergyReading

    class Flaky:
        name, method = "flaky", "nvml"

        def __init__(self):
            self.j, self.fail = 0.0, False

        def read(self):
            if self.fail:
                raise RuntimeError("driver gone")
            return EnergyReading(time.monotonic(), {0: self.j})

    meter = Flaky()
    ledger = EnergyLedger(meter)
    a = ledger.open()
    meter.j, meter.fail = 100.0, True
    b = ledger.open()  # its start is unknown
    meter.j, meter.fail = 500.0, False
    assert ledger.close(a) is None and ledger.close(b) is None
    c = ledger.open()
    meter.j = 560.0
    assert ledger.close(c) == pytest.approx(60.0)
