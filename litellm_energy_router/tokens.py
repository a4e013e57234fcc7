"""Token counting in the unit of the energy profiles: tiktoken ``cl100k_base`` (RouterBench's own
counting), via ``bpe-openai``. Lean (no torch); the encoding is built once per process."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

_CL100K_EXACT_CHARS = 32_768


@lru_cache(maxsize=1)
def cl100k() -> Any:
    """The ``cl100k_base`` encoding (``encode(text) -> list[int]``)."""
    from bpe_openai import get_encoding

    return get_encoding("cl100k_base")


def count_prompt_tokens(text: str) -> int:
    """``cl100k_base`` token count of ``text``, in bounded time: texts longer than 32 KiB are counted on
    their last 32 KiB and scaled by length."""
    enc = cl100k()
    text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    if len(text) <= _CL100K_EXACT_CHARS:
        return len(enc.encode(text))
    sample = text[-_CL100K_EXACT_CHARS:]
    return int(round(len(enc.encode(sample)) * len(text) / len(sample)))
