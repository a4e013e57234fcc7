"""Output tokens and joules of one request per candidate, from what the table and the length model know.

:func:`request_tokens`: a task the checkpoint's energy estimate holds gets its per-task mean; any other request
(no task tag, or one never seen) gets the cross-task length model's prediction (:mod:`.length_model`), or the
estimate's conservative prior; never another task's mean. Then the request's own bounds: ``max_tokens`` /
``max_completion_tokens`` (:func:`request_max_tokens`, :func:`bound_tokens`, :func:`bounded_energy`) and each
candidate's context length (:func:`context_room`, :func:`context_bounded_energy`), with the decision's metadata
note (:func:`bounded_note`). Tokens are counts; energies in joules (J); J/token rates in J per token.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from litellm_energy_router.router.length_model import PRIOR_BAND, LengthModel


def bound_tokens(tokens: np.ndarray, max_tokens: Sequence[float | None] | float | None) -> np.ndarray:
    """``tokens[n, K]`` capped at each request's ``max_tokens`` (None: no cap): a request never writes more."""
    if max_tokens is None or (isinstance(max_tokens, (list, tuple)) and all(v is None for v in max_tokens)):
        return tokens
    cap = np.array(
        [np.inf if v is None or v <= 0 else float(v) for v in np.atleast_1d(np.asarray(max_tokens, dtype=object))]
    )
    return np.minimum(tokens, cap[:, None] if tokens.ndim == 2 else cap)


MAX_TOKENS_BOUND = 2**31  # a larger max_tokens bounds nothing (and 10**400 has no float): read as no bound


def request_max_tokens(request_kwargs: dict | None) -> int | None:
    """The request's bound on output tokens (``max_completion_tokens``, else ``max_tokens``), or None;
    anything not a positive integer is ignored (a hostile value never lowers Ê below a real answer's)."""
    for key in ("max_completion_tokens", "max_tokens"):
        v = (request_kwargs or {}).get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_TOKENS_BOUND:
            return v
    return None


def request_tokens(
    est,
    length: "LengthModel | None",
    candidates: Sequence[str],
    texts: Sequence[str | None],
    tasks: Sequence[str | None],
    prompt_tokens: Sequence[float],
    offset: np.ndarray | None = None,
    max_tokens: Sequence[int | None] | None = None,
) -> tuple[np.ndarray, list[dict]]:
    """Expected output tokens ``[n, K]`` per request and candidate, and per request a note for the decision's
    metadata. A task the energy estimate ``est`` (:class:`.checkpoint.EnergyEstimate`) holds: its per-task mean
    (+ ``offset``, the per-task token model) for each candidate with rows of that task; a candidate without
    (a task known from a few production rows of other candidates) is priced like any other request, its
    columns listed in the note's ``length_model_for``. Any other request (no task tag, or a tag never seen):
    ``length``'s prediction, or the estimate's conservative prior without one; never the other tasks' mean.
    ``max_tokens`` bounds each request's figures."""
    n = len(texts)
    prior, out, gap, source = _task_means(est, candidates, tasks)
    if offset is not None:
        out = np.maximum(out + offset, 0.0)
    lo, hi = out, out
    support = [None] * n
    unk = list(range(n)) if gap is None else [i for i in range(n) if gap[i].any()]
    if unk and length is not None:
        pred = length.predict([texts[i] for i in unk], [prompt_tokens[i] for i in unk], prior)
        if gap is None:  # no request of a known task (production traffic): the prediction throughout
            out, lo, hi = pred.mean, pred.lo, pred.hi
        else:
            g = gap[unk]
            out, lo, hi = out.copy(), out.copy(), out.copy()
            out[unk], lo[unk], hi[unk] = (
                np.where(g, p, a[unk]) for p, a in ((pred.mean, out), (pred.lo, lo), (pred.hi, hi))
            )
        for j, i in enumerate(unk):
            support[i] = round(float(pred.support[j]), 4)
            if source[i] == "prior":
                source[i] = pred.source(j)
    elif unk:
        lo, hi = (out * k if gap is None else np.where(gap, out * k, out) for k in PRIOR_BAND)
    caps = list(max_tokens) if max_tokens is not None else [None] * n
    if any(c is not None for c in caps):
        out, lo, hi = (bound_tokens(a, caps) for a in (out, lo, hi))
    bands = np.empty((n, len(candidates), 3))  # [n, K, 3]: one rounding pass, then Python floats
    bands[..., 0], bands[..., 1], bands[..., 2] = lo, out, hi
    bands = np.round(bands, 1, out=bands).tolist()
    notes = [_note(candidates, source[i], support[i], caps[i], bands[i]) for i in range(n)]
    for i in unk:
        if source[i] == "task_mean":
            notes[i]["length_model_for" if length is not None else "prior_for"] = [
                c
                for c, g in zip(candidates, gap[i])
                if g  # a known task's request: gap is not None
            ]
        elif source[i] == "prior":
            notes[i]["prior"] = est.prior_source or "mean of the table's tasks (checkpoint without a prior)"
    return out, notes


