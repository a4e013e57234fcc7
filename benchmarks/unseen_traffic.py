"""Traffic the table never held: each task in turn held out of the table, its queries scored by routers fitted
on the other tasks, then by the router after N production rows of it.

    python benchmarks/unseen_traffic.py --quick          # both matrices, (d) on one task each (~10 min, 2 cores)
    python benchmarks/unseen_traffic.py                  # every task, (d) on every task
    python benchmarks/unseen_traffic.py --routerbench-db sqlite:///rb.db --llmrouter-db sqlite:///llm.db

**Matrices** (SQLite tables; made here in ``--workdir`` when not given): the bundled RouterBench rows
(``energy-router table import-routerbench``: output tokens known, so the energy actually used is known) and
the LLMRouter pool (``energy-router table import-matrix ../shared/data/llmrouter/train.json --energy-profile
config_examples/energy_profile_llmrouter.yaml``: correctness only; its joules are the profile's estimate with
each model's chat-length prior as output length, so its Ê / E ratio is not informative and not reported).

**Split** of a held-out task: half of its queries (stable hash) are the *served pool* (production traffic
for (d)), the other half the *judged* queries every method is scored on; the table is the other tasks.

**Methods** (no LM router is trained per fold: too slow for 2 cores; the embedding is a numpy hashed
byte-n-gram sketch, ``router.length_model.sketch``, standing in for MiniLM):

* ``router``: what a served checkpoint does with a task it never saw: P = the pooled prior (exported
  checkpoints answer an unseen task with it, ``selection.UNKNOWN_TASK_FALLBACK``), Ê = prompt tokens ×
  J/prompt token + the cross-task length model's output tokens (``router.output_tokens.request_tokens``).
* ``pooled_prior``: ``task_prior`` (an unseen task: the other tasks pooled) with the evaluation's Ê
  (``training.energy_fit.estimate_energy``: an unseen task's output length is the chat-length prior).
* ``knn``: kNN on the sketch (k = 40, shrink 10, fixed, not tuned) with the evaluation's Ê.
* what-ifs, not the router: ``knn+length`` (kNN's P with the router's Ê), ``logreg+length`` (text
  logistic regression, C = 1).
* ``after_N`` (d): the first N pool queries (N = 25, 50, 100, 200 while the pool has them) sent through a
  real ``litellm.Router`` + ``EnergyRoutingStrategy`` (ε-greedy, propensities logged) + ``EnergyLogger``
  against ``LocalBackend`` replaying the recorded answers (LLMRouter has none: a filler of the candidate's
  chat-prior length), served by a ``task_prior`` checkpoint of the table, production rows tagged with the
  task (``writer.task``) and labelled with the recorded correctness (feedback API); then P = ``task_prior``
  refitted on the table + those partial rows (IPS-weighted, ``training.pairs``) and Ê from the energy
  estimate refitted on every run (``fit_energy_from_pairs``) — :func:`refit_after_production`, where an
  online energy/prior update would plug in instead.

Each method is judged with the held-out task's tag **shown** (a tag never seen; for (d) the tag of its
production rows) and **hidden** (``UNKNOWN_TASK``). AIQ is ``training.evaluate``'s (λ sweep, hull, x_max =
the held-out task's costliest static candidate); accuracy and J/query at the operator λ (``--lam``, accuracy
per 100 J). Intervals: 2.5–97.5 % percentiles over ``--boot`` bootstrap resamples of the judged queries, the
same resamples for every method; ``d_aiq`` is the paired interval of (router − method). Last line:
``key=value``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import _offline  # noqa: F401  (before LiteLLM is imported)
import numpy as np
from litellm_energy_router.training.baselines import make_baseline
from litellm_energy_router.training.data import TableMatrix, holdout_split, load_matrix
from litellm_energy_router.training.energy_fit import estimate_energy, fit_energy_estimate
from litellm_energy_router.training.evaluate import Curve, aiq, sweep_lambda
from litellm_energy_router.training.length_fit import fit_length_model

from litellm_energy_router.router.decide import DEFAULT_E_REF_J, decide_lambda
from litellm_energy_router.router.format import UNKNOWN_TASK
from litellm_energy_router.router.output_tokens import request_tokens
from litellm_energy_router.table import open_store

try:
    from benchmarks.unseen_production import (
        HashEmbedder,
        full_rows_router,
        online_after,
        refit_after_production,
        serve_production,
        with_tag,
    )
except ImportError:  # run as a script: benchmarks/ is on sys.path
    from unseen_production import (
        HashEmbedder,
        full_rows_router,
        online_after,
        refit_after_production,
        serve_production,
        with_tag,
    )

NS = (25, 50, 100, 200)
LLM_PROFILE = Path(__file__).resolve().parent.parent / "config_examples" / "energy_profile_llmrouter.yaml"


def ensure_tables(a, workdir: Path, log) -> list[tuple[str, str, Path | None]]:
    """(name, SQLite url, energy profile) of each matrix; imports those not given into ``workdir``."""
    from litellm_energy_router.energy.profile import load_profile

    out = []
    if not a.no_routerbench:
        url = a.routerbench_db or f"sqlite:///{workdir / 'routerbench.db'}"
        if not a.routerbench_db and not (workdir / "routerbench.db").exists():
            from litellm_energy_router.profiling.routerbench import bundled_files, import_routerbench

            with open_store(url) as s:
                log(import_routerbench(s, bundled_files(), load_profile()).line(url))
        out.append(("routerbench", url, None))
    if not a.no_llmrouter:
        url = a.llmrouter_db or f"sqlite:///{workdir / 'llmrouter.db'}"
        if not a.llmrouter_db and not (workdir / "llmrouter.db").exists():
            here = Path(__file__).resolve().parents
            a.llmrouter = a.llmrouter or next(
                p / "shared/data/llmrouter" for p in (here[2], here[3]) if (p / "shared").is_dir()
            )
            from litellm_energy_router.profiling.matrix_import import import_matrix

            with open_store(url) as s:
                log(import_matrix(s, a.llmrouter / "train.json", load_profile(LLM_PROFILE)).line(url))
        out.append(("llmrouter", url, LLM_PROFILE))
    return out


def judge(methods: dict, ev: TableMatrix, lam: float, e_ref: float, n_boot: int, seed: int) -> dict:
    """Per method: AIQ, accuracy and J/query at ``lam`` (value, 2.5 %, 97.5 %) over the same bootstrap
    resamples of ``ev``, and the paired interval of AIQ(router) − AIQ(method)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, ev.n, (n_boot, ev.n))
    x_max = float(ev.E.mean(axis=0).max())
    rows, rng_n = {}, np.arange(ev.n)
    for name, (P, Eh) in methods.items():
        curve, C = sweep_lambda(P, Eh, ev.Y, ev.E, e_ref, 41, name)
        ch = decide_lambda(P, Eh, lam, DEFAULT_E_REF_J)
        acc_q, j_q = ev.Y[rng_n, ch], ev.E[rng_n, ch]
        full = (aiq(curve.energy_j, curve.accuracy, x_max), acc_q.mean(), j_q.mean())
        st = np.array(
            [
                (
                    aiq(*_xy(Curve.from_choices(name, "lambda", curve.knob, C[:, i], ev.Y[i], ev.E[i])), x_max),
                    acc_q[i].mean(),
                    j_q[i].mean(),
                )
                for i in idx
            ]
        )
        rows[name] = {"full": full, "boot": st, "e_hat": Eh.mean(axis=0)}
    out = {}
    for name, r in rows.items():
        lo, hi = np.percentile(r["boot"], [2.5, 97.5], axis=0)
        d = rows["router"]["boot"][:, 0] - r["boot"][:, 0] if "router" in rows else np.zeros(1)
        out[name] = {k: (float(r["full"][j]), float(lo[j]), float(hi[j])) for j, k in enumerate(("aiq", "acc", "j"))}
        out[name]["d_aiq"] = tuple(float(x) for x in np.percentile(d, [2.5, 97.5]))
        out[name]["e_ratio"] = (r["e_hat"] / ev.E.mean(axis=0)).round(2).tolist()
        if "full" in rows:  # against the router trained with the task's complete rows: paired
            f, b = rows["full"], r["boot"]
            pct = lambda x: tuple(float(v) for v in np.percentile(x, [2.5, 97.5]))  # noqa: E731
            out[name]["vs_full"] = {
                "d_aiq": pct(b[:, 0] - f["boot"][:, 0]),
                "d_acc": pct(b[:, 1] - f["boot"][:, 1]),
                "j_ratio": (float(r["full"][2] / f["full"][2]), *pct(b[:, 2] / f["boot"][:, 2])),
            }
    return out


