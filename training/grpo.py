"""GRPO stage (TRL ``GRPOTrainer``): a λ-conditioned choice policy that starts from the calibrated scorer's
decisions and is kept near them.

1. **Buckets** (:func:`decision_buckets`): the λ of each ``<er:lam{b}>`` token is placed where the
   calibrated decision rule actually switches candidates on the calibration queries (0, quantiles of the
   switch points :func:`~litellm_energy_router.router.decide.lambda_breakpoints`, the λ where every query
   is at its cheapest candidate), in the serving unit (accuracy per ``DEFAULT_E_REF_J`` J): where the
   accuracy–energy curve bends, not a fixed geometric grid.
2. **Start** (:func:`train_start`): SFT (TRL ``SFTTrainer``) of a copy of the router's LM on the choice
   layout (query, task, ``<er:lam{b}>`` → ``<er:cj>``), the target being
   :func:`~litellm_energy_router.router.decide.decide` with the calibrated P and Ê in bucket b. The
   router's own LM (the scorer) is not changed by this stage.
3. **GRPO** (:func:`run_grpo`): decoding restricted to the K labels; reward ``correct_j − λ_b ·
   joules_j / e_ref`` by table lookup (the dataset carries each query's correctness and true joules);
   TRL's ``beta`` (KL penalty) anchors the policy to its start (TRL keeps a frozen copy as reference).
4. **Check** (:func:`never_worse_check`): per bucket, on the calibration queries (which neither step
   trained on), the policy's mean utility minus the scorer's decision's, paired, with its standard error.
   A bucket is marked ``served`` only when the policy beats the scorer's decision by more than
   ``serve_margin_se`` standard errors and is not below its own start; otherwise serving keeps the
   scorer's decision (:mod:`litellm_energy_router.router.policy`).
"""

from __future__ import annotations

import copy
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from litellm_energy_router.knob import Knob
from litellm_energy_router.router.decide import DEFAULT_E_REF_J, decide, lambda_grid
from litellm_energy_router.router.format import N_LAMBDA_BUCKETS, Layout, Q, lambda_token
from litellm_energy_router.router.model import compute_choice_logits as choice_logits
from litellm_energy_router.router.policy import POLICY_FILE, START_FILE


@dataclass
class GRPOStageConfig:
    """GRPO hyper-parameters (``retrain.train.grpo``: each key is one of these fields, its bounds in the field's
    metadata, plus ``enabled``; :mod:`.train_config`).

    Attributes:
        steps: GRPO optimiser steps.
        num_generations: sampled choices per prompt (the GRPO group).
        prompts_per_step: prompts per step (batch = prompts_per_step * num_generations completions).
        learning_rate: GRPO AdamW learning rate.
        temperature: sampling temperature (~1 keeps groups diverse, so rewards differ and give a gradient).
        beta: KL penalty to the start (TRL ``GRPOConfig.beta``; 0 would drop the anchor).
        start_epochs: epochs of the SFT start over (query, bucket) pairs.
        start_learning_rate: the SFT start's learning rate.
        start_batch_size: (query, bucket) rows per SFT start step.
        serve_margin_se: a bucket is served by the policy only when it beats the scorer's decision on the
            calibration queries by more than this many standard errors of the paired difference.
        keep_start: also save the SFT start (``policy_start.safetensors``), for benchmarks.
        seed: bucket sampling / trainer seed.
    """

    steps: int = field(default=200, metadata={"ge": 1, "le": 1_000_000})
    num_generations: int = field(default=6, metadata={"ge": 2, "le": 64})
    prompts_per_step: int = field(default=4, metadata={"ge": 1, "le": 1024})
    learning_rate: float = field(default=2e-4, metadata={"gt": 0, "lt": 1})
    temperature: float = field(default=1.0, metadata={"gt": 0, "le": 10})
    beta: float = field(default=0.04, metadata={"ge": 0})
    start_epochs: float = field(default=2.0, metadata={"gt": 0, "le": 1000})
    start_learning_rate: float = field(default=5e-3, metadata={"gt": 0, "lt": 1})
    start_batch_size: int = field(default=32, metadata={"ge": 1, "le": 4096})
    serve_margin_se: float = field(default=2.0, metadata={"ge": 0})
    keep_start: bool = False
    seed: int = 0


