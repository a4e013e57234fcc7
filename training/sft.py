"""SFT stage: per-candidate yes/no targets, all K slots of a query in one sequence (TRL ``SFTTrainer``).

Each example is the scoring layout of :mod:`litellm_energy_router.router.format` with causal-LM
``labels`` holding ``<er:yes>``/``<er:no>`` after every candidate slot. ``SFTTrainer`` takes the
pre-tokenized dataset as is (``input_ids`` + ``labels``) and its collator pads both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from litellm_energy_router.router.format import UNKNOWN_TASK, Layout


@dataclass
class SFTStageConfig:
    """SFT hyper-parameters (``retrain.train.sft``: each key is one of these fields, its bounds in the field's
    metadata; :mod:`.train_config`).

    Attributes:
        epochs: passes over the training queries.
        batch_size: queries per step (each query carries all K candidate targets).
        learning_rate: AdamW peak learning rate (linear decay).
        task_dropout: share of training copies whose task tag is replaced by ``unknown``, so the router
            also works on production traffic, which has no task label.
        seed: shuffling / dropout seed.
    """

    epochs: float = field(default=4.0, metadata={"gt": 0, "le": 1000})
    batch_size: int = field(default=16, metadata={"ge": 1, "le": 4096})
    learning_rate: float = field(default=2e-3, metadata={"gt": 0, "lt": 1})
    task_dropout: float = field(default=0.25, metadata={"ge": 0, "le": 1})
    seed: int = 0


def build_sft_dataset(
    layout: Layout,
    texts: Sequence[str],
    tasks: Sequence[str | None],
    Y: np.ndarray,
    task_dropout: float = 0.25,
    seed: int = 0,
) -> Any:
    """A ``datasets.Dataset`` with ``input_ids`` and ``labels`` (one row per query, K targets each)."""
    from datasets import Dataset

    rng = random.Random(seed)
    shown = [UNKNOWN_TASK if rng.random() < task_dropout else t for t in tasks]
    ids_col, labels_col = [], []
    for (ids, slots), y in zip(layout.scoring_batch(texts, shown), Y):
        ids_col.append(ids)
        labels_col.append(layout.scoring_labels(ids, slots, list(y)))
    return Dataset.from_dict({"input_ids": ids_col, "labels": labels_col})


def run_sft(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    cfg: SFTStageConfig,
    out_dir: str,
    on_log: Callable[[dict[str, float]], None] | None = None,
) -> Any:
    """Train in place with TRL's ``SFTTrainer`` on CPU or GPU; returns the model."""
    import torch
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=out_dir,
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=0.05,
        weight_decay=0.01,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        max_length=None,
        dataset_num_proc=None,
        disable_tqdm=True,
        **checkpointing(SFTConfig),
    )

    class _Log(TrainerCallback):
        def on_log(self, _args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if on_log and logs:
                on_log({**logs, "step": state.global_step, "max_steps": state.max_steps})

    from transformers.trainer_callback import PrinterCallback

    from .progress import active_heartbeat, trainer_progress_callback

    hb = active_heartbeat()  # inside `with heartbeat(out)` (the demo): a step line at least every few seconds
    callbacks = [_Log()] + ([trainer_progress_callback("SFT", hb)] if hb is not None else [])
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # progress goes through on_log (a rich bar in the CLI)
    trainer.train()
    return trainer.model


def checkpointing(config_cls: Any) -> dict[str, bool]:
    """TRL's default (activation checkpointing on) under the name transformers reads: transformers 5.2x renamed
    ``gradient_checkpointing`` and warns (FutureWarning, in every ``train`` output) when only the old name is set,
    as TRL's default sets it."""
    return {"activation_checkpointing": True} if "activation_checkpointing" in config_cls.__dataclass_fields__ else {}
