"""Synthetic tournament rows with a planted rule, and a seconds-long router trained on them."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

from litellm_energy_router.demo.backend import model_list
from litellm_energy_router.table import make_query

CANDS = ["small", "medium", "large"]
ENERGY = {"small": 10.0, "medium": 30.0, "large": 90.0}
TOPICS = ["apples", "rivers", "music", "trains", "clouds", "bread", "chess", "paint", "glass", "birds"]


def small_big_pool(api_base: str) -> list[dict]:
    """Two deployments of the model group ``pool`` at ``api_base``: models ``small`` and ``big``, ids
    ``dep-small`` and ``dep-big``, mapped to candidates by the settings (no candidate tag)."""
    return model_list(api_base, ["small", "big"], group="pool", ids=["dep-small", "dep-big"], candidates=False)


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
    await GLOBAL_LOGGING_WORKER.flush()


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