def _xy(c: Curve) -> tuple:
    return c.energy_j, c.accuracy


def static_methods(train: TableMatrix, ev: TableMatrix, profile, log) -> dict[str, dict]:
    """tag → method → (P, Ê) for (a)–(c) and the what-ifs, fitted on ``train`` only."""
    t0 = time.time()
    est = fit_energy_estimate(train, profile)
    lm, info = fit_length_model(train, profile)
    emb = HashEmbedder()
    fits = {
        n: make_baseline(k, embedder=emb, seed=0, **kw).fit(train)
        for n, k, kw in (
            ("prior", "task_prior", {}),
            ("knn", "knn", {"k": 40, "shrink": 10.0}),
            ("logreg", "logreg", {"C": 1.0}),
        )
    }
    log(
        f"    fitted on {train.n} queries in {time.time() - t0:.0f} s (length model: {info.get('model')}; pseudo-rows "
        f"by leave-task-out CV: {fits['prior'].params['alpha']})"
    )
    jp, jo = est.rates(train.candidates)
    out = {}
    for tag, name in (("shown", ev.tasks[0]), ("hidden", UNKNOWN_TASK)):
        m = with_tag(ev, name)
        T, _ = request_tokens(est, lm, m.candidates, m.texts, list(m.tasks), m.prompt_tokens)
        e_len, e_std = m.prompt_tokens[:, None] * jp + T * jo, estimate_energy(est, m)
        P = {n: f.predict_proba(m) for n, f in fits.items()}
        out[tag] = {
            "router": (P["prior"], e_len),
            "pooled_prior": (P["prior"], e_std),
            "knn": (P["knn"], e_std),
            "knn+length": (P["knn"], e_len),
            "logreg+length": (P["logreg"], e_len),
        }
    return out, lm


