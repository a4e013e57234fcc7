"""Part (d) of ``benchmarks/unseen_traffic.py``: N production rows of a held-out task through the real serving
path, then the router refitted with them.

:func:`serve_production` copies the SQLite table without the held-out task, exports a ``task_prior``
checkpoint of it (an unseen task answered with the pooled prior, as exported checkpoints do), and sends the
pool's queries in steps through a real ``litellm.Router`` + ``EnergyRoutingStrategy`` + ``EnergyLogger``
(``litellm_energy_router.demo.serve``) against ``LocalBackend`` replaying the recorded answers; each served
call gets the recorded correctness through the feedback API (``demo.loop.label_production``).

:func:`refit_after_production` is the update the table's rows allow today: the prior refitted on the
complete rows + the partial production rows (IPS-weighted) and the energy estimate refitted on every run.
An online energy correction or context prior plugs in here (same inputs: the table after N rows; same
outputs: P and Ê per tag).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import _offline  # noqa: F401  (before LiteLLM is imported)
import numpy as np
from litellm_energy_router.training.baselines import make_baseline
from litellm_energy_router.training.data import TableMatrix, concat_rows
from litellm_energy_router.training.energy_fit import fit_energy_from_pairs
from litellm_energy_router.training.pairs import load_pairs, partial_only

from litellm_energy_router.router.format import UNKNOWN_TASK
from litellm_energy_router.router.length_model import buckets, sketch
from litellm_energy_router.router.output_tokens import request_tokens
from litellm_energy_router.table import open_store


class HashEmbedder:
    """A numpy stand-in for MiniLM: the unit signed sketch of the text's hashed byte 3/4-grams."""

    name = "hashed-ngram-sketch-512"

    def embed(self, texts):
        return np.stack([sketch(buckets(t or "")) for t in texts]).astype(np.float32)


def with_tag(m: TableMatrix, tag: str) -> TableMatrix:
    """A copy of ``m`` whose every row has task ``tag``."""
    out = m.subset(np.arange(m.n))
    out.tasks = np.array([tag] * m.n, dtype=object)
    return out


def _replay_records(pool: TableMatrix, profile: Any) -> list[Any]:
    """Per pool query: ``prompt`` and ``answers`` (candidate → (correctness, answer text)). RouterBench rows:
    the recorded answers; others (no answers recorded): a filler as long as the candidate's chat-length prior."""
    from litellm_energy_router.energy.profile import chat_output_tokens

    recorded: dict[str, dict] = {}
    if any(str(i).startswith("routerbench:") for i in pool.ids):
        from litellm_energy_router.profiling.routerbench import bundled_files, iter_records

        want = set(pool.ids.tolist())
        recorded = {r.query_id: r.answers for r in iter_records(bundled_files()) if r.query_id in want}
    prior, _ = chat_output_tokens(pool.candidates, profile)
    filler = {c: " ok" * int(round(prior[c])) for c in pool.candidates}
    return [
        SimpleNamespace(
            prompt=pool.texts[i],
            answers={
                c: (float(pool.Y[i, k]), recorded[q][c][1] if q in recorded else filler[c])
                for k, c in enumerate(pool.candidates)
            },
        )
        for i, q in enumerate(pool.ids.tolist())
    ]


def _table_without(url: str, task: str, dest: Path) -> str:
    """A copy of the SQLite table at ``url`` without ``task``'s queries and runs."""
    src = Path(url.removeprefix("sqlite:///"))
    shutil.copy(src, dest)
    con = sqlite3.connect(dest)
    with con:
        con.execute("DELETE FROM er_runs WHERE query_id IN (SELECT id FROM er_queries WHERE task = ?)", (task,))
        con.execute("DELETE FROM er_queries WHERE task = ?", (task,))
    con.close()
    return f"sqlite:///{dest}"