def decision_buckets(
    P: np.ndarray, E_hat: np.ndarray, e_ref: float = DEFAULT_E_REF_J, n: int = N_LAMBDA_BUCKETS
) -> np.ndarray:
    """λ of each bucket: 0, the quantiles of the λ at which the calibrated decision switches candidates
    on these queries, and the λ where every query is at its cheapest (:func:`lambda_grid`)."""
    return lambda_grid(P, E_hat, e_ref, n)


def choice_targets(
    P: np.ndarray, E_hat: np.ndarray, buckets: Sequence[float], e_ref: float = DEFAULT_E_REF_J
) -> np.ndarray:
    """The decision rule's choice per bucket and query, [B, n]."""
    return np.stack([decide(P, E_hat, Knob.point(lambda_=float(lam), e_ref_j=e_ref)) for lam in buckets])


def choice_prompt(layout: Layout, text: str, task: str | None, bucket: int) -> str:
    """The choice layout as text (GRPOTrainer tokenizes prompts itself); the query is cut from the left."""
    ids = layout.choice_ids(text, task, bucket)[:-2]
    return layout.tokenizer.decode(ids, skip_special_tokens=False) + Q + lambda_token(bucket)


def build_start_dataset(layout: Layout, texts: Sequence[str], tasks: Sequence[str | None], targets: np.ndarray) -> Any:
    """Pre-tokenized SFT rows, one per (query, bucket): the choice prompt and its target label token,
    the loss on the label only."""
    from datasets import Dataset

    ids_col, labels_col = [], []
    for b in range(targets.shape[0]):
        for i, (text, task) in enumerate(zip(texts, tasks)):
            ids = layout.choice_ids(text, task, b)
            ids_col.append(ids + [layout.label_ids[int(targets[b, i])]])
            labels_col.append([-100] * len(ids) + [layout.label_ids[int(targets[b, i])]])
    return Dataset.from_dict({"input_ids": ids_col, "labels": labels_col}).shuffle(seed=0)


def fresh_copy(model: Any) -> Any:
    """A new module with ``model``'s config and weights (no trainer hooks: a deepcopy of a model a TRL
    trainer has run keeps the wrapped forward of the original)."""
    new = type(model)(copy.deepcopy(model.config))
    new.load_state_dict(model.state_dict())
    return new


def train_start(
    model: Any,
    tokenizer: Any,
    layout: Layout,
    texts: Sequence[str],
    tasks: Sequence[str | None],
    targets: np.ndarray,
    cfg: GRPOStageConfig,
    out_dir: str,
) -> Any:
    """A copy of ``model`` trained (SFT) to reproduce ``targets[B, n]`` on the choice layout."""
    from .sft import SFTStageConfig, run_sft

    policy = fresh_copy(model)
    policy.train()
    sft = SFTStageConfig(
        epochs=cfg.start_epochs, batch_size=cfg.start_batch_size, learning_rate=cfg.start_learning_rate, seed=cfg.seed
    )
    return run_sft(policy, tokenizer, build_start_dataset(layout, texts, tasks, targets), sft, out_dir)


