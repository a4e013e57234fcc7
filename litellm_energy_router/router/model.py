"""The LM scorer: P(candidate j answers correctly) for every candidate in one forward pass (no ``generate``).

The ``lm`` kind of the scorer registry (:mod:`.scoring`), ``energy-router route --scorer lm`` and
evaluation. Imports torch and transformers (inside :class:`RouterModel`), never TRL.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from litellm_energy_router.router.checkpoint import CheckpointError, Manifest
from litellm_energy_router.router.format import Layout
from litellm_energy_router.router.scoring import (
    CheckpointScorer,
    StudentScorer,
    scores_from_logits,
)


@lru_cache(maxsize=64)
def _keeps_logits(forward: Any) -> bool:
    import inspect

    return "logits_to_keep" in inspect.signature(forward).parameters


def left_padded(rows: Sequence[Sequence[int]], pad: int) -> tuple[Any, Any]:
    """``(input_ids, attention_mask)``, long tensors [len(rows), longest]: each row of token ids padded on
    the LEFT with ``pad`` (so the last positions line up), mask 1 on the row's own tokens."""
    import torch

    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


def compute_slot_logits(
    model: Any,
    layout: Layout,
    texts: Sequence[str],
    tasks: Sequence[str | None] | None = None,
    batch_size: int = 64,
    scorer: Any = None,
) -> np.ndarray:
    """One forward pass per batch; returns logit(yes) − logit(no) per slot, [n, K].

    Rows are padded on the LEFT with explicit ``position_ids`` (so every row sees the positions it had
    unpadded, as in training), which puts the K slots at the same last positions of every row; models
    that support ``logits_to_keep`` then compute the LM head only there, not over the whole sequence.
    With ``scorer`` (a :class:`~litellm_energy_router.router.fastpath.SlotScorer` over the same model's
    weights) the lean forward replaces the HF one.
    """
    import torch

    tasks = list(tasks) if tasks is not None else [None] * len(texts)
    enc = layout.scoring_batch(texts, tasks)
    k = layout.n_candidates
    out = np.zeros((len(texts), k), dtype=np.float64)
    pad = layout.tokenizer.pad_token_id or 0
    keep = scorer is None and _keeps_logits(type(model).forward)
    for s in range(0, len(enc), batch_size):
        chunk = enc[s : s + batch_size]
        ids, mask = left_padded([row for row, _ in chunk], pad)
        if scorer is not None:
            out[s : s + len(chunk)] = scorer.slot_logits(ids, mask, k)
            continue
        pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
        kw = {"logits_to_keep": k + 1} if keep else {}
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, **kw).logits
        sel = logits[:, -(k + 1) : -1, :]  # the K slot positions (the last token is <er:end>)
        out[s : s + len(chunk)] = (sel[..., layout.yes_id] - sel[..., layout.no_id]).double().numpy()
    return out


def compute_choice_logits(
    model: Any, layout: Layout, texts: Sequence[str], tasks: Sequence[str | None], bucket: int, batch_size: int = 64
) -> np.ndarray:
    """The GRPO choice policy's logits over the K labels at the λ bucket token ``<er:lam{bucket}>`` (the last
    position of :meth:`~.format.Layout.choice_ids`), [n, K] (one forward pass per batch, rows left-padded
    with explicit positions)."""
    import torch

    out = np.zeros((len(texts), layout.n_candidates))
    pad = layout.tokenizer.pad_token_id or 0
    for s in range(0, len(texts), batch_size):
        rows = [layout.choice_ids(t, k, bucket) for t, k in zip(texts[s : s + batch_size], tasks[s : s + batch_size])]
        ids, mask = left_padded(rows, pad)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1, :]
        out[s : s + len(rows)] = logits[:, layout.label_ids].double().numpy()
    return out


class RouterModel(CheckpointScorer):
    """The LM scorer: a loaded router checkpoint's LM. ``score`` is thread-safe (one forward pass at a time).

    ``scorer``: ``"student"`` scores with the checkpoint's distilled student when it ships one (else the
    LM); ``"lm"`` always runs the LM forward (the reference). ``fast=False`` keeps the HF forward even
    where the lean one (:mod:`.fastpath`) covers the architecture. Serving loads the student through
    :func:`~.scoring.load_scorer` without this class (and without torch).
    """

    name = "lm"

    def __init__(
        self,
        path: str | Path,
        expect_candidates: Sequence[str] | None = None,
        threads: int | None = None,
        fast: bool = True,
        scorer: str = "student",
        manifest: Manifest | None = None,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        super().__init__(path, manifest, expect_candidates)
        m = self.manifest
        if set(m.label_tokens) != set(m.candidates):
            raise CheckpointError(
                f"{self.path}: label_tokens do not cover candidates {m.candidates} (not an LM checkpoint)"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
            self.model = AutoModelForCausalLM.from_pretrained(str(self.path))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{self.path}: cannot load model/tokenizer ({str(e).splitlines()[0]})") from None
        self.model.eval()
        if threads:
            torch.set_num_threads(threads)
        try:
            self.layout = Layout(self.tokenizer, len(m.candidates), m.max_len, m.max_chars)
        except ValueError as e:
            raise CheckpointError(f"{self.path}: {e}") from None
        for c, tok in m.label_tokens.items():
            if self.tokenizer.convert_tokens_to_ids(tok) != self.layout.label_ids[m.candidates.index(c)]:
                raise CheckpointError(f"{self.path}: label token {tok!r} of {c!r} does not match the tokenizer")
        from litellm_energy_router.router.fastpath import build_slot_scorer

        self.scorer = build_slot_scorer(self.model, self.layout.yes_id, self.layout.no_id) if fast else None
        self._student = StudentScorer(self.path, m) if scorer == "student" and m.student else None
        self.student = self._student.student if self._student is not None else None
        if self._student is not None:  # one length model: the one whose rows the student's gather shares
            self.length = self._student.length
        self.probe = self.read_probe()
        self._lock = threading.Lock()

    @property
    def student_is_final(self) -> bool:
        """True when the student was distilled on the calibrated logits (probe head included), so its
        output needs no calibration and no encoder."""
        return self._student is not None and self._student.final

    @property
    def scorer_name(self) -> str:
        """What :meth:`score` runs: ``student``, ``lm-fast`` (lean forward) or ``lm``."""
        return "student" if self.student is not None else "lm-fast" if self.scorer is not None else "lm"

    def slot_logits(
        self, texts: Sequence[str], tasks: Sequence[str | None] | None = None, batch_size: int = 64
    ) -> np.ndarray:
        """logit(yes) − logit(no) per candidate slot, shape [n, K]."""
        with self._lock:
            return compute_slot_logits(self.model, self.layout, texts, tasks, batch_size, scorer=self.scorer)

    def score(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None) -> np.ndarray:
        """Calibrated P[n, K] in [0, 1] (the student's when one is loaded, else the LM's)."""
        if self._student is not None:
            return self._student.score(texts, tasks)
        tasks = list(tasks) if tasks is not None else [None] * len(texts)
        z = self.slot_logits(texts, tasks)
        return scores_from_logits(z, self.manifest.calibration, tasks, offset=self.probe_logits(texts, tasks))


def lm_scorer(path: str | Path, manifest: Manifest) -> RouterModel:
    """The ``lm`` scorer kind: the LM forward pass, never the student."""
    return RouterModel(path, manifest=manifest, scorer="lm")
