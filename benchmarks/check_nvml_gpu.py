"""Real-GPU check of the ``nvml`` meter. Runs only where an NVIDIA driver exists; elsewhere it prints
why and exits 0.

    python benchmarks/check_nvml_gpu.py [--gpu 0] [--seconds 5]

1. The energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ) exists and is monotone; how often
   it changes (its update period, ms) when polled every 1 ms.
2. Over one window with load (torch matmuls when CUDA torch is installed, else idle), the counter's
   joules vs the power-sampling fallback's (``NVML_FI_DEV_POWER_INSTANT`` / ``nvmlDeviceGetPowerUsage``
   at 10 Hz) — both meters read the same GPU at the same time.
3. Per-request attribution on the real counter: a few overlapping "requests" against the sampled
   counter; requests + idle == counter delta.

Exit status 1 when the counter is missing, not monotone, or the two methods differ by more than 25 %.
Last line: ``gpu=<name> counter_update_ms=<p50> window_s=<s> counter_j=<x> sampling_j=<y> rel_diff=<d>
conservation_err=<e>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time


def gpu_present(gpu: int) -> bool:
    """Whether NVML answers and GPU ``gpu`` exists (prints why not)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        print(f"no NVIDIA driver here ({type(e).__name__}: {e}); nothing to check")
        return False
    n = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    if gpu >= n:
        print(f"GPU {gpu} not present ({n} GPUs); nothing to check")
        return False
    return True


def update_period(counter) -> tuple[bool, float]:
    """1. (the counter is monotone, its median update period in ms) over 1.5 s of polling every 1 ms."""
    changes, last, last_t, t_end = [], counter.read().total_j, time.perf_counter(), time.perf_counter() + 1.5
    monotone = True
    while time.perf_counter() < t_end:
        v = counter.read().total_j
        if v < last:
            monotone = False
        if v != last:
            now = time.perf_counter()
            changes.append((now - last_t) * 1e3)
            last, last_t = v, now
        time.sleep(0.001)
    upd = statistics.median(changes[1:]) if len(changes) > 2 else float("nan")
    print(f"counter monotone: {monotone}; changes seen: {len(changes)}; median update period {upd:.1f} ms")
    return monotone, upd


def start_load(gpu: int, stop: threading.Event) -> threading.Thread:
    """CUDA matmuls on ``gpu`` until ``stop`` (none without CUDA torch: idle power only), on a daemon thread."""
    try:
        import torch  # before the window: importing takes seconds

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    print("load: CUDA matmuls" if cuda else "load: none (no CUDA torch): idle power only")

    def load() -> None:
        if not cuda:
            return
        try:
            a = torch.randn(4096, 4096, device=torch.device(f"cuda:{gpu}"))
            while not stop.is_set():
                (a @ a).sum().item()
        except Exception as e:  # noqa: BLE001
            print(f"(no load generated: {e})")

    th = threading.Thread(target=load, daemon=True)
    th.start()
    return th


def loaded_window(counter, sampler, gpu: int, seconds: float):
    """2. and 3.: (window s, counter J, sampling J, the Attributor, requests added) over one loaded window, with
    synthetic overlapping requests of 0.8 s, one every 0.3 s, attributed on the sampled counter."""
    from litellm_energy_router.energy.attribution import Attributor

    stop = threading.Event()
    th = start_load(gpu, stop)
    time.sleep(0.5)
    att = Attributor(idle_power_w=0.0)
    c0, s0 = counter.read().total_j, sampler.read().total_j
    t0 = time.time()
    att.add_sample(t0, c0)
    next_t, i = t0, 0
    while time.time() < t0 + seconds:
        next_t += 0.1
        time.sleep(max(0.0, next_t - time.time()))
        att.add_sample(time.time(), counter.read().total_j)
        if i % 3 == 0 and time.time() + 0.8 < t0 + seconds:
            att.add_request(f"r{i}", time.time(), time.time() + 0.8, 50, 40)
        i += 1
    c1, s1 = counter.read().total_j, sampler.read().total_j
    window = time.time() - t0
    stop.set()
    th.join(5)
    for _ in range(3):
        time.sleep(0.1)
        att.add_sample(time.time(), counter.read().total_j)
    return window, c1 - c0, s1 - s0, att, range(0, i, 3)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    if not gpu_present(args.gpu):
        return 0

    from litellm_energy_router.energy.meter import MeterError
    from litellm_energy_router.energy.nvml import NvmlMeter

    try:
        counter = NvmlMeter([args.gpu], mode="counter")
    except MeterError as e:
        print(f"FAIL: {e}")
        return 1
    sampler = NvmlMeter([args.gpu], mode="power", sample_hz=10)
    print(f"GPU {args.gpu}: {counter.gpu}; methods: {counter.method} and {sampler.method}")
    monotone, upd = update_period(counter)
    window, cj, sj, att, ids = loaded_window(counter, sampler, args.gpu, args.seconds)
    rel = abs(cj - sj) / max(cj, 1e-9)
    print(
        f"window {window:.2f} s: counter {cj:.1f} J ({cj / window:.0f} W), power sampling {sj:.1f} J "
        f"({sj / window:.0f} W), relative difference {rel:.3f}"
    )
    reqs = [att.energy(f"r{k}", final=True) for k in ids]
    tot = att.totals()
    attributed = sum(r.energy_j for r in reqs if r is not None)
    cons = abs(attributed + tot.idle_j - tot.meter_j) / max(tot.meter_j, 1e-9)
    print(
        f"attribution: {len(reqs)} requests {attributed:.1f} J + idle {tot.idle_j:.1f} J vs counter {tot.meter_j:.1f} J"
    )
    counter.close()
    sampler.close()
    ok = monotone and rel <= 0.25 and cons < 0.01
    print(
        f"gpu={counter.gpu.replace(' ', '_')} counter_update_ms={upd:.1f} window_s={window:.2f} counter_j={cj:.1f} sampling_j={sj:.1f} "
        f"rel_diff={rel:.3f} conservation_err={cons:.2e}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
