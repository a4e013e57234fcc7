"""The task interface: a task = loader + prompt format + grader, provided under one name by a plugin.

A :class:`Task` turns raw benchmark records (Hugging Face ``datasets`` rows, or the same rows stored
as JSON Lines) into :class:`TaskItem` objects, formats each item as chat messages, and grades a
candidate's answer text into a score in [0, 1]::

    task = get_task("gsm8k")
    items = task.load("tests/data/tasks/gsm8k.jsonl")      # or task.load() -> HF dataset by name
    messages = task.messages(items[0])
    grade = await task.grade(items[0], answer_text, GradeContext())

New tasks subclass :class:`Task` and are listed by the ``energy_router_tasks`` hook of a plugin
(:mod:`litellm_energy_router.plugins`; the built-ins in :mod:`.builtin_tasks`, third-party ones through the
``litellm_energy_router`` entry-point group, see ``docs/plugins.md``).
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

from litellm_energy_router.errors import UserError
from litellm_energy_router.plugins import task_factories

if TYPE_CHECKING:  # pragma: no cover
    from ..judge import Judge
    from ..sandbox import Sandbox


class TaskError(UserError, ValueError):
    """Bad task name, task file or record; the message is one line naming the file/line/field."""


@dataclass(frozen=True)
class TaskItem:
    """One benchmark question.

    Attributes:
        task: task name (registry key).
        id: item id, unique within the task (the dataset's id, or the row index when it has none).
        prompt: the user message sent to candidates (also the query text in the table).
        reference: the gold answer as text (stored in the table's ``reference`` column), or None.
        data: whatever the grader needs (choices, tests, reference answer...).
        key: the query's table key when it is not ``<task>:<id>`` (e.g. a production query id).
    """

    task: str
    id: str
    prompt: str
    reference: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None

    @property
    def query_id(self) -> str:
        """Table key of the query: ``key`` when set, else ``<task>:<id>:<first 8 hex of SHA-256(prompt)>``
        — another dataset source or prompt format never overwrites an earlier query with the same id."""
        return self.key or f"{self.task}:{self.id}:{hashlib.sha256(self.prompt.encode('utf-8')).hexdigest()[:8]}"


@dataclass(frozen=True)
class Grade:
    """Outcome of grading one answer.

    ``score`` is correctness in [0, 1]; ``None`` means the answer could not be graded (e.g. the judge
    gave no rating) — such pairs are written with ``status="failure"`` and retried on the next run.
    ``note`` is a caveat written with the run (its ``grade_note``), e.g. code run without isolation.
    """

    score: float | None
    detail: str = ""
    note: str | None = None


@dataclass
class GradeContext:
    """Services a grader may need: the LLM judge (MT-Bench) and the code sandbox (MBPP)."""

    judge: "Judge | None" = None
    sandbox: "Sandbox | None" = None


@dataclass(frozen=True)
class HFSource:
    """Where :meth:`Task.load` finds the task on the Hugging Face Hub by default."""

    path: str
    name: str | None = None
    split: str = "test"


class Task(ABC):
    """A benchmark task. Subclasses set ``name``, ``hf`` and implement :meth:`from_record` and
    :meth:`grade`; :meth:`messages` may be overridden for a different prompt format."""

    name: ClassVar[str]
    hf: ClassVar[HFSource]
    #: default generation budget, tokens (the tournament config may override it per task)
    max_tokens: ClassVar[int] = 64
    system_prompt: ClassVar[str | None] = None

    @abstractmethod
    def from_record(self, record: Mapping[str, Any], index: int) -> TaskItem:
        """Build an item from one raw record (KeyError/TypeError/ValueError on a malformed one)."""

    @abstractmethod
    async def grade(self, item: TaskItem, answer: str, ctx: GradeContext) -> Grade:
        """Score ``answer`` (the candidate's full response text) for ``item``."""

    def messages(self, item: TaskItem) -> list[dict[str, str]]:
        """Chat messages sent to a candidate."""
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return msgs + [{"role": "user", "content": item.prompt}]

    # -- loading ---------------------------------------------------------------------------------
    def load(self, source: str | Path | None = None) -> list[TaskItem]:
        """Items from ``source``: a ``.jsonl``/``.json`` file of raw records, a Hugging Face dataset
        spec ``path[:config][@split]``, or ``None`` for the task's default dataset (:attr:`hf`)."""
        if source is not None and (Path(source).suffix in (".jsonl", ".json") or Path(source).exists()):
            records, where = _read_file(Path(source)), str(source)
        else:
            records, where = self._load_hf(str(source) if source is not None else None), "dataset"
        items: list[TaskItem] = []
        seen: set[str] = set()
        for i, (line, rec) in enumerate(records):
            try:
                item = self.from_record(rec, i)
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:  # a field of the wrong type
                what = f"missing field {e.args[0]!r}" if isinstance(e, KeyError) else str(e).splitlines()[0]
                raise TaskError(
                    f"{where}{f' line {line}' if line else f' row {i}'}: task {self.name}: {what}"
                ) from None
            at = f"{where}{f' line {line}' if line else f' row {i}'}: task {self.name}"
            if item.id in seen:
                raise TaskError(f"{at}: duplicate item id {item.id!r}")
            bad = _unstorable(item)
            if bad:
                raise TaskError(f"{at}: {bad}")
            seen.add(item.id)
            items.append(item)
        return items

    def _load_hf(self, spec: str | None) -> list[tuple[int, Mapping[str, Any]]]:
        src = self.hf
        if spec:
            path, _, split = spec.partition("@")
            path, _, name = path.partition(":")
            src = HFSource(path, name or None, split or self.hf.split)
        try:
            import datasets  # heavy: only for real runs
        except ImportError:  # pragma: no cover
            raise TaskError(f"task {self.name}: loading {src.path!r} needs the 'datasets' package") from None
        try:
            ds = datasets.load_dataset(src.path, src.name, split=src.split)
        except Exception as e:  # noqa: BLE001  (network, missing config, ...)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TaskError(
                f"task {self.name}: cannot load dataset {src.path!r} ({src.name}, {src.split}): {first}"
            ) from None
        return [(0, dict(r)) for r in ds]


MAX_QUERY_ID = 200  # characters of the table's query key


def _unstorable(item: TaskItem) -> str | None:
    """Why the table cannot take ``item`` (text that is not Unicode, a query id over its key's length), or None."""
    for name, value in (("id", item.id), ("prompt", item.prompt), ("reference", item.reference or "")):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"field {name!r} holds a lone surrogate at character {e.start} (not Unicode text)"
    if len(item.query_id) > MAX_QUERY_ID:
        return (
            f"item id {item.id[:40]!r}... makes a query id of {len(item.query_id)} characters (at most {MAX_QUERY_ID})"
        )
    return None


def _read_file(path: Path) -> list[tuple[int, Mapping[str, Any]]]:
    try:
        raw = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TaskError(f"{path}: task file not found") from None
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if path.suffix == ".json":
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path} line {e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(doc, list):
            raise TaskError(f"{path}: a .json task file must hold a list of records")
        return [(0, r) for r in doc]
    out = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path} line {n}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise TaskError(f"{path} line {n}: a record must be a JSON object")
        out.append((n, rec))
    return out


def sample_items(items: Sequence[TaskItem], n: int | None, seed: int) -> list[TaskItem]:
    """A reproducible sample of ``n`` items (all when ``n`` is None or >= len), in id order."""
    ordered = sorted(items, key=lambda it: it.id)
    if n is None or n >= len(ordered):
        return ordered
    rng = random.Random(f"{seed}:{ordered[0].task}")
    return sorted(rng.sample(ordered, n), key=lambda it: it.id)


# -- registry (plugins: litellm_energy_router.plugins; the built-ins in .builtin_tasks) --------------------
def get_task(name: str) -> Task:
    """A fresh instance of the task registered as ``name`` by any plugin; unknown names raise :class:`TaskError`."""
    factories = task_factories()
    try:
        factory = factories[name]
    except KeyError:
        raise TaskError(f"task {name!r} is not registered (known: {', '.join(sorted(factories)) or 'none'})") from None
    task = factory()
    if not isinstance(task, Task) or task.name != name:
        raise TaskError(
            f"task {name!r}: the factory returned {type(task).__name__} named {getattr(task, 'name', None)!r}, "
            f"expected a Task named {name!r}"
        )
    return task


def task_names() -> list[str]:
    """Names of the tasks of every installed plugin (built-ins included)."""
    return sorted(task_factories())
