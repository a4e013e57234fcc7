"""Quality labels for production rows, keyed by LiteLLM call id.

Production traffic has no ground truth; a user, an application or a reviewer can score an answer
afterwards. ``apply_feedback(store, call_id, score)`` sets ``score`` (correctness in [0, 1]) on the
call's successful production run(s); unknown ids and out-of-range scores are rejected before anything
is written. Idempotent: a run that already has that score is not written again (its ``updated`` time,
which retraining watches, stays); a different score replaces the previous one (a correction). The table
keeps the first request of a call id (:mod:`litellm_energy_router.table.production`), so a later request
reusing the id — or a replayed row — never receives or resets this label. Served over HTTP by
:func:`feedback_app` (``energy-router feedback serve``), which always requires a bearer token::

    POST /v1/feedback   {"call_id": "<litellm call id>", "score": 0.0..1.0}
    -> 200 {"call_id": ..., "score": ..., "updated": n (0: already so)} | 400 | 401 | 404 unknown id | 409 | 422 | 503

Two kinds of bearer: the operator's ``feedback.token`` labels any call; with ``feedback.caller_keys`` a LiteLLM
virtual key labels only the calls made with that key (``owner``: the key's SHA-256, which is LiteLLM's
``user_api_key_hash`` for a virtual key and is stored with each production row). Another key's call, a row
written before rows recorded their key, or one made with the master key is "unknown" to a caller key: the answer
is the same 404 as for an id that was never served (this endpoint tells a key nothing of other calls).

A row reaches the table a moment after its response (the writer batches): feedback sent before that
gets 404 and can be retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import re
from typing import Any

from litellm_energy_router.errors import UserError
from litellm_energy_router.table import TableError, TableStore
from litellm_energy_router.table.production import stored_call_id


class FeedbackError(UserError, ValueError):
    """Rejected feedback; ``status`` is the HTTP status to answer with."""

    def __init__(self, msg: str, status: int) -> None:
        super().__init__(msg)
        self.status = status


_NUMBER = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
)  # ASCII only (float() takes "٠.٧", "1_0")


def parse_score(value: Any) -> float:
    """A correctness score in [0, 1]; anything else raises :class:`FeedbackError` (422)."""
    if isinstance(value, bool) or (isinstance(value, str) and not _NUMBER.fullmatch(value.strip())):
        raise FeedbackError(f"score {str(value)[:40]!r} is not a number in [0, 1]", 422)
    try:
        s = float(value)
    except (TypeError, ValueError, OverflowError):  # an integer too large for a float: not a score either
        raise FeedbackError(f"score {str(value)[:40]!r} is not a number in [0, 1]", 422) from None
    if not math.isfinite(s) or not 0.0 <= s <= 1.0:
        raise FeedbackError(f"score {value!r} is out of range [0, 1]", 422)
    return s


def apply_feedback(store: TableStore, call_id: str, score: Any, *, owner: str | None = None) -> int:
    """Label the successful production run(s) of ``call_id`` with ``score``. Returns rows changed (0 when
    they already had that score). ``owner``: a caller key's hash; only runs recorded with that ``key_hash`` are
    found (None: the operator, every run)."""
    s = parse_score(score)
    if not isinstance(call_id, str) or not call_id or len(call_id) > 256:
        raise FeedbackError(f"call id {str(call_id)[:80]!r} is not a LiteLLM call id", 400)
    runs = [
        r
        for r in store.runs_for_call(stored_call_id(call_id))
        if r.source == "production" and (owner is None or _owned(r.key_hash, owner))
    ]
    if not runs:
        raise FeedbackError(f"unknown call id {call_id!r} (no production row yet)", 404)
    ok = [r for r in runs if r.status != "failure"]
    if not ok:
        raise FeedbackError(f"call id {call_id!r} failed: there is no answer to score", 409)
    changed = [r.model_copy(update={"score": s}) for r in ok if r.score != s]
    if changed:
        store.write(runs=changed)
    return len(changed)


def _owned(key_hash: str | None, owner: str) -> bool:
    return key_hash is not None and hmac.compare_digest(key_hash.encode(), owner.encode())


MAX_CREDENTIAL_BYTES = 4096


def bearer_owner(header: bytes, token: bytes | None, caller_keys: bool) -> tuple[bool, str | None]:
    """(authorised, owner) of an ``Authorization`` header (``Bearer <credential>``, the scheme in any case): the
    operator's ``token`` → (True, None), any call; with ``caller_keys`` another credential → (True, its SHA-256
    hex): the calls made with that key."""
    scheme, _, cred = header.strip().partition(b" ")
    cred = cred.strip()
    if scheme.lower() != b"bearer" or not cred or len(cred) > MAX_CREDENTIAL_BYTES:
        return False, None
    if token is not None and hmac.compare_digest(cred, token):
        return True, None
    if caller_keys:
        return True, hashlib.sha256(cred).hexdigest()  # LiteLLM's hash_token: sha256 of the key's UTF-8 bytes
    return False, None


def feedback_app(store: TableStore, token: str | None, *, caller_keys: bool = False) -> Any:
    """The aiohttp application of the feedback endpoint: the operator's ``token``, LiteLLM virtual keys
    (``caller_keys``: each labels its own calls), or both; at least one is required."""
    from aiohttp import web

    if not token and not caller_keys:
        raise ValueError("feedback endpoint: a bearer token is required (set feedback.token or feedback.caller_keys)")
    expected = token.encode("utf-8", "surrogateescape") if token else None

    async def post(request: web.Request) -> web.Response:
        # surrogateescape: a header with a byte that is not UTF-8 is a wrong token (401), not a server error
        ok, owner = bearer_owner(
            request.headers.get("Authorization", "").encode("utf-8", "surrogateescape"), expected, caller_keys
        )
        if not ok:
            return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        try:
            body = await request.json()
            call_id, score = body["call_id"], body["score"]
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'body must be JSON {"call_id": str, "score": number}'}, status=400)
        if not isinstance(score, (int, float)) or isinstance(score, bool):  # "0.5", " 1 ", "٠.٧": not a JSON number
            return web.json_response({"error": f"score {str(score)[:40]!r} is not a JSON number in [0, 1]"}, status=422)
        try:
            n = await asyncio.to_thread(apply_feedback, store, call_id, score, owner=owner)
        except FeedbackError as e:
            return web.json_response({"error": str(e)}, status=e.status)
        except TableError as e:
            return web.json_response({"error": str(e)}, status=503)
        return web.json_response({"call_id": call_id, "score": float(score), "updated": n})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/feedback", post)
    app.router.add_get("/healthz", healthz)
    return app