def _serving_checkpoint(train: TableMatrix, tmp: Path, profile: Any) -> Path:
    from litellm_energy_router.training.baselines import export_baseline
    from litellm_energy_router.training.selection import UNKNOWN_TASK_FALLBACK

    from litellm_energy_router.router.checkpoint import point_to, read_manifest, write_manifest

    ck = export_baseline("task_prior", train, tmp / "ck", embedder=HashEmbedder(), profile=profile)
    man = read_manifest(ck)
    man.baseline["unknown_task"] = UNKNOWN_TASK_FALLBACK
    write_manifest(ck, man)
    point_to(tmp / "router.json", ck)
    return tmp / "router.json"


def serve_production(
    url: str,
    train: TableMatrix,
    pool: TableMatrix,
    task: str,
    ns: list[int],
    tmp: Path,
    a: Any,
    profile: Any,
    profile_path: Path | None,
    log: Any,
) -> Iterator[tuple[int, str, Any]]:
    """Serve the pool's first ``ns[-1]`` queries (seeded order) in steps, every request from one app (the key
    alias ``app-<task>``: its context); yields (N, table url, the served checkpoint's runtime) after each step,
    the table then holding N labelled production rows of ``task`` and the process's online state
    (:data:`~litellm_energy_router.router.adapt.ADAPT`) what a serving process would hold: Ê corrected by the
    settled rows (the callback's writer thread), the context prior read from the table after the labels."""
    from litellm_energy_router.demo.backend import LocalBackend, ReplayAnswers
    from litellm_energy_router.demo.loop import label_production
    from litellm_energy_router.demo.serve import serve
    from litellm_energy_router.router.adapt import ADAPT
    from litellm_energy_router.router.runtime import RouterRuntime

    url_d = _table_without(url, task, tmp / "table.db")
    ck = _serving_checkpoint(train, tmp, profile)
    settings = _serving_settings(url_d, ck, task, tmp, a, profile_path)
    rt = RouterRuntime(ck, background=False)
    ADAPT.reset()
    ADAPT.enabled = True
    ADAPT.bind(rt.model)  # a process that just started: the context prior read from the table's rows
    ADAPT.refresh_table(url_d)
    order = np.random.default_rng(0).permutation(pool.n)[: ns[-1]]
    recs = _replay_records(pool.subset(order), profile)
    done = 0
    try:
        with LocalBackend(ReplayAnswers(recs)) as backend:
            for n in ns:
                step = recs[done:n]
                calls, counts = serve(
                    [r.prompt for r in step],
                    pool.candidates,
                    backend.base_url,
                    settings,
                    concurrency=8,
                    metadata={"user_api_key_alias": app_of(task)},
                )
                rows = label_production(url_d, calls, lambda i, c, off=done: recs[off + i].answers[c][0])
                shadow_j = _shadow(url_d, rows, calls, step, pool.candidates, a.shadow, profile)
                ADAPT.refresh_table(url_d)  # the labels (and shadow rows), as the process's next refresh reads them
                served = np.bincount([pool.candidates.index(c.candidate) for c in calls], minlength=pool.K).tolist()
                log(
                    f"    (d) served {n} production requests (written {counts['written']}, per candidate {served}, "
                    f"replay misses {backend.answers.unknown}, online rows {ADAPT.energy.rows if ADAPT.energy else 0}, "
                    f"shadow {shadow_j[0]} queries x {pool.K} candidates, {shadow_j[1]:.0f} J estimated)"
                )
                done = n
                yield n, url_d, rt
    finally:
        rt.close()
        ADAPT.reset()


def _shadow(url: str, rows: dict, calls: list, step: list, candidates: list[str], share: float, profile: Any) -> tuple:
    """Replayed shadow rows (every candidate, recorded correctness, estimated J, the production row's context) for
    the first ``share`` of this step's requests, as a shadow tournament of them writes; (queries, their J)."""
    from litellm_energy_router.demo.steps import served_matrices, write_shadow_rows

    picked = [c for c in calls if c.index < round(share * len(step))]  # calls come in index order
    if not picked:
        return 0, 0.0
    mats = served_matrices([step[c.index] for c in picked], candidates, profile)
    write_shadow_rows(url, [rows[c.call_id] for c in picked], mats, candidates, profile)
    return len(picked), float(mats[3].sum())


