"""What the router reads from a request: the text to route on, whatever shape LiteLLM was given.

* chat ``messages``: the last user turn, plus a bounded slice of the turns around it (up to 2 before,
  and up to 2 after it, e.g. a tool call and its result; each cut to 1 KiB);
  content may be a string or a list of parts (text parts kept, images/audio ignored); tool calls and
  tool results contribute their text only as context;
* system-only, empty or whitespace content: routed on whatever text exists (possibly ``""``);
* text-completion ``prompt`` and embedding ``input``: ``None`` (pass through to LiteLLM's own choice)
  unless ``route_prompts`` is set.

Never raises: anything unexpected yields ``""`` or ``None``. Output is bounded (``max_chars``).
"""

from __future__ import annotations

from collections.abc import Mapping  # typing's Mapping makes every isinstance check several calls
from typing import Any, Sequence

MAX_CHARS = 8192
CONTEXT_CHARS = 1024
CONTEXT_TURNS = 2


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        return _content_text(content.get("text") if content.get("type", "text") == "text" else None)
    if isinstance(content, (list, tuple)):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif (
                isinstance(p, Mapping)
                and p.get("type") in ("text", "input_text", None)
                and isinstance(p.get("text"), str)
            ):
                parts.append(p["text"])
        return "\n".join(parts)
    return ""


def _message_text(m: Any) -> str:
    if not isinstance(m, Mapping):
        return ""
    text = _content_text(m.get("content"))
    calls = m.get("tool_calls")
    if isinstance(calls, (list, tuple)):
        for c in calls:
            fn = c.get("function") if isinstance(c, Mapping) else None
            if isinstance(fn, Mapping):
                text += f"\n{fn.get('name', '')}({str(fn.get('arguments', ''))[:CONTEXT_CHARS]})"
    return text


def request_chars(messages: Sequence[Any] | None, max_messages: int = 10_000) -> int:
    """Characters of every message's text (system prompt and earlier turns included): the size of the prompt the
    model will read, of which :func:`query_text` keeps a bounded slice to route on. Never raises."""
    try:
        return sum(
            len(_content_text(m.get("content"))) for m in list(messages or ())[-max_messages:] if isinstance(m, Mapping)
        )
    except Exception:  # noqa: BLE001 - a size is a hint, never a failure
        return 0


def _tail(text: str, n: int) -> str:
    return text[-n:] if len(text) > n else text


def query_text(
    messages: Sequence[Any] | None = None,
    prompt: Any = None,
    input: Any = None,
    route_prompts: bool = False,
    max_chars: int = MAX_CHARS,
) -> str | None:
    """The text to route on, or ``None`` when the request should pass through unrouted."""
    try:
        if messages:
            msgs = list(messages)
            idx = next(
                (
                    i
                    for i in range(len(msgs) - 1, -1, -1)
                    if isinstance(msgs[i], Mapping) and msgs[i].get("role") == "user"
                ),
                None,
            )
            if idx is None:  # system-only / assistant-only: route on the last message with text
                texts = [_message_text(m) for m in msgs]
                return _tail(next((t for t in reversed(texts) if t.strip()), ""), max_chars)
            last = _tail(_message_text(msgs[idx]), max_chars)
            before = [_tail(_message_text(m), CONTEXT_CHARS) for m in msgs[max(0, idx - CONTEXT_TURNS) : idx]]
            after = [_tail(_message_text(m), CONTEXT_CHARS) for m in msgs[idx + 1 : idx + 1 + CONTEXT_TURNS]]
            text = "\n\n".join(c for c in [*before, last, *after] if c.strip())
            return _tail(text, max_chars)
        if route_prompts:
            src = prompt if prompt is not None else input
            if isinstance(src, str):
                return _tail(src, max_chars)
            if isinstance(src, (list, tuple)) and src and all(isinstance(x, str) for x in src):
                return _tail(src[-1], max_chars)
        return None
    except Exception:  # noqa: BLE001 - never fail a request over text extraction
        return ""
