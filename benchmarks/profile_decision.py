"""Where one serving decision's time goes, measured on this machine.

    python benchmarks/profile_decision.py [--checkpoint DIR] [--cprofile] [--cold] [--in-loop]

Calls each stage of a serving-student decision (``EnergyRouterCore.choose``: text and knob, prompt tokens, the
student's P, the output-length model's parts, the decision, the accounting figures) directly on the uncached
RouterBench prompts :mod:`bench_routing` uses, and prints the median per-prompt time of each (5 passes over 300
prompts), then ``choose()`` end to end. ``--cprofile`` adds cProfile's top functions by own time over 1,000
decisions; ``--cold`` adds ``choose()`` after evicting the CPU caches before each call. Without a checkpoint
at ``--checkpoint DIR`` it builds :mod:`bench_routing`'s checkpoint (a few minutes), into DIR when given. Last line:
``choose_p50_us=<x> length_model_us=<y> prompt_tokens_us=<z> student_us=<w> shared_ngram_pass_ratio=<r>`` (and
``cold_choose_p50_us=<c>`` with ``--cold``; ``in_loop_choose_p50_us=<l>`` with ``--in-loop``: each stage timed inside
``choose()`` back to back and between sequential ``Router.acompletion`` calls against a local backend, side by side). ``unlike_table_choose_p50_us``: ``choose()`` on 60 chat requests unlike the
table's prompts, whose support scan cannot stop early.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import pstats
import sys
import tempfile
import time
from pathlib import Path

import _offline  # noqa: E402, F401  (before LiteLLM is imported)
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


from litellm_energy_router.router import length_model as lm  # noqa: E402
from litellm_energy_router.router.checkpoint import read_manifest  # noqa: E402
from litellm_energy_router.router.length_cues import dense_features  # noqa: E402
from litellm_energy_router.router.output_tokens import request_tokens  # noqa: E402
from litellm_energy_router.tokens import count_prompt_tokens, estimate_prompt_tokens  # noqa: E402


def stage(name: str, f, n: int) -> float:
    """Median over 5 passes of the mean µs of ``f(i)`` for i < n (after a warm-up)."""
    for i in range(min(n, 30)):
        f(i)
    per = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for i in range(n):
            f(i)
        per.append((time.perf_counter_ns() - t0) / n / 1000)
    print(f"  {name:46s} {np.median(per):8.1f} µs")
    return float(np.median(per))


def messages(texts: list[str]) -> list[list[dict]]:
    """Each prompt as a one-message chat request."""
    return [[{"role": "user", "content": t}] for t in texts]


def setup(checkpoint: str | None):
    """(core, prompts, deployments) for the decisions: the checkpoint (built when not given), 300 uncached prompts;
    the core and prompts as :mod:`bench_routing` makes them, deployments at an address never called."""
    from bench_routing import checkpoint_at, make_core, pool_model_list, texts_of

    tmp = Path(tempfile.mkdtemp())
    ck = checkpoint_at(checkpoint, tmp)
    cands = read_manifest(ck).candidates
    texts = [f"{t} #{i}" for i, t in enumerate(texts_of(tmp, cands[0])[:300])]
    core = make_core(ck, "auto")
    core.runtime.wait_ready()
    return core, texts, pool_model_list(cands, lambda name: "http://127.0.0.1:9")


def stages(core, texts: list[str], deps: list[dict], rk: dict) -> dict[str, float]:
    """Each stage of a decision timed alone (printed), µs by stage name."""
    n, sc, cands = len(texts), core.runtime.model, core.runtime.model.candidates
    L, est = sc.length, sc.manifest.energy
    prior = np.array([est.unknown_task_tokens()[c] for c in cands])
    msgs = messages(texts)
    ntok = [estimate_prompt_tokens(t) for t in texts]
    sk = [lm.sketch(lm.buckets(t)).astype(np.float32) for t in texts]
    scored = [core.runtime.score_sync(t) for t in texts]
    print(f"scorer {sc.name}, {n} prompts (median {int(np.median([len(t) for t in texts]))} characters)")
    s = {
        "plan": stage("text, knob, deployments by candidate", lambda i: core._plan(deps, msgs[i], None, rk), n),
        "tokens": stage("prompt tokens (the estimate routing uses)", lambda i: estimate_prompt_tokens(texts[i]), n),
        "cl100k": stage("  for reference: the cl100k count", lambda i: count_prompt_tokens(texts[i]), n),
        "student": stage("student P (n-grams, weights)", lambda i: sc.score([texts[i]], [None]), n),
    }
    if L is not None and L.W is not None:
        s["cues"] = stage("length model: cue flags", lambda i: dense_features(texts[i], ntok[i]), n)
        s["buckets"] = stage("length model: n-gram buckets", lambda i: lm.buckets(texts[i]), n)
        s["support"] = stage("length model: support (reference products)", lambda i: L.support(sk[i]), n)
        s["length"] = stage("length model: predict, all of it", lambda i: L.predict([texts[i]], [ntok[i]], prior), n)
    s["tokens_all"] = stage(
        "output tokens and note (request_tokens)",
        lambda i: request_tokens(est, L, cands, [texts[i]], [None], [ntok[i]]),
        n,
    )
    s["decide"] = stage(
        "decision, metadata, metrics",
        lambda i: core.decide(scored[i], deps, core.knob(rk), time.perf_counter(), None, rk),
        n,
    )
    dec = [core.decide(scored[i], deps, core.knob(rk), time.perf_counter(), None, rk) for i in range(n)]
    s["figures"] = stage("accounting figures", lambda i: core.accounting.estimate(dec[i][1], dec[i][0]), n)
    return s


async def choose_p50(core, deps: list[dict], msgs: list, rk: dict) -> float:
    """``choose()`` end to end, p50 µs over the prompts (after one pass as warm-up)."""
    for _ in range(2):  # the first pass warms up
        out = []
        for m in msgs:
            t0 = time.perf_counter_ns()
            await core.choose(deps, m, None, rk)
            out.append((time.perf_counter_ns() - t0) / 1000)
    return float(np.median(out))


def top_functions(core, deps: list[dict], msgs: list, rk: dict) -> None:
    """cProfile's top functions by own time over 1,000 decisions."""
    pr = cProfile.Profile()

    async def many() -> None:
        for i in range(1000):
            await core.choose(deps, msgs[i % len(msgs)], None, rk)

    pr.enable()
    asyncio.run(many())
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint")
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--cold", action="store_true", help="also choose() after writing 64 MB before each call")
    ap.add_argument("--in-loop", action="store_true", help="also each stage between sequential acompletion calls")
    args = ap.parse_args()
    core, texts, deps = setup(args.checkpoint)
    rk = {"metadata": {}}
    s = stages(core, texts, deps, rk)
    msgs = messages(texts)
    p50 = asyncio.run(choose_p50(core, deps, msgs, rk))
    print(f"  {'choose() end to end, p50':46s} {p50:8.1f} µs")
    shared = asyncio.run(shared_pass_ab(core, deps, msgs, rk))
    far = asyncio.run(unlike_the_table(core, deps, rk))
    cold = asyncio.run(cold_choose(core, deps, msgs, rk)) if args.cold else None
    looped = asyncio.run(in_loop(core, texts)) if args.in_loop else None
    if args.cprofile:
        top_functions(core, deps, msgs, rk)
    print(
        f"choose_p50_us={p50:.0f} length_model_us={s.get('length', 0):.0f} prompt_tokens_us={s['tokens']:.0f} "
        f"student_us={s['student']:.0f} shared_ngram_pass_ratio={shared:.3f} unlike_table_choose_p50_us={far:.0f}"
        + (f" cold_choose_p50_us={cold:.0f}" if cold is not None else "")
        + (f" in_loop_choose_p50_us={looped:.0f}" if looped is not None else "")
    )


