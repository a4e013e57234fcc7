"""GRPO stage (TRL ``GRPOTrainer``): a λ-conditioned choice policy whose reward is a table lookup.

Prompt: the choice layout of :mod:`litellm_energy_router.router.format` (query, task, ``<er:lam{b}>``,
``<er:choose>``); completion: one candidate label token, decoding restricted to the K labels
(``suppress_tokens`` = every other token id). The dataset carries each query's per-candidate
correctness and true joules, so the reward ``correct_j − λ_b · joules_j / e_ref`` needs no model call.
λ_b takes the bucket values of :func:`lambda_buckets` over the SFT checkpoint's knob range.

The policy shares the backbone with the SFT slot head; :func:`choice_logits` scores it in one forward
pass for evaluation against the SFT decision rule.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from litellm_energy_router.router.format import CHOOSE, N_LAMBDA_BUCKETS, Q, Layout, lambda_token


@dataclass
class GRPOStageConfig:
    """GRPO hyper-parameters.

    Attributes:
        steps: optimiser steps.
        num_generations: sampled choices per prompt (the GRPO group).
        prompts_per_step: prompts per step (batch = prompts_per_step * num_generations completions).
        learning_rate: AdamW learning rate.
        temperature: sampling temperature (~1 keeps groups diverse, so rewards differ and give a gradient).
        seed: λ-bucket sampling seed.
    """

    steps: int = 200
    num_generations: int = 6
    prompts_per_step: int = 4
    learning_rate: float = 5e-4
    temperature: float = 1.0
    seed: int = 0


def lambda_buckets(lambda_max: float) -> np.ndarray:
    """λ value of each ``<er:lam{b}>`` token: 0, then geometric up to ``lambda_max``."""
    return np.concatenate([[0.0], np.geomspace(max(lambda_max, 1e-9) * 1e-2, lambda_max, N_LAMBDA_BUCKETS - 1)])


def choice_prompt(layout: Layout, text: str, task: str | None, bucket: int) -> str:
    """The choice layout as text (GRPOTrainer tokenizes prompts itself); the query is cut from the left."""
    ids = layout.choice_ids(text, task, bucket)[: -3]
    return layout.tokenizer.decode(ids, skip_special_tokens=False) + Q + lambda_token(bucket) + CHOOSE


def build_grpo_dataset(layout: Layout, texts: Sequence[str], tasks: Sequence[str | None], Y: np.ndarray, E: np.ndarray,
                       buckets: np.ndarray, seed: int = 0) -> Any:  # fmt: skip
    from datasets import Dataset

    rng = random.Random(seed)
    rows: dict[str, list] = {"prompt": [], "correct": [], "joules": [], "lam": []}
    for text, task, y, e in zip(texts, tasks, Y, E):
        b = rng.randrange(len(buckets))
        rows["prompt"].append(choice_prompt(layout, text, task, b))
        rows["correct"].append([float(v) for v in y])
        rows["joules"].append([float(v) for v in e])
        rows["lam"].append(float(buckets[b]))
    return Dataset.from_dict(rows)


def make_reward(label_ids: Sequence[int], e_ref: float) -> Callable[..., list[float]]:
    index = {t: j for j, t in enumerate(label_ids)}

    def reward(prompts: list, completions: list, completion_ids: list, correct: list, joules: list, lam: list,
               **_: Any) -> list[float]:  # fmt: skip
        out = []
        for ids, c, e, l in zip(completion_ids, correct, joules, lam):
            j = index.get(ids[0]) if len(ids) else None
            out.append(-1.0 if j is None else float(c[j]) - float(l) * float(e[j]) / e_ref)
        return out

    reward.__name__ = "correct_minus_lambda_joules"
    return reward


def run_grpo(model: Any, tokenizer: Any, layout: Layout, dataset: Any, e_ref: float, cfg: GRPOStageConfig,
             out_dir: str) -> Any:  # fmt: skip
    import torch
    from trl import GRPOConfig, GRPOTrainer

    allowed = set(layout.label_ids)
    suppress = [i for i in range(len(tokenizer)) if i not in allowed]
    args = GRPOConfig(
        output_dir=out_dir, max_steps=cfg.steps, learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations, num_generations=cfg.num_generations,
        max_completion_length=1, temperature=cfg.temperature, generation_kwargs={"suppress_tokens": suppress},
        report_to="none", save_strategy="no", logging_steps=10, seed=cfg.seed, use_cpu=not torch.cuda.is_available(),
        bf16=False, disable_tqdm=True,
    )  # fmt: skip
    from transformers.trainer_callback import PrinterCallback

    trainer = GRPOTrainer(model=model, reward_funcs=[make_reward(layout.label_ids, e_ref)], args=args,
                          train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trainer.model


def choice_logits(model: Any, layout: Layout, texts: Sequence[str], tasks: Sequence[str | None], bucket: int) -> np.ndarray:
    """Policy logits over the K labels at ``<er:choose>`` for one λ bucket, [n, K] (one pass per batch)."""
    import torch

    out = np.zeros((len(texts), layout.n_candidates))
    pad = layout.tokenizer.pad_token_id or 0
    for s in range(0, len(texts), 64):
        rows = [layout.choice_ids(t, k, bucket) for t, k in zip(texts[s : s + 64], tasks[s : s + 64])]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), pad)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1, :]
        out[s : s + len(rows)] = logits[:, layout.label_ids].double().numpy()
    return out