def _serving_settings(url: str, ck: Path, task: str, tmp: Path, a: Any, profile_path: Path | None) -> Any:
    """The served process's settings: the checkpoint ``ck`` at the operator's λ and ε, the context's own rows, the
    estimate meter, production rows of ``task`` written to ``url``."""
    from litellm_energy_router.settings import Settings

    return Settings.model_validate(
        {
            "table": {"url": url},
            "router": {
                "checkpoint": str(ck),
                "epsilon": a.epsilon,
                "epsilon_new_context": a.epsilon_new,
                "explore": a.explore,
                "timeout_ms": 5000,
                "context_refresh_s": 0,
                "context_rows": True,
            },
            "knob": {"lambda": a.lam},
            "energy": {"meter": "estimate", "profile": str(profile_path) if profile_path else None},
            "privacy": {"store_text": True},
            "writer": {"spool_dir": str(tmp / "spool"), "flush_interval_s": 0.2, "task": task},
        }
    )


def app_of(task: str) -> str:
    return f"app-{task}"


def online_after(rt: Any, ev: TableMatrix, task: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """What the serving process decides on for the judged queries ``ev`` (tag hidden, from the task's app):
    ``online``: the checkpoint's P and Ê through :meth:`~litellm_energy_router.router.adapt.Adaptation.apply`
    (Ê corrected by the settled rows, P by the context's labels); ``ctxprior``: the context prior alone
    (context → cluster → pool) with that Ê."""
    from litellm_energy_router.demo.serve import MODEL_GROUP
    from litellm_energy_router.router.adapt import ADAPT
    from litellm_energy_router.router.context import request_context

    P, Pc, E = (np.empty((ev.n, ev.K)) for _ in range(3))
    md = [{"user_api_key_alias": app_of(task)}]
    for i, text in enumerate(ev.texts):
        scored = rt.score_sync(text, None)
        ctx = request_context(text, md, MODEL_GROUP, [{"role": "user", "content": text}])
        P[i], E[i], _, _ = ADAPT.apply(scored, ctx, scored.E, explore=False, own_rows=True)
        Pc[i] = ADAPT.prior.prior(ctx)
    return {"online": (P, E), "ctxprior": (Pc, E)}


def full_rows_router(
    train: TableMatrix, pool: TableMatrix, ev: TableMatrix, task: str, lm: Any, profile: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(P, Ê) of the router trained with the task's complete tournament rows (the served pool's, tag shown):
    ``task_prior`` on the table + the pool, energy estimate refitted on both (the task's own mean lengths)."""
    from litellm_energy_router.training.energy_fit import fit_energy_estimate

    both = concat_rows(train, pool)
    est = fit_energy_estimate(both, profile)
    jp, jo = est.rates(train.candidates)
    m = with_tag(ev, task)
    T, _ = request_tokens(est, lm, m.candidates, m.texts, list(m.tasks), m.prompt_tokens)
    return make_baseline("task_prior", seed=0).fit(both).predict_proba(m), m.prompt_tokens[:, None] * jp + T * jo


def refit_after_production(
    url_d: str, train: TableMatrix, ev: TableMatrix, task: str, lm: Any, profile: Any
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(P, Ê) per tag ("shown": ``task``, "hidden": ``UNKNOWN_TASK``) for the judged queries ``ev``, from the
    table at ``url_d``: the prior on the complete rows + the production rows, the energy estimate on every run,
    output length as the checkpoint has it (the task's mean once it holds the task, else ``lm`` / the prior)."""
    with open_store(url_d) as s:
        pairs = load_pairs(s, candidates=train.candidates)
    prior = make_baseline("task_prior", seed=0).fit(concat_rows(train, partial_only(pairs, train)))
    est = fit_energy_from_pairs(pairs, profile)
    jp, jo = est.rates(train.candidates)
    P, E = {}, {}
    for tag, name in (("shown", task), ("hidden", UNKNOWN_TASK)):
        m = with_tag(ev, name)
        T, _ = request_tokens(est, lm, m.candidates, m.texts, list(m.tasks), m.prompt_tokens)
        P[tag], E[tag] = prior.predict_proba(m), m.prompt_tokens[:, None] * jp + T * jo
    return P, E
