"""``energy-router train``: table → SFT (TRL) → calibration → checkpoint.

:class:`TrainConfig` documents every knob; its defaults are the configuration the README reports.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from litellm_energy_router.errors import UserError
from litellm_energy_router.router.checkpoint import Manifest, library_versions, write_manifest
from litellm_energy_router.router.decide import DEFAULT_E_REF_J, lambda_grid
from litellm_energy_router.router.fastpath import build_slot_scorer
from litellm_energy_router.router.format import UNKNOWN_TASK, Layout, label_token
from litellm_energy_router.router.model import compute_slot_logits
from litellm_energy_router.router.scoring import scores_from_logits
from litellm_energy_router.table import TableStore

from .backbones import BackboneSpec, build_backbone, load_warm_start
from .data import TableMatrix as Matrix
from .data import load_matrix, near_duplicate_groups, watermark
from .energy_fit import fit_energy_estimate
from .grpo import GRPOStageConfig, grpo_stage
from .head_fit import Calibrated, calibrate_heads, distil, student_head
from .length_fit import attach_length_model
from .pairs import PairReader, PairTable, partial_only
from .progress import CountingStore
from .sft import SFTStageConfig, build_sft_dataset, run_sft


class TrainingDataError(UserError, ValueError):
    """The table does not hold enough labelled data to train on."""


@dataclass
class TrainConfig:
    """Router training configuration (``retrain.train``: its scalar fields and the three stage sections, each
    key one field, its bounds in the field's metadata; :mod:`.train_config`).

    Attributes:
        backbone: which backbone to build (``tiny``, ``minilm``, ``hf:<id>``) and its size.
        sft: SFT stage hyper-parameters.
        grpo: GRPO stage (λ-conditioned choice policy started from the calibrated scorer's decisions,
            served per bucket only where it passed the never-worse check), or ``None`` to skip it. Off by
            default: on CV folds it does not beat its SFT start (README: GRPO vs SFT,
            ``benchmarks/grpo_vs_sft.py``).
        max_len: router input length, tokens (the query is cut from the left, never its end).
        calib_fraction: share of training queries held out of SFT to fit the calibration.
        student: distil the router into the serving student (``student.npz``; README: fidelity of the student).
        probe_c: the probe head (``probe.npz``): inverse L2 strength of its per-(task, candidate) logistic
            regressions on the query's MiniLM embedding; the LM's slot logits are calibrated on top of it
            (:mod:`.calibrate`). ``None`` leaves the LM alone with per-task intercepts (README: ablation).
        candidates: candidate names in slot order (default: all in the table, cheapest first).
        sources: table sources used for training.
        seed: split seed.
        init_from: warm start: a checkpoint directory whose weights and tokenizer SFT starts from
            (same candidates in the same order) instead of a fresh ``backbone``.
        partial_feedback: ``train()`` also reads every labelled (query, candidate) run (:mod:`.pairs`): the
            probe head trains on them (production rows inverse-propensity weighted), the student sees their
            queries, the energy estimate prefers measured joules. SFT and calibration keep complete queries.
    """

    backbone: BackboneSpec = field(default_factory=BackboneSpec)
    sft: SFTStageConfig = field(default_factory=SFTStageConfig)
    grpo: GRPOStageConfig | None = None
    max_len: int = field(default=128, metadata={"ge": 16, "le": 8192})
    calib_fraction: float = field(default=0.2, metadata={"gt": 0, "lt": 1})
    student: bool = True
    probe_c: float | None = field(default=0.3, metadata={"gt": 0})
    candidates: list[str] | None = None
    sources: tuple[str, ...] = ("import", "tournament", "shadow", "production")
    seed: int = 0
    init_from: str | None = None
    partial_feedback: bool = True

    @classmethod
    def quick(cls) -> "TrainConfig":
        """Seconds-long training for tests and smoke runs."""
        return cls(
            backbone=BackboneSpec(name="tiny", hidden_size=64, layers=1, vocab_size=512),
            sft=SFTStageConfig(epochs=3, batch_size=8, learning_rate=5e-3),
            max_len=64,
        )


def _version() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{int(time.time() * 1000) % 1000:03d}"


def calibration_split(m: Matrix, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(fit_idx, cal_idx): about ``fraction`` of the queries (at least 5) held out of SFT to fit the
    calibration; near-duplicates (:func:`~.data.near_duplicate_groups`) stay on one side, so the
    calibration never sees the twin of a query SFT memorised."""
    keys = near_duplicate_groups(m.texts, m.ids, m.tasks)
    uniq = np.unique(keys.astype(str))
    perm = np.random.default_rng(seed).permutation(len(uniq))
    n_cal = max(int(round(fraction * len(m))), 5)
    size = {u: 0 for u in uniq}
    for k in keys.astype(str):
        size[k] += 1
    chosen, count = set(), 0
    for i in perm:
        if count >= n_cal:
            break
        if count + size[uniq[i]] > max(1.5 * n_cal, n_cal + 1):
            continue  # a group too large for the calibration share stays in SFT
        chosen.add(uniq[i])
        count += size[uniq[i]]
    if count == 0 or count >= len(m):  # degenerate grouping: fall back to a split by query
        order = np.random.default_rng(seed).permutation(len(m))
        return np.sort(order[n_cal:]), np.sort(order[:n_cal])
    cal = np.array([k in chosen for k in keys.astype(str)])
    return np.flatnonzero(~cal), np.flatnonzero(cal)


def train_matrix(
    m: Matrix,
    out_dir: str | Path,
    cfg: TrainConfig,
    log: Callable[[str], None] = print,
    on_step: Callable[[dict], None] | None = None,
    pairs: PairTable | None = None,
) -> Path:
    """Train on a :class:`Matrix` and write a checkpoint into ``out_dir``. Returns the directory.

    ``pairs``: every labelled (query, candidate) run of the training queries (:mod:`.pairs`; held-out
    queries already excluded): the probe head, the student and the energy estimate learn from them too."""
    if len(m) < 10:
        raise TrainingDataError(f"only {len(m)} fully labelled queries for candidates {m.candidates}; need >= 10")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fit_idx, cal_idx = calibration_split(m, cfg.calib_fraction, cfg.seed)
    cal, fit = m.take(cal_idx), m.take(fit_idx)
    model, tok, layout, t_sft = _sft_stage(fit, m.candidates, cfg, out, log, on_step)
    est = fit_energy_estimate(m, pairs=pairs)
    E_hat = est.estimate(m.candidates, cal.prompt_tokens, cal.tasks)  # J
    model.eval()
    lean = build_slot_scorer(model, layout.yes_id, layout.no_id)  # the HF forward's numbers, faster
    z_task = compute_slot_logits(model, layout, cal.texts, cal.tasks, scorer=lean)
    z_any = compute_slot_logits(model, layout, cal.texts, [UNKNOWN_TASK] * len(cal), scorer=lean)
    c = calibrate_heads(m, cal, cal_idx, z_task, z_any, cfg.probe_c, out, log, pairs)
    P_cal = scores_from_logits(z_task, c.calibration, cal.tasks, offset=c.q_cal)
    knob_grpo = None
    if cfg.grpo is not None:  # the choice policy trains on a copy of the LM: the scorer stays as calibrated
        q_fit = c.early.logits(c.emb[fit_idx], list(fit.tasks)) if cfg.probe_c else None
        z_fit = compute_slot_logits(model, layout, fit.texts, fit.tasks, scorer=lean)
        P_fit = scores_from_logits(z_fit, c.calibration, fit.tasks, offset=q_fit)
        Eh_fit = est.estimate(m.candidates, fit.prompt_tokens, fit.tasks)
        knob_grpo = grpo_stage(model, tok, layout, fit, cal, P_fit, P_cal, Eh_fit, E_hat, cfg.grpo, out, log)
    grid = lambda_grid(P_cal, E_hat, DEFAULT_E_REF_J, 2)  # λ in the serving unit (accuracy per 100 J)
    scores = {
        "calibration_brier": float(((P_cal - cal.Y) ** 2).mean()),
        "calibration_prior_brier": float(((np.tile(fit.Y.mean(axis=0), (len(cal), 1)) - cal.Y) ** 2).mean()),
        "calibration_queries": len(cal),
        "sft_seconds": round(t_sft, 1),
    }
    student = None
    if cfg.student:
        extra = partial_only(pairs, m) if pairs is not None else None
        student = distil(model, layout, lean, fit, cal, z_task, z_any, out, log, student_head(c), extra)
    manifest = _manifest(m, cfg, model, est, c, student, knob_grpo, float(grid[-1]), scores, pairs, out)
    from transformers.utils import logging as hf_logging

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the library's "Writing model shards" bar: the log line below says it
    try:
        model.save_pretrained(str(out), safe_serialization=True)
    finally:
        if bar_was_on:  # the process's other downloads and saves keep their bars
            hf_logging.enable_progress_bar()
    tok.save_pretrained(str(out))
    write_manifest(out, manifest)
    log(
        f"checkpoint {out} version {manifest.version}: calibration Brier {scores['calibration_brier']:.4f} "
        f"(candidate-prior {manifest.eval['calibration_prior_brier']:.4f}), SFT {t_sft:.0f}s"
    )
    return out


def _sft_stage(
    fit: Matrix,
    candidates: list[str],
    cfg: TrainConfig,
    out: Path,
    log: Callable[[str], None],
    on_step: Callable[[dict], None] | None,
) -> tuple[Any, Any, Layout, float]:
    """Build the backbone (or load the warm start) and fine-tune it on the SFT queries ``fit`` over
    ``candidates``. Returns (model, tokenizer, layout, SFT seconds)."""
    k = len(candidates)
    t0 = time.time()
    if cfg.init_from:
        model, tok = load_warm_start(cfg.init_from, candidates)
    else:
        model, tok = build_backbone(cfg.backbone, fit.texts, k, cfg.max_len)
    layout = Layout(tok, k, cfg.max_len)
    ds = build_sft_dataset(layout, fit.texts, fit.tasks, fit.Y, cfg.sft.task_dropout, cfg.seed)
    log(
        f"SFT: {len(fit)} queries x {k} candidates, backbone {cfg.backbone.name}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params"
    )
    model = run_sft(model, tok, ds, cfg.sft, str(out / "_trainer"), on_log=on_step)
    shutil.rmtree(out / "_trainer", ignore_errors=True)  # the trainer's scratch: not part of the checkpoint
    return model, tok, layout, time.time() - t0


def _manifest(
    m: Matrix,
    cfg: TrainConfig,
    model: Any,
    est: Any,
    calib: Calibrated,
    student: dict | None,
    knob_grpo: dict | None,
    lambda_max: float,
    scores: dict[str, Any],
    pairs: PairTable | None,
    out: Path,
) -> Manifest:
    """The checkpoint's manifest (``lambda_max`` in accuracy per 100 J; ``scores``: its ``eval`` entry); fits
    the length model on ``m`` and saves it into ``out`` on the way."""
    return Manifest(
        version=_version(),
        candidates=m.candidates,
        label_tokens={c: label_token(j) for j, c in enumerate(m.candidates)},
        backbone={
            "name": cfg.backbone.name,
            "hidden_size": cfg.backbone.hidden_size,
            "layers": cfg.backbone.layers,
            "params": int(sum(p.numel() for p in model.parameters())),
            "warm_start_from": cfg.init_from,
        },
        max_len=cfg.max_len,
        knob={
            "lambda_min": 0.0,
            "lambda_max": lambda_max,
            "grpo_lambda_buckets": None if knob_grpo is None else [b["lambda"] for b in knob_grpo["buckets"]],
            "grpo": knob_grpo,
        },
        energy=est,
        calibration=calib.calibration,
        student=student,
        probe=calib.probe_entry,
        length=attach_length_model(m, out),
        watermark={
            **watermark(m),
            "sources": list(cfg.sources),
            **({"pairs": pairs.counts()} if pairs is not None else {}),
        },
        eval=scores,
        versions=library_versions(),
    )


def train(
    store: TableStore,
    out_dir: str | Path,
    cfg: TrainConfig | None = None,
    log: Callable[[str], None] = print,
    on_step: Callable[[dict], None] | None = None,
) -> Path:
    """Read the table and train a router checkpoint into ``out_dir``."""
    cfg = cfg or TrainConfig()
    reader = PairReader(None) if cfg.partial_feedback else None  # fed by the matrix's pass over the table
    m = load_matrix(
        CountingStore(store, lambda n: None, also=reader.add) if reader else store, cfg.candidates, cfg.sources
    )
    pairs = reader.table(m.candidates, getattr(store, "url", "?")) if reader else None
    return train_matrix(m, out_dir, cfg, log, on_step, pairs=pairs)


class _RouterModelPredictor:
    """Cross-validation predictor over a loaded :class:`~litellm_energy_router.router.scoring.Scorer` (``self.model``): P and Ê of a
    matrix's queries, as serving scores them."""

    model: Any = None

    def predict_proba(self, test) -> np.ndarray:
        return self.model.score(list(test.texts), [str(t) for t in test.tasks])

    def predict_energy(self, test) -> np.ndarray:
        return self.model.energy(list(test.texts), [str(t) for t in test.tasks], prompt_tokens=list(test.prompt_tokens))


class LMRouterPredictor(_RouterModelPredictor):
    """The LM router as a cross-validation predictor (``fit(train)``, ``predict_proba(test)``,
    ``predict_energy(test)``): each fold trains a checkpoint with ``cfg`` (default: the defaults of
    ``energy-router train``) into a temporary directory and scores the held-out queries with the LM
    (the reference; ``scorer="student"`` judges the distilled student serving runs by default)."""

    def __init__(
        self,
        cfg: TrainConfig | None = None,
        log: Callable[[str], None] = lambda s: None,
        scorer: str = "lm",
        share: dict | None = None,
    ) -> None:
        self.cfg = cfg or TrainConfig()
        self.log, self.scorer, self.share = log, scorer, share

    def fit(self, train) -> "LMRouterPredictor":
        """Train a checkpoint on ``train`` (or reuse the one another predictor with the same ``share``
        dict trained on the same queries: one training judged with both scorers)."""
        import hashlib
        import tempfile

        from litellm_energy_router.router.model import RouterModel

        key = hashlib.sha256("\n".join(map(str, train.ids)).encode()).hexdigest()
        if self.share is not None and self.share.get("key") == key:
            self._dir = self.share["dir"]
        else:
            self._dir = tempfile.TemporaryDirectory(prefix="er-cv-")
            train_matrix(train, self._dir.name, self.cfg, log=self.log)
            if self.share is not None:
                self.share.update(key=key, dir=self._dir)
        self.model = RouterModel(self._dir.name, scorer=self.scorer)
        return self


class CheckpointPredictor(_RouterModelPredictor):
    """A trained checkpoint as a cross-validation predictor: ``fit`` does nothing (the checkpoint is
    scored as it is, on every held-out fold, with the serving scorer and its own energy estimate), so
    the rows it is judged on must be rows it never trained on. ``expect_candidates`` refuses a
    checkpoint routing other candidates."""

    def __init__(self, path: str | Path, expect_candidates: Sequence[str] | None = None) -> None:
        from litellm_energy_router.router.scoring import load_scorer

        self.model = load_scorer(path, expect_candidates=expect_candidates)

    def fit(self, train) -> "CheckpointPredictor":
        return self


def lm_trainer(
    kind: str,
    *,
    train_config: TrainConfig | None = None,
    log: Callable[[str], None] = lambda s: None,
    share: dict | None = None,
    **_context: Any,
) -> LMRouterPredictor:
    """The ``fit`` of the ``student`` and ``lm`` registry entries: the LM router, judged with scorer ``kind``."""
    return LMRouterPredictor(train_config, log=log, scorer=kind, share=share)


def export_lm(
    kind: str,
    m: Any,
    out_dir: str | Path,
    *,
    train_config: TrainConfig | None = None,
    log: Callable[[str], None] = print,
    pairs: Any = None,
    **_context: Any,
) -> Path:
    """The ``export`` of the ``student`` and ``lm`` registry entries: train the LM router on ``m`` into
    ``out_dir``, its manifest serving scorer ``kind``."""
    from litellm_energy_router.router.checkpoint import read_manifest, write_manifest

    out = Path(out_dir)
    train_matrix(m, out, train_config or TrainConfig(), log=log, pairs=pairs)
    if kind == "lm":
        manifest = read_manifest(out)
        manifest.scorer = kind
        write_manifest(out, manifest)
    return out
