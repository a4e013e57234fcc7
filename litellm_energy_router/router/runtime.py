"""The router at serving time: a loaded :class:`~.scoring.Scorer`, micro-batching, an LRU cache, hot reload.

* ``await runtime.score(text, task)`` → ``Scored`` (P per candidate, Ê per candidate in J, version).
  Depends on the scorer protocol only. A scorer that is not ``inline`` (the LM, the embedding
  baselines) scores on a worker thread (never on the event loop); an ``inline`` one (the distilled
  student, the task prior: a bounded numpy pass, tens of µs) scores in place, as a thread hop costs
  more. Off the loop, when idle, a request waits ``batch_wait_ms`` for company (0, the default: until
  the next loop turn); while a forward pass
  runs, arriving requests queue and the next pass scores all of them at once (up to
  ``max_batch``), so a burst costs few forward passes.
* ``runtime.score_sync(...)`` for LiteLLM's sync paths.
* Loading never stalls the event loop: a runtime built inside a running loop (the proxy) loads on a
  background thread, and until the scorer is ready every request fails open (``RouterLoading``, the
  strategy's ``energy_router_fallbacks_total{reason="loading"}``); built outside a loop it loads in the
  constructor. The load time is logged and observed in ``energy_router_checkpoint_load_seconds``.
* Hot reload: the checkpoint path may be a pointer file or symlink; at most once per
  ``poll_s`` a request checks whether it now names another checkpoint (or the manifest changed) and,
  if so, loads it on a background thread and swaps it in. A broken checkpoint is refused (error
  logged, ``energy_router_reloads_total{result="error"}``) and the old one keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from litellm_energy_router.metrics import CHECKPOINT_LOAD_SECONDS, RELOADS
from litellm_energy_router.router.checkpoint import MANIFEST, resolve
from litellm_energy_router.tokens import estimate_prompt_tokens

log = logging.getLogger("litellm_energy_router")


@dataclass(frozen=True)
class Scored:
    """Router output for one prompt. ``P`` in [0, 1], ``E`` in joules, both in candidate order."""

    candidates: tuple[str, ...]
    P: np.ndarray
    E: np.ndarray
    version: str
    tokens: np.ndarray | None = None  # expected output tokens per candidate (None: a scorer that does not say)
    j_out: np.ndarray | None = None  # J per output token per candidate, to bound E by a request's max_tokens
    note: dict | None = None  # how the output tokens were estimated (router/output_tokens.request_tokens)
    prompt_tokens: int | None = None  # the prompt's cl100k tokens, to bound E by a deployment's context length
    j_prompt: np.ndarray | None = None  # J per prompt token per candidate


class NoCheckpoint(RuntimeError):
    """No usable checkpoint is loaded."""


class RouterLoading(NoCheckpoint):
    """The first checkpoint is still loading (in the background); the request fails open."""


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _fingerprint(path: Path | None) -> tuple[str, tuple] | None:
    """(checkpoint dir, (name, size, mtime) of its files): changes when the pointer moves or any file of
    the checkpoint changes, so a refused checkpoint is retried once its files are fixed."""
    if path is None:
        return None
    try:
        d = resolve(path)
        (d / MANIFEST).stat()
        return str(d), tuple((p.name, st.st_size, st.st_mtime_ns) for p in sorted(d.iterdir()) if (st := p.stat()))
    except (OSError, ValueError):
        return None


class RouterRuntime:
    def __init__(
        self,
        checkpoint: str | os.PathLike[str] | None,
        *,
        batch_wait_ms: float = 0.0,
        cache_size: int = 4096,
        max_batch: int = 64,
        poll_s: float = 1.0,
        expect_candidates: Sequence[str] | None = None,
        threads: int | None = None,
        scorer: str = "auto",
        background: bool | None = None,
    ) -> None:
        """``background``: load the first checkpoint on a thread (None: when called inside a running
        event loop, so the loop never waits for it)."""
        self.checkpoint = Path(checkpoint) if checkpoint else None
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.cache_size, self.max_batch, self.poll_s = cache_size, max_batch, poll_s
        self.expect_candidates = list(expect_candidates) if expect_candidates else None
        self.threads, self.scorer = threads, scorer
        self._model = None
        self._loaded: tuple[str, tuple] | None = None
        self._cache: OrderedDict[str, Scored] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="energy-router")
        self._reloading = threading.Lock()
        self._next_poll = 0.0
        self.closed = False  # set by close(); this runtime's helper threads poll it (router/adapt.start_refresh)
        self._pending: list[tuple[str, str | None, asyncio.Future]] = []
        self._flush_scheduled = False
        self._busy = False
        self.last_error: str | None = None
        self._loading = False
        if self.checkpoint is not None:
            if background if background is not None else _in_event_loop():
                self._loading = True
                self._reloading.acquire()
                threading.Thread(
                    target=self._load_then_release,
                    args=(_fingerprint(self.checkpoint),),
                    name="energy-router-load",
                    daemon=True,
                ).start()
            else:
                self._load(_fingerprint(self.checkpoint))

    def _load_then_release(self, fp: tuple[str, tuple] | None) -> None:
        try:
            self._load(fp)
        finally:
            self._loading = False
            self._reloading.release()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the first load finished (True when a scorer is serving). Not for the event loop."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._loading and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)
        return self._model is not None

    # -- loading ----------------------------------------------------------------------------------
    def _load(self, fp: tuple[str, tuple] | None) -> bool:
        from litellm_energy_router.router.scoring import load_scorer

        if fp is None:
            where = Path(self.checkpoint).absolute() if self.checkpoint else None
            self.last_error = f"checkpoint {self.checkpoint} not found" + (
                f" ({where})" if where is not None and str(where) != str(self.checkpoint) else ""
            )  # a relative path names the proxy's working directory
            RELOADS.labels(result="missing").inc()
            log.error("energy-router: %s; serving falls back", self.last_error)
            return False
        t0 = time.perf_counter()
        try:
            model = load_scorer(fp[0], self.scorer, expect_candidates=self.expect_candidates)
            (
                model.score(["warm-up"], [None]),
                model.energy(["warm-up"], [None]),
            )  # tokenizer tables etc. built here, not on a request
            if self.threads and not model.inline and "torch" in sys.modules:  # a torch scorer: keep its threads off
                # the proxy's cores (an inline scorer never runs torch, and torch may be half-imported by another loader)
                sys.modules["torch"].set_num_threads(self.threads)
        except Exception as e:  # noqa: BLE001 - refuse any broken checkpoint, keep the old one
            self.last_error = f"checkpoint {fp[0]} refused: {str(e).splitlines()[0]}"
            RELOADS.labels(result="error").inc()
            log.error("energy-router: %s", self.last_error)
            self._loaded = fp  # do not retry the same broken files on every request
            return False
        with self._cache_lock:  # the swap and the clear together: _remember checks the model under this lock
            self._model, self._loaded = model, fp
            self._cache.clear()
        self.last_error = None
        dt = time.perf_counter() - t0
        RELOADS.labels(result="ok").inc()
        CHECKPOINT_LOAD_SECONDS.observe(dt)
        log.info(
            "energy-router: serving checkpoint %s (version %s, scorer %s), loaded in %.2f s",
            fp[0],
            model.version,
            model.name,
            dt,
        )
        return True

    def maybe_reload(self, block: bool = False) -> None:
        """Check the pointer at most once per ``poll_s``; reload in the background when it moved."""
        now = time.monotonic()
        if self.checkpoint is None or (now < self._next_poll and not block):
            return
        self._next_poll = now + self.poll_s
        fp = _fingerprint(self.checkpoint)
        if fp is None and self._model is not None and not self.checkpoint.exists():
            self._model, self._loaded = None, None  # the checkpoint was removed: fail open from now on
            with self._cache_lock:
                self._cache.clear()
            self.last_error = f"checkpoint {self.checkpoint} was removed"
            RELOADS.labels(result="missing").inc()
            return
        if fp == self._loaded or not self._reloading.acquire(blocking=False):
            return

        def run() -> None:
            try:
                self._load(fp)
            finally:
                self._reloading.release()

        if block:
            run()
        else:
            threading.Thread(target=run, name="energy-router-reload", daemon=True).start()

    @property
    def model(self):
        return self._model

    @property
    def inline(self) -> bool:
        """True when the serving scorer scores in place (:meth:`score` never leaves the event loop)."""
        model = self._model
        return model is not None and model.inline

    @property
    def version(self) -> str | None:
        return self._model.version if self._model is not None else None

    # -- scoring ----------------------------------------------------------------------------------
    @staticmethod
    def _key(text: str, task: str | None) -> str:
        return hashlib.sha256(f"{task}\x00{text}".encode("utf-8", "surrogatepass")).hexdigest()

    def _cached(self, key: str) -> Scored | None:
        if self._model is None:
            if self._loading:
                raise RouterLoading("the checkpoint is still loading")
            raise NoCheckpoint(self.last_error or "no checkpoint configured")
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def _remember(self, key: str, s: Scored) -> None:
        if self.cache_size <= 0:
            return
        with self._cache_lock:
            model = self._model
            if model is None or s.version != model.version:  # scored by a model a reload replaced: not cached
                return
            self._cache[key] = s
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _score_batch(self, items: Sequence[tuple[str, str | None]]) -> list[Scored]:
        model = self._model
        if model is None:
            raise NoCheckpoint(self.last_error or "no checkpoint configured")
        texts, tasks = [t for t, _ in items], [k for _, k in items]
        P = model.score(texts, tasks)
        cands = tuple(model.candidates)
        if not hasattr(model, "energy_detail"):  # a plugin scorer: energy only
            E = model.energy(texts, tasks)
            return [Scored(cands, P[i], E[i], model.version) for i in range(len(items))]
        n_tok = [estimate_prompt_tokens(t) for t in texts]
        E, T, notes = model.energy_detail(texts, tasks, n_tok)
        jp, jo = model.token_rates
        return [Scored(cands, P[i], E[i], model.version, T[i], jo, notes[i], n_tok[i], jp) for i in range(len(items))]

    def _lookup(self, text: str, task: str | None) -> tuple[str, Scored | None]:
        """(cache key, cached score or None), after the hot-reload check."""
        self.maybe_reload()
        key = self._key(text, task) if self.cache_size > 0 else ""  # no cache: no key to hash
        return key, self._cached(key)

    def _score_now(self, key: str, text: str, task: str | None) -> Scored:
        s = self._score_batch([(text, task)])[0]
        self._remember(key, s)
        return s

    def score_sync(self, text: str, task: str | None = None) -> Scored:
        key, hit = self._lookup(text, task)
        return hit if hit is not None else self._score_now(key, text, task)

    async def score(self, text: str, task: str | None = None) -> Scored:
        key, hit = self._lookup(text, task)
        if hit is not None:
            return hit
        model = self._model
        if model is not None and model.inline:
            # a bounded numpy pass (tens of µs): cheaper in place than a hop to the worker
            return self._score_now(key, text, task)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._pending.append((text, task, fut))
        if len(self._pending) >= self.max_batch and not self._busy:
            self._flush(loop)
        elif not self._flush_scheduled and not self._busy:
            # idle: score on the next loop turn (callers started in this turn join the batch);
            # busy: the running pass flushes what accumulated when it ends (natural batching)
            self._flush_scheduled = True
            if self.batch_wait_s > 0:
                loop.call_later(self.batch_wait_s, self._flush, loop)
            else:  # next loop turn: callers started in this turn still join the batch
                loop.call_soon(self._flush, loop)
        s = await fut
        self._remember(key, s)
        return s

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        self._flush_scheduled = False
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
        if not batch:
            return
        self._busy = True
        job = loop.run_in_executor(self._executor, self._score_batch, [(t, k) for t, k, _ in batch])

        def done(f: asyncio.Future) -> None:
            self._busy = False
            err = f.exception()
            for i, (_, _, fut) in enumerate(batch):
                if fut.done():
                    continue
                if err is not None:
                    fut.set_exception(err)
                else:
                    fut.set_result(f.result()[i])
            if self._pending:
                self._flush(loop)

        job.add_done_callback(done)

    def close(self) -> None:
        self.closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
