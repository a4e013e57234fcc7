"""What the GPU-node agent accepts from callers: request bodies and query strings, validated and bounded.

Everything a caller sends is treated as hostile. A ``POST /v1/progress`` body is read up to
``max_body_bytes`` (413 beyond), must be UTF-8 JSON (any nesting depth Python's parser survives) and
match :class:`ProgressBody`: at most :data:`MAX_EVENTS` events, each with a request id of visible ASCII
(1..:data:`MAX_ID_LEN` characters), a finite timestamp inside the agent's window (see
:class:`TimeWindow`), integer token counts in ``[0, MAX_TOKENS]`` and a boolean ``finished``; unknown
fields are refused. A ``GET /v1/energy/{id}`` query must match :class:`TimingsQuery`. Any violation
raises :class:`ApiError`, whose message is one line naming the field (``events[3].prompt_tokens``)
and the offending value (shortened); a batch is accepted or refused as a whole.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

MAX_TOKENS = 10_000_000  # cumulative tokens of one request (prompt or output): above any context window in use
MAX_EVENTS = 1000  # progress events per body
MAX_ID_LEN = 256  # characters of a request id

RequestId = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_ID_LEN, pattern=r"^[!-~]+$")]
TokenCount = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
QueryTokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
Timestamp = Annotated[float, Field(allow_inf_nan=False)]
_REQUEST_ID = TypeAdapter(RequestId)


class ApiError(ValueError):
    """A refused request: ``status`` (400, 413) and a one-line message naming the field."""

    def __init__(self, status: int, msg: str) -> None:
        super().__init__(msg)
        self.status = status


@dataclass(frozen=True)
class TimeWindow:
    """Timestamps (Unix s) the agent accepts: ``[now - history_s - skew_s, now + skew_s]``. Older ones
    fall outside the kept history; later ones would be future clock skew or an attack."""

    lo: float
    hi: float

    @classmethod
    def around(cls, now: float, history_s: float, skew_s: float) -> "TimeWindow":
        return cls(now - history_s - skew_s, now + skew_s)

    def check(self, t: float | None) -> float | None:
        if t is not None and not self.lo <= t <= self.hi:
            raise ValueError(
                f"outside the agent's window [{self.lo:.3f}, {self.hi:.3f}] (Unix s; history and clock skew)"
            )
        return t


def _in_window(t: float | None, info: ValidationInfo) -> float | None:
    window = (info.context or {}).get("window")
    return window.check(t) if window is not None else t


class ProgressEvent(BaseModel):
    """Cumulative token counts of one request at Unix time ``t``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: RequestId
    t: Annotated[float, Field(strict=True, allow_inf_nan=False)]
    prompt_tokens: TokenCount = 0
    output_tokens: TokenCount = 0
    finished: StrictBool = False

    _t_window = field_validator("t")(_in_window)


class ProgressBody(BaseModel):
    """``POST /v1/progress``: ``{"events": [ProgressEvent, ...]}`` (1..MAX_EVENTS events)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    events: Annotated[list[ProgressEvent], Field(min_length=1, max_length=MAX_EVENTS)]


class TimingsQuery(BaseModel):
    """``GET /v1/energy/{id}?start=&end=&first_token=&prompt_tokens=&completion_tokens=&final=``: a
    finished request's timings (Unix s) and token counts; without ``start``/``end`` a plain lookup."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: Timestamp | None = None
    end: Timestamp | None = None
    first_token: Timestamp | None = None
    prompt_tokens: QueryTokens = 0
    completion_tokens: QueryTokens = 0
    final: bool = False

    _windows = field_validator("start", "end", "first_token")(_in_window)

    @model_validator(mode="after")
    def _span(self) -> "TimingsQuery":
        if (self.start is None) != (self.end is None):
            raise ValueError("start and end go together")
        if self.start is not None and self.end is not None and self.end < self.start:
            raise ValueError(f"end {self.end!r} is before start {self.start!r}")
        return self


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _shown(value: Any) -> str:
    s = type(value).__name__ if isinstance(value, (dict, list)) else repr(value)
    return s if len(s) <= 40 else s[:37] + "..."


def error_line(err: ValidationError, what: str) -> str:
    """The first error of ``err`` as one line: ``{what}: {field} = {value}: {message}``."""
    e = err.errors()[0]
    where, msg = _where(e["loc"]), e["msg"].removeprefix("Value error, ")
    if e["type"] == "missing":
        return f"{what}: {where} is required"
    if e["type"] == "extra_forbidden":
        return f"{what}: unknown field {where}"
    if not where and e["type"] == "model_type":
        return f"{what}: body = {_shown(e.get('input'))}: must be a JSON object"
    if not where:
        return f"{what}: {msg}"
    return f"{what}: {where} = {_shown(e.get('input'))}: {msg}"


async def read_body(request: Any, limit: int) -> bytes:
    """The body of an aiohttp request, at most ``limit`` bytes (:class:`ApiError` 413 beyond, also
    while streaming a body without Content-Length)."""
    over = f"over the limit of {limit} bytes (energy.agent_max_body_bytes)"
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"body: {request.content_length} bytes is {over}")
    buf = bytearray()
    async for chunk in request.content.iter_chunked(64 * 1024):
        buf += chunk
        if len(buf) > limit:
            raise ApiError(413, f"body: {over}")
    return bytes(buf)


def parse_progress(raw: bytes, window: TimeWindow) -> ProgressBody:
    """Validate a ``/v1/progress`` body; :class:`ApiError` (400) naming the field otherwise."""
    what = "bad progress body"
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ApiError(400, f"{what}: body is not UTF-8") from None
    except ValueError as e:
        raise ApiError(400, f"{what}: body is not JSON ({str(e)[:80]})") from None
    except RecursionError:
        raise ApiError(400, f"{what}: body nests too deep") from None
    try:
        return ProgressBody.model_validate(doc, context={"window": window})
    except ValidationError as e:
        raise ApiError(400, error_line(e, what)) from None


def parse_timings(query: Mapping[str, str], window: TimeWindow) -> TimingsQuery:
    """Validate the query of ``GET /v1/energy/{id}`` (an aiohttp MultiDict or a plain mapping)."""
    what = "bad query parameter"
    repeated = [k for k, n in Counter(k for k, _ in query.items()).items() if n > 1]  # a MultiDict's keys() are unique
    if repeated:
        raise ApiError(400, f"{what}: {_shown(repeated[0])} given more than once")
    try:
        return TimingsQuery.model_validate(dict(query), context={"window": window})
    except ValidationError as e:
        raise ApiError(400, error_line(e, what)) from None


def parse_request_id(rid: str) -> str:
    """A request id from the URL path: visible ASCII, 1..MAX_ID_LEN characters."""
    try:
        return _REQUEST_ID.validate_python(rid)
    except ValidationError as e:
        err = e.errors()[0]
        raise ApiError(400, f"bad request id: request_id = {_shown(rid)}: {err['msg']}") from None
