"""How much slower the serving path's text work is on hostile request shapes than on ordinary prose.

    python benchmarks/hostile_text.py

The student scorer decides in place on the event loop, so every per-text function of a decision must stay linear
in the text: one request built to make a regular expression backtrack would stall routing for every tenant. For
each shape (a run of newlines, of spaces, of cue words, ``answer:`` followed by blank lines, ...) at the routed
text's bound (8 KiB), times the text work of a decision — :func:`query_text`, the output-length model's cues
(``dense_features``), its buckets and sketch, the student's n-gram buckets, the prompt-token estimate — as the
median of 20 calls, and divides by the same on prose of the same length. Last line:
``worst_ratio=<x> worst_shape=<name> worst_ms=<y> prose_ms=<z>``.
"""

from __future__ import annotations

import statistics
import time

from litellm_energy_router.litellm_glue.request_text import query_text
from litellm_energy_router.router.length_cues import dense_features
from litellm_energy_router.router.length_model import buckets, text_sketch
from litellm_energy_router.router.student import ngram_buckets
from litellm_energy_router.tokens import estimate_prompt_tokens

N = 8190  # characters: the routed text's bound (8 KiB)
PROSE = ("The committee reviewed the proposal and asked for a revised budget by Friday. " * 200)[:N]
SHAPES = {
    "newlines": "\n" * N,
    "spaces": " " * N,
    "space-newline": " \n" * (N // 2),
    "answer-blank-lines": "answer:" + "\n" * (N - 7),
    "choose": "choose " * (N // 7),
    "write": "write " * (N // 6),
    "option": "option " * (N // 7),
    "choice-lines": "\nA) " * (N // 4),
    "one-char": "x" * N,
    "code-fences": "```" * (N // 3),
}


def text_work(body: str) -> None:
    text = query_text([{"role": "user", "content": f"Q{body}1"}])  # not all whitespace (that is stripped)
    dense_features(text, float(estimate_prompt_tokens(text)))
    buckets(text)
    text_sketch(text)
    ngram_buckets(text, (1, 2, 3), 1 << 16, 512)


def median_ms(body: str, n: int = 20) -> float:
    text_work(body)  # warm-up
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        text_work(body)
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def main() -> None:
    prose = median_ms(PROSE)
    print(f"prose: {prose:.3f} ms")
    worst = ("prose", prose)
    for name, body in SHAPES.items():
        ms = median_ms(body)
        print(f"{name}: {ms:.3f} ms ({ms / prose:.2f}x prose)")
        worst = max(worst, (name, ms), key=lambda x: x[1])
    print(f"worst_ratio={worst[1] / prose:.2f} worst_shape={worst[0]} worst_ms={worst[1]:.3f} prose_ms={prose:.3f}")


if __name__ == "__main__":
    main()
