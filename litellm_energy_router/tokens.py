"""Token counting in the unit of the energy profiles: tiktoken ``cl100k_base`` (RouterBench's own
counting). Lean (no torch); the encoding is built once per process. Inside a LiteLLM process it is
LiteLLM's own (tiktoken, from the file LiteLLM bundles): shared with LiteLLM's token counting, 39 MiB
at most instead of the 90 MiB of a second copy. Elsewhere ``bpe-openai`` (offline) builds it. Both
count identically."""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

import numpy as np

_CL100K_EXACT_CHARS = 32_768


@lru_cache(maxsize=1)
def cl100k() -> Any:
    """The ``cl100k_base`` encoding (``encode(text) -> list[int]``)."""
    if "litellm" in sys.modules:  # LiteLLM's own copy (its bundled file, offline): shared, 39 vs 90 MiB
        try:
            from litellm.litellm_core_utils.default_encoding import encoding

            return encoding
        except Exception:  # noqa: BLE001 - another LiteLLM layout: build our own below
            pass
    from bpe_openai import get_encoding

    return get_encoding("cl100k_base")


def count_prompt_tokens(text: str) -> int:
    """``cl100k_base`` token count of ``text``, in bounded time: texts longer than 32 KiB are counted on
    their last 32 KiB and scaled by length. A special token's text (``<|endoftext|>``) in a prompt counts as
    ordinary text (``encode`` would refuse it, and the request would fail open)."""
    enc = cl100k()
    text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    if len(text) <= _CL100K_EXACT_CHARS:
        return len(enc.encode_ordinary(text))
    sample = text[-_CL100K_EXACT_CHARS:]
    return int(round(len(enc.encode_ordinary(sample)) * len(text) / len(sample)))


def _byte_classes() -> tuple[np.ndarray, np.ndarray]:
    """Per byte value: its class (0 lower-case, 1 upper-case, 2 digit, 3 space, 4 newline or tab, 5 other ASCII,
    6 a UTF-8 lead byte, 7 a continuation byte) and its run class (letters one class, as a UTF-8 character's bytes)."""
    cls = np.full(256, 5, dtype=np.uint8)
    for c in range(256):
        ch = chr(c)
        if c >= 0x80:
            cls[c] = 7 if c < 0xC0 else 6
        elif ch.islower() or ch.isupper() or ch.isdigit() or ch in " \n\r\t":
            cls[c] = 0 if ch.islower() else 1 if ch.isupper() else 2 if ch.isdigit() else 3 if ch == " " else 4
    run = cls.copy()
    run[run == 1] = 0
    run[run == 7] = 6
    return cls, run


_CLS, _RUN = _byte_classes()
_RUN_STARTS = np.array([0, 2, 3, 4, 5, 6])  # the run classes whose runs are counted
#: coefficients of :func:`estimate_prompt_tokens` (tokens per feature of :func:`token_features`), fitted on the
#: bundled RouterBench prompts and answers and LLMRouter queries by ``benchmarks/token_estimate.py``
_EST_W = np.array(
    [0.0544, 0.1687, 0.2362, 0.0409, 0.163, 0.3856, 0.7101, 0.3561, 0.4642, 1.1802, 0.3309, 0.5957, 0.4118, -0.2907]
    + [0.0282]
)


def token_features(text: str) -> np.ndarray:
    """The 15 features of :func:`estimate_prompt_tokens`: the UTF-8 bytes per class (8), the runs that start per
    run class (letters, digits, spaces, newlines, other ASCII, other characters: 6), and 1."""
    b = np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8)
    f = np.zeros(15)
    f[:8] = np.bincount(_CLS[b], minlength=8)
    r = _RUN[b]
    if len(r):
        f[8:14] = np.bincount(r[1:][r[1:] != r[:-1]], minlength=8)[_RUN_STARTS]
        f[8 + int(np.searchsorted(_RUN_STARTS, r[0]))] += 1.0  # the first run starts at the first byte
    f[14] = 1.0
    return f


_W_UNIT = 10_000  # the coefficients have four decimals: in units of 1e-4 they are integers, and the sum exact


def _integer_weights() -> np.ndarray:
    """:data:`_EST_W` in units of 1e-4 (int64): the coefficients have four decimals, so every sum of them is exact."""
    w = np.rint(_EST_W * _W_UNIT).astype(np.int64)
    if not np.allclose(w, _EST_W * _W_UNIT, rtol=0, atol=1e-6):
        raise ValueError("tokens._EST_W: the estimate's coefficients must have at most four decimals")
    return w


def _fused_weights(w: np.ndarray) -> np.ndarray:
    """The integer weights ``w`` per (byte class, whether the byte starts a run), ``[16]``: the class's weight, plus
    its run class's weight where the byte starts a run; one bincount of ``class + 8 · starts`` dotted with it is the
    estimate's sum less the constant, exact."""
    run_of_class = _RUN[[int(np.flatnonzero(_CLS == c)[0]) for c in range(8)]]  # the run class of a byte of each
    return np.concatenate([w[:8], w[:8] + w[8 + np.searchsorted(_RUN_STARTS, run_of_class)]])


_W_INT = _integer_weights()
_FUSED_W, _EST_CONST = _fused_weights(_W_INT), int(_W_INT[14])


def estimate_prompt_tokens(text: str) -> int:
    """``cl100k_base`` tokens of ``text`` estimated from its byte classes (a linear model, :data:`_EST_W`): what
    routing prices a prompt with, in a sixth of the count's time and without its 39 MiB table. Error against the
    count on the bundled texts: 50th / 90th / 99th percentile of |relative error| in docs/benchmarks.md
    (``benchmarks/token_estimate.py``); smaller than the gap between cl100k and a served model's own tokenizer,
    which the profiles' J per token already absorbs. 0 for an empty text, at least 1 otherwise: the features' sum
    (:func:`token_features` · :data:`_EST_W`) computed exactly, rounded half to even."""
    if not text:
        return 0
    b = np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8)
    runs = _RUN[b]
    starts = np.empty(len(b), dtype=np.uint8)
    starts[0] = 8  # the first run starts at the first byte
    np.not_equal(runs[1:], runs[:-1], out=starts[1:])
    starts[1:] <<= 3
    starts += _CLS[b]
    total = int(np.bincount(starts, minlength=16) @ _FUSED_W) + _EST_CONST  # tokens x 1e4, exact
    q, r = divmod(total, _W_UNIT)
    return max(q + (r > _W_UNIT // 2 or (r == _W_UNIT // 2 and q % 2 == 1)), 1)
