"""Scoring: P(candidate j answers correctly) for every candidate in one forward pass (no ``generate``).

Used by serving (runtime, strategy), by ``energy-router route`` and by evaluation. Imports torch and
transformers, never TRL.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .checkpoint import CheckpointError, Manifest, read_manifest, resolve
from .decide import decide_lambda, decide_target
from .format import Layout

_CL100K_EXACT_CHARS = 32_768


@lru_cache(maxsize=1)
def _cl100k() -> Any:
    from bpe_openai import get_encoding

    return get_encoding("cl100k_base")


def count_prompt_tokens(text: str) -> int:
    """tiktoken ``cl100k_base`` token count (the unit of the energy profiles), bounded time: texts longer
    than 32 KiB are counted on their last 32 KiB and scaled by length."""
    enc = _cl100k()
    text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    if len(text) <= _CL100K_EXACT_CHARS:
        return len(enc.encode(text))
    sample = text[-_CL100K_EXACT_CHARS:]
    return int(round(len(enc.encode(sample)) * len(text) / len(sample)))


def scores_from_logits(slot_logits: np.ndarray, calibration: dict[str, Any], tasks: Sequence[str | None]) -> np.ndarray:
    """``slot_logits[n, K]`` = logit(yes) − logit(no) per slot → calibrated P[n, K].

    Calibration is Platt scaling per candidate with a per-task intercept (``b_task``; ``b_any`` for
    unknown tasks such as production traffic, with slope ``a_any``): ``P = sigmoid(a_j * logit + b_{task, j})``. Without a
    calibration entry the raw sigmoid is returned.
    """
    k = slot_logits.shape[1]
    a = np.asarray(calibration.get("a", [1.0] * k), dtype=np.float64)
    a_any = np.asarray(calibration.get("a_any", a), dtype=np.float64)
    b_any = np.asarray(calibration.get("b_any", [0.0] * k), dtype=np.float64)
    b_task = {t: np.asarray(v, dtype=np.float64) for t, v in calibration.get("b_task", {}).items()}
    known = np.array([(t or "") in b_task for t in tasks], dtype=bool)
    slope = np.where(known[:, None], a[None, :], a_any[None, :])
    b = np.stack([b_task.get(t or "", b_any) for t in tasks]) if len(tasks) else np.zeros((0, k))
    z = slope * slot_logits + b
    return 1.0 / (1.0 + np.exp(-z))


def compute_slot_logits(model: Any, layout: Layout, texts: Sequence[str], tasks: Sequence[str | None] | None = None,
                        batch_size: int = 64) -> np.ndarray:  # fmt: skip
    """One forward pass per batch; returns logit(yes) − logit(no) per slot, [n, K].

    Rows are padded on the LEFT with explicit ``position_ids`` (so every row sees the positions it had
    unpadded, as in training), which puts the K slots at the same last positions of every row; models
    that support ``logits_to_keep`` then compute the LM head only there, not over the whole sequence.
    """
    import inspect

    import torch

    tasks = list(tasks) if tasks is not None else [None] * len(texts)
    enc = layout.scoring_batch(texts, tasks)
    k = layout.n_candidates
    out = np.zeros((len(texts), k), dtype=np.float64)
    pad = layout.tokenizer.pad_token_id or 0
    keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    for s in range(0, len(enc), batch_size):
        chunk = enc[s : s + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, (row, _) in enumerate(chunk):
            ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
        pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
        kw = {"logits_to_keep": k + 1} if keep else {}
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, **kw).logits
        sel = logits[:, -(k + 1) : -1, :]  # the K slot positions (the last token is <er:end>)
        out[s : s + len(chunk)] = (sel[..., layout.yes_id] - sel[..., layout.no_id]).double().numpy()
    return out


class RouterModel:
    """A loaded router checkpoint. ``score`` is thread-safe (one forward pass at a time)."""

    def __init__(self, path: str | Path, expect_candidates: Sequence[str] | None = None, threads: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        self.path = resolve(path)
        self.manifest: Manifest = read_manifest(self.path, expect_candidates)
        m = self.manifest
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
        self._lock = threading.Lock()
        self._torch = torch

    @property
    def candidates(self) -> list[str]:
        return list(self.manifest.candidates)

    @property
    def version(self) -> str:
        return self.manifest.version

    def slot_logits(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None, batch_size: int = 64) -> np.ndarray:
        """logit(yes) − logit(no) per candidate slot, shape [n, K]."""
        with self._lock:
            return compute_slot_logits(self.model, self.layout, texts, tasks, batch_size)

    def score(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None) -> np.ndarray:
        """Calibrated P[n, K] in [0, 1]."""
        tasks = list(tasks) if tasks is not None else [None] * len(texts)
        return scores_from_logits(self.slot_logits(texts, tasks), self.manifest.calibration, tasks)

    def energy(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None,
               prompt_tokens: Sequence[int] | None = None) -> np.ndarray:  # fmt: skip
        """Ê[n, K] in joules from the prompt length (known at routing time) and expected output tokens."""
        tasks = list(tasks) if tasks is not None else [None] * len(texts)
        n_tok = list(prompt_tokens) if prompt_tokens is not None else [count_prompt_tokens(t) for t in texts]
        return self.manifest.energy.estimate(self.manifest.candidates, n_tok, tasks)

    def decide(self, P: np.ndarray, E: np.ndarray, lam: float | None = None, target: float | None = None) -> np.ndarray:
        """Chosen candidate index per row (target accuracy wins over λ when both are given)."""
        if target is not None:
            return decide_target(P, E, target)
        return decide_lambda(P, E, lam or 0.0, float(self.manifest.knob["e_ref_j"]))
