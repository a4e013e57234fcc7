"""What the serving router learns between retrains, and how a decision uses it: :class:`Adaptation`.

One per process (:data:`ADAPT`): the router's decision path (:mod:`litellm_energy_router.litellm_glue.strategy`) reads it,
the energy callback's writer thread feeds it (after each row's energy settled, off the event loop).

* **Energy** (:class:`.online.OnlineEnergy`): settled production rows correct Ê per candidate and per context
  (the context key, else the text cluster); rebuilt when the checkpoint changes (a new checkpoint was fitted
  on those rows).
* **Correctness per context** (:class:`.context.ContextPrior`): fitted at start from the table (streaming:
  tournament rows under ``task:<task>``, production rows under their stored context, labelled ones only), and
  from then on from the rows the refresh reads (:meth:`Adaptation.refresh_from`: new labelled rows since the
  last one read, e.g. ``router.context_refresh_s``).
* **No support** (the scorer has never seen anything like the request): the scorer's ``P`` is blended toward
  the prior of the levels above the context key (its cluster's, else the pooled prior) with weight ``w`` from the
  request's support cosine ``s`` (the largest cosine between its n-gram sketch and the checkpoint's training
  rows', :mod:`.length_model`): ``w = clip((s - SUPPORT_LO) / (SUPPORT_HI - SUPPORT_LO), 0, 1)``,
  ``P' = w * P + (1 - w) * prior``; thresholds fitted by leave-task-out CV on the development rows
  (``training/support_fit.py``, numbers in docs/training.md). A request with a task tag the scorer knows keeps
  ``w = 1``; without a support figure (a checkpoint without a length model) too. Before any labelled row was
  read (an empty table) there is no prior to blend toward: ``P`` stands, the metadata says ``prior_level: none``.
* **The context's own rows** (any support; ``router.context_rows``, off by default: mixed results,
  docs/unseen_traffic.md): the labelled rows of the request's context key shrink that ``P``
  toward them, ``(sum + n0 * (P + δ)) / (n + n0)`` per candidate, δ the context's shrunk mean residual
  (:meth:`.context.ContextPrior.on_top`, :func:`.context._shrink`): an app whose
  traffic the table never held is learned from its own labels. ``n0``: the checkpoint's ``context_n0`` (a
  ``task_prior`` checkpoint: its leave-task-out ``alpha``, ``training/baselines.pseudo_rows_cv``), else
  :data:`.context.N0_CTX`.
* The decision's ``adapt`` metadata: ``context`` (its keys), ``support`` (cosine), ``weight`` (``w``),
  ``unsure`` (``w < 1``: the router blended toward the prior), ``prior_level`` (the level the prior came from),
  ``context_rows`` (the context's own labelled rows, when it has any),
  ``online_rows`` (production rows behind the energy correction), ``checkpoint_j`` (Ê per candidate before the
  correction, J: what the next rows are compared with).
"""

from __future__ import annotations

import logging
import threading
from contextlib import closing, contextmanager
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from litellm_energy_router.router.context import (
    N0_CTX,
    Context,
    ContextPrior,
    request_context,
)
from litellm_energy_router.router.length_model import SUPPORT_BLEND
from litellm_energy_router.router.online import Explore, OnlineEnergy

log = logging.getLogger("litellm_energy_router")
REFRESH_WAIT_S = 60.0  # the longest a context-prior refresh waits for the one running, s
SUPPORT_LO, SUPPORT_HI = SUPPORT_BLEND  # cosine: no support at or below LO, full support from HI (docs/training.md)


def support_weight(
    similarity: float | None, task_known: bool = False, lo: float = SUPPORT_LO, hi: float = SUPPORT_HI
) -> float:
    """The scorer's weight against the context prior (module docstring); 1 for a known task or no figure."""
    if task_known or similarity is None:
        return 1.0
    return min(max((float(similarity) - lo) / max(hi - lo, 1e-9), 0.0), 1.0)


def context_n0(model: Any) -> float:
    """Pseudo-rows of a context's own rows: the checkpoint's ``context_n0``, else a ``task_prior`` checkpoint's
    cross-validated ``alpha``, else :data:`.context.N0_CTX`."""
    man = getattr(model, "manifest", None)
    v = getattr(man, "context_n0", None) or ((getattr(man, "baseline", None) or {}).get("params") or {}).get("alpha")
    return float(v) if isinstance(v, (int, float)) and v > 0 else N0_CTX


