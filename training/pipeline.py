"""``energy-router train``: table → SFT (TRL) → calibration → checkpoint.

:class:`TrainConfig` documents every knob; its defaults are the configuration the README reports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from litellm_energy_router.router.checkpoint import Manifest, library_versions, write_manifest
from litellm_energy_router.router.decide import lambda_grid
from litellm_energy_router.router.format import UNKNOWN_TASK, Layout, label_token
from litellm_energy_router.router.model import compute_slot_logits, scores_from_logits
from litellm_energy_router.table import TableStore

from .backbones import BackboneSpec, build_backbone
from .calibrate import fit_calibration
from .data import TableMatrix as Matrix, fit_energy_estimate, load_matrix
from .grpo import GRPOStageConfig, build_grpo_dataset, lambda_buckets, run_grpo
from .sft import SFTStageConfig, build_sft_dataset, run_sft


class TrainingDataError(ValueError):
    """The table does not hold enough labelled data to train on."""


@dataclass
class TrainConfig:
    """Router training configuration.

    Attributes:
        backbone: which backbone to build (``tiny``, ``minilm``, ``hf:<id>``) and its size.
        sft: SFT stage hyper-parameters.
        grpo: GRPO stage (λ-conditioned choice policy) after SFT, or ``None`` to skip it. Off by default:
            it has not been shown to improve the held-out curve over SFT + calibration (see README).
        max_len: router input length, tokens (the query is cut from the left, never its end).
        calib_fraction: share of training queries held out of SFT to fit the calibration.
        candidates: candidate names in slot order (default: all in the table, cheapest first).
        sources: table sources used for training.
        seed: split seed.
    """

    backbone: BackboneSpec = field(default_factory=BackboneSpec)
    sft: SFTStageConfig = field(default_factory=SFTStageConfig)
    grpo: GRPOStageConfig | None = None
    max_len: int = 128
    calib_fraction: float = 0.2
    candidates: list[str] | None = None
    sources: tuple[str, ...] = ("import", "tournament", "shadow", "production")
    seed: int = 0

    @classmethod
    def quick(cls) -> "TrainConfig":
        """Seconds-long training for tests and smoke runs."""
        return cls(backbone=BackboneSpec(name="tiny", hidden_size=64, layers=1, vocab_size=512),
                   sft=SFTStageConfig(epochs=3, batch_size=8, learning_rate=5e-3), max_len=64)  # fmt: skip


def _version() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{int(time.time() * 1000) % 1000:03d}"


def train_matrix(m: Matrix, out_dir: str | Path, cfg: TrainConfig,
                 log: Callable[[str], None] = print, on_step: Callable[[dict], None] | None = None) -> Path:  # fmt: skip
    """Train on a :class:`Matrix` and write a checkpoint into ``out_dir``. Returns the directory."""
    if len(m) < 10:
        raise TrainingDataError(f"only {len(m)} fully labelled queries for candidates {m.candidates}; need >= 10")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(len(m))
    n_cal = max(int(round(cfg.calib_fraction * len(m))), 5)
    cal, fit = m.take(perm[:n_cal]), m.take(perm[n_cal:])
    k = len(m.candidates)
    t0 = time.time()
    model, tok = build_backbone(cfg.backbone, fit.texts, k, cfg.max_len)
    layout = Layout(tok, k, cfg.max_len)
    ds = build_sft_dataset(layout, fit.texts, fit.tasks, fit.Y, cfg.sft.task_dropout, cfg.seed)
    log(f"SFT: {len(fit)} queries x {k} candidates, backbone {cfg.backbone.name}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params")  # fmt: skip
    model = run_sft(model, tok, ds, cfg.sft, str(out / "_trainer"), on_log=on_step)
    t_sft = time.time() - t0
    e_ref = float(m.E.mean(axis=0).max())
    est = fit_energy_estimate(m)
    E_hat = est.estimate(m.candidates, cal.prompt_tokens, cal.tasks)
    buckets = None
    if cfg.grpo is not None:
        model.eval()
        z0 = compute_slot_logits(model, layout, cal.texts, cal.tasks)
        lam_max = float(lambda_grid(1 / (1 + np.exp(-z0)), E_hat, e_ref, 2)[-1])
        buckets = lambda_buckets(lam_max)
        log(f"GRPO: {cfg.grpo.steps} steps, lambda buckets up to {lam_max:.3g}")
        model.train()
        model = run_grpo(model, tok, layout, build_grpo_dataset(layout, fit.texts, fit.tasks, fit.Y, fit.E, buckets, cfg.seed),
                         e_ref, cfg.grpo, str(out / "_grpo"))  # fmt: skip
    model.eval()
    z_task = compute_slot_logits(model, layout, cal.texts, cal.tasks)
    z_any = compute_slot_logits(model, layout, cal.texts, [UNKNOWN_TASK] * len(cal))
    calibration = fit_calibration(z_task, z_any, cal.Y, cal.tasks)
    P_cal = scores_from_logits(z_task, calibration, cal.tasks)
    grid = lambda_grid(P_cal, E_hat, e_ref, 2)
    brier = float(((P_cal - cal.Y) ** 2).mean())
    prior = np.tile(fit.Y.mean(axis=0), (len(cal), 1))
    manifest = Manifest(
        version=_version(), candidates=m.candidates,
        label_tokens={c: label_token(j) for j, c in enumerate(m.candidates)},
        backbone={"name": cfg.backbone.name, "hidden_size": cfg.backbone.hidden_size, "layers": cfg.backbone.layers,
                  "params": int(sum(p.numel() for p in model.parameters()))},
        max_len=cfg.max_len,
        knob={"lambda_min": 0.0, "lambda_max": float(grid[-1]), "e_ref_j": e_ref,
              "target_min": 0.0, "target_max": 1.0,
              "grpo_lambda_buckets": None if buckets is None else [float(b) for b in buckets]},
        energy=est, calibration=calibration,
        watermark={"max_run_id": m.max_run_id, "queries": len(m), "sources": list(cfg.sources)},
        eval={"calibration_brier": brier, "calibration_prior_brier": float(((prior - cal.Y) ** 2).mean()),
              "calibration_queries": len(cal), "sft_seconds": round(t_sft, 1)},
        versions=library_versions(),
    )  # fmt: skip
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    write_manifest(out, manifest)
    log(f"checkpoint {out} version {manifest.version}: calibration Brier {brier:.4f} "
        f"(candidate-prior {manifest.eval['calibration_prior_brier']:.4f}), SFT {t_sft:.0f}s")  # fmt: skip
    return out


def train(store: TableStore, out_dir: str | Path, cfg: TrainConfig | None = None,
          log: Callable[[str], None] = print, on_step: Callable[[dict], None] | None = None) -> Path:  # fmt: skip
    """Read the table and train a router checkpoint into ``out_dir``."""
    cfg = cfg or TrainConfig()
    m = load_matrix(store, cfg.candidates, cfg.sources)
    return train_matrix(m, out_dir, cfg, log, on_step)



class LMRouterPredictor:
    """The LM router as a cross-validation predictor (``fit(train)``, ``predict_proba(test)``,
    ``predict_energy(test)``): each fold trains a checkpoint with ``cfg`` (default: the defaults of
    ``energy-router train``) into a temporary directory and scores the held-out queries with the serving
    scorer, so CV judges exactly what serving would run."""

    def __init__(self, cfg: TrainConfig | None = None, log: Callable[[str], None] = lambda s: None) -> None:
        self.cfg = cfg or TrainConfig()
        self.log = log
        self.model = None

    def fit(self, train) -> "LMRouterPredictor":
        import tempfile

        from litellm_energy_router.router.model import RouterModel

        self._dir = tempfile.TemporaryDirectory(prefix="er-cv-")
        train_matrix(train, self._dir.name, self.cfg, log=self.log)
        self.model = RouterModel(self._dir.name)
        return self

    def predict_proba(self, test) -> np.ndarray:
        return self.model.score(list(test.texts), [str(t) for t in test.tasks])

    def predict_energy(self, test) -> np.ndarray:
        return self.model.energy(list(test.texts), [str(t) for t in test.tasks], prompt_tokens=list(test.prompt_tokens))


class CheckpointPredictor:
    """A trained checkpoint as a cross-validation predictor: ``fit`` does nothing (the checkpoint is
    scored as it is, on every held-out fold, with the serving scorer and its own energy estimate), so
    the rows it is judged on must be rows it never trained on."""

    def __init__(self, path: str | Path) -> None:
        from litellm_energy_router.router.model import RouterModel

        self.model = RouterModel(path)

    def fit(self, train) -> "CheckpointPredictor":
        return self

    def predict_proba(self, test) -> np.ndarray:
        return self.model.score(list(test.texts), [str(t) for t in test.tasks])

    def predict_energy(self, test) -> np.ndarray:
        return self.model.energy(list(test.texts), [str(t) for t in test.tasks], prompt_tokens=list(test.prompt_tokens))