def _task_means(
    est, candidates: Sequence[str], tasks: Sequence[str | None]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, list[str]]:
    """(the estimate's prior ``[K]``, output tokens ``[n, K]``: a known task's per-task mean, else the prior, ``gap``
    ``[n, K]``: no row of the request's task for the candidate, or None when no request's task is known (production
    traffic: every entry a gap), the source per request)."""
    fb = est.unknown_task_tokens()
    prior = np.array([fb[c] for c in candidates], dtype=np.float64)
    known = [i for i, task in enumerate(tasks) if est.knows_task(task)]
    out = np.empty((len(tasks), len(prior)))
    out[:] = prior
    source = ["prior"] * len(tasks)
    if not known:
        return prior, out, None, source
    gap = np.ones(out.shape, dtype=bool)
    for i in known:
        table, source[i] = est.output_tokens[tasks[i]], "task_mean"
        out[i] = [table.get(c, fb[c]) for c in candidates]
        gap[i] = [c not in table for c in candidates]
    return prior, out, gap, source


def _note(candidates: Sequence[str], source: str, support: float | None, cap: int | None, bands: list) -> dict:
    """One request's note: where its output tokens came from, and per candidate (``bands[K]``) [80 % low, expected,
    80 % high]."""
    return {
        "output_tokens_source": source,
        "support": support,
        "max_tokens": cap,
        "output_tokens": dict(zip(candidates, bands)),
    }


def bounded_energy(
    E: np.ndarray, tokens: np.ndarray | None, j_out: np.ndarray | None, max_tokens: int | None
) -> np.ndarray:
    """``E`` (J) less the output tokens a request's ``max_tokens`` rules out (per candidate J/output token ``j_out``)."""
    if max_tokens is None or tokens is None or j_out is None:
        return E
    return E - j_out * np.maximum(np.asarray(tokens) - float(max_tokens), 0.0)


def context_room(
    tokens: np.ndarray, prompt_tokens: float, max_tokens: int | None, context: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, output tokens) per candidate within its context length ``context[K]`` (tokens; inf: none):
    the prompt up to the context, the output (bounded by ``max_tokens``) up to what the prompt leaves of it."""
    p = np.minimum(float(prompt_tokens), context)
    return p, np.minimum(bound_tokens(np.asarray(tokens, dtype=float), max_tokens), np.maximum(context - p, 0.0))


def context_bounded_energy(
    E: np.ndarray,
    tokens: np.ndarray | None,
    prompt_tokens: float | None,
    j_prompt: np.ndarray | None,
    j_out: np.ndarray | None,
    max_tokens: int | None,
    context: np.ndarray | None,
) -> np.ndarray:
    """``E`` (J, already :func:`bounded_energy`) less the tokens beyond each candidate's context length ``context[K]``
    (inf: none): a deployment processes no more than its context, prompt and output together; never extrapolated
    past it. Unchanged without a context, or from a scorer that does not give its tokens."""
    if context is None or tokens is None or prompt_tokens is None or j_prompt is None or j_out is None:
        return E
    p, out = context_room(tokens, prompt_tokens, max_tokens, context)
    return (
        E
        - j_prompt * (float(prompt_tokens) - p)
        - j_out * (bound_tokens(np.asarray(tokens, dtype=float), max_tokens) - out)
    )


def bounded_note(
    note: dict | None,
    candidates: Sequence[str],
    max_tokens: int | None,
    prompt_tokens: float | None = None,
    context: np.ndarray | None = None,
) -> dict | None:
    """The scorer's output-token note (a copy: the note is cached) with the request's ``max_tokens`` and the
    candidates' context lengths applied: ``output_tokens`` capped, ``context_tokens`` per candidate with one, and
    ``over_context``: the candidates whose context the prompt (``prompt_tokens``) exceeds, whose Ê is the bound's."""
    if note is None or (max_tokens is None and context is None):
        return note
    out = dict(note, max_tokens=max_tokens) if max_tokens is not None else dict(note)
    room: dict[str, float] = {}
    if context is not None and prompt_tokens is not None:
        ctx = {c: float(n) for c, n in zip(candidates, context) if np.isfinite(n)}
        room = {c: max(n - min(float(prompt_tokens), n), 0.0) for c, n in ctx.items()}
        out.update(
            prompt_tokens=int(prompt_tokens),
            context_tokens={c: int(n) for c, n in ctx.items()},
            over_context=[c for c, n in ctx.items() if prompt_tokens > n],
        )
    caps = {c: [x for x in (max_tokens, room.get(c)) if x is not None] for c in candidates}
    out["output_tokens"] = {
        c: [min([v, *caps.get(c, ())]) for v in vals] for c, vals in note.get("output_tokens", {}).items()
    }
    return out
