"""Single-GPU offline profiling with vLLM (extra ``gpu``; ``mode: vllm_offline`` in the config).

Each candidate's ``model`` (Hugging Face id or local path) is loaded with ``vllm.LLM`` in turn; the
task prompts (rendered with the model's chat template) run in batches of ``batch_size``; the GPU
energy of each batch is the difference of two readings of the configured meter (``nvml``: the
cumulative NVML counter), split across the batch's queries by tokens — a prompt token weighs
``prefill_token_weight`` output tokens — and the model is unloaded before the next one. With
``energy.meter: estimate`` each query gets the profile estimate instead. Grading and writing are the
runner's (:meth:`Tournament.finish`), so rows look exactly like those of a LiteLLM tournament.

vLLM is imported only here and only when this mode runs; it is not part of the CPU install.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any, Callable, Sequence

from litellm_energy_router.energy.attribution import split_energy, token_weight
from litellm_energy_router.settings import ConfigError
from litellm_energy_router.table import open_store

from .config import CandidateSpec, TournamentConfig
from .metering import MeterAccountant
from .runner import Generation, Job, ProgressSink, Tournament, TournamentSummary, build_jobs

EngineFactory = Callable[[CandidateSpec, TournamentConfig], Any]
ParamsFactory = Callable[[TournamentConfig, int], Any]


def vllm_engine(cand: CandidateSpec, cfg: TournamentConfig) -> Any:
    """``vllm.LLM`` for the candidate (``cfg.vllm`` holds extra LLM kwargs, e.g. gpu_memory_utilization)."""
    try:
        import vllm
    except ImportError:
        raise ConfigError("mode vllm_offline needs vLLM: pip install 'litellm-energy-router[gpu]'") from None
    return vllm.LLM(model=cand.model, **cfg.vllm)


def vllm_sampling_params(cfg: TournamentConfig, max_tokens: int) -> Any:
    """``vllm.SamplingParams`` from the config's generation settings (tokens)."""
    from vllm import SamplingParams

    kw: dict[str, Any] = {"max_tokens": max_tokens, "temperature": cfg.generation.temperature}
    if cfg.generation.top_p is not None:
        kw["top_p"] = cfg.generation.top_p
    return SamplingParams(**kw)


def unload(engine: Any) -> None:
    """Free the GPU for the next model."""
    del engine
    gc.collect()
    try:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception:  # noqa: BLE001  (not vLLM, or already torn down)
        pass
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def _metric(out: Any, name: str) -> float | None:
    m = getattr(out, "metrics", None)
    v = getattr(m, name, None) if m is not None else None
    return float(v) if isinstance(v, (int, float)) else None


class OfflineDriver:
    """Runner driver: one engine per candidate, batched generation, batch energy split by tokens."""

    def __init__(
        self,
        engine_factory: EngineFactory = vllm_engine,
        params_factory: ParamsFactory = vllm_sampling_params,
        unload_fn: Callable[[Any], None] = unload,
    ) -> None:
        self.engine_factory = engine_factory
        self.params_factory = params_factory
        self.unload_fn = unload_fn

    async def __call__(self, t: Tournament, cand: CandidateSpec, jobs: Sequence[Job]) -> None:
        cfg = t.config
        engine = await asyncio.to_thread(self.engine_factory, cand, cfg)
        try:
            tok = engine.get_tokenizer()
            from_meter = isinstance(t.accountant, MeterAccountant)
            for i in range(0, len(jobs), cfg.batch_size):
                batch = jobs[i : i + cfg.batch_size]
                prompts = [
                    tok.apply_chat_template(j.task.messages(j.item), tokenize=False, add_generation_prompt=True)
                    for j in batch
                ]
                params = [self.params_factory(cfg, j.max_tokens) for j in batch]
                r0 = t.accountant.meter.read().total_j if from_meter else 0.0  # type: ignore[attr-defined]
                t0 = time.perf_counter()
                outs = await asyncio.to_thread(engine.generate, prompts, params, use_tqdm=False)
                wall = time.perf_counter() - t0
                r1 = t.accountant.meter.read().total_j if from_meter else 0.0  # type: ignore[attr-defined]
                p_tok = [len(o.prompt_token_ids or []) for o in outs]
                c_tok = [len(o.outputs[0].token_ids) for o in outs]
                if from_meter:
                    weights = [token_weight(p, c, cfg.prefill_token_weight) for p, c in zip(p_tok, c_tok)]
                    energies: list[float | None] = list(split_energy(max(0.0, r1 - r0), weights))
                else:
                    energies = [t.accountant.end(None, cand.model_name, p, c) for p, c in zip(p_tok, c_tok)]
                for job, out, p, c, e in zip(batch, outs, p_tok, c_tok, energies):
                    arrival, first, done = (
                        _metric(out, k) for k in ("arrival_time", "first_token_time", "finished_time")
                    )
                    latency = done - arrival if done is not None and arrival is not None else wall
                    ttft = first - arrival if first is not None and arrival is not None else None
                    gen = Generation(
                        out.outputs[0].text,
                        latency,
                        ttft,
                        p,
                        c,
                        energy_j=e,
                        energy_method=t.accountant.method if e is not None else None,
                    )
                    await t.finish(cand, job, gen)
        finally:
            await asyncio.to_thread(self.unload_fn, engine)


def run_offline(
    cfg: TournamentConfig, url: str, *, progress: ProgressSink | None = None, driver: OfflineDriver | None = None
) -> TournamentSummary:
    """Profile every candidate model one after another on the local GPU; rows go to ``url``."""
    jobs = build_jobs(cfg)
    with open_store(url) as store:
        t = Tournament(cfg, store, progress=progress)
        try:
            return asyncio.run(t.run(jobs, driver=driver or OfflineDriver(), sequential=True))
        finally:
            t.close()
