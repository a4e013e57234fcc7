"""Per-request energy under continuous batching: split each metered interval across the requests in
flight, by tokens processed in it.

Model (units: seconds, joules, watts, tokens):

* A cumulative meter is sampled at ~10 Hz; consecutive samples close an **interval** ``k`` of length
  ``dt_k`` (s) with energy ``E_k`` (J).
* Each request is a set of **segments** ``(a, b, w)``: ``w`` weighted tokens processed uniformly over
  ``[a, b]``, with ``w = prefill_weight * prompt_tokens + decode_weight * output_tokens``. Segments
  come from live progress (``add_progress``: cumulative token counts at a time) or, for a finished
  request, from its timings (``add_request``: prefill over ``[start, first_token]``, decode over
  ``[first_token, end]``).
* ``W_k`` is the weighted tokens processed in interval ``k``: the sum over known requests, or the
  engine's aggregate token counters when sampled with the meter (vLLM ``/metrics``; never less than
  what the known requests claim).
* **Idle** ``I_k = E_k`` when ``W_k = 0``, else ``min(E_k, P_idle * dt_k)`` (the static-power line;
  ``P_idle`` configured in W, ``"auto"`` = the lowest trailing-1 s power seen in the history).
* A request's energy is ``sum_k w_rk * (E_k - I_k) / W_k`` over its intervals.

Conservation: with ``W_k`` from the known requests, ``sum_r energy_r + sum_k I_k = sum_k E_k``
exactly. With aggregate counters, energy of tokens no known request claims is reported as
``unattributed`` (``requests + idle + unattributed = meter``).

**Settlement.** A request's share depends on every request sharing its intervals. Its energy is
final (``settled``) once the interval holding its end and the next one are closed and — unless
aggregate counters are available — every request that started before that interval's end is known
up to it. ``final=True`` answers with what is known.

Memory is bounded: intervals and requests older than ``history_s`` are dropped. Optional caps bound it
against a flood too: at most ``max_requests`` requests and ``max_segments`` segments are tracked (the
oldest requests are dropped first), and an unfinished request not heard from for ``stale_s`` seconds
expires (so a request whose engine died stops holding back settlement). Drops are counted per reason
in ``dropped_requests``. A dropped request's tokens stay in the intervals they fell in, so the other
requests' shares do not change.

The intervals and requests kept, and their lock-held bookkeeping, are in :mod:`.attribution_state`.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Literal, Sequence

from litellm_energy_router.energy.attribution_state import _EPS, AttributionState, _Interval, _overlap_w, _Request

CLOCK_STEP_S = 0.25  # s: a wall-clock advance this far from the monotonic one between two samples is a step (NTP)


def token_weight(
    prompt_tokens: float, output_tokens: float, prefill_weight: float, decode_weight: float = 1.0
) -> float:
    """Weighted tokens of a request: ``prefill_weight * prompt_tokens + decode_weight * output_tokens``."""
    return prefill_weight * prompt_tokens + decode_weight * output_tokens


def split_energy(energy_j: float, weights: Sequence[float], total: float | None = None) -> list[float]:
    """Split ``energy_j`` (J) by weight: share ``i`` is ``energy_j * min(weights[i] / total, 1)`` J.

    ``weights`` are weighted tokens (:func:`token_weight`), or 1 per request for an equal split;
    ``total`` is the weighted tokens the energy was spent on (default: ``sum(weights)``, so the shares
    add up to ``energy_j``). When ``total`` is 0 every share is equal.
    """
    w_total = sum(weights) if total is None else total
    if w_total <= 0:
        return [energy_j / len(weights)] * len(weights) if weights else []
    return [energy_j * min(w / w_total, 1.0) for w in weights]


@dataclass(frozen=True)
class Attribution:
    """Energy attributed to one request: joules (J), its span (Unix s), settled or provisional."""

    request_id: str
    energy_j: float
    start_s: float
    end_s: float
    settled: bool

    @property
    def avg_power_w(self) -> float | None:
        d = self.end_s - self.start_s
        return self.energy_j / d if d > 0 else None


@dataclass(frozen=True)
class Totals:
    """Energy lines over a window, joules: ``requests + idle + unattributed == meter``."""

    meter_j: float
    requests_j: float
    idle_j: float
    unattributed_j: float
    t0: float | None
    t1: float | None


class Attributor(AttributionState):
    """Thread-safe attribution core shared by the GPU-node agent and in-process counter meters.

    Args:
        prefill_weight: weight of one prompt (prefill) token relative to ``decode_weight``.
        decode_weight: weight of one output (decode) token.
        idle_power_w: static power line, W; ``"auto"`` estimates it as the lowest trailing power over
            ``floor_window_s`` seen in the history.
        history_s: seconds of intervals and requests kept.
        floor_window_s: window of the ``"auto"`` idle estimate, s (≥ the meter's update period).
        max_requests: most requests tracked (finished or not); ``None``: no cap.
        max_segments: most token segments tracked over all requests; ``None``: no cap.
        stale_s: an unfinished request without progress for this long (s, by sample time) expires;
            ``None``: only the history bounds it.
    """

    def __init__(
        self,
        *,
        prefill_weight: float = 0.125,
        decode_weight: float = 1.0,
        idle_power_w: float | Literal["auto"] = 0.0,
        history_s: float = 600.0,
        floor_window_s: float = 1.0,
        max_requests: int | None = None,
        max_segments: int | None = None,
        stale_s: float | None = None,
    ) -> None:
        if prefill_weight < 0 or decode_weight <= 0:
            raise ValueError("prefill_weight must be >= 0 and decode_weight > 0")
        if any(v is not None and not v > 0 for v in (max_requests, max_segments, stale_s)):
            raise ValueError("max_requests, max_segments and stale_s must be > 0 (or None)")
        super().__init__(
            idle_power_w=idle_power_w,
            history_s=history_s,
            floor_window_s=floor_window_s,
            max_requests=max_requests,
            max_segments=max_segments,
            stale_s=stale_s,
        )
        self.wp = float(prefill_weight)
        self.wd = float(decode_weight)
        self._lock = threading.Lock()

    # -- inputs -----------------------------------------------------------------------------------
    def add_sample(
        self,
        t: float,
        cumulative_j: float,
        prefill_total: float | None = None,
        decode_total: float | None = None,
        mono: float | None = None,
    ) -> None:
        """A meter reading at ``t`` (Unix s): cumulative J; optionally the engine's cumulative token
        counters (prompt, generation) sampled at the same time, and ``mono``, a monotonic clock (s) read with ``t``.

        A wall-clock step (NTP) is a span without a trustworthy time: a ``t`` at or before the last sample's (a step
        back), or, with ``mono``, a wall-clock advance that differs from the monotonic one by more than
        :data:`CLOCK_STEP_S` (a step forward), opens a hole as failed reads do; sampling resumes once ``t`` passes
        every time already measured, and a request across the hole gets no figure (not the joules of the step)."""
        if not math.isfinite(cumulative_j):  # a meter's NaN or inf: no reading (it would poison two intervals)
            return
        agg = None
        if prefill_total is not None and decode_total is not None:
            agg = token_weight(float(prefill_total), float(decode_total), self.wp, self.wd)
            if not math.isfinite(agg):
                agg = None
        with self._lock:
            if self._last is not None and (t <= self._last[0] or self._stepped(t, mono)):
                self._open_gap()
            if self._last is None:
                if self._gap_from is not None:
                    if t <= self._resume_after:  # the clock stepped back: no sample until it passes what is measured
                        self._gap_from = min(self._gap_from, t)
                        return
                    self._holes = [*self._holes[-255:], (self._gap_from, t)]  # failed reads or a step: a hole
                self._last, self._gap_from, self._mono = (t, cumulative_j, agg), None, mono
                self._pending = [seg for seg in self._pending if seg[1] > t]  # none of the rest reaches an interval
                return
            t_prev, e_prev, agg_prev = self._last
            self._mono = mono
            de = cumulative_j - e_prev
            if de < 0:  # counter reset (driver reload): restart from this reading
                de = 0.0
            w = None
            if agg is not None and agg_prev is not None:
                w = max(agg - agg_prev, 0.0)
            iv = _Interval(t_prev, t, de, w)
            self._ivs.append(iv)
            self._t1s.append(t)
            self._last = (t, cumulative_j, agg)
            still = []
            for seg in self._pending:
                iv.curve_w += _overlap_w(seg, iv.t0, iv.t1)
                if seg[1] > t:
                    still.append(seg)
            self._pending = still
            self._update_floor()
            self._prune(t)
            self._expire_stale(t)

    def read_failed(self) -> None:
        """The meter could not be read: the span until the next reading has no energy (a power-sampling meter
        resumes without the joules of the gap), so a request across it gets no figure."""
        with self._lock:
            if self._last is not None:
                self._open_gap()

    def _open_gap(self) -> None:
        """From the last good sample on, no reading counts until a new one starts the intervals again (lock held)."""
        self._gap_from = self._resume_after = self._last[0]  # type: ignore[index]
        self._last = None

    def _stepped(self, t: float, mono: float | None) -> bool:
        """Whether the wall clock stepped since the last sample: its advance and the monotonic clock's differ by more
        than :data:`CLOCK_STEP_S` (both read with the samples; lock held)."""
        if mono is None or self._mono is None or self._last is None:
            return False
        return abs((t - self._last[0]) - (mono - self._mono)) > CLOCK_STEP_S

    def request_started(self, request_id: str, t: float) -> None:
        """A request started at ``t`` (Unix s). Lock-free: safe on a serving hot path."""
        self._started.append((request_id, t))

    def add_progress(
        self, request_id: str, t: float, prompt_done: float, output_done: float, finished: bool = False
    ) -> None:
        """Live progress: cumulative prompt tokens prefilled and output tokens decoded by ``t``."""
        with self._lock:
            self._drain_started()
            r = self._reqs.get(request_id)
            if r is None and self.evicted(request_id):
                return  # dropped (cap, stale): its tokens so far are in the curve; no figure rather than a wrong one
            if r is None:
                r = self._track(request_id, _Request(start=t, known_until=t), is_open=True)
            elif request_id in self._open:
                self._open[request_id] = self._open.pop(request_id)  # most recently updated last
            if t >= r.known_until and not r.finished:
                dp = max(prompt_done - r.prefill, 0.0)
                dd = max(output_done - r.decode, 0.0)
                self._add_segment(r, r.known_until, t, token_weight(dp, dd, self.wp, self.wd))
                r.prefill, r.decode = max(prompt_done, r.prefill), max(output_done, r.decode)
                r.known_until = t
            if finished:
                r.finished, r.end = True, r.known_until
                self._open.pop(request_id, None)
            self._enforce_caps()

    def add_request(
        self,
        request_id: str,
        start: float,
        end: float,
        prompt_tokens: int,
        completion_tokens: int,
        first_token: float | None = None,
        prefill_fraction: float = 0.1,
    ) -> bool:
        """A finished request from its timings (Unix s). Prefill is spread over ``[start,
        first_token]``; without a usable first-token time, over the first ``prefill_fraction`` of
        the request. When :meth:`request_started` saw the request later than ``start`` (the backend
        call began after the proxy's own processing), the span starts there. Returns ``False`` if
        the request was already known as finished, or was dropped (cap, stale: it gets no figure)."""
        end = max(end, start)
        if first_token is None or not (start <= first_token < end):
            first_token = start + prefill_fraction * (end - start)
        with self._lock:
            self._drain_started()
            r = self._reqs.get(request_id)
            if r is None and self.evicted(request_id):
                return False  # dropped (cap, stale) with its tokens in the curve: no figure rather than a wrong one
            if r is not None and (r.finished or r.segments):
                if not r.finished:  # known from progress events that lag: its tokens since then, up to its end
                    r.end = max(r.known_until, end)
                    dp, dd = max(prompt_tokens - r.prefill, 0.0), max(completion_tokens - r.decode, 0.0)
                    self._add_segment(r, r.known_until, r.end, token_weight(dp, dd, self.wp, self.wd))
                    r.prefill, r.decode = max(r.prefill, float(prompt_tokens)), max(r.decode, float(completion_tokens))
                    r.finished, r.known_until = True, r.end
                    self._open.pop(request_id, None)
                return False
            o = self._open.pop(request_id, None)
            if o is not None and start < o.start <= end:
                # started (request_started) later than the caller's start: the backend call began then.
                # Using that time keeps settlement consistent: no request can later claim tokens in a
                # span that was already settled.
                start = o.start
                first_token = max(first_token, start)
            self._reqs.pop(request_id, None)  # known without tokens: replaced
            r = self._track(request_id, _Request(start=start, known_until=end, finished=True, end=end))
            r.prefill, r.decode = float(prompt_tokens), float(completion_tokens)
            self._add_segment(r, start, first_token, self.wp * prompt_tokens)
            self._add_segment(r, first_token, end, self.wd * completion_tokens)
            self._enforce_caps()
            return True

    def discard(self, request_id: str) -> None:
        """Stop tracking a request that will get no figure (it ended before the kept history): started and never
        finished, it would hold back the settlement of every request beside it."""
        with self._lock:
            self._drain_started()
            if request_id in self._reqs:
                self._forget(request_id)

    # -- outputs ----------------------------------------------------------------------------------
    def knows(self, request_id: str) -> bool:
        with self._lock:
            self._drain_started()
            r = self._reqs.get(request_id)
            return r is not None and (r.finished or bool(r.segments))

    def energy(self, request_id: str, *, final: bool = False) -> Attribution | None:
        """Energy of a request; ``None`` when unknown, or not settled yet and not ``final``."""
        with self._lock:
            self._drain_started()
            r = self._reqs.get(request_id)
            if r is None or (not r.segments and not r.finished):
                return None
            end = r.end if r.end is not None else r.known_until
            if not self._ivs or self._unmeasured(r.start, end):
                return None  # before the kept history, or across failed reads: unknown, not the part measured
            settled = self._settled(request_id, r, end)
            if not settled and not final:
                return None
            if not settled and self._ivs[-1].t1 < end - _EPS:
                return None  # the meter stopped reading before the request ended: unknown, not the part it saw
            if r.answer is not None:
                return r.answer
            # settled, or final (the caller writes it now): given for good, its joules claimed, so no later answer can
            # take them again (a provisional answer left unclaimed let requests beside it add up to more than the
            # meter); asked again, the same answer
            r.answer = Attribution(request_id, self._claim(r, commit=True), r.start, end, settled)
            return r.answer

    def _claim(self, r: _Request, commit: bool) -> float:
        """``r``'s joules (J): per interval its share of the dynamic energy by weighted tokens, at most what the
        settled answers already given left of it (a request the meter's side learnt of late, without engine
        counters, cannot take joules another request was already given: settled answers never add up to more than
        the meter measured); with ``commit`` (a settled answer) the shares are marked as given. Lock held."""
        floor = self._floor_w()
        shares: dict[int, float] = {}
        for seg in r.segments:
            for k in self._span(seg[0], seg[1]):
                iv = self._ivs[k]
                wk = _overlap_w(seg, iv.t0, iv.t1)
                if wk <= 0:
                    continue
                W = _denominator(iv)
                if W <= _EPS:
                    continue
                dyn = iv.energy_j - _idle(iv, W, floor)
                shares[k] = shares.get(k, 0.0) + split_energy(dyn, [wk], W)[0]
        total = 0.0
        for k, share in shares.items():
            iv = self._ivs[k]
            if share > 0:
                share = min(share, max(iv.energy_j - _idle(iv, _denominator(iv), floor) - iv.claimed_j, 0.0))
                if commit:
                    iv.claimed_j += share
            total += share
        return total

    def totals(self, t0: float | None = None, t1: float | None = None) -> Totals:
        """Energy lines (J) over the closed intervals inside ``[t0, t1]`` (default: all history)."""
        with self._lock:
            floor = self._floor_w()
            m = req = idle = un = 0.0
            first = last = None
            for iv in self._ivs:
                if (t0 is not None and iv.t0 < t0 - _EPS) or (t1 is not None and iv.t1 > t1 + _EPS):
                    continue
                first = iv.t0 if first is None else first
                last = iv.t1
                W = _denominator(iv)
                i = _idle(iv, W, floor)
                dyn = iv.energy_j - i
                known = split_energy(dyn, [iv.curve_w], W)[0] if W > _EPS else 0.0
                m += iv.energy_j
                idle += i
                req += known
                un += dyn - known
            return Totals(m, req, idle, un, first, last)

    def covers(self, t: float) -> bool:
        """True when the kept history starts before ``t`` (Unix s)."""
        with self._lock:
            first = self._ivs[0].t0 if self._ivs else (self._last[0] if self._last else None)
            return first is not None and first < t

    def idle_power_floor_w(self) -> float:
        with self._lock:
            return self._floor_w()

    def in_flight(self) -> int:
        with self._lock:
            self._drain_started()
            return len(self._open)

    def tracked(self) -> int:
        """Requests tracked (finished or not)."""
        with self._lock:
            self._drain_started()
            return len(self._reqs)

    def tracked_segments(self) -> int:
        """Token segments tracked over all requests."""
        with self._lock:
            return self._n_segments

    def dropped(self) -> dict[str, int]:
        """Requests dropped so far, by reason: ``cap`` (over max_requests/max_segments), ``stale``."""
        with self._lock:
            return dict(self.dropped_requests)

    def last_sample_t(self) -> float | None:
        with self._lock:
            return self._last[0] if self._last else None


def _denominator(iv: _Interval) -> float:
    """Weighted tokens the interval's dynamic energy is divided by: the engine's aggregate when
    known (never less than what known requests claim, so shares never exceed the interval)."""
    return iv.curve_w if iv.agg_w is None else max(iv.agg_w, iv.curve_w)


def _idle(iv: _Interval, W: float, floor_w: float) -> float:
    if W <= _EPS:
        return iv.energy_j
    return min(iv.energy_j, floor_w * (iv.t1 - iv.t0))