def held_out(name: str, url: str, m: TableMatrix, t: str, a, profile, profile_path, log, do_d: bool) -> list[dict]:
    train = m.subset(np.flatnonzero(m.tasks != t))
    task_rows = np.flatnonzero(m.tasks == t)
    pool_i, ev_i = holdout_split(m.ids[task_rows], 0.5, salt="unseen-traffic")
    ev, pool = m.subset(task_rows[ev_i]), m.subset(task_rows[pool_i])
    if a.max_judged and ev.n > a.max_judged:
        ev = ev.subset(np.random.default_rng(0).choice(ev.n, a.max_judged, replace=False))
    log(f"  {name} / {t}: table {train.n} queries, pool {pool.n}, judged {ev.n}")
    methods, lm = static_methods(train, ev, profile, log)
    e_ref = float(train.E.mean(axis=0).max())
    if do_d:
        ns = [n for n in NS if n <= pool.n][: a.max_steps]
        for tag in ("shown", "hidden"):
            methods[tag]["full"] = full_rows_router(train, pool, ev, t, lm, profile)
        with tempfile.TemporaryDirectory(prefix="unseen-d-") as tmp:
            for n, url_d, rt in serve_production(url, train, pool, t, ns, Path(tmp), a, profile, profile_path, log):
                P, E = refit_after_production(url_d, train, ev, t, lm, profile)
                for tag in ("shown", "hidden"):
                    methods[tag][f"after_{n}"] = (P[tag], E[tag])
                for k, v in online_after(rt, ev, t).items():
                    methods["hidden"][f"{k}_{n}"] = v
    out = []
    for tag in ("shown", "hidden"):
        res = judge(
            methods[tag], with_tag(ev, ev.tasks[0] if tag == "shown" else UNKNOWN_TASK), a.lam, e_ref, a.boot, 0
        )
        out += [{"matrix": name, "task": t, "tag": tag, "method": k, "n": ev.n, **v} for k, v in res.items()]
    return out