#: chat requests nothing like the table's benchmark prompts (the traffic of docs/unseen_traffic.md), one per (verb, topic)
FAR_VERBS = (
    "Draft a friendly note to my landlord about",
    "Give me three weekend ideas involving",
    "Rewrite this tagline so it sounds warmer: we sell",
    "What should I pack for a trip centred on",
    "Plan a dinner menu around",
)
FAR_TOPICS = (
    "a leaking kitchen tap",
    "old film cameras",
    "sourdough starters",
    "a rainy week in Lisbon",
    "vintage bicycles",
    "houseplants that survive neglect",
    "a quiet board game night",
    "learning the cello at forty",
    "birdwatching gear",
    "a community garden",
    "home espresso",
    "a coastal hiking trail",
)


async def unlike_the_table(core, deps: list[dict], rk: dict) -> float:
    """``choose()`` p50 (µs) on chat requests unlike the table (support below the blend's threshold on the bench's
    checkpoint: the support scan reads every reference row instead of stopping early), printed with the scan alone."""
    texts = [f"{v} {t}? (#{i})" for i, (v, t) in enumerate((v, t) for v in FAR_VERBS for t in FAR_TOPICS)]
    L, msgs = core.runtime.model.length, messages(texts)
    sk = [lm.text_sketch(t) for t in texts]
    if L is not None and len(L.ref):
        sup = [L.support(v) for v in sk]
        stage(f"support scan, unlike the table (median {np.median(sup):.2f})", lambda i: L.support(sk[i]), len(texts))
    p50 = await choose_p50(core, deps, msgs, rk)
    print(f"  {'choose() p50, requests unlike the table':46s} {p50:8.1f} µs")
    return p50


