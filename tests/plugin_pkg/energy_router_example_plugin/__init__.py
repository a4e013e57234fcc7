"""An example litellm-energy-router plugin (entry point ``example`` in the group ``litellm_energy_router``).

* meter ``constant-power``: a GPU drawing a constant ``power_w`` watts, behind the same meter interface
  as ``nvml`` (``name``, ``method``, ``read()``, ``close()``). Not a measurement: ``method`` is
  ``"simulated"``.
* meter ``fake-rocm``: an AMD-style device meter registered with a :class:`MeterSpec`: its joules are
  declared measured (``energy_method`` ``rocm_smi``) and it takes the ``energy.gpus`` device option.
  (A test double: constant power, like ``constant-power``.)
* task ``echo``: "use the word X in your answer", graded 1 when the answer contains X. Loads the
  bundled ``echo.jsonl`` by default.
* scorer ``slow-student``: the built-in student behind a deliberately slow load (``ER_EXAMPLE_LOAD_S``
  seconds, default 2: a large checkpoint on a slow disk), for a checkpoint whose manifest says
  ``"scorer": "slow-student"``.
* scorer ``keyword-prior`` (trainable: registered with a ``fit``): per candidate, the mean training score
  of the queries that contain a word (default "proof") and of those that do not. Trained, cross-validated,
  selected by ``retrain`` (``select: true``) and served with its name written only here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from litellm_energy_router.profiling.tasks import Grade, GradeContext, HFSource, Task, TaskItem

from litellm_energy_router.energy.meter import EnergyReading
from litellm_energy_router.plugins import MeterSpec, ScorerSpec, hookimpl


class ConstantPowerMeter:
    """Cumulative joules of ``gpus`` GPUs each drawing ``power_w`` W since the meter was built."""

    name = "constant-power"
    method = "simulated"

    def __init__(self, power_w: float = 100.0, gpus: int = 1) -> None:
        if power_w < 0:
            raise ValueError(f"energy meter 'constant-power': power_w = {power_w} must be >= 0")
        self.power_w = float(power_w)
        self.gpus = int(gpus)
        self.gpu = f"{self.gpus}x constant {self.power_w:g} W"
        self._t0 = time.monotonic()

    def read(self) -> EnergyReading:
        t = time.monotonic()
        return EnergyReading(t, {i: self.power_w * (t - self._t0) for i in range(self.gpus)})

    def close(self) -> None:
        pass


class EchoTask(Task):
    """Records ``{"id": str, "word": str}``; the answer must contain the word (case-insensitive)."""

    name = "echo"
    hf = HFSource("none/echo")  # never used: load() defaults to the bundled file
    max_tokens = 32

    def load(self, source: str | Path | None = None) -> list[TaskItem]:
        return super().load(source if source is not None else Path(__file__).with_name("echo.jsonl"))

    def from_record(self, record: Mapping[str, Any], index: int) -> TaskItem:
        word = str(record["word"]).strip()
        if not word:
            raise ValueError("field 'word' is empty")
        return TaskItem(self.name, str(record.get("id", index)), f"Use the word '{word}' in a sentence.", word)

    async def grade(self, item: TaskItem, answer: str, ctx: GradeContext) -> Grade:
        hit = item.reference.lower() in answer.lower()
        return Grade(1.0 if hit else 0.0, "word used" if hit else "word missing")


class FakeRocmMeter(ConstantPowerMeter):
    """Constant power on the ``gpus`` it is given (device indices, from ``energy.gpus``)."""

    name = "fake-rocm"
    method = "rocm_smi"

    def __init__(self, gpus: list[int] | None = None, power_w: float = 100.0) -> None:
        super().__init__(power_w, len(gpus or [0]))
        self.devices = list(gpus or [0])


@hookimpl
def energy_router_meters() -> dict:
    return {
        "constant-power": ConstantPowerMeter,
        "fake-rocm": MeterSpec(FakeRocmMeter, methods=("rocm_smi",), measured=True, options=("gpus",)),
    }


@hookimpl
def energy_router_tasks() -> dict:
    return {"echo": EchoTask}


def slow_student(path: Path, manifest: Any) -> Any:
    """factory(checkpoint_dir, manifest) -> a Scorer (``name``, ``candidates``, ``version``, ``inline``,
    ``score(texts, tasks) -> P[n, K]``, ``energy(texts, tasks) -> E[n, K]``)."""
    import os

    from litellm_energy_router.router.scoring import StudentScorer

    time.sleep(float(os.environ.get("ER_EXAMPLE_LOAD_S", "2")))
    scorer = StudentScorer(path, manifest)
    scorer.name = "slow-student"
    return scorer


class KeywordPrior:
    """The training side of ``keyword-prior``: ``fit(train)`` on a table matrix, ``predict_proba(test)``,
    ``export_arrays()`` (what the checkpoint stores), ``params``. Takes the selection's context and ignores it."""

    uses_embeddings = False
    accepts_partial = False

    def __init__(self, word: str = "proof", **_context: Any) -> None:
        self.word = word
        self.params = {"word": word}

    def _has(self, texts: Any) -> np.ndarray:
        return np.array([self.word in str(t).lower() for t in texts], dtype=int)

    def fit(self, train: Any) -> "KeywordPrior":
        Y, h = np.asarray(train.Y, dtype=np.float64), self._has(train.texts)
        prior = np.nanmean(Y, axis=0)
        self.means = np.stack([np.nanmean(Y[h == v], axis=0) if (h == v).any() else prior for v in (0, 1)])
        return self

    def predict_proba(self, test: Any) -> np.ndarray:
        return self.means[self._has(test.texts)]

    def export_arrays(self) -> dict:
        return {"means": self.means, "word": np.array(self.word)}


def keyword_prior_scorer(path: Path, manifest: Any) -> Any:
    """The serving side of ``keyword-prior``: the checkpoint's ``baseline.npz`` (written by the generic export)."""
    from litellm_energy_router.router.scoring import CheckpointScorer

    class KeywordPriorScorer(CheckpointScorer):
        name, inline = "keyword-prior", True

        def __init__(self) -> None:
            super().__init__(path, manifest)
            with np.load(self.path / manifest.baseline["file"], allow_pickle=False) as z:
                self.model = KeywordPrior(str(z["word"]))
                self.model.means = z["means"]

        def score(self, texts: Any, tasks: Any = None) -> np.ndarray:
            return self.model.means[self.model._has(texts)]

    return KeywordPriorScorer()


@hookimpl
def energy_router_scorers() -> dict:
    return {
        "slow-student": slow_student,
        "keyword-prior": ScorerSpec(load=keyword_prior_scorer, fit=KeywordPrior, rank=1),
    }
