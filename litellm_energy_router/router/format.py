"""How a query becomes router input: the one token layout shared by training and serving.

Scoring layout (one forward pass predicts every candidate)::

    [query tokens, cut from the LEFT] [" task: <task>"] <er:q> <er:c0> <er:c1> ... <er:cK-1> <er:end>

The logits at the position of ``<er:cj>`` over the two tokens ``<er:yes>``/``<er:no>`` give
P(candidate j answers correctly). Training puts the yes/no target of slot j in ``labels`` at the
position after ``<er:cj>`` (causal-LM labels are shifted by one inside the model), so no slot ever
sees another slot's answer: training and the one-pass inference see the same inputs.

Choice layout (GRPO policy: λ-conditioned, decoding restricted to the candidate labels)::

    [query tokens] [" task: <task>"] <er:q> <er:lam{b}>   ->   completion: <er:cj>

(the label is predicted at the bucket token itself, so the bucket is in that position's own embedding;
with a constant ``<er:choose>`` after it a small backbone learned only the label marginal).

Long prompts: only the last ``max_chars`` characters are tokenized (bounded time for a 1 MB prompt),
and only the last ``max_len - overhead`` query tokens are kept, so the query itself (at the end of a
few-shot prompt) is never cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

Q, END, YES, NO, CHOOSE = "<er:q>", "<er:end>", "<er:yes>", "<er:no>", "<er:choose>"
N_LAMBDA_BUCKETS = 8
UNKNOWN_TASK = "unknown"


def label_token(j: int) -> str:
    return f"<er:c{j}>"


def lambda_token(b: int) -> str:
    return f"<er:lam{b}>"


def special_tokens(n_candidates: int) -> list[str]:
    """Every token the layout needs; added to a tokenizer as normal (not special) tokens so they
    survive decoding."""
    return (
        [Q, END, YES, NO, CHOOSE]
        + [label_token(j) for j in range(n_candidates)]
        + [lambda_token(b) for b in range(N_LAMBDA_BUCKETS)]
    )


def clean_text(text: str, max_chars: int) -> str:
    """Last ``max_chars`` characters, lone surrogates replaced (never raises)."""
    if len(text) > max_chars:
        text = text[-max_chars:]
    return text.encode("utf-8", "replace").decode("utf-8", "replace")


@dataclass
class Layout:
    """Token ids of the layout for one tokenizer; built once per loaded router."""

    tokenizer: Any
    n_candidates: int
    max_len: int = 256
    max_chars: int = 4096

    def __post_init__(self) -> None:
        conv = self.tokenizer.convert_tokens_to_ids
        self.q_id, self.end_id = conv(Q), conv(END)
        self.yes_id, self.no_id, self.choose_id = conv(YES), conv(NO), conv(CHOOSE)
        self.label_ids = [conv(label_token(j)) for j in range(self.n_candidates)]
        self.lambda_ids = [conv(lambda_token(b)) for b in range(N_LAMBDA_BUCKETS)]
        unk = getattr(self.tokenizer, "unk_token_id", None)
        ids = [self.q_id, self.end_id, self.yes_id, self.no_id, self.choose_id, *self.label_ids]
        if any(i is None or (unk is not None and i == unk) for i in ids):
            raise ValueError("tokenizer lacks the router's layout tokens (was it saved with the checkpoint?)")
        bos = getattr(self.tokenizer, "bos_token_id", None) or getattr(self.tokenizer, "cls_token_id", None)
        self.prefix = [bos] if bos is not None else []

    def _tail(self, task: str | None) -> list[int]:
        key = task or UNKNOWN_TASK
        cache = self.__dict__.setdefault("_tails", {})
        if key not in cache:
            cache[key] = self.tokenizer(f" task: {key}", add_special_tokens=False)["input_ids"]
        return cache[key]

    def _bodies(self, texts: Sequence[str], tasks: Sequence[str | None], reserve: int) -> list[list[int]]:
        batch = self.tokenizer([clean_text(t, self.max_chars) for t in texts], add_special_tokens=False)["input_ids"]
        out = []
        for ids, task in zip(batch, tasks):
            tail = self._tail(task)
            keep = max(self.max_len - reserve - len(tail) - len(self.prefix), 8)
            out.append(self.prefix + ids[-keep:] + tail)
        return out

    def _body(self, text: str, task: str | None, reserve: int) -> list[int]:
        return self._bodies([text], [task], reserve)[0]

    def scoring_batch(self, texts: Sequence[str], tasks: Sequence[str | None]) -> list[tuple[list[int], list[int]]]:
        """Input ids and the positions of the K candidate slots, per text (one batched tokenizer call)."""
        out = []
        for body in self._bodies(texts, tasks, reserve=self.n_candidates + 2):
            start = len(body) + 1
            out.append(
                (body + [self.q_id] + self.label_ids + [self.end_id], list(range(start, start + self.n_candidates)))
            )
        return out

    def scoring_labels(self, ids: Sequence[int], slots: Sequence[int], correct: Sequence[float]) -> list[int]:
        """Causal-LM labels: the yes/no target of slot j at position slot_j + 1, -100 elsewhere."""
        labels = [-100] * len(ids)
        for pos, c in zip(slots, correct):
            labels[pos + 1] = self.yes_id if c >= 0.5 else self.no_id
        return labels

    def choice_ids(self, text: str, task: str | None, bucket: int) -> list[int]:
        """Prompt ids of the λ-conditioned choice layout (completion: one label token)."""
        body = self._body(text, task, reserve=2)
        return body + [self.q_id, self.lambda_ids[bucket]]