def fmt(v) -> str:
    return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def summary_tables(rows: list[dict], has_tokens: dict) -> str:
    """The README's table (task hidden; the static methods are the same with an unseen tag shown) and the
    (d) table (both tags), markdown."""
    by = {(r["matrix"], r["task"], r["tag"], r["method"]): r for r in rows}
    tasks = list(dict.fromkeys((r["matrix"], r["task"]) for r in rows))
    d = lambda v: f"[{v[0]:+.3f}, {v[1]:+.3f}]"  # noqa: E731
    out = [
        "| matrix | held-out task (judged) | router AIQ | pooled prior AIQ | kNN AIQ | router − pooled | router − kNN "
        "| router acc / J at λ | router Ê / E per candidate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m, t in tasks:
        R, P, K = (by[(m, t, "hidden", x)] for x in ("router", "pooled_prior", "knn"))
        ratio = ", ".join(f"{x:.2f}" for x in R["e_ratio"]) if has_tokens[m] else "–"
        out.append(
            f"| {m} | {t} ({R['n']}) | {fmt(R['aiq'])} | {fmt(P['aiq'])} | {fmt(K['aiq'])} | {d(P['d_aiq'])} | "
            f"{d(K['d_aiq'])} | {R['acc'][0]:.3f} / {R['j'][0]:.1f} | {ratio} |"
        )
    out += [
        "",
        "| matrix | task | tag | method | AIQ | router − method | acc at λ | J/query at λ | Ê / E per candidate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (m, t, tag, meth), r in by.items():
        if (
            meth == "router"
            and any(k[:3] == (m, t, tag) and k[3].startswith("after_") for k in by)
            or meth.startswith(("after_", "online_", "full"))
        ):
            ratio = ", ".join(f"{x:.2f}" for x in r["e_ratio"]) if has_tokens[m] else "–"
            out.append(
                f"| {m} | {t} | {tag} | {meth} | {fmt(r['aiq'])} | {d(r['d_aiq'])} | {fmt(r['acc'])} | "
                f"{fmt(r['j'])} | {ratio} |"
            )
    return "\n".join(out)


def online_table(rows: list[dict]) -> str:
    """(d) through the online path against the router trained with the task's complete rows (``full``), task
    hidden: per N, the online router's AIQ, J/query and accuracy at λ (paired with ``full``), the context
    prior's AIQ, and the refitted lookup's (tag shown), markdown."""
    by = {(r["matrix"], r["task"], r["tag"], r["method"]): r for r in rows}
    d = lambda v: f"[{v[0]:+.3f}, {v[1]:+.3f}]"  # noqa: E731
    out = [
        "| matrix | task | N | online AIQ | online − full | J online / full at λ | acc online − full | "
        "ctx prior AIQ | ctx prior − full | refit (tag shown) AIQ | full AIQ / acc / J |",
        "|---" * 11 + "|",
    ]
    for (m, t, tag, meth), r in by.items():
        if tag != "hidden" or not meth.startswith("online_"):
            continue
        n = meth.split("_")[1]
        c, f, rf = (
            by[(m, t, "hidden", f"ctxprior_{n}")],
            by[(m, t, "hidden", "full")],
            by.get((m, t, "shown", f"after_{n}")),
        )
        j = r["vs_full"]["j_ratio"]
        out.append(
            f"| {m} | {t} | {n} | {fmt(r['aiq'])} | {d(r['vs_full']['d_aiq'])} | {j[0]:.2f} [{j[1]:.2f}, {j[2]:.2f}] | "
            f"{d(r['vs_full']['d_acc'])} | {fmt(c['aiq'])} | {d(c['vs_full']['d_aiq'])} | "
            f"{fmt(rf['aiq']) if rf else '–'} | {f['aiq'][0]:.3f} / {f['acc'][0]:.3f} / {f['j'][0]:.1f} |"
        )
    return "\n".join(out)


def online_verdict(rows: list[dict], n: int = 50) -> str:
    """At N = ``n``: J/query at λ within 10 % of ``full``'s with accuracy not below it beyond the interval; the
    context prior's AIQ not below ``full``'s beyond the interval."""
    on = [r for r in rows if r["method"] == f"online_{n}"]
    cp = [r for r in rows if r["method"] == f"ctxprior_{n}"]
    j_ok = sum(abs(r["vs_full"]["j_ratio"][0] - 1) <= 0.1 and r["vs_full"]["d_acc"][1] >= 0 for r in on)
    # the same with fewer joules than full's allowed (a cheaper choice at no lower accuracy): how many of the misses
    # spend less, not more
    j_le = sum(r["vs_full"]["j_ratio"][0] <= 1.1 and r["vs_full"]["d_acc"][1] >= 0 for r in on)
    c_ok = sum(r["vs_full"]["d_aiq"][1] >= 0 for r in cp)
    return (
        f"online{n}_j_within_10pct_acc_not_below={j_ok}/{len(on)} online{n}_j_at_most_110pct_acc_not_below="
        f"{j_le}/{len(on)} ctxprior{n}_reaches_lookup={c_ok}/{len(cp)}"
    )


def verdict(rows: list[dict], has_tokens: dict) -> str:
    """The done-when checks: router's AIQ ≥ pooled prior's and kNN's within the paired interval (the upper
    end of router − method ≥ 0), and RouterBench's Ê / E per candidate within 1.5×."""
    r = [x for x in rows if x["method"] in ("pooled_prior", "knn")]
    ok = sum(x["d_aiq"][1] >= 0 for x in r)
    beat = sum(x["d_aiq"][0] > 0 for x in r)
    ratios = [
        v
        for x in rows
        if x["method"] == "router" and x["tag"] == "hidden" and has_tokens[x["matrix"]]
        for v in x["e_ratio"]
    ]
    within = sum(1 / 1.5 <= v <= 1.5 for v in ratios)
    return f"comparisons={len(r)} router_not_below={ok} router_above={beat} e_ratio_within_1_5={within}/{len(ratios)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routerbench-db", default=None)
    ap.add_argument("--llmrouter-db", default=None)
    ap.add_argument(
        "--llmrouter", type=Path, default=None, help="LLMRouter data folder (default: ../shared/data/llmrouter)"
    )
    ap.add_argument("--no-routerbench", action="store_true")
    ap.add_argument("--no-llmrouter", action="store_true")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "unseen_traffic")
    ap.add_argument("--quick", action="store_true", help="(d) on --d-tasks only, 2 steps, fewer resamples")
    ap.add_argument("--d-tasks", default="mbpp,gsm8k", help="tasks (d) runs on in --quick (comma-separated)")
    ap.add_argument("--lam", type=float, default=0.22, help="operator λ, accuracy per 100 J (the demo's serving λ)")
    ap.add_argument("--epsilon", type=float, default=0.1, help="exploration rate of the served router in (d)")
    ap.add_argument(
        "--epsilon-new", type=float, default=0.0, help="(d): router.epsilon_new_context of the served router (0: off)"
    )
    ap.add_argument("--explore", choices=("energy", "aimed"), default="energy", help="(d): router.explore")
    ap.add_argument(
        "--shadow",
        type=float,
        default=0.0,
        help="(d): share of each step's requests also run on every candidate (a shadow tournament: recorded "
        "correctness, estimated J, the request's context; 0: none)",
    )
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--max-judged", type=int, default=0, help="judge at most this many queries per task (0: all)")
    ap.add_argument("--max-steps", type=int, default=len(NS), help="(d): at most this many N steps")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    a = ap.parse_args()
    if a.quick:
        a.boot, a.max_steps, a.max_judged = min(a.boot, 300), min(a.max_steps, 2), a.max_judged or 250
    a.workdir.mkdir(parents=True, exist_ok=True)
    t0, rows, has_tokens = time.time(), [], {}
    log = lambda s: print(s, flush=True)  # noqa: E731
    for name, url, profile_path in ensure_tables(a, a.workdir, log):
        from litellm_energy_router.energy.profile import load_profile

        with open_store(url, create=False) as s:
            m = load_matrix(s)
        profile = load_profile(profile_path) if profile_path else None
        has_tokens[name] = bool(np.isfinite(m.T).all())
        log(f"{name}: {m.n} queries x {m.K} candidates, {len(m.task_names())} tasks")
        for t in m.task_names():
            do_d = not a.quick or t in a.d_tasks.split(",")
            for r in held_out(name, url, m, t, a, profile, profile_path, log, do_d):
                rows.append(r)
                log(
                    f"| {name} | {t} | {r['tag']} | {r['method']} | {fmt(r['aiq'])} | "
                    f"[{r['d_aiq'][0]:+.3f}, {r['d_aiq'][1]:+.3f}] | {fmt(r['acc'])} | {fmt(r['j'])} | "
                    f"{r['e_ratio'] if has_tokens[name] else '-'} |"
                )
            if a.out:
                a.out.write_text(json.dumps(rows, indent=1))
    print("\n" + summary_tables(rows, has_tokens) + "\n")
    if any(r["method"].startswith("online_") for r in rows):
        print(online_table(rows) + "\n")
    print(
        f"{verdict(rows, has_tokens)} {online_verdict(rows)} held_out={len({(r['matrix'], r['task']) for r in rows})} "
        f"seconds={time.time() - t0:.0f}"
    )


if __name__ == "__main__":
    main()