def build_grpo_dataset(
    layout: Layout,
    texts: Sequence[str],
    tasks: Sequence[str | None],
    Y: np.ndarray,
    E: np.ndarray,
    buckets: Sequence[float],
    seed: int = 0,
) -> Any:
    """GRPO prompts, one per (query, bucket), shuffled, each with its query's correctness and true joules."""
    from datasets import Dataset

    rows: dict[str, list] = {"prompt": [], "correct": [], "joules": [], "lam": []}
    for b, lam in enumerate(buckets):
        for text, task, y, e in zip(texts, tasks, Y, E):
            rows["prompt"].append(choice_prompt(layout, text, task, b))
            rows["correct"].append([float(v) for v in y])
            rows["joules"].append([float(v) for v in e])
            rows["lam"].append(float(lam))
    order = list(range(len(rows["prompt"])))
    random.Random(seed).shuffle(order)
    return Dataset.from_dict({k: [v[i] for i in order] for k, v in rows.items()})


def make_reward(label_ids: Sequence[int], e_ref: float) -> Callable[..., list[float]]:
    """Reward of a sampled label: ``correct_j − λ · joules_j / e_ref`` from the row's own columns; -1 for
    a completion that is not a label."""
    index = {t: j for j, t in enumerate(label_ids)}

    def reward(
        prompts: list, completions: list, completion_ids: list, correct: list, joules: list, lam: list, **_: Any
    ) -> list[float]:
        out = []
        for ids, c, e, lam_i in zip(completion_ids, correct, joules, lam):
            j = index.get(ids[0]) if len(ids) else None
            out.append(-1.0 if j is None else float(c[j]) - float(lam_i) * float(e[j]) / e_ref)
        return out

    reward.__name__ = "correct_minus_lambda_joules"
    return reward


