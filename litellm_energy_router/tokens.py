"""Token counting in the unit of the energy profiles: tiktoken ``cl100k_base`` (RouterBench's own
counting). Lean (no torch); the encoding is built once per process. Inside a LiteLLM process it is
LiteLLM's own (tiktoken, from the file LiteLLM bundles): shared with LiteLLM's token counting, 39 MiB
at most instead of the 90 MiB of a second copy. Elsewhere ``bpe-openai`` (offline) builds it. Both
count identically."""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

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
