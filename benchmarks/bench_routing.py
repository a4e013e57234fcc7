"""Routing cost, measured in one run on this machine.

    python benchmarks/bench_routing.py [--checkpoint DIR] [--calls 1000]

1. Decision latency of the router (text extraction + scoring + decision), uncached prompts from the
   bundled RouterBench rows: one request at a time, and a burst of 64 concurrent requests; with the
   serving default (``router.scorer: student``, the checkpoint's distilled student) and with the LM
   (``router.scorer: lm``, the lean forward pass).
2. End-to-end ``Router.acompletion`` per-call time against a local OpenAI-compatible backend, with the
   energy strategy vs LiteLLM's ``simple-shuffle``, sequentially and with 64 concurrent callers (and
   sequentially with the LM scorer), ``--calls`` each. The routers take turns in blocks (50 calls
   sequentially, 250 concurrently), so load from other processes drifts over all of them alike.
3. A real ``litellm --config`` proxy process, plain vs with the energy router + logger on the same
   checkpoint (:mod:`proxy_footprint`): resident memory after 200 requests and the time from start to the
   first request the router routed (``--no-proxy`` skips this part).

Without a checkpoint at ``--checkpoint DIR`` it builds the default ``energy-router train`` architecture (tiny
backbone, max_len 128, student) with a few SFT steps, into DIR when given (reused by the next run: pass the same
DIR): decision cost depends on the architecture, not on training length. Last line (serving default):
``ratio_vs_shuffle=<x> decision_p50_ms=<y> decision_p99_ms=<z>
proxy_rss_mib=<a> plain_rss_mib=<b> first_routed_s=<c> plain_first_s=<d> in_loop_decision_p50_ms=<e>`` (the
decision timed inside the sequential ``acompletion`` calls), then ``glue_ratio=<g>`` with ``--glue``: the strategy's
per-call time with a decision made in advance over ``simple-shuffle``'s (the plugin path and the decision's metadata
without ``choose()``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import _offline  # noqa: E402, F401  (before LiteLLM is imported)
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from litellm_energy_router.profiling.routerbench import bundled_files, import_routerbench  # noqa: E402

from litellm_energy_router.demo.backend import LocalBackend  # noqa: E402
from litellm_energy_router.energy import load_profile  # noqa: E402
from litellm_energy_router.settings import Settings  # noqa: E402
from litellm_energy_router.table import open_store  # noqa: E402


def pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1000, q))


def build_checkpoint(d: Path) -> Path:
    from litellm_energy_router.training.pipeline import TrainConfig, train

    store = open_store(f"sqlite:///{d / 'bench.db'}")
    import_routerbench(store, bundled_files(), load_profile())
    cfg = TrainConfig()
    cfg.sft.epochs = 0.05
    ck = train(store, d / "router", cfg, log=lambda s: None)
    store.close()
    return ck


def checkpoint_at(arg: str | None, tmp: Path) -> Path:
    """The benchmark's checkpoint: ``arg`` when it is one (a checkpoint directory or pointer), the one an earlier run
    built into ``arg`` (``arg/router``), else one built now into ``arg`` (kept for the next run) or, without ``arg``,
    into ``tmp``."""
    from litellm_energy_router.router.checkpoint import MANIFEST

    if arg is None:
        return build_checkpoint(tmp)
    d = Path(arg)
    if d.is_file() or (d / MANIFEST).exists():
        return d
    if (d / "router" / MANIFEST).exists():
        return d / "router"
    print(f"no checkpoint at {d}: building the benchmark's checkpoint into it (a minute or two; reused next time)")
    d.mkdir(parents=True, exist_ok=True)
    return build_checkpoint(d)


def texts_of(tmp: Path, candidate: str) -> list[str]:
    """The bundled RouterBench prompts (one split), as the decisions and calls send them."""
    store = open_store(f"sqlite:///{tmp / 'texts.db'}")
    import_routerbench(store, bundled_files()[-1:], load_profile())
    texts = [r["text"] for r in store.iter_runs() if r["candidate"] == candidate]
    store.close()
    return texts


def pool_model_list(cands: list[str], base) -> list[dict]:
    """One deployment per candidate in model group ``pool``, tagged with its candidate, at ``base(f"c{j}")``."""
    return [
        {
            "model_name": "pool",
            "litellm_params": {"model": f"openai/c{j}", "api_base": base(f"c{j}"), "api_key": "k"},
            "model_info": {"id": f"dep-{j}", "energy_router_candidate": c},
        }
        for j, c in enumerate(cands)
    ]


def make_core(ck: Path, scorer: str):
    from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore

    settings = {"router": {"checkpoint": str(ck), "cache_size": 0, "timeout_ms": 10_000, "scorer": scorer}}
    return EnergyRouterCore(Settings.model_validate({**settings, "knob": {"lambda": 0.3}}))


class Calls:
    """The prompts as chat messages (``#i`` keeps every call uncached) and the ways of sending them."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def msgs(self, i: int) -> list[dict]:
        return [{"role": "user", "content": f"{self.texts[i % len(self.texts)]} #{i}"}]

    async def decisions(self, c, deps, n: int, label: str) -> list[float]:
        """Seconds per ``choose`` one at a time (printed with a burst of 64 concurrent ones); returns the single."""
        for i in range(20):  # warm-up
            await c.choose(deps, self.msgs(i))
        single, burst = [], []
        for i in range(n):
            t0 = time.perf_counter()
            await c.choose(deps, self.msgs(1000 + i))
            single.append(time.perf_counter() - t0)

        async def one(i):
            t0 = time.perf_counter()
            await c.choose(deps, self.msgs(5000 + i))
            burst.append(time.perf_counter() - t0)

        for r in range(n // 64 or 1):
            await asyncio.gather(*[one(r * 64 + i) for i in range(64)])
        print(
            f"decision single ({label}): p50 {pct(single, 50):.2f} ms  p99 {pct(single, 99):.2f} ms  (n={len(single)})"
        )
        print(
            f"decision burst of 64 ({label}): p50 {pct(burst, 50):.2f} ms  p99 {pct(burst, 99):.2f} ms  (n={len(burst)})"
        )
        return single

    async def seq(self, router, n: int, offset: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            await router.acompletion(model="pool", messages=self.msgs(offset + i))
        return time.perf_counter() - t0

    async def conc(self, router, n: int, offset: int, width: int = 64) -> float:
        sem = asyncio.Semaphore(width)

        async def call(i):
            async with sem:
                await router.acompletion(model="pool", messages=self.msgs(offset + i))

        t0 = time.perf_counter()
        await asyncio.gather(*[call(i) for i in range(n)])
        return time.perf_counter() - t0


async def interleaved(run, routers: dict, n: int, block: int, offset: int) -> dict[str, float]:
    """Per-call seconds of each router; blocks alternate (order rotating) so load drift hits all alike."""
    tot = dict.fromkeys(routers, 0.0)
    names = list(routers)
    for b, start in enumerate(range(0, n, block)):
        size = min(block, n - start)
        for name in names[b % len(names) :] + names[: b % len(names)]:
            tot[name] += await run(routers[name], size, offset)
            offset += size
    return {k: v / n for k, v in tot.items()}


async def acompletion_ratios(calls: Calls, model_list: list[dict], core, lm_core, n: int, label: str) -> tuple:
    """(sequential per-call s by router: ``shuffle``, ``energy``, ``lm``; the decision times inside the strategy's
    calls, s); prints the sequential and 64-concurrent comparisons."""
    from litellm import Router

    from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
    from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy

    shuffle = Router(model_list=model_list, routing_strategy="simple-shuffle")
    energy, energy_lm = Router(model_list=model_list), Router(model_list=model_list)
    register_strategy(energy, EnergyRoutingStrategy(energy, core=core))
    register_strategy(energy_lm, EnergyRoutingStrategy(energy_lm, core=lm_core))
    for r in (shuffle, energy, energy_lm):  # warm-up
        await calls.seq(r, 50, 0)
    in_loop = timed_choose(core)  # the same decision timed inside acompletion (LiteLLM's own work between them)
    sq = await interleaved(calls.seq, {"shuffle": shuffle, "energy": energy, "lm": energy_lm}, n, 50, 20_000)
    del core.choose  # the class method again
    cc = await interleaved(calls.conc, {"shuffle": shuffle, "energy": energy}, n, 250, 80_000)
    for kind, d in (("sequential", sq), ("64 concurrent", cc)):
        s, e = d["shuffle"], d["energy"]
        print(
            f"acompletion {kind} ({label}): simple-shuffle {s * 1000:.2f} ms/call, energy {e * 1000:.2f} ms/call, "
            f"ratio {e / s:.3f}"
        )
    print(f"decision inside acompletion, sequential ({label}): p50 {pct(in_loop, 50):.2f} ms  (n={len(in_loop)})")
    return sq, in_loop


async def glue_ratio(calls: Calls, model_list: list[dict], core, n: int) -> float:
    """Sequential per-call time of the strategy with a decision made once in advance (the plugin path and the
    decision's metadata, without ``choose()``) over ``simple-shuffle``'s, interleaved like :func:`acompletion_ratios`."""
    from litellm import Router

    from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
    from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy

    dep, decision = await core.choose(model_list, calls.msgs(0))

    async def made(deployments, *a, **k):
        return dep, decision

    fixed = SimpleNamespace(choose=made)  # all the strategy calls of its core
    shuffle = Router(model_list=model_list, routing_strategy="simple-shuffle")
    glue = Router(model_list=model_list)
    register_strategy(glue, EnergyRoutingStrategy(glue, core=fixed))
    for r in (shuffle, glue):
        await calls.seq(r, 50, 0)
    d = await interleaved(calls.seq, {"shuffle": shuffle, "glue": glue}, n, 50, 140_000)
    print(f"acompletion sequential, a decision made in advance: ratio {d['glue'] / d['shuffle']:.3f} vs simple-shuffle")
    return d["glue"] / d["shuffle"]


async def proxy_part(ck: Path, cands: list[str], backend, texts: list[str], label: str) -> str:
    """The proxy-process comparison (:mod:`proxy_footprint`), printed; returns its key=value fields."""
    from proxy_footprint import run_proxy

    plain = await asyncio.to_thread(run_proxy, None, cands, backend.base, texts)
    ours = await asyncio.to_thread(run_proxy, ck, cands, backend.base, texts)
    print(
        f"proxy process: plain LiteLLM {plain['rss_mib']:.0f} MiB, with the energy router ({label}) "
        f"{ours['rss_mib']:.0f} MiB (+{ours['rss_mib'] - plain['rss_mib']:.0f} MiB)"
    )
    print(
        f"start to first answered request: plain {plain['first_routed_s']:.1f} s; start to first routed request: "
        f"{ours['first_routed_s']:.1f} s ({ours['fail_open_before_ready']} answered fail-open before)"
    )
    return (
        f" proxy_rss_mib={ours['rss_mib']:.0f} plain_rss_mib={plain['rss_mib']:.0f}"
        f" first_routed_s={ours['first_routed_s']:.1f} plain_first_s={plain['first_routed_s']:.1f}"
    )


async def main_async(args) -> None:
    import litellm

    from litellm_energy_router.router.checkpoint import read_manifest

    logging.getLogger("LiteLLM").setLevel(logging.ERROR)
    litellm.suppress_debug_info = True
    tmp = Path(tempfile.mkdtemp())
    ck = checkpoint_at(args.checkpoint, tmp)
    cands = read_manifest(ck).candidates
    texts = texts_of(tmp, cands[0])
    backend = LocalBackend().start()
    model_list = pool_model_list(cands, backend.base)
    core, lm_core = make_core(ck, "auto"), make_core(ck, "lm")
    for c in (core, lm_core):
        c.runtime.wait_ready()  # built inside the event loop: they load on a thread
    label = core.runtime.model.name
    print(f"scorers: serving default {label}, reference {lm_core.runtime.model.name}")
    calls = Calls(texts)
    lm_single = await calls.decisions(lm_core, model_list, args.decisions, "lm")
    single = await calls.decisions(core, model_list, args.decisions, label)
    sq, in_loop = await acompletion_ratios(calls, model_list, core, lm_core, args.calls, label)
    s_seq, e_seq = sq["shuffle"], sq["energy"]
    print(
        f"acompletion sequential (lm): energy {sq['lm'] * 1000:.2f} ms/call, ratio {sq['lm'] / s_seq:.3f}; "
        f"lm decision single p50 {pct(lm_single, 50):.2f} ms"
    )
    tail = "" if args.no_proxy else await proxy_part(ck, cands, backend, texts, label)
    glue = f" glue_ratio={await glue_ratio(calls, model_list, core, args.calls):.3f}" if args.glue else ""
    backend.stop()
    print(
        f"ratio_vs_shuffle={e_seq / s_seq:.3f} decision_p50_ms={pct(single, 50):.2f} decision_p99_ms={pct(single, 99):.2f}"
        f"{tail} in_loop_decision_p50_ms={pct(in_loop, 50):.2f}{glue}"
    )


def timed_choose(core) -> list[float]:
    """Seconds of each ``core.choose`` call from now on (the list fills as the routers run)."""
    out: list[float] = []
    core.choose = timed(core.choose, out)
    return out


def timed(f, out: list[float]):
    """``f`` (a function or a coroutine function) appending the seconds of each call to ``out``."""
    if asyncio.iscoroutinefunction(f):

        async def timed_async(*a, **k):
            t0 = time.perf_counter()
            try:
                return await f(*a, **k)
            finally:
                out.append(time.perf_counter() - t0)

        return timed_async

    def timed_sync(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            out.append(time.perf_counter() - t0)

    return timed_sync


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--decisions", type=int, default=300)
    ap.add_argument("--no-proxy", action="store_true", help="skip the proxy-process part")
    ap.add_argument("--glue", action="store_true", help="also the strategy with a decision made in advance")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
