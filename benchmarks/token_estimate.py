"""The prompt-token estimate the router prices requests with, against the exact cl100k count.

    python benchmarks/token_estimate.py [--n 6000] [--checkpoint DIR]

:func:`litellm_energy_router.tokens.estimate_prompt_tokens` is a linear model over byte-class counts
(:func:`~litellm_energy_router.tokens.token_features`). This fits it (least squares on relative error) on each
bundled source in turn and scores it on the other (RouterBench prompts and answers ↔ LLMRouter queries), then on
both, and prints the absolute relative error's 50th / 90th / 99th percentiles, the time per text of the estimate
and of the cl100k count, and the coefficients fitted on both sources (what ``tokens._EST_W`` holds). Last line:
``median_rel_err=<x> p99_rel_err=<y> estimate_us=<a> cl100k_us=<b> speed_ratio=<b/a> ...``. With ``--checkpoint``
(e.g. :mod:`bench_routing`'s), also the serving decisions (``EnergyRouterCore.decide``, exploration off) on every
bundled RouterBench prompt at 9 λ from 0 to 1, priced with the estimate and with the exact count:
``decisions_changed=<fraction>``.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import time
from pathlib import Path

import _offline  # noqa: E402, F401  (before LiteLLM is imported)
import litellm  # noqa: E402, F401 - as in serving: the count is LiteLLM's tiktoken encoding
import numpy as np

from litellm_energy_router.tokens import (  # noqa: E402
    _EST_W,
    count_prompt_tokens,
    estimate_prompt_tokens,
    token_features,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def routerbench_texts(n: int, rng: np.random.Generator) -> list[str]:
    """Prompts and model answers of the bundled RouterBench rows."""
    csv.field_size_limit(2**31 - 1)
    out: list[str] = []
    for f in sorted((DATA / "routerbench").glob("*.csv")):
        with open(f, newline="") as fh:
            for r in csv.DictReader(fh):
                p = r["prompt"]
                try:
                    v = ast.literal_eval(p)
                    p = "\n".join(map(str, v)) if isinstance(v, list) else p
                except (ValueError, SyntaxError):
                    pass
                out.append(p)
                out += [v for k, v in r.items() if k.endswith("model_response") and v][:3]
    return [out[i] for i in rng.permutation(len(out))[:n]]


def llmrouter_texts(n: int, rng: np.random.Generator) -> list[str]:
    with open(DATA / "llmrouter" / "default_query_train.jsonl") as fh:
        out = [json.loads(line)["query"] for line in fh]
    return [out[i] for i in rng.permutation(len(out))[:n]]


def fit(F: np.ndarray, t: np.ndarray) -> np.ndarray:
    w = 1.0 / np.maximum(t, 1.0)
    return np.linalg.lstsq(F * w[:, None], t * w, rcond=None)[0]


def rel_err(F: np.ndarray, t: np.ndarray, coef: np.ndarray) -> np.ndarray:
    return np.abs(np.maximum(np.rint(F @ coef), 0) - t) / np.maximum(t, 1.0)


def per_text_us(f, texts: list[str]) -> float:
    f(texts[0])
    t0 = time.perf_counter()
    for t in texts:
        f(t)
    return (time.perf_counter() - t0) / len(texts) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=6000, help="texts per source (default 6000)")
    ap.add_argument("--checkpoint", help="also compare the decisions of this checkpoint (exact count vs estimate)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    src = {"routerbench": routerbench_texts(a.n, rng), "llmrouter": llmrouter_texts(a.n, rng)}
    F = {k: np.array([token_features(t) for t in v]) for k, v in src.items()}
    T = {k: np.array([count_prompt_tokens(t) for t in v], dtype=float) for k, v in src.items()}
    pct = lambda e: " / ".join(f"{x:.3f}" for x in np.percentile(e, [50, 90, 99]))  # noqa: E731
    for fit_on, test_on in (("routerbench", "llmrouter"), ("llmrouter", "routerbench")):
        c = fit(F[fit_on], T[fit_on])
        print(
            f"fit on {fit_on} ({len(T[fit_on])} texts), error on {test_on} p50/p90/p99: {pct(rel_err(F[test_on], T[test_on], c))}"
        )
    both = fit(np.vstack(list(F.values())), np.concatenate(list(T.values())))
    print("coefficients fitted on both:", np.array2string(both, precision=4, separator=", "))
    errs = []
    for k in src:
        e = np.abs([estimate_prompt_tokens(t) - n for t, n in zip(src[k], T[k])]) / np.maximum(T[k], 1.0)
        errs.append(e)
        print(f"served coefficients (tokens._EST_W), error on {k} p50/p90/p99: {pct(e)}")
    texts = [t for v in src.values() for t in v][:4000]
    us_est, us_cl = per_text_us(estimate_prompt_tokens, texts), per_text_us(count_prompt_tokens, texts)
    print(f"time per text: estimate {us_est:.1f} µs, cl100k count {us_cl:.1f} µs ({len(texts)} texts)")
    e = np.concatenate(errs)
    changed = f" decisions_changed={decisions_changed(Path(a.checkpoint)):.4f}" if a.checkpoint else ""
    print(
        f"median_rel_err={np.median(e):.4f} p99_rel_err={np.percentile(e, 99):.4f} estimate_us={us_est:.1f} "
        f"cl100k_us={us_cl:.1f} speed_ratio={us_cl / us_est:.2f} coef_max_abs_diff={np.abs(both - _EST_W).max():.4f}"
        + changed
    )


def decisions_changed(ck: Path) -> float:
    """The fraction of (prompt, λ) decisions of checkpoint ``ck`` that differ when the prompt is priced with the
    exact count instead of the estimate (the task tag hidden, as in a proxy)."""
    import time as _t

    from litellm_energy_router.knob import resolve_knob
    from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore
    from litellm_energy_router.router import runtime
    from litellm_energy_router.router.checkpoint import read_manifest
    from litellm_energy_router.settings import Settings

    cands = read_manifest(ck).candidates
    deps = [
        {"model_name": "pool", "model_info": {"id": f"d{j}", "energy_router_candidate": c}} for j, c in enumerate(cands)
    ]
    core = EnergyRouterCore(
        Settings.model_validate({"router": {"checkpoint": str(ck), "cache_size": 0, "epsilon": 0.0, "online": False}})
    )
    core.runtime.wait_ready()
    prompts = sorted(set(routerbench_texts(10**9, np.random.default_rng(0))))  # prompts and answers: any text
    knobs = [
        resolve_knob(core.settings.knob, {"metadata": {"energy_router": {"lambda": lam}}})
        for lam in np.linspace(0, 1, 9)
    ]
    picks = {}
    for how, f in (("estimate", runtime.estimate_prompt_tokens), ("exact", count_prompt_tokens)):
        runtime.estimate_prompt_tokens = f
        scored = [core.runtime.score_sync(t) for t in prompts]
        picks[how] = [core.decide(s, deps, k, _t.perf_counter())[1].candidate for s in scored for k in knobs]
    runtime.estimate_prompt_tokens = estimate_prompt_tokens
    diff = sum(a != b for a, b in zip(picks["estimate"], picks["exact"]))
    print(
        f"decisions: {diff} of {len(picks['exact'])} ({len(prompts)} texts × {len(knobs)} λ) differ, exact count vs estimate"
    )
    return diff / len(picks["exact"])


if __name__ == "__main__":
    main()
