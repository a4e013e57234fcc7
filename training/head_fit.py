"""Fitting the heads on top of the fine-tuned LM (:func:`~.pipeline.train_matrix`): the calibration of
its slot logits, on top of the probe head when there is one (:mod:`.calibrate`), and the distilled serving
student (:mod:`.distil_student`). Each writes its file into the checkpoint directory and returns what the
manifest records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from litellm_energy_router.router.format import UNKNOWN_TASK, Layout
from litellm_energy_router.router.model import compute_slot_logits
from litellm_energy_router.router.probe import PROBE_FILE
from litellm_energy_router.router.scoring import calibrated_logits
from litellm_energy_router.router.student import STUDENT_FILE

from .calibrate import fit_calibration, fit_probe
from .data import TableMatrix as Matrix
from .data import concat_rows
from .embed import default_embedder, embed_queries
from .pairs import PairTable


@dataclass
class Calibrated:
    """The calibration of the LM's slot logits and, with a probe head, the probes fitted on the way."""

    calibration: dict
    q_cal: np.ndarray | None = None  # the early probe's logits of the calibration queries, task shown
    early: Any = None  # the probe fitted on the SFT queries (scores the calibration queries out of sample)
    emb: np.ndarray | None = None  # every training query's embedding
    probe: Any = None  # the probe shipped: refitted on every training query
    probe_entry: dict | None = None  # its manifest entry


def calibrate_heads(
    m: Matrix,
    cal: Matrix,
    cal_idx: np.ndarray,
    z_task: np.ndarray,
    z_any: np.ndarray,
    probe_c: float | None,
    out: Path,
    log: Callable[[str], None],
    pairs: PairTable | None,
) -> Calibrated:
    """Fit the calibration on the calibration queries' slot logits (task shown ``z_task``, hidden ``z_any``):
    with a ``probe_c`` (the probe's inverse L2 strength), on top of the probe head, which is fitted on the
    SFT queries' labelled pairs (``pairs``, else ``m``), refitted on all of them and saved into ``out``."""
    if not probe_c:
        return Calibrated(fit_calibration(z_task, z_any, cal.Y, cal.tasks))
    # the probe fitted on the SFT queries scores the calibration queries out of sample; the one
    # shipped is refitted on every training query
    t1 = time.time()
    emb = embed_queries(m.texts)
    enc = default_embedder().name
    pm = pairs.matrix() if pairs is not None else m  # every labelled pair, weighted (complete queries: m)
    pe = embed_queries(pm.texts) if pairs is not None else emb
    pfit = ~np.isin(pm.ids.astype(str), cal.ids.astype(str))
    early = fit_probe(pe[pfit], pm.Y[pfit], pm.tasks[pfit], enc, probe_c, weights=None if pm.W is None else pm.W[pfit])
    q_cal = early.logits(emb[cal_idx], list(cal.tasks))
    q_cal_any = early.logits(emb[cal_idx], [None] * len(cal))
    calibration = fit_calibration(z_task, z_any, cal.Y, cal.tasks, q_cal, q_cal_any)
    probe = fit_probe(pe, pm.Y, pm.tasks, enc, probe_c, weights=pm.W)
    probe.save(out / PROBE_FILE)
    probe_entry = {"file": PROBE_FILE, "encoder": enc, "dim": probe.dim, "C": probe_c}
    log(
        f"probe head: {enc} embeddings ({probe.dim}), LM slopes {np.round(calibration['a'], 3).tolist()}, {time.time() - t1:.0f}s"
    )
    return Calibrated(calibration, q_cal, early, emb, probe, probe_entry)


def student_head(c: Calibrated) -> Callable | None:
    """What the student distils with a probe head (:func:`distil`'s ``head``): the shipped router's
    calibrated logits, task shown / hidden. None without one (the LM's slot logits)."""
    if c.probe is None:
        return None
    calibration, probe = c.calibration, c.probe

    def head(texts, tasks, z_t, z_a):
        e = embed_queries(texts)
        none = [None] * len(texts)
        return (
            calibrated_logits(z_t, calibration, tasks, offset=probe.logits(e, tasks)),
            calibrated_logits(z_a, calibration, none, offset=probe.logits(e, none)),
        )

    return head


def distil(
    model,
    layout: Layout,
    scorer,
    fit: Matrix,
    cal: Matrix,
    z_task_cal: np.ndarray,
    z_any_cal: np.ndarray,
    out: Path,
    log: Callable[[str], None],
    head: Callable | None = None,
    extra: Matrix | None = None,
) -> dict:
    """Fit the student on the LM's slot logits of every training query (task shown and hidden; ``scorer``
    the lean forward or None); the calibration queries' logits are already computed. ``head(texts, tasks,
    z_task, z_any) -> (u_task, u_any)``: distil these (the calibrated logits, probe included) instead.
    ``extra``: queries only partial feedback labels, distilled too (their probe logits reach serving)."""
    from .distil_student import fit_student

    t0 = time.time()
    if extra is not None and len(extra):
        fit = concat_rows(fit, extra)
    tasks = [str(t) for t in fit.tasks]
    z_task = np.vstack([compute_slot_logits(model, layout, fit.texts, tasks, scorer=scorer), z_task_cal])
    z_any = np.vstack(
        [compute_slot_logits(model, layout, fit.texts, [UNKNOWN_TASK] * len(fit), scorer=scorer), z_any_cal]
    )
    texts, all_tasks = list(fit.texts) + list(cal.texts), tasks + [str(t) for t in cal.tasks]
    if head is not None:
        z_task, z_any = head(texts, all_tasks, z_task, z_any)
    st = fit_student(texts, all_tasks, z_task, z_any)
    st.save(out / STUDENT_FILE)
    z_hat = st.slot_logits(texts, [None] * len(texts))
    corr = float(np.corrcoef(z_hat.ravel(), z_any.ravel())[0, 1])
    log(
        f"student: {st.dim} hashed n-gram features, training-fit correlation with its target {corr:.3f}, {time.time() - t0:.0f}s"
    )
    return {
        "file": STUDENT_FILE,
        "dim": st.dim,
        "ngrams": list(st.ngrams),
        "tail_chars": st.tail_chars,
        "train_corr_any": round(corr, 4),
        "target": "slot_logit" if head is None else "calibrated_logit",
    }
