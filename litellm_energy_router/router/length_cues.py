"""The cue flags and numeric features a request's text gives the output-length model (:mod:`.length_model`).

:func:`dense_features` reads, from the last :data:`CUE_CHARS` characters of the request: a flag per cue of
:data:`CUES` (code, a letter or option answer, a short answer, a long one, arithmetic, a closing question mark, a
blank to fill), a requested length (:data:`LENGTH_RE`, in tokens by :data:`UNIT_TOKENS`), and the log1p of the
earlier turns, of the prompt tokens and of the characters: :data:`DENSE`, in that order. numpy and ``re`` only; on
ASCII text each pattern is tried only where it can match (:func:`_fires`), with the flags of a search everywhere.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

CUE_CHARS = 4000  # characters of the request's tail the cues read


@dataclass(frozen=True)
class Needs:
    """A cue pattern's necessary characters on ASCII text: every match holds a character of each group (a pattern that
    any position may begin is searched only on a text that has them: most texts have no digit or no "?")."""

    groups: tuple[str, ...]

    def met(self, low: str) -> bool:
        return all(any(c in low for c in g) for g in self.groups)


#: cue name → its alternatives, each (pattern, anchors): lower-case literals one of which begins every match of the
#: pattern on ASCII text (``()``: any position may begin one; :class:`Needs`: any position, on a text with those
#: characters). On an ASCII text (nearly all) a pattern is tried only where one of its anchors occurs: the same flags
#: as a search everywhere, in a tenth of the time (docs/benchmarks.md).
CUES: tuple[tuple[str, tuple[tuple[re.Pattern[str], tuple[str, ...] | Needs], ...]], ...] = tuple(
    (n, tuple((re.compile(p, re.I | re.M), a) for p, a in alts))
    for n, alts in (
        (
            "code",
            (
                (
                    r"\b(write|implement|complete|create|fix)\b[^.?!\n]{0,40}\b(function|program|script|class|method|code|query)\b"
                    r"|```|\bdef \w+\(|\bassert \w+\(|\b(python|javascript|sql|java|c\+\+)\b",
                    (
                        "write",
                        "implement",
                        "complete",
                        "create",
                        "fix",
                        "```",
                        "def ",
                        "assert ",
                        "python",
                        "java",
                        "sql",
                        "c++",
                    ),
                ),
            ),
        ),
        (
            "choice",
            (
                (
                    r"answer with (only )?(the|a|one) (letter|option|number|choice)|\b(choose|select|pick) (the |one )?(correct|best|right)?"
                    r" ?(answer|option|choice)|^[^\S\n]*\(?[A-Ea-e][).:]\s|\boption [1-4A-E]\b|^answer:\s*$",
                    (),
                ),
            ),
        ),
        (
            "short",
            (
                (
                    r"\b(one|single) word\b|\byes or no\b|\btrue or false\b|\bshort answer\b|\bbriefly\b|\bone sentence\b"
                    r"|\bonly (the|give|with) (answer|number|letter|name)|\bwithout (any )?explanation\b|\bsingle (choice|letter)\b",
                    ("one", "single", "yes", "true", "short", "briefly", "only", "without"),
                ),
            ),
        ),
        (
            "long",
            (
                (
                    r"\b(explain|describe|discuss|elaborate|essay|in detail|step[- ]by[- ]step|story|article|blog|poem|report"
                    r"|summari[sz]e|outline|compare)\b",
                    (
                        "explain",
                        "describe",
                        "discuss",
                        "elaborate",
                        "essay",
                        "in detail",
                        "step",
                        "story",
                        "article",
                        "blog",
                        "poem",
                        "report",
                        "summari",
                        "outline",
                        "compare",
                    ),
                ),
            ),
        ),
        (
            "math",
            (
                (
                    r"\b(solve|calculate|compute|how many|how much)\b",
                    ("solve", "calculate", "compute", "how many", "how much"),
                ),
                (r"\d\s*[-+*/^=]\s*\d", Needs(("0123456789", "-+*/^="))),
            ),
        ),
        ("question", ((r"\?\s*\Z", Needs(("?",))),)),
        ("fill", ((r"_{2,}|\bblank\b", ("__", "blank")),)),
    )
)
LENGTH_RE = re.compile(
    r"\b(\d{1,4})\s*(words?|sentences?|paragraphs?|lines?|bullet points?|bullets?|items?|tokens?)\b", re.I
)
#: tokens per requested unit (a word ~1.3 tokens, a sentence ~25, a paragraph ~100, a line ~12, an item ~20)
UNIT_TOKENS = {
    "word": 1.3,
    "sentence": 25.0,
    "paragraph": 100.0,
    "line": 12.0,
    "bullet point": 20.0,
    "bullet": 20.0,
    "item": 20.0,
    "token": 1.0,
}
LENGTH_UNITS = ("word", "sentence", "paragraph", "line", "bullet", "item", "token")  # one begins every LENGTH_RE unit
DENSE = [*(n for n, _ in CUES), "asked_length", "asked_length_log", "turns_log", "prompt_tokens_log", "chars_log"]
#: the flags that inform a length on their own: one of them on, and seen in :data:`MIN_CUE_ROWS` training rows,
#: gives the model full weight whatever the n-gram support (a closing "?" says little about a length)
INFORMATIVE = np.array([n in ("code", "choice", "short", "long", "math", "fill", "asked_length") for n in DENSE])
MIN_CUE_ROWS = 30
_BLANK = re.compile(r"\n\s*\n")


def dense_features(text: str, prompt_tokens: float) -> np.ndarray:
    """The cue flags and numeric features of one request (:data:`DENSE`, in that order)."""
    tail = text[-CUE_CHARS:]
    low = tail.lower() if tail.isascii() else None  # ASCII: lower() maps character for character, as re.I does
    f = []
    for _, alts in CUES:  # plain loops: a generator per cue cost more than most cues' searches
        hit = 0.0
        for p, anchors in alts:
            if _fires(p, tail, low, anchors):
                hit = 1.0
                break
        f.append(hit)
    asked = 0.0
    for m in LENGTH_RE.finditer(tail) if low is None or _may_ask_length(low) else ():
        unit = m.group(2).lower().rstrip("s")
        asked = max(asked, float(m.group(1)) * UNIT_TOKENS.get(unit, UNIT_TOKENS.get(unit + "s", 1.0)))
    turns = len([b for b in _BLANK.split(text) if b.strip()])
    f += [
        1.0 if asked else 0.0,
        math.log1p(asked),
        math.log1p(max(turns - 1, 0)),
        math.log1p(max(prompt_tokens, 0.0)),
        math.log1p(len(text)),
    ]
    return np.asarray(f, dtype=np.float64)


def _may_ask_length(low: str) -> bool:
    """Whether ASCII ``low`` may hold a :data:`LENGTH_RE` match: one of its units and a digit."""
    return any(u in low for u in LENGTH_UNITS) and any(d in low for d in "0123456789")


def _fires(p: re.Pattern[str], tail: str, low: str | None, anchors: tuple[str, ...] | Needs) -> bool:
    """Whether ``p`` matches somewhere in ``tail``: where one of its ``anchors`` occurs in ``low`` (``tail``
    lower-cased, ASCII), else everywhere (with :class:`Needs`: on ASCII text only where it has those characters)."""
    if isinstance(anchors, Needs):
        return (low is None or anchors.met(low)) and p.search(tail) is not None
    if low is None or not anchors:
        return p.search(tail) is not None
    find, match = low.find, p.match
    for a in anchors:
        i = find(a)
        while i >= 0:
            if match(tail, i):
                return True
            i = find(a, i + 1)
    return False
