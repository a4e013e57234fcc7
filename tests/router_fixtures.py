"""Synthetic tournament rows with a planted rule, and a seconds-long router trained on them; served rows for the
callback's writer."""

from __future__ import annotations

import asyncio
import random
import sys
import textwrap
from pathlib import Path

from litellm_energy_router.demo.backend import model_list
from litellm_energy_router.table import make_query

CANDS = ["small", "medium", "large"]
ENERGY = {"small": 10.0, "medium": 30.0, "large": 90.0}
TOPICS = ["apples", "rivers", "music", "trains", "clouds", "bread", "chess", "paint", "glass", "birds"]


def served_row(i: int, **over):
    """The ``i``-th served request's row for the callback's writer (a :class:`PendingRow`): call id ``call-<i>``,
    mistral-7b, success, text ``question <i>``, 1 s from ``1000 + i`` (Unix s), 10 prompt and 5 output tokens; ``over``:
    fields to change."""
    from litellm_energy_router.litellm_glue.callback import PendingRow

    fields = {
        "call_id": f"call-{i}",
        "candidate": "mistralai/mistral-7b-chat",
        "status": "success",
        "text": f"question {i}",
        "start_s": 1000.0 + i,
        "end_s": 1001.0 + i,
        "first_token_s": None,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "propensity": None,
        "deployment_id": "d",
        "backend_id": None,
    }
    return PendingRow(**{**fields, **over})


def small_big_pool(api_base: str) -> list[dict]:
    """Two deployments of the model group ``pool`` at ``api_base``: models ``small`` and ``big``, ids
    ``dep-small`` and ``dep-big``, mapped to candidates by the settings (no candidate tag)."""
    return model_list(api_base, ["small", "big"], group="pool", ids=["dep-small", "dep-big"], candidates=False)


def pool_deployments(backend, group: str = "pool", names=None) -> list[dict]:
    """One deployment per candidate (``names``, default :data:`CANDS`) in model group ``group``, each at its own path
    of the local ``backend`` (``backend.base(name)``), ids ``dep-<name>``, mapped to candidates by name (no tag)."""
    return [
        {
            "model_name": group,
            "litellm_params": {"model": f"openai/{c}", "api_base": backend.base(c), "api_key": "k"},
            "model_info": {"id": f"dep-{c}"},
        }
        for c in (names or CANDS)
    ]


def loop_settings(ckpt, url: str, tmp_path: Path, router: dict | None = None, **sections):
    """Settings of the whole loop on the planted pool: ``ckpt`` serving (timeout 5 s, ``router`` on top), λ 0.05, the
    table at ``url``, the simulated meter, a spool under ``tmp_path``; ``sections``: more top-level sections."""
    from litellm_energy_router.settings import Settings

    return Settings.model_validate(
        {
            "router": {"checkpoint": str(ckpt), "timeout_ms": 5000, **(router or {})},
            "candidates": [{"name": c} for c in CANDS],
            "knob": {"lambda": 0.05},
            "table": {"url": url},
            "energy": {"meter": "simulated"},
            "writer": {"spool_dir": str(tmp_path / "spool"), "flush_interval_s": 0.1},
            **sections,
        }
    )


def planted_rows(n: int = 60, seed: int = 0, names=None, prefix: str = "q"):
    """Queries containing "proof" are solved only by `large`; all others by every candidate.
    ``names`` renames (small, medium, large); ``prefix`` starts the query ids (``q0``, ``q1``...)."""
    rename = dict(zip(CANDS, names or CANDS))
    rng = random.Random(seed)
    queries, runs = [], []
    for i in range(n):
        hard = i % 2 == 0
        topic = rng.choice(TOPICS)
        text = f"Give a proof about {topic} number {i}" if hard else f"Tell me about {topic} number {i}"
        q = make_query(f"{prefix}{i}", "synthetic", text, source="tournament")
        queries.append(q)
        for c in CANDS:
            ok = 1.0 if (not hard or c == "large") else 0.0
            runs.append(
                {
                    "query_id": q.id,
                    "candidate": rename[c],
                    "source": "tournament",
                    "score": ok,
                    "energy_j": ENERGY[c],
                    "prompt_tokens": 8,
                    "completion_tokens": 20,
                }
            )
    cands = [{"name": rename[c]} for c in CANDS]
    return cands, queries, runs


