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


def scores_from_logits(slot_logits: np.ndarray, calibration: dict[str, Any], tasks: Sequence[str | None],
                       offset: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Calibrated P[n, K]: ``sigmoid`` of :func:`calibrated_logits`."""
    return 1.0 / (1.0 + np.exp(-calibrated_logits(slot_logits, calibration, tasks, offset)))


def calibrated_logits(slot_logits: np.ndarray, calibration: dict[str, Any], tasks: Sequence[str | None],
                      offset: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """``slot_logits[n, K]`` = logit(yes) − logit(no) per slot → the calibrated logit of P[n, K].

    Calibration is Platt scaling per candidate with a per-task intercept (``b_task``; ``b_any`` for
    unknown tasks such as production traffic, with slope ``a_any``):
    ``P = sigmoid(a_j * logit + b_{task, j} + offset_j)``, ``offset`` being the probe head's logits
    (:mod:`.probe`) when the checkpoint has one. Without a calibration entry the slot logits pass unchanged.
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
    return z + offset if offset is not None else z


@lru_cache(maxsize=64)
def _keeps_logits(forward: Any) -> bool:
    import inspect

    return "logits_to_keep" in inspect.signature(forward).parameters


def compute_slot_logits(model: Any, layout: Layout, texts: Sequence[str], tasks: Sequence[str | None] | None = None,
                        batch_size: int = 64, scorer: Any = None) -> np.ndarray:  # fmt: skip
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
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, (row, _) in enumerate(chunk):
            ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
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


class RouterModel:
    """A loaded router checkpoint. ``score`` is thread-safe (one forward pass at a time).

    ``scorer``: ``"student"`` scores with the checkpoint's distilled student when it ships one (else the
    LM); ``"lm"`` always runs the LM forward (the reference). ``fast=False`` keeps the HF forward even
    where the lean one (:mod:`.fastpath`) covers the architecture.
    """

    def __init__(self, path: str | Path, expect_candidates: Sequence[str] | None = None, threads: int | None = None,
                 fast: bool = True, scorer: str = "student"):  # fmt: skip
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
        from .fastpath import build_slot_scorer

        self.scorer = build_slot_scorer(self.model, self.layout.yes_id, self.layout.no_id) if fast else None
        self.student = self._load_student() if scorer == "student" else None
        self.probe = self._load_probe()
        self._lock = threading.Lock()
        self._torch = torch

    def _load_student(self) -> Any:
        from .student import STUDENT_FILE, Student

        return self._load_part(self.manifest.student, STUDENT_FILE, Student.load, "student")

    def _load_probe(self) -> Any:
        from .probe import PROBE_FILE, Probe

        return self._load_part(self.manifest.probe, PROBE_FILE, Probe.load, "probe head")

    def _load_part(self, entry: dict | None, default_file: str, load: Any, what: str) -> Any:
        """A numpy part of the checkpoint named by its manifest ``entry`` (None when absent); refuses a
        file that does not load or does not have one output per candidate."""
        if not entry:
            return None
        try:
            part = load(self.path / str(entry.get("file", default_file)))
        except (OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"{self.path}: cannot load the {what} ({str(e).splitlines()[0]})") from None
        if part.n_candidates != len(self.manifest.candidates):
            raise CheckpointError(f"{self.path}: the {what} has {part.n_candidates} outputs, not {len(self.manifest.candidates)}")
        return part

    @property
    def student_is_final(self) -> bool:
        """True when the student was distilled on the calibrated logits (probe head included), so its
        output needs no calibration and no encoder."""
        return self.student is not None and (self.manifest.student or {}).get("target") == "calibrated_logit"

    def probe_logits(self, texts: Sequence[str], tasks: Sequence[str | None]) -> np.ndarray | None:
        """The probe head's logits [n, K] (None without a probe); embeds the query blocks."""
        if self.probe is None:
            return None
        from .encoder import get_encoder, query_block

        emb = get_encoder(self.probe.encoder).embed([query_block(t) for t in texts])
        return self.probe.logits(emb, tasks)

    @property
    def scorer_name(self) -> str:
        """What :meth:`score` runs: ``student``, ``lm-fast`` (lean forward) or ``lm``."""
        return "student" if self.student is not None else "lm-fast" if self.scorer is not None else "lm"

    @property
    def candidates(self) -> list[str]:
        return list(self.manifest.candidates)

    @property
    def version(self) -> str:
        return self.manifest.version

    def slot_logits(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None, batch_size: int = 64) -> np.ndarray:
        """logit(yes) − logit(no) per candidate slot, shape [n, K]."""
        with self._lock:
            return compute_slot_logits(self.model, self.layout, texts, tasks, batch_size, scorer=self.scorer)

    def score(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None) -> np.ndarray:
        """Calibrated P[n, K] in [0, 1] (the student's when one is loaded, else the LM's)."""
        tasks = list(tasks) if tasks is not None else [None] * len(texts)
        if self.student_is_final:
            return 1.0 / (1.0 + np.exp(-self.student.slot_logits(texts, tasks)))
        z = self.student.slot_logits(texts, tasks) if self.student is not None else self.slot_logits(texts, tasks)
        return scores_from_logits(z, self.manifest.calibration, tasks, offset=self.probe_logits(texts, tasks))

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
