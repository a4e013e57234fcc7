"""The state under :class:`~.attribution.Attributor` and its lock-held bookkeeping.

:class:`AttributionState` holds the metered intervals (``t0``, ``t1`` in Unix s; energy in J; weighted
tokens) and the tracked requests with their token segments ``(a, b, w)`` (``w`` weighted tokens
processed uniformly over ``[a, b]``, Unix s), and the methods that keep them: tracking requests,
bounding memory (``max_requests``, ``max_segments``, ``stale_s`` and ``history_s`` in s), placing
segments into intervals, the settlement test, and the ``"auto"`` idle-power floor (W). It is not
thread-safe on its own: :class:`~.attribution.Attributor` calls these methods with its lock held. The
model and its rules are in :mod:`.attribution`.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Literal

_EPS = 1e-9
_TOUCH_S = 1e-6  # s: the least overlap of a segment and an interval that counts
MIN_EVICTED = 4096  # dropped request ids remembered (at least; ``max_requests`` if larger)


@dataclass
class _Interval:
    t0: float
    t1: float
    energy_j: float
    agg_w: float | None = None  # aggregate weighted tokens from engine counters
    curve_w: float = 0.0  # sum of known requests' weighted tokens
    claimed_j: float = 0.0  # dynamic joules already given to requests in settled answers


@dataclass
class _Request:
    start: float
    known_until: float
    finished: bool = False
    end: float | None = None
    prefill: float = 0.0  # cumulative tokens at known_until
    decode: float = 0.0
    segments: list[tuple[float, float, float]] = field(default_factory=list)
    answer: Any = None  # the settled Attribution given: asked again, the same (its joules claimed once)


class AttributionState:
    """Intervals and requests of an :class:`~.attribution.Attributor`, and their bookkeeping (lock held).

    Args: as :class:`~.attribution.Attributor`'s ``idle_power_w`` (W or ``"auto"``), ``history_s``,
    ``floor_window_s``, ``stale_s`` (s), ``max_requests`` and ``max_segments``, already validated.
    """

    def __init__(
        self,
        *,
        idle_power_w: float | Literal["auto"],
        history_s: float,
        floor_window_s: float,
        max_requests: int | None,
        max_segments: int | None,
        stale_s: float | None,
    ) -> None:
        self.max_requests, self.max_segments, self.stale_s = max_requests, max_segments, stale_s
        self.idle_power_w = idle_power_w
        self.history_s = float(history_s)
        self.floor_window_s = float(floor_window_s)
        self._ivs: list[_Interval] = []
        self._t1s: list[float] = []
        self._last: tuple[float, float, float | None] | None = None  # (t, cumulative J, aggregate W)
        self._reqs: dict[str, _Request] = {}
        self._open: dict[str, _Request] = {}  # started, not finished; least recently updated first
        self._n_segments = 0
        self.dropped_requests = {"cap": 0, "stale": 0}
        self._pending: list[tuple[float, float, float]] = []  # segments reaching past the last sample
        self._started: deque[tuple[str, float]] = deque()  # lock-free inbox for request_started
        self._trail: deque[float] = deque()
        self._floor: float | None = None
        self.dropped_intervals = 0
        self._gap_from: float | None = None  # the last good sample before failed reads or a clock step (Unix s)
        self._resume_after = 0.0  # Unix s: after a clock step back, samples resume past this (the last measured)
        self._mono: float | None = None  # the monotonic clock (s) read with the last sample, when its meter gives one
        self._holes: list[tuple[float, float]] = []  # spans with no reading (failed reads): no figure across them
        #: requests dropped (cap, stale), newest last, bounded: their tokens stay in the curve, so a later event of one
        #: would re-add it with its tokens counted twice (or all at once): ignored, the request gets no figure
        self._evicted: OrderedDict[str, None] = OrderedDict()

    # -- internals (lock held) --------------------------------------------------------------------
    def _drain_started(self) -> None:
        if not self._started:
            return
        while self._started:
            rid, t = self._started.popleft()
            if rid not in self._reqs and rid not in self._evicted:
                self._track(rid, _Request(start=t, known_until=t), is_open=True)
        self._enforce_caps()

    def _track(self, rid: str, r: _Request, *, is_open: bool = False) -> _Request:
        self._reqs[rid] = r
        if is_open:
            self._open[rid] = r
        return r

    def _forget(self, rid: str, reason: str | None = None, remember: bool = True) -> None:
        """Stop tracking ``rid``; with a ``reason`` (cap, stale) it is counted as dropped and, when ``remember`` (its
        tokens are in the curve), its later events are ignored (:meth:`evicted`)."""
        r = self._reqs.pop(rid)
        self._open.pop(rid, None)
        self._n_segments -= len(r.segments)
        if reason is not None:
            self.dropped_requests[reason] += 1
        if reason is not None and remember:
            self._evicted[rid] = None
            while len(self._evicted) > max(self.max_requests or 0, MIN_EVICTED):
                self._evicted.popitem(last=False)

    def evicted(self, rid: str) -> bool:
        """Whether ``rid`` was dropped (cap or stale) recently: its later events are ignored."""
        return rid in self._evicted

    def _enforce_caps(self) -> None:
        """Drop the oldest requests while over ``max_requests`` or ``max_segments``."""
        while self._reqs and (
            (self.max_requests is not None and len(self._reqs) > self.max_requests)
            or (self.max_segments is not None and self._n_segments > self.max_segments)
        ):
            self._forget(next(iter(self._reqs)), "cap")

    def _expire_stale(self, now: float) -> None:
        """Drop unfinished requests without progress since ``now - stale_s`` (least recently updated first)."""
        if self.stale_s is None:
            return
        horizon = now - self.stale_s
        while self._open:
            rid, r = next(iter(self._open.items()))
            if r.known_until >= horizon:
                break
            # one known only from request_started (the proxy's own meter learns its tokens at the end) has no tokens
            # in the curve: dropped to stop holding back settlement, but not ignored: its row still gets a figure
            self._forget(rid, "stale", remember=bool(r.segments))

    def _add_segment(self, r: _Request, a: float, b: float, w: float) -> None:
        if w <= 0:
            return
        seg = (a, max(a, b), w)
        r.segments.append(seg)
        self._n_segments += 1
        for k in self._span(seg[0], seg[1]):
            iv = self._ivs[k]
            iv.curve_w += _overlap_w(seg, iv.t0, iv.t1)
        if self._last is None or seg[1] > self._last[0]:
            self._pending.append(seg)
            if self.max_segments is not None and len(self._pending) > self.max_segments:
                del self._pending[: len(self._pending) - self.max_segments]  # a meter failing for long: bounded

    def _span(self, a: float, b: float) -> range:
        """Indices of the closed intervals ``(t0, t1]`` a segment ``[a, b]`` touches (contiguous)."""
        n = len(self._ivs)
        if b - a <= _EPS:
            k = bisect.bisect_left(self._t1s, a)
            return range(k, k + 1) if k < n and self._ivs[k].t0 < a else range(0)
        return range(bisect.bisect_right(self._t1s, a), min(bisect.bisect_left(self._t1s, b) + 1, n))

    def _settled(self, rid: str, r: _Request, end: float) -> bool:
        if not r.finished:  # still running (or its end not reported yet): more tokens may come
            return False
        hi = bisect.bisect_left(self._t1s, end)
        if hi >= len(self._ivs) - 1:
            return False  # the interval holding the end (and one more, as a margin) must be closed
        lo = bisect.bisect_left(self._t1s, r.start)
        span = self._ivs[lo : hi + 1]
        if span and all(iv.agg_w is not None for iv in span):
            return True  # aggregate counters: other requests do not matter
        # every request that may put tokens into the intervals we touch must be known up to their end
        cut = self._t1s[hi]
        for oid, o in self._open.items():
            if oid != rid and o.start < cut and o.known_until < cut:
                return False
        return True

    def _floor_w(self) -> float:
        if self.idle_power_w == "auto":
            return self._floor or 0.0
        return float(self.idle_power_w)

    def _update_floor(self) -> None:
        if self.idle_power_w != "auto":
            return
        # trailing power over >= floor_window_s ending at the newest interval
        e = 0.0
        t_end = t_next = self._ivs[-1].t1
        for iv in reversed(self._ivs):
            if iv.t1 < t_next - _EPS:  # a hole (failed reads, a clock step): no contiguous window ends here
                break
            e += iv.energy_j
            t_next = iv.t0
            if t_end - iv.t0 >= self.floor_window_s - _EPS:
                p = e / (t_end - iv.t0)
                self._trail.append(p)
                break
        n_keep = max(1, len(self._ivs))
        while len(self._trail) > n_keep:
            self._trail.popleft()
        self._floor = min(self._trail) if self._trail else None

    def _unmeasured(self, a: float, b: float) -> bool:
        """Whether ``[a, b]`` (Unix s) is not wholly measured: it starts before the kept history (the meter began,
        or its history was pruned, after it started) or crosses a span of failed reads."""
        return a < self._ivs[0].t0 - _TOUCH_S or any(h0 < b and a < h1 for h0, h1 in self._holes)

    def _prune(self, now: float) -> None:
        horizon = now - self.history_s
        self._holes = [h for h in self._holes if h[1] >= horizon]
        n = bisect.bisect_right(self._t1s, horizon)
        if n > max(64, len(self._ivs) // 10):
            del self._ivs[:n]
            del self._t1s[:n]
            self.dropped_intervals += n
            for rid in [rid for rid, r in self._reqs.items() if (r.end if r.finished else r.known_until) < horizon]:
                self._forget(rid)  # an unfinished one too: stop waiting for it


def _overlap_w(seg: tuple[float, float, float], t0: float, t1: float) -> float:
    """Weighted tokens of a uniform segment falling in ``(t0, t1]`` (an instant segment counts in the
    interval that contains it)."""
    a, b, w = seg
    if b - a <= _EPS:
        return w if t0 < a <= t1 else 0.0
    ov = min(b, t1) - max(a, t0)
    # an overlap under a microsecond is the rounding of Unix times (~0.2 µs at today's), not tokens in the interval:
    # counted, it would give a request that ends on a sample time the whole next interval when no one else claims it
    return w * ov / (b - a) if ov > _TOUCH_S else 0.0