class Adaptation:
    """The process's online state (module docstring). ``enabled`` False: :meth:`apply` passes P and Ê through."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.version: str | None = None
        self.energy: OnlineEnergy | None = None
        self.prior: ContextPrior | None = None
        self.last_run_id = -1
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()  # one table read at a time (every core of the process shares ADAPT)

    def reset(self) -> None:
        """Forget everything learned (tests; a new pool)."""
        with self._lock:
            self.version, self.energy, self.prior, self.last_run_id = None, None, None, -1

    def bind(self, model: Any) -> None:
        """Follow the serving scorer ``model``: new energy state on a new checkpoint version; a context prior for
        its candidates (kept across versions with the same candidates)."""
        if model is None or model.version == self.version:
            return
        with self._lock:
            if model.version == self.version:
                return
            cands = list(model.candidates)
            est = getattr(getattr(model, "manifest", None), "energy", None)
            self.energy = None
            if est is not None:
                prior = est.unknown_task_tokens()
                jp, jo = est.rates(cands)
                self.energy = OnlineEnergy(cands, jo, jp, [prior[c] for c in cands])
            n0 = context_n0(model)
            if self.prior is None or list(self.prior.candidates) != cands or self.prior.n0 != n0:
                self.prior, self.last_run_id = ContextPrior(cands, n0=n0), -1
            self.version = model.version

    @staticmethod
    def context(
        text: str | None, request_kwargs: Mapping[str, Any] | None, messages: Any, model_group: str | None
    ) -> Context:
        """The request's :class:`.context.Context` (authenticated fields only)."""
        from litellm_energy_router.knob import metadata_dicts

        return request_context(text, metadata_dicts(request_kwargs), model_group, messages)

    def apply(
        self,
        scored: Any,
        ctx: Context | None,
        E: np.ndarray | None = None,
        explore: bool = True,
        own_rows: bool = False,
    ) -> tuple[np.ndarray, np.ndarray, Explore | None, dict | None]:
        """(``P'[K]``, ``Ê'[K]`` J, what the exploration draws on (:class:`.online.Explore`) or None, the decision's
        ``adapt`` metadata) of one scored request (:class:`.runtime.Scored`); ``E``: its Ê already bounded by the
        request (default ``scored.E``); ``own_rows``: the context's own labels move P on any request
        (``router.context_rows``), else only as the most specific level of the no-support blend;
        ``explore``: compute the exploration's inputs (False: ε = 0, None)."""
        P, E = scored.P, (scored.E if E is None else E)
        if not self.enabled or ctx is None or scored.version != self.version:
            return P, E, None, None
        energy, prior = self.energy, self.prior
        ekey = ctx.key or ctx.cluster
        note = scored.note or {}
        sim = note.get("support")
        w = support_weight(sim, note.get("output_tokens_source") == "task_mean")
        info: dict[str, Any] = {"context": str(ctx), "support": sim, "weight": round(w, 4), "unsure": w < 1.0}
        spread = None  # what P's spread comes from where a context's rows shaped it (aimed exploration)
        if prior is not None and prior.rows > 0 and own_rows:
            level = "pool"
            if w < 1.0:  # toward the levels above the context key (cluster, pool)
                pi, _, level = prior.detail(ctx.cluster)
                P = w * P + (1.0 - w) * pi
            P, own = prior.on_top(P, ctx.key)  # the context's own labelled rows, whatever the support
            spread = (P, own, prior.n0, 1.0) if ctx.key else None
            if own.any():
                level, info["context_rows"] = "ctx", int(own.sum())
            if w < 1.0:
                info["prior_level"] = level.split(":")[0]
        elif w < 1.0 and prior is not None and prior.rows > 0:
            pi, rows, level = prior.detail(ctx)
            P = w * P + (1.0 - w) * pi
            spread = (pi, rows, prior.n0, 1.0 - w)  # the scorer's part counted as known
            info["prior_level"] = level.split(":")[0]
        elif w < 1.0:  # no labelled row read yet: nothing to blend toward, the scorer's P stands
            info["prior_level"] = "none"
        u = None
        if energy is not None:
            info["checkpoint_j"] = dict(zip(scored.candidates, np.round(E, 3).tolist()))
            E = energy.adjust(E, ekey)
            u = energy.uncertainty(ekey) if explore else None
            info["online_rows"] = int(energy.rows)
            info["context_production_rows"] = round(energy.context_rows(ekey), 1)
        return P, E, Explore(u, spread) if explore else None, info

    def observe(
        self,
        candidate: str,
        prompt_tokens: float,
        output_tokens: float,
        joules: float | None,
        context: str | None,
        estimate_j: float | None = None,
        version: str | None = None,
    ) -> None:
        """One settled production row (writer thread): tokens, joules (J) or None, its context string, the
        checkpoint's estimate (J) at decision time and that checkpoint's ``version``. A row decided by another
        checkpoint than the one served now (in flight across a hot reload) teaches nothing: its estimate was
        that checkpoint's, and the new state corrects the new one's. Without a version (a fallback, or a
        deployment other than the router's choice served) the row is compared with the served checkpoint's
        own token-based estimate, not with ``estimate_j``."""
        with self._lock:
            energy, current = self.energy, self.version
        if not self.enabled or energy is None or (version is not None and version != current):
            return
        estimate_j = estimate_j if version is not None else None
        try:
            ctx = Context.parse(context)
            energy.update(
                candidate, prompt_tokens, output_tokens, joules, (ctx.key or ctx.cluster) if ctx else None, estimate_j
            )
        except Exception as e:  # noqa: BLE001 - the writer thread must not lose the row for this
            log.debug("energy-router: online update skipped: %s", e)

    def refresh_from(self, rows: Iterable[Mapping[str, Any]], wait_s: float = REFRESH_WAIT_S) -> int:
        """Add table rows (streamed, run id order) newer than the last read to the context prior; returns rows used.
        Refreshes run one at a time (another core of the process: waits up to ``wait_s``, then reads nothing), and
        a prior replaced meanwhile (``bind``) gets the rows again next time: nothing is counted twice or lost."""
        with self._turn(wait_s) as ours:
            return self._refresh(lambda since: rows) if ours else 0

    @contextmanager
    def _turn(self, wait_s: float) -> Iterator[bool]:
        """The refresh lock, waited for up to ``wait_s`` (s): yields whether this refresh holds it."""
        ours = self._refreshing.acquire(timeout=wait_s)
        try:
            yield ours
        finally:
            if ours:
                self._refreshing.release()

    def _refresh(self, read: Any) -> int:
        """Feed ``read(since_id)``'s rows after the snapshot's last id to the prior of the same snapshot (the
        refresh lock held); the last id moves only if that prior still serves."""
        with self._lock:
            prior, last = self.prior, self.last_run_id
        if prior is None:
            return 0
        seen = [last]

        def fresh() -> Iterable[Mapping[str, Any]]:
            for r in read(last):
                rid = int(r.get("id", -1))
                if rid > seen[0]:
                    seen[0] = rid
                    yield r

        used = prior.fit_rows(fresh())
        with self._lock:
            if self.prior is prior:
                self.last_run_id = max(self.last_run_id, seen[0])
        return used

    def refresh_table(self, url: str) -> int:
        """:meth:`refresh_from` the table at ``url`` (runs after the last id read); logs and returns rows used."""
        from litellm_energy_router.table import open_store

        with self._turn(REFRESH_WAIT_S) as ours:
            if not ours:
                return 0
            with closing(open_store(url, create=False)) as store:
                n = self._refresh(lambda since: store.iter_runs(since_id=since))
        log.info(
            "energy-router: context prior: %d labelled rows read (%d contexts)",
            n,
            self.prior.n_keys if self.prior else 0,
        )
        return n


def start_refresh(adapt: Adaptation, runtime: Any, url: str, every_s: float) -> None:
    """A daemon thread: once ``runtime``'s scorer serves, fit the context prior from the table at ``url``, then
    read its new rows every ``every_s`` seconds (off the event loop; a table error is logged, retried next turn).
    It ends within ``every_s`` of ``runtime.close()`` (its ``closed`` flag)."""
    import time

    def run() -> None:
        while not runtime.closed:
            runtime.wait_ready(every_s)
            try:
                adapt.bind(runtime.model)
                adapt.refresh_table(url)
            except Exception as e:  # noqa: BLE001 - the prior waits for the next turn, routing goes on
                log.info("energy-router: context prior not refreshed: %s", str(e).splitlines()[0] if str(e) else e)
            time.sleep(every_s)

    threading.Thread(target=run, name="energy-router-context", daemon=True).start()


ADAPT = Adaptation()
