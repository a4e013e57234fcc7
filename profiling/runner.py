"""The tournament runner: every query x every candidate through LiteLLM, graded, into the table.

::

    config = load_tournament_config("tournament.yaml")
    with open_store(url) as store:
        summary = asyncio.run(Tournament(config, store).run(build_jobs(config)))

* Candidates are called through a ``litellm.Router`` built from the config's model list, streaming,
  so time to first token (TTFT, s) and end-to-end latency (s) are measured per request; tokens come
  from the stream's usage (else LiteLLM's token counter); joules from :mod:`.metering`.
* Each (query, candidate) pair is graded, then written with its query in one transaction (batched
  with other finished pairs; every pair is all-or-nothing). Ctrl-C flushes finished pairs and drops
  in-flight ones; a SIGKILL loses at most the pairs not yet committed. No partial rows either way.
* Resume: pairs already in the table for this ``source`` are skipped, except rows with
  ``status="failure"`` (request or grading failed), which are retried and replaced.
* Candidates run in parallel (``concurrency`` requests each) with the ``estimate`` meter, one after
  another with a physical meter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Sequence

from litellm_energy_router.energy.meter import meter_options
from litellm_energy_router.settings import ConfigError
from litellm_energy_router.table import Candidate, Query, Run, TableStore, make_query

from .config import CandidateSpec, TournamentConfig
from .judge import Judge
from .metering import Accountant, MeterAccountant, make_accountant
from .sandbox import Sandbox, SandboxError
from .tasks import Grade, GradeContext, TaskError, get_task, sample_items
from .tournament_records import CandidateSummary, Generation, Job, ProgressSink, TournamentSummary

log = logging.getLogger(__name__)
_STOP = object()


def build_jobs(config: TournamentConfig, source: str = "tournament") -> list[Job]:
    """Load and sample every configured task (reproducible for a given seed)."""
    jobs: list[Job] = []
    for spec in config.tasks:
        task = get_task(spec.name)
        if spec.name == "mt_bench" and config.judge is None:
            raise ConfigError("task mt_bench needs a judge deployment: add 'judge:' to the tournament config")
        items = sample_items(task.load(spec.source), spec.sample_size or config.sample_size, config.seed)
        max_tokens = spec.max_tokens or config.generation.max_tokens or task.max_tokens
        for it in items:
            q = make_query(it.query_id, it.task, it.prompt, store_text=True, reference=it.reference, source=source)
            jobs.append(Job(task, it, q, max_tokens))
    return jobs


def build_router(config: TournamentConfig) -> Any:
    """A ``litellm.Router`` over the candidates (and the judge)."""
    import litellm

    deployments = [*config.candidates, *([config.judge] if config.judge else [])]
    deployments = [d for d in deployments if d.litellm_params.get("model")]  # vllm_offline candidates have none
    model_list = [
        {"model_name": d.model_name, "litellm_params": dict(d.litellm_params), "model_info": dict(d.model_info)}
        for d in deployments
    ]
    return litellm.Router(
        model_list=model_list, num_retries=config.generation.num_retries, timeout=config.generation.timeout_s
    )


def _first_leaf(e: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: what a task group's failure was."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _tokens(v: Any) -> int | None:
    """A token count an endpoint reported, or None when it is not one (negative, fractional, not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e9 or int(v) != v:
        return None
    return int(v)


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return f"{type(e).__name__}: {s.splitlines()[0][:300]}" if s else type(e).__name__


Driver = Callable[["Tournament", CandidateSpec, Sequence[Job]], Awaitable[None]]


class Tournament:
    """Runs jobs against the configured candidates and writes the runs to ``store``."""

    def __init__(
        self,
        config: TournamentConfig,
        store: TableStore,
        *,
        source: str = "tournament",
        accountant: Accountant | None = None,
        progress: ProgressSink | None = None,
        router: Any = None,
        write_batch: int = 256,
    ) -> None:
        self.config = config
        self.store = store
        self.source = source
        self.progress = progress
        self.write_batch = write_batch
        self.accountant = accountant or make_accountant(
            config.energy.meter,
            profile=str(config.energy.profile) if config.energy.profile else None,
            options={**meter_options(config.energy.meter, config.energy), **config.energy.options},  # gpus
            candidates=[(c.model_name, c.energy_profile_key or c.model_name) for c in config.candidates],
        )
        self._router = router
        self.sandbox = Sandbox(config.sandbox)
        self.summary = TournamentSummary()
        self._queue: asyncio.Queue[Any] | None = None

    # -- LiteLLM ---------------------------------------------------------------------------------
    @property
    def router(self) -> Any:
        if self._router is None:
            self._router = build_router(self.config)
        return self._router

    async def _judge_complete(self, messages: list[dict[str, str]]) -> str:
        judge = self.config.judge
        assert judge is not None
        handle = self.accountant.begin() if isinstance(self.accountant, MeterAccountant) else None
        try:
            resp = await self.router.acompletion(
                model=judge.model_name, messages=messages, max_tokens=judge.max_tokens, temperature=judge.temperature
            )
        finally:
            if handle is not None:  # the judge's share of a shared GPU is discarded, not billed to candidates
                self.accountant.end(handle, judge.model_name, None, None)
        return resp.choices[0].message.content or ""

    def grade_context(self) -> GradeContext:
        judge = Judge(self._judge_complete, self.config.judge.model_name) if self.config.judge else None
        return GradeContext(judge=judge, sandbox=self.sandbox)

    async def generate(self, cand: CandidateSpec, messages: list[dict[str, str]], max_tokens: int) -> Generation:
        """Stream one completion from ``cand``; never raises for a failed request."""
        import litellm

        gen = self.config.generation
        kwargs: dict[str, Any] = {"max_tokens": max_tokens, "temperature": gen.temperature, **gen.extra}
        if gen.top_p is not None:
            kwargs["top_p"] = gen.top_p
        parts: list[str] = []
        usage = None
        t0 = time.perf_counter()
        ttft = None
        try:
            stream = await self.router.acompletion(
                model=cand.model_name, messages=messages, stream=True, stream_options={"include_usage": True}, **kwargs
            )
            async for chunk in stream:
                if chunk.choices:
                    delta = chunk.choices[0].delta
                    piece = getattr(delta, "content", None) or getattr(delta, "reasoning_content", None)
                    if piece:
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        if getattr(delta, "content", None):
                            parts.append(delta.content)
                if getattr(chunk, "usage", None):
                    usage = chunk.usage
        except Exception as e:  # noqa: BLE001  (connection, timeout, HTTP 4xx/5xx after retries)
            return Generation(latency_s=time.perf_counter() - t0, error=_first_line(e))
        latency = time.perf_counter() - t0
        text = "".join(parts)
        # the endpoint's usage is as hostile as its text: a count that is no count is counted here instead
        p_tok = _tokens(getattr(usage, "prompt_tokens", None)) if usage else None
        c_tok = _tokens(getattr(usage, "completion_tokens", None)) if usage else None
        model = str(cand.litellm_params.get("model", cand.model_name))
        if p_tok is None:
            p_tok = litellm.token_counter(model=model, messages=messages)
        if c_tok is None:
            c_tok = litellm.token_counter(model=model, text=text, count_response_tokens=True) if text else 0
        return Generation(text, latency, ttft, int(p_tok), int(c_tok))

    async def _litellm_driver(self, cand: CandidateSpec, jobs: Sequence[Job]) -> None:
        pending = iter(jobs)

        async def worker() -> None:
            for job in pending:  # shared iterator: each job is taken by exactly one worker
                t_begin = time.perf_counter()
                handle = self.accountant.begin()
                gen = Generation(error="not started")
                try:
                    gen = await self.generate(cand, job.task.messages(job.item), job.max_tokens)
                finally:
                    energy = self.accountant.end(handle, cand.model_name, gen.prompt_tokens, gen.completion_tokens)
                gen.energy_j, gen.energy_method = energy, (self.accountant.method if energy is not None else None)
                if energy is not None and self.accountant.method != "estimate":
                    gen.energy_window_s = time.perf_counter() - t_begin  # a metered window, not the response time
                await self.finish(cand, job, gen)

        async with asyncio.TaskGroup() as tg:
            for _ in range(min(self.config.concurrency_of(cand), len(jobs))):
                tg.create_task(worker())

    # -- grading and writing ---------------------------------------------------------------------
    async def finish(self, cand: CandidateSpec, job: Job, gen: Generation) -> None:
        """Grade ``gen`` and queue the run (with its query) for writing. Used by every driver."""
        if gen.error is not None:
            grade = Grade(None, gen.error)
        else:
            try:
                grade = await job.task.grade(job.item, gen.text, self._ctx)
            except (TaskError, SandboxError, ConfigError):
                raise  # configuration problems stop the tournament
            except Exception as e:  # noqa: BLE001  (judge request failed, ...)
                grade = Grade(None, f"grading failed: {_first_line(e)}")
        window = gen.energy_window_s or gen.latency_s
        power = gen.energy_j / window if gen.energy_j is not None and window else None
        run = Run(
            query_id=job.item.query_id,
            candidate=cand.model_name,
            source=self.source,
            score=grade.score,
            latency_s=gen.latency_s,
            ttft_s=gen.ttft_s,
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=gen.completion_tokens,
            energy_j=gen.energy_j,
            avg_power_w=power,
            energy_method=gen.energy_method,
            gpu=self.config.energy.gpu or cand.hardware,
            status="success" if grade.score is not None else "failure",
            call_id=job.call_id,
            context=job.context,
            grade_note=grade.note,
        )
        if grade.score is None:
            log.warning("%s on %s: %s", cand.model_name, job.item.query_id, grade.detail)
        assert self._queue is not None
        await self._queue.put((job.query, run))
        s = self.summary.candidates[cand.model_name]
        s.done += 1
        if grade.score is None:
            s.failed += 1
        else:
            s.score_sum += grade.score
        if gen.energy_j is not None:
            s.energy_sum_j += gen.energy_j
            s.energy_n += 1
        if self.progress:
            self.progress.update(s)

    def _write(self, batch: list[tuple[Query | None, Run]]) -> None:
        queries = list({q.id: q for q, _ in batch if q is not None}.values())
        self.store.write(queries=queries, runs=[r for _, r in batch])
        self.summary.written += len(batch)

    async def _writer(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < self.write_batch and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            await asyncio.to_thread(self._write, batch)
            if stop:
                return

    def _flush_now(self) -> None:
        """Write whatever finished pairs are still queued (after a cancel)."""
        assert self._queue is not None
        batch = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not _STOP:
                batch.append(item)
        if batch:
            self._write(batch)

    # -- the run ---------------------------------------------------------------------------------
    def done_pairs(self) -> set[tuple[str, str]]:
        """(query_id, candidate) pairs already in the table for this source (failures excluded)."""
        return {
            (r["query_id"], r["candidate"])
            for r in self.store.iter_runs(sources=[self.source])
            if r.get("status") != "failure"
        }

    def _write_candidates(self) -> None:
        self.store.write(
            candidates=[
                Candidate(
                    name=c.model_name,
                    model=c.model or c.litellm_params.get("model"),
                    params_b=c.params_b,
                    active_params_b=c.active_params_b,
                    hardware=c.hardware,
                )
                for c in self.config.candidates
            ]
        )

    def _todo(self, jobs: Sequence[Job]) -> dict[str, list[Job]]:
        """Per candidate, the jobs not yet in the table; starts each candidate's summary (and progress)."""
        done = self.done_pairs()
        todo: dict[str, list[Job]] = {}
        for c in self.config.candidates:
            todo[c.model_name] = [j for j in jobs if (j.item.query_id, c.model_name) not in done]
            self.summary.candidates[c.model_name] = CandidateSummary(
                c.model_name, len(todo[c.model_name]), len(jobs) - len(todo[c.model_name])
            )
            if self.progress:
                self.progress.start(c.model_name, len(todo[c.model_name]), len(jobs) - len(todo[c.model_name]))
        return todo

    async def _drive_all(self, drive: Driver, todo: dict[str, list[Job]], seq: bool) -> None:
        cands = self.config.candidates
        if seq:
            for c in cands:
                if todo[c.model_name]:
                    await drive(self, c, todo[c.model_name])
        else:
            async with asyncio.TaskGroup() as tg:
                for c in cands:
                    if todo[c.model_name]:
                        tg.create_task(drive(self, c, todo[c.model_name]))

    async def _abort(self, drivers: asyncio.Task[None], writer: asyncio.Task[None]) -> None:
        """After a failure or a cancel: stop the drivers and the writer, then write the pairs already finished."""
        self.summary.interrupted = True
        for task in (drivers, writer):
            if not task.done():
                task.cancel()
        await asyncio.gather(drivers, writer, return_exceptions=True)  # in-flight pairs end, unwritten
        try:
            await asyncio.shield(asyncio.to_thread(self._flush_now))  # finished pairs are kept
        except BaseException:  # noqa: BLE001  (cancelled again while flushing: the thread still commits)
            pass

    async def run(
        self, jobs: Sequence[Job], driver: Driver | None = None, sequential: bool | None = None
    ) -> TournamentSummary:
        """Run every job on every candidate not yet in the table; returns this run's summary.
        ``sequential`` (default: the accountant's choice) runs candidates one after another."""
        t0 = time.perf_counter()
        self._write_candidates()
        todo = self._todo(jobs)
        if any(j.task.name == "mbpp" for j in jobs) and any(todo.values()):
            await self.sandbox.isolation()  # probe once, before any candidate is called
        self._ctx = self.grade_context()
        self._queue = asyncio.Queue()
        writer = asyncio.create_task(self._writer())
        drive: Driver = driver or Tournament._litellm_driver
        if drive is Tournament._litellm_driver and any(todo.values()):
            import litellm  # noqa: F401  (imported, and the Router built, before the first metered window opens:

            _ = self.router  # the first pair's joules, latency and TTFT were the import's and the build's)
        seq = self.accountant.sequential if sequential is None else sequential
        drivers = asyncio.create_task(self._drive_all(drive, todo, seq))
        try:
            await asyncio.wait({drivers, writer}, return_when=asyncio.FIRST_COMPLETED)
            if writer.done():  # the table refused a write: stop asking candidates
                writer.result()
            drivers.result()
        except BaseException as e:
            await self._abort(drivers, writer)
            leaf = _first_leaf(e)  # a configuration error, not the task group's wrapping of it
            if leaf is not e:
                raise leaf from e
            raise
        finally:
            self.summary.elapsed_s = time.perf_counter() - t0
        await self._queue.put(_STOP)
        await writer
        self.summary.elapsed_s = time.perf_counter() - t0
        return self.summary

    def close(self) -> None:
        self.accountant.close()
