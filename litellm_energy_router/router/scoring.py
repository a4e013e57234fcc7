"""Scorers: queries → ``P[n, K]`` (probability that each candidate answers correctly, in [0, 1]) and
``Ê[n, K]`` (joules each candidate is expected to spend), in the checkpoint's candidate order.

One protocol (:class:`Scorer`), one registry (:func:`scorer_factories`: the pluggy hook
``energy_router_scorers`` of the entry-point group ``litellm_energy_router``), one loader
(:func:`load_scorer`). The checkpoint manifest names its scorer (``scorer``); ``router.scorer`` in the
settings may ask for another kind the checkpoint can serve. The serving runtime and the strategy depend
on this protocol only.

Built-in kinds (registered by :mod:`.builtin_scorers`):

* ``student`` — the distilled student (:mod:`.student`): numpy only, tens of µs per query.
* ``lm`` — the LM router's forward pass (:class:`.model.RouterModel`); imports torch and transformers
  when chosen, never before.
* ``task_prior``, ``knn``, ``logreg``, ``mf``, ``stacked`` — the evaluation's baselines (and their
  per-candidate stack, which retrain's model selection may promote) exported to a checkpoint
  (:mod:`.baseline_scorers`); all but ``task_prior`` embed the query with MiniLM, imported when chosen.

Nothing here imports torch, transformers or scikit-learn.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from litellm_energy_router.router.checkpoint import (
    CheckpointError,
    Manifest,
    part_path,
    read_manifest,
    resolve,
    verify_files,
)
from litellm_energy_router.tokens import estimate_prompt_tokens


@runtime_checkable
class Scorer(Protocol):
    """What serving needs from a loaded checkpoint.

    Attributes:
        name: the scorer kind (``student``, ``lm``, ``task_prior``, ...).
        candidates: candidate names, in the column order of ``P`` and ``Ê``.
        version: the checkpoint's version label.
        inline: True when one query scores in well under a millisecond (numpy only), so the event loop
            may score in place; False sends scoring to a worker thread.
    """

    name: str
    candidates: list[str]
    version: str
    inline: bool

    def score(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None) -> np.ndarray:
        """``P[n, K]`` in [0, 1]."""
        ...

    def energy(
        self,
        texts: Sequence[str],
        tasks: Sequence[str | None] | None = None,
        prompt_tokens: Sequence[int] | None = None,
    ) -> np.ndarray:
        """``Ê[n, K]`` in joules."""
        ...


def scores_from_logits(
    slot_logits: np.ndarray, calibration: dict[str, Any], tasks: Sequence[str | None], offset: np.ndarray | None = None
) -> np.ndarray:
    """Calibrated P[n, K]: ``sigmoid`` of :func:`calibrated_logits`."""
    return 1.0 / (1.0 + np.exp(-calibrated_logits(slot_logits, calibration, tasks, offset)))


def calibrated_logits(
    slot_logits: np.ndarray, calibration: dict[str, Any], tasks: Sequence[str | None], offset: np.ndarray | None = None
) -> np.ndarray:
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


class CheckpointScorer:
    """Base of the built-in scorers: the manifest, the energy estimate, the checkpoint's numpy parts."""

    name = "checkpoint"
    inline = False

    def __init__(
        self, path: str | Path, manifest: Manifest | None = None, expect_candidates: Sequence[str] | None = None
    ) -> None:
        self.path = resolve(path)
        self.manifest: Manifest = manifest or read_manifest(self.path, expect_candidates)
        self.probe: Any = None  # the probe head, for the scorers that calibrate on top of it (read_probe)
        from litellm_energy_router.router.token_model import TOKENS_FILE, TokenModel

        self.tokens = self.load_part(self.manifest.tokens, TOKENS_FILE, TokenModel.load, "token model")
        from litellm_energy_router.router.length_model import LENGTH_FILE, LengthModel

        self.length = self.load_part(self.manifest.length, LENGTH_FILE, LengthModel.load, "length model")

    @property
    def candidates(self) -> list[str]:
        return list(self.manifest.candidates)

    @functools.cached_property
    def token_rates(self) -> tuple[np.ndarray, np.ndarray]:
        """(J per prompt token, J per output token) per candidate, in candidate order (read-only arrays)."""
        out = self.manifest.energy.rates(self.manifest.candidates)
        for a in out:
            a.flags.writeable = False
        return out

    @property
    def version(self) -> str:
        return self.manifest.version

    def energy(
        self,
        texts: Sequence[str],
        tasks: Sequence[str | None] | None = None,
        prompt_tokens: Sequence[int] | None = None,
    ) -> np.ndarray:
        """Ê[n, K] in joules from the prompt length (known at routing time) and expected output tokens."""
        return self.energy_detail(texts, tasks, prompt_tokens)[0]

    def energy_detail(
        self,
        texts: Sequence[str],
        tasks: Sequence[str | None] | None = None,
        prompt_tokens: Sequence[int] | None = None,
        max_tokens: Sequence[int | None] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, list[dict]]:
        """(Ê[n, K] J, expected output tokens [n, K], a note per request for the decision's metadata):
        :func:`.output_tokens.request_tokens` (a task the table never held gets the length model or the prior)."""
        from litellm_energy_router.router.output_tokens import request_tokens

        tasks = list(tasks) if tasks is not None else [None] * len(texts)
        n_tok = list(prompt_tokens) if prompt_tokens is not None else [estimate_prompt_tokens(t) for t in texts]
        offset = self.tokens.offset(texts, n_tok, tasks) if self.tokens is not None else None
        est, cands = self.manifest.energy, self.manifest.candidates
        T, notes = request_tokens(est, self.length, cands, texts, tasks, n_tok, offset, max_tokens)
        jp, jo = self.token_rates
        return np.asarray(n_tok, dtype=float)[:, None] * jp[None, :] + T * jo[None, :], T, notes

    def load_part(self, entry: dict | None, default_file: str, load: Callable[[Path], Any], what: str) -> Any:
        """A numpy part of the checkpoint named by its manifest ``entry`` (None when absent); refuses a
        file that does not load or does not have one output per candidate."""
        if not entry:
            return None
        path = part_path(self.path, self.manifest, entry.get("file", default_file))  # its own one-line error
        try:
            part = load(path)
        except (OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"{self.path}: cannot load the {what} ({str(e).splitlines()[0]})") from None
        if part.n_candidates != len(self.manifest.candidates):
            raise CheckpointError(
                f"{self.path}: the {what} has {part.n_candidates} outputs, not {len(self.manifest.candidates)}"
            )
        return part

    def read_probe(self) -> Any:
        """The checkpoint's probe head (None without one); refuses a broken file."""
        from litellm_energy_router.router.probe import PROBE_FILE, Probe

        return self.load_part(self.manifest.probe, PROBE_FILE, Probe.load, "probe head")

    def probe_logits(self, texts: Sequence[str], tasks: Sequence[str | None]) -> np.ndarray | None:
        """The probe head's logits [n, K] (None without a probe); embeds the query blocks (MiniLM)."""
        if self.probe is None:
            return None
        from litellm_energy_router.router.encoder import get_encoder, query_block

        emb = get_encoder(self.probe.encoder).embed([query_block(t) for t in texts])
        return self.probe.logits(emb, tasks)


