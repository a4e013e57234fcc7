"""An example litellm-energy-router plugin (entry point ``example`` in the group ``litellm_energy_router``).

* meter ``constant-power``: a GPU drawing a constant ``power_w`` watts, behind the same meter interface
  as ``nvml`` (``name``, ``method``, ``read()``, ``close()``). Not a measurement: ``method`` is
  ``"simulated"``.
* task ``echo``: "use the word X in your answer", graded 1 when the answer contains X. Loads the
  bundled ``echo.jsonl`` by default.
* scorer ``slow-student``: the built-in student behind a deliberately slow load (``ER_EXAMPLE_LOAD_S``
  seconds, default 2: a large checkpoint on a slow disk), for a checkpoint whose manifest says
  ``"scorer": "slow-student"``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from litellm_energy_router.energy.meter import EnergyReading
from litellm_energy_router.plugins import hookimpl
from litellm_energy_router.profiling.tasks import Grade, GradeContext, HFSource, Task, TaskItem


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


@hookimpl
def energy_router_meters() -> dict:
    return {"constant-power": ConstantPowerMeter}


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


@hookimpl
def energy_router_scorers() -> dict:
    return {"slow-student": slow_student}
