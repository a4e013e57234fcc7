"""What the router decided for one request, and how that decision reaches the energy callback.

The decision travels **in-process**, never through caller-controlled data: the routing strategy / proxy
filter records it in :data:`DECISION_BOOK`, keyed by the identity of the request's metadata dict (LiteLLM
hands that very dict object from routing to the callbacks: SDK sync, async and streaming calls, and the
proxy); the energy callback takes it back with :func:`take_decision`. A caller can put anything into
request metadata but cannot make the callback's metadata dict be one the router saw for another request,
so a decision a caller sends (``metadata[DECISION_KEY]``) is never read. The strategy still writes a copy
of its decision under ``metadata[DECISION_KEY]`` (replacing any caller value) for other callbacks to log;
this package never reads it back. Kept free of LiteLLM and torch imports so any layer may use it.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping  # typing's Mapping makes every isinstance check several calls
from dataclasses import dataclass, field
from typing import Any

DECISION_KEY = "energy_router_decision"
KNOB_KEY = "energy_router"  # request metadata: {"energy_router": {"lambda": 0.3}} or {"target_accuracy": 0.9}


@dataclass
class Decision:
    """One routing decision.

    Attributes:
        candidate: chosen candidate name (table key).
        deployment_id: LiteLLM ``model_info.id`` of the chosen deployment, when known.
        scores: predicted probability of a correct answer per candidate, in [0, 1].
        energy_j: estimated joules per candidate for this prompt (J).
        lambda_: energy weight used (accuracy given up per ``knob.e_ref_j`` joules), or None.
        target_accuracy: accuracy target used, or None.
        max_energy_j: energy budget per request used (J, estimated), or None.
        propensity: probability that this policy picks ``candidate`` for this request, in (0, 1].
        router_version: checkpoint version that decided.
        fallback: why the router did not decide (``None`` when it did): e.g. "timeout", "error".
        latency_ms: decision time, milliseconds.
        figures: decision-time energy and carbon estimates of the served request
            (:meth:`litellm_energy_router.litellm_glue.figures.Estimate.as_metadata`), or None.
        energy_note: how the output tokens behind ``energy_j`` were estimated: ``output_tokens_source``
            (task_mean, length_model, prior or length_model+prior: the router was unsure of the length),
            ``output_tokens`` per candidate as [80 % low, expected, 80 % high], ``support`` (cosine; from 0.70 up
            a lower bound), ``max_tokens``; with a deployment context length: ``prompt_tokens``,
            ``context_tokens`` per candidate and ``over_context``, the
            candidates whose context the prompt exceeds (their ``energy_j`` is the context's, not extrapolated).
        adapt: what the online state did (:mod:`~litellm_energy_router.router.adapt`): ``context`` (its hashed
            keys), ``support`` (cosine), ``weight`` of the scorer against the context prior, ``unsure`` (True:
            the router had little support and blended toward the prior), ``prior_level``, ``online_rows``.
    """

    candidate: str | None
    deployment_id: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    energy_j: dict[str, float] = field(default_factory=dict)
    lambda_: float | None = None
    target_accuracy: float | None = None
    max_energy_j: float | None = None
    propensity: float | None = None
    router_version: str | None = None
    fallback: str | None = None
    latency_ms: float | None = None
    figures: dict[str, Any] | None = None
    energy_note: dict[str, Any] | None = None
    adapt: dict[str, Any] | None = None

    def as_metadata(self) -> dict[str, Any]:
        """A plain dict (what ``dataclasses.asdict`` gives, without its recursive deep copy: this runs
        on every routed request)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["scores"], d["energy_j"] = dict(self.scores), dict(self.energy_j)
        if self.energy_note is not None:
            d["energy_note"] = dict(self.energy_note)
        if self.adapt is not None:
            d["adapt"] = dict(self.adapt)
        return d

    @classmethod
    def from_metadata(cls, d: Mapping[str, Any]) -> "Decision":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


class DecisionBook:
    """Decisions made in this process, keyed by the identity of the request's metadata dict.

    ``put`` writes a token private to this book and process (``_energy_router_<name>``: a random prefix and a count)
    into the metadata dict, and a lookup by ``id`` checks it, so a reused ``id`` never finds another request's
    decision; the entry holds the token and the decision, not the dict (whose size the caller chooses). Bounded
    (``maxsize`` entries, oldest dropped, counted in ``energy_router_decisions_evicted_total{book}``): requests no
    callback reads back, e.g. the filter without the energy callback, cost no more than that; more requests in flight
    than that lose their oldest decisions. Thread-safe (LiteLLM logs sync calls on its own threads).
    """

    def __init__(self, maxsize: int = 16_384, name: str = "decisions") -> None:
        from litellm_energy_router.metrics import DECISIONS_EVICTED

        self.maxsize = maxsize
        self._evicted = DECISIONS_EVICTED.labels(book=name)
        self._key = f"_energy_router_{name}"
        self._prefix, self._count = os.urandom(8).hex() + "-", itertools.count()
        self._d: OrderedDict[int, tuple[str, Decision]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._d)

    def put(self, md: dict[str, Any], decision: Decision) -> None:
        """Record ``decision`` for the request whose metadata dict is ``md`` (a retry's replaces it)."""
        token = self._prefix + str(next(self._count))
        md[self._key] = token
        with self._lock:
            self._d.pop(id(md), None)
            self._d[id(md)] = (token, decision)
            while len(self._d) > self.maxsize:
                self._d.popitem(last=False)
                self._evicted.inc()  # that request's row loses its decision (propensity, context, estimate)

    def _entry(self, md: dict[str, Any]) -> tuple[str, Decision] | None:
        """``md``'s entry (lock held): the one under its id whose token ``md`` carries."""
        e = self._d.get(id(md))
        return e if e is not None and md.get(self._key) == e[0] else None

    def discard(self, md: dict[str, Any]) -> None:
        with self._lock:
            if self._entry(md) is not None:
                del self._d[id(md)]

    def get(self, kwargs: Mapping[str, Any], *, take: bool = False) -> Decision | None:
        """The decision recorded for the request of a LiteLLM callback's ``kwargs`` (removed with ``take``)."""
        for md in _metadata_of(kwargs):
            with self._lock:
                e = self._entry(md)
                if e is None:
                    continue
                if take:
                    del self._d[id(md)]
                return e[1]
        return None


DECISION_BOOK = DecisionBook()


def _metadata_of(kwargs: Mapping[str, Any]) -> list[dict[str, Any]]:
    lp = kwargs.get("litellm_params")
    places = [lp.get("metadata"), lp.get("litellm_metadata")] if isinstance(lp, Mapping) else []
    places += [kwargs.get("metadata"), kwargs.get("litellm_metadata")]
    return [md for md in places if isinstance(md, dict)]


def decision_from_kwargs(kwargs: Mapping[str, Any]) -> Decision | None:
    """The decision this process's router made for the request of a LiteLLM callback's ``kwargs``;
    ``None`` when it made none (never a decision found in the request's metadata)."""
    return DECISION_BOOK.get(kwargs)


def take_decision(kwargs: Mapping[str, Any]) -> Decision | None:
    """:func:`decision_from_kwargs`, removing it (the energy callback: one decision, one row)."""
    return DECISION_BOOK.get(kwargs, take=True)