def train_planted(store, out_dir, n: int = 60, names=None):
    from litellm_energy_router.training.pipeline import TrainConfig, train

    cands, queries, runs = planted_rows(n, names=names)
    store.write(queries, runs, candidates=cands)
    return train(store, out_dir, TrainConfig.quick(), log=lambda s: None)


async def drain_litellm_logging():
    """Let LiteLLM's logging of the calls made so far run on this event loop, not on a later test's."""
    try:
        from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER
    except ImportError:  # a LiteLLM without the logging worker
        return
    if not hasattr(GLOBAL_LOGGING_WORKER, "_bound_loop"):
        _move_old_worker_to_this_loop(GLOBAL_LOGGING_WORKER)
    await GLOBAL_LOGGING_WORKER.flush()


def _move_old_worker_to_this_loop(worker) -> None:
    """LiteLLM 1.80: what newer LiteLLM does itself on a loop change (``LoggingWorker._ensure_queue``): its
    queue and worker task stay bound to the first loop, so on a later loop nothing serves the queue and
    ``flush`` never returns. The pending coroutines (not started yet) move to a fresh queue and worker here."""
    loop = asyncio.get_running_loop()
    task = worker._worker_task
    if task is not None and not task.done() and task.get_loop() is loop:
        return
    old, pending = worker._queue, []
    while old is not None and not old.empty():
        pending.append(old.get_nowait())
    worker._queue = worker._worker_task = None
    worker.start()
    for item in pending:
        worker._queue.put_nowait(item)


def release_litellm_logging_loop():
    """Between tests: drop LiteLLM 1.80's logging queue and worker of a finished test's event loop (newer
    LiteLLM rebinds them itself, ``LoggingWorker._bound_loop``), so its late calls are not logged into a
    later test's table, and the next call starts a fresh worker on its own loop."""
    module = sys.modules.get("litellm.litellm_core_utils.logging_worker")  # not imported: nothing to unbind
    worker = getattr(module, "GLOBAL_LOGGING_WORKER", None)
    if worker is None:
        return
    if hasattr(worker, "_bound_loop"):  # rebinds itself, but carries a finished loop's pending logging onto the next
        _drop_pending_logging(worker)
        return
    worker._queue = worker._worker_task = None


def _drop_pending_logging(worker) -> None:
    """Newer LiteLLM: close the logging coroutines a finished test left queued (or dequeued, not started), which
    ``LoggingWorker._ensure_queue`` would otherwise run on the next test's loop with that test's callbacks."""
    queue, dropped = getattr(worker, "_queue", None), []
    while queue is not None and not queue.empty():
        dropped.append(queue.get_nowait())
    unstarted = getattr(worker, "_unstarted_dequeued_tasks", None)
    if unstarted is not None:
        dropped += list(unstarted())
        worker._dequeued_tasks.clear()
    for task in dropped:
        task["coroutine"].close()


def retrain_yaml(tmp_path: Path, url: str, min_new_rows: int, retrain_extra: str = "") -> Path:
    """A settings file with a ``retrain:`` section (quick training, 30 % held out) over the table ``url``,
    its pointer under ``tmp_path``; ``retrain_extra``: more YAML inside ``retrain:``."""
    p = tmp_path / "retrain.yaml"
    p.write_text(
        textwrap.dedent(f"""
        energy_router:
          table: {{url: "{url}"}}
          router: {{checkpoint: "{tmp_path / "current.json"}"}}
        retrain:
          quick: true
          min_new_rows: {min_new_rows}
          holdout_fraction: 0.3
        """)
        + textwrap.indent(textwrap.dedent(retrain_extra), "  ")
    )
    return p


def store_with_write(before_write):
    """A ``store_factory`` for the table writer: the real store, with ``before_write()`` run before each ``write``
    (raise to fail it, block to hang it)."""
    from litellm_energy_router.table import open_store

    class Wrapped:
        def __init__(self, url):
            self.s = open_store(url)

        def write(self, *a, **k):
            before_write()
            return self.s.write(*a, **k)

        def __getattr__(self, name):
            return getattr(self.s, name)

    return Wrapped