def run_grpo(
    model: Any, tokenizer: Any, layout: Layout, dataset: Any, e_ref: float, cfg: GRPOStageConfig, out_dir: str
) -> Any:
    """GRPO in place from ``model`` (the start), KL-anchored to a frozen copy of it (``beta``).

    TRL 1.16 builds the reference model of a policy passed as an instance from its config's
    ``_name_or_path``; the start is saved under ``out_dir`` and named there, so the reference is the
    start itself (not the backbone the LM was first loaded from)."""
    import torch
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from .sft import checkpointing

    allowed = set(layout.label_ids)
    suppress = [i for i in range(len(tokenizer)) if i not in allowed]
    args = GRPOConfig(
        output_dir=out_dir,
        max_steps=cfg.steps,
        learning_rate=cfg.learning_rate,
        beta=cfg.beta,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations,
        num_generations=cfg.num_generations,
        max_completion_length=1,
        temperature=cfg.temperature,
        generation_kwargs={"suppress_tokens": suppress},
        report_to="none",
        save_strategy="no",
        logging_steps=10,
        seed=cfg.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        disable_tqdm=True,
        **checkpointing(GRPOConfig),
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if cfg.beta:
        ref_dir = str(Path(out_dir) / "reference")
        model.save_pretrained(ref_dir, safe_serialization=True)
        model.config._name_or_path = ref_dir
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[make_reward(layout.label_ids, e_ref)],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trainer.model


def policy_choices(
    model: Any, layout: Layout, texts: Sequence[str], tasks: Sequence[str | None], n_buckets: int
) -> np.ndarray:
    """The policy's argmax label per bucket and query, [B, n]."""
    model.eval()
    return np.stack([choice_logits(model, layout, texts, tasks, b).argmax(axis=1) for b in range(n_buckets)])


def _paired(u_a: np.ndarray, u_b: np.ndarray) -> tuple[float, float]:
    d = u_a - u_b
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("inf")
    return float(d.mean()), se


def never_worse_check(
    Y: np.ndarray,
    E: np.ndarray,
    buckets: Sequence[float],
    C_policy: np.ndarray,
    C_scorer: np.ndarray,
    C_start: np.ndarray,
    e_ref: float = DEFAULT_E_REF_J,
    margin_se: float = 2.0,
) -> list[dict]:
    """Per bucket, on held-out queries with true correctness ``Y`` and joules ``E``: the policy's mean
    utility ``y − λ·e/e_ref`` minus the scorer's decision's (``vs_scorer``) and minus its start's
    (``vs_start``), paired, each with its standard error; ``served`` when the policy beats the scorer by
    more than ``margin_se`` standard errors and is not below its start by more than as many."""
    rows = np.arange(Y.shape[0])
    out = []
    for b, lam in enumerate(buckets):
        u = {
            k: Y[rows, C[b]] - float(lam) * E[rows, C[b]] / e_ref
            for k, C in (("policy", C_policy), ("scorer", C_scorer), ("start", C_start))
        }
        d_sc, se_sc = _paired(u["policy"], u["scorer"])
        d_st, se_st = _paired(u["policy"], u["start"])
        served = d_sc > margin_se * se_sc and d_sc > 0 and d_st >= -margin_se * se_st
        out.append(
            {
                "lambda": float(lam),
                "vs_scorer": round(d_sc, 6),
                "vs_scorer_se": round(se_sc, 6),
                "vs_start": round(d_st, 6),
                "vs_start_se": round(se_st, 6),
                "agree_start_scorer": round(float((C_start[b] == C_scorer[b]).mean()), 4),
                "served": bool(served),
            }
        )
    return out


def grpo_stage(
    model: Any,
    tokenizer: Any,
    layout: Layout,
    fit: Any,
    cal: Any,
    P_fit: np.ndarray,
    P_cal: np.ndarray,
    Eh_fit: np.ndarray,
    Eh_cal: np.ndarray,
    cfg: GRPOStageConfig,
    out: Path,
    log: Callable[[str], None] = print,
) -> dict:
    """Buckets, SFT start and GRPO on the ``fit`` queries (calibrated ``P_fit``, Ê ``Eh_fit``); the check
    on the ``cal`` queries; the policy saved in ``out/policy.safetensors``. Returns the manifest's ``knob.grpo``."""
    import time

    from safetensors.torch import save_model

    t0 = time.time()
    buckets = decision_buckets(P_cal, Eh_cal)
    texts, tasks = list(fit.texts), [str(t) for t in fit.tasks]
    start = fresh_copy(
        train_start(
            model, tokenizer, layout, texts, tasks, choice_targets(P_fit, Eh_fit, buckets), cfg, str(out / "_start")
        )
    )
    c_texts, c_tasks = list(cal.texts), [str(t) for t in cal.tasks]
    C_start = policy_choices(start, layout, c_texts, c_tasks, len(buckets))
    if cfg.keep_start:
        save_model(start, str(out / START_FILE))
    policy = fresh_copy(start)
    policy.train()
    ds = build_grpo_dataset(layout, texts, tasks, fit.Y, fit.E, buckets, cfg.seed)
    policy = fresh_copy(run_grpo(policy, tokenizer, layout, ds, DEFAULT_E_REF_J, cfg, str(out / "_grpo")))
    C_pol = policy_choices(policy, layout, c_texts, c_tasks, len(buckets))
    C_sc = choice_targets(P_cal, Eh_cal, buckets)
    check = never_worse_check(cal.Y, cal.E, buckets, C_pol, C_sc, C_start, DEFAULT_E_REF_J, cfg.serve_margin_se)
    save_model(policy, str(out / POLICY_FILE))
    for tmp in ("_start", "_grpo"):
        shutil.rmtree(out / tmp, ignore_errors=True)
    log(
        f"GRPO: buckets {np.round(buckets, 4).tolist()}, start agrees with the scorer on "
        f"{np.mean([c['agree_start_scorer'] for c in check]):.0%} of calibration choices, "
        f"served buckets {[b for b, c in enumerate(check) if c['served']]}, {time.time() - t0:.0f}s"
    )
    return {
        "file": POLICY_FILE,
        "e_ref_j": DEFAULT_E_REF_J,
        "beta": cfg.beta,
        "steps": cfg.steps,
        "start_file": START_FILE if cfg.keep_start else None,
        "buckets": check,
    }
