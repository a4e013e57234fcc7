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

import numpy as np

from litellm_energy_router.router.format import UNKNOWN_TASK
from litellm_energy_router.router.length_model import buckets, request_tokens, sketch
from litellm_energy_router.table import open_store
from litellm_energy_router.training.baselines import make_baseline
from litellm_energy_router.training.data import TableMatrix, concat_rows
from litellm_energy_router.training.energy_fit import fit_energy_from_pairs
from litellm_energy_router.training.pairs import load_pairs, partial_only


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
    return [SimpleNamespace(prompt=pool.texts[i], answers={
        c: (float(pool.Y[i, k]), recorded[q][c][1] if q in recorded else filler[c]) for k, c in enumerate(pool.candidates)})
        for i, q in enumerate(pool.ids.tolist())]  # fmt: skip


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
    from litellm_energy_router.router.checkpoint import point_to, read_manifest, write_manifest
    from litellm_energy_router.training.baselines import export_baseline
    from litellm_energy_router.training.selection import UNKNOWN_TASK_FALLBACK

    ck = export_baseline("task_prior", train, tmp / "ck", embedder=HashEmbedder(), profile=profile)
    man = read_manifest(ck)
    man.baseline["unknown_task"] = UNKNOWN_TASK_FALLBACK
    write_manifest(ck, man)
    point_to(tmp / "router.json", ck)
    return tmp / "router.json"


def serve_production(url: str, train: TableMatrix, pool: TableMatrix, task: str, ns: list[int], tmp: Path, a: Any,
                     profile: Any, profile_path: Path | None, log: Any) -> Iterator[tuple[int, str]]:  # fmt: skip
    """Serve the pool's first ``ns[-1]`` queries (seeded order) in steps; yields (N, table url) after each
    step, the table then holding N labelled production rows of ``task``."""
    from litellm_energy_router.demo.backend import LocalBackend, ReplayAnswers
    from litellm_energy_router.demo.loop import label_production
    from litellm_energy_router.demo.serve import serve
    from litellm_energy_router.settings import Settings

    url_d = _table_without(url, task, tmp / "table.db")
    settings = Settings.model_validate({
        "table": {"url": url_d},
        "router": {"checkpoint": str(_serving_checkpoint(train, tmp, profile)), "epsilon": a.epsilon, "timeout_ms": 5000},
        "knob": {"lambda": a.lam}, "energy": {"meter": "estimate", "profile": str(profile_path) if profile_path else None},
        "privacy": {"store_text": True}, "writer": {"spool_dir": str(tmp / "spool"), "flush_interval_s": 0.2, "task": task},
    })  # fmt: skip
    order = np.random.default_rng(0).permutation(pool.n)[: ns[-1]]
    recs = _replay_records(pool.subset(order), profile)
    done = 0
    with LocalBackend(ReplayAnswers(recs)) as backend:
        for n in ns:
            step = recs[done:n]
            calls, counts = serve([r.prompt for r in step], pool.candidates, backend.base_url, settings, concurrency=8)
            label_production(url_d, calls, lambda i, c, off=done: recs[off + i].answers[c][0])
            served = np.bincount([pool.candidates.index(c.candidate) for c in calls], minlength=pool.K).tolist()
            log(f"    (d) served {n} production requests (written {counts['written']}, per candidate {served}, "
                f"replay misses {backend.answers.unknown})")  # fmt: skip
            done = n
            yield n, url_d


def refit_after_production(url_d: str, train: TableMatrix, ev: TableMatrix, task: str, lm: Any,
                           profile: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:  # fmt: skip
    """(P, Ê) per tag ("shown": ``task``, "hidden": ``UNKNOWN_TASK``) for the judged queries ``ev``, from the
    table at ``url_d``: the prior on the complete rows + the production rows, the energy estimate on every run,
    output length as the checkpoint has it (the task's mean once it holds the task, else ``lm`` / the prior)."""
    with open_store(url_d) as s:
        pairs = load_pairs(s, candidates=train.candidates)
    prior = make_baseline("task_prior", embedder=HashEmbedder(), seed=0).fit(concat_rows(train, partial_only(pairs, train)))
    est = fit_energy_from_pairs(pairs, profile)
    jp = np.array([est.j_per_prompt_token[c] for c in train.candidates])
    jo = np.array([est.j_per_output_token[c] for c in train.candidates])
    P, E = {}, {}
    for tag, name in (("shown", task), ("hidden", UNKNOWN_TASK)):
        m = with_tag(ev, name)
        T, _ = request_tokens(est, lm, m.candidates, m.texts, list(m.tasks), m.prompt_tokens)
        P[tag], E[tag] = prior.predict_proba(m), m.prompt_tokens[:, None] * jp + T * jo
    return P, E