class StudentScorer(CheckpointScorer):
    """The distilled student. Lean (numpy only, ``inline``) when it was distilled on the calibrated
    logits (``student.target == "calibrated_logit"``) or the checkpoint has no probe head; otherwise its
    logits are calibrated with the probe's offset, which embeds the query."""

    name = "student"

    def __init__(
        self, path: str | Path, manifest: Manifest | None = None, expect_candidates: Sequence[str] | None = None
    ) -> None:
        super().__init__(path, manifest, expect_candidates)
        from litellm_energy_router.router.student import STUDENT_FILE, Student

        if not self.manifest.student:
            raise CheckpointError(f"{self.path}: the manifest names no student (use router.scorer: lm)")
        self.student = self.load_part(self.manifest.student, STUDENT_FILE, Student.load, "student")
        self._share_rows()
        self.final = (self.manifest.student or {}).get("target") == "calibrated_logit"
        self.inline = self.final or not self.manifest.probe
        if not self.final:
            self.probe = self.read_probe()

    def _share_rows(self) -> None:
        """A student that reads the length model's buckets sums its rows and the length model's in one gather."""
        from litellm_energy_router.router import length_model as lm
        from litellm_energy_router.router.student import SharedRows

        L = self.length
        if L is not None and L.W is not None and self.student.reads(lm.NGRAMS, lm.DIM, lm.TAIL_CHARS):
            shared = SharedRows(self.student.W, L.W)
            self.student.rows, L.rows = shared.part(0), shared.part(1)

    def score(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None) -> np.ndarray:
        tasks = list(tasks) if tasks is not None else [None] * len(texts)
        z = self.student.slot_logits(texts, tasks)
        if self.final:
            return 1.0 / (1.0 + np.exp(-z))
        return scores_from_logits(z, self.manifest.calibration, tasks, offset=self.probe_logits(texts, tasks))


def scorer_factories() -> dict[str, Callable[[Path, Manifest], Scorer]]:
    """Every registered scorer kind → factory(checkpoint_dir, manifest): the built-ins (:mod:`.builtin_scorers`)
    and any plugin's, through the ``energy_router_scorers`` hook."""
    from litellm_energy_router.plugins import scorer_factories as registered

    return registered()


def scorer_kind(manifest: Manifest, requested: str = "auto") -> str:
    """The kind to serve: ``auto`` → the manifest's ``scorer`` (older manifests: ``student`` when one
    ships, else ``lm``); ``student`` on a checkpoint without one → ``lm``; any other name as given."""
    if requested == "auto":
        return manifest.scorer or ("student" if manifest.student else "lm")
    if requested == "student" and not manifest.student:
        return "lm"
    return requested


def load_scorer(path: str | Path, kind: str = "auto", expect_candidates: Sequence[str] | None = None) -> Scorer:
    """Load the checkpoint at ``path`` (directory, symlink or pointer file) as a :class:`Scorer`.

    Raises :class:`CheckpointError` (one line naming the path) for a broken checkpoint or an unknown kind.
    """
    d = resolve(path)
    manifest = read_manifest(d, expect_candidates)
    verify_files(d, manifest)
    name = scorer_kind(manifest, kind)
    factories = scorer_factories()
    if name not in factories:
        raise CheckpointError(f"{d}: scorer {name!r} is not registered (have: {', '.join(sorted(factories))})")
    scorer = factories[name](d, manifest)
    if list(scorer.candidates) != list(manifest.candidates):
        raise CheckpointError(f"{d}: scorer {name!r} returned candidates {list(scorer.candidates)}, not the manifest's")
    return scorer