async def cold_choose(core, deps, msgs, rk) -> float:
    """``choose()`` p50 (µs) with the CPU caches evicted before each call (64 MB written): what a decision costs
    between two of LiteLLM's calls, which leave none of the router's tables in cache (docs/benchmarks.md)."""
    buf, t = np.zeros(64 * 2**20 // 8), []
    for _ in range(2):
        for m in msgs:
            buf += 1.0
            t0 = time.perf_counter_ns()
            await core.choose(deps, m, None, rk)
            t.append(time.perf_counter_ns() - t0)
    p50 = float(np.median(t)) / 1000
    print(f"  {'choose() p50 after a 64 MB cache eviction':46s} {p50:8.1f} µs")
    return p50


#: (owner, attribute, label) of the stages :func:`in_loop` times inside ``choose()`` (owner: a module or a class path)
IN_LOOP_STAGES = (
    ("litellm_energy_router.litellm_glue.core:EnergyRouterCore", "_plan", "text, knob, deployments, context"),
    ("litellm_energy_router.router.scoring:StudentScorer", "score", "student P"),
    ("litellm_energy_router.router.runtime", "estimate_prompt_tokens", "prompt tokens"),
    ("litellm_energy_router.router.output_tokens", "request_tokens", "output tokens and note"),
    ("litellm_energy_router.router.length_model", "dense_features", "  of which cue flags"),
    ("litellm_energy_router.litellm_glue.core:EnergyRouterCore", "decide", "decision, metadata, metrics"),
    ("litellm_energy_router.litellm_glue.core:EnergyRouterCore", "choose", "choose() end to end"),
)


async def in_loop(core, texts: list[str], n: int = 500) -> float:
    """Each stage's p50 (µs) inside ``choose()`` back to back, then between sequential ``Router.acompletion`` calls
    (the energy strategy, a local backend): what LiteLLM's own work between two decisions leaves in the caches.
    Printed side by side; returns ``choose()``'s p50 in the loop."""
    import importlib

    import litellm
    from bench_routing import Calls, pool_model_list, timed
    from litellm import Router

    from litellm_energy_router.demo.backend import LocalBackend
    from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
    from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy

    logging.getLogger("LiteLLM").setLevel(logging.ERROR)
    litellm.suppress_debug_info = True
    times: dict[str, list[float]] = {label: [] for *_, label in IN_LOOP_STAGES}
    undo, backend = [], LocalBackend()
    try:
        for path, attr, label in IN_LOOP_STAGES:
            mod, _, cls = path.partition(":")
            owner = getattr(importlib.import_module(mod), cls) if cls else importlib.import_module(mod)
            f = owner.__dict__[attr]
            setattr(owner, attr, timed(f, times[label]))
            undo.append((owner, attr, f))
        backend.start()
        deps = pool_model_list(list(core.runtime.model.candidates), backend.base)
        router = Router(model_list=deps)
        register_strategy(router, EnergyRoutingStrategy(router, core=core))
        calls = Calls(texts)
        await calls.seq(router, 50, 0)  # warm-up, not counted
        for v in times.values():
            v.clear()
        for i in range(n):
            await core.choose(deps, calls.msgs(100_000 + i))
        hot = {k: float(np.median(v)) * 1e6 for k, v in times.items() if v}
        for v in times.values():
            v.clear()
        await calls.seq(router, n, 200_000)
        loop = {k: float(np.median(v)) * 1e6 for k, v in times.items() if v}
    finally:
        if backend.port is not None:
            backend.stop()
        for owner, attr, f in undo:
            setattr(owner, attr, f)
    for k, h in hot.items():
        print(f"  {k:46s} {h:8.1f} µs back to back, {loop.get(k, float('nan')):8.1f} µs in the loop")
    return loop.get("choose() end to end", float("nan"))


async def shared_pass_ab(core, deps, msgs, rk) -> float:
    """``choose()`` p50 with the request's n-gram pass shared (the caches of ``student._hashes``,
    ``student._suffix_buckets`` and ``length_model._tail_sketch``) over its p50 with one pass per consumer (the
    uncached functions), interleaved prompt by prompt in one run, 3 passes: below 1 means the sharing saves time."""
    from litellm_energy_router.router import student

    cached = (student._hashes, student._suffix_buckets, lm._tail_sketch)
    plain = tuple(f.__wrapped__ for f in cached)
    t = {True: [], False: []}
    for _ in range(3):
        for i in range(len(msgs)):
            for share in (True, False):
                student._hashes, student._suffix_buckets, lm._tail_sketch = cached if share else plain
                t0 = time.perf_counter_ns()
                await core.choose(deps, msgs[i], None, rk)
                t[share].append(time.perf_counter_ns() - t0)
    student._hashes, student._suffix_buckets, lm._tail_sketch = cached
    a, b = float(np.median(t[True])) / 1000, float(np.median(t[False])) / 1000
    print(f"  {'choose() p50, n-grams shared / per consumer':46s} {a:8.1f} / {b:.1f} µs")
    return a / b


if __name__ == "__main__":
    main()
