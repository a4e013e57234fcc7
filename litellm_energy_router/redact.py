"""Credentials out of every log line and message: use :func:`redact_url` wherever a table URL (DSN) or an
HTTP address is shown, :func:`redact` on free text that may carry one (a driver's error message)."""

from __future__ import annotations

import re

MASK = "***"
SECRET_NAMES = ("password", "passwd", "pwd", "token", "api_key", "apikey", "secret")  # values never shown
_RULES = [  # (pattern, replacement): what precedes the secret is kept
    # scheme://user:pw@host: the password up to the @ that a host follows (it may hold "/", "@" or a space)
    (
        re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s'\"]*):[^'\"\n]*?@(?=[^@'\"\s]*(?:[/:?]|\s|$|['\"]))"),
        rf"\1:{MASK}@",
    ),
    (re.compile(rf"(?i)(\b(?:{'|'.join(SECRET_NAMES)})\s*=\s*)[^\s&;,'\"]+"), rf"\1{MASK}"),
    (re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]+"), rf"\1{MASK}"),
]


def redact(text: str) -> str:
    """``text`` with URL passwords (``scheme://user:***@``), ``password=***``-style values and bearer
    tokens masked."""
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


def redact_url(url: object) -> str:
    """A URL or DSN fit for a log line: SQLAlchemy's rendering with the password hidden, then
    :func:`redact` (query-string secrets); an unparsable one through :func:`redact` alone."""
    s = str(url)
    try:
        from sqlalchemy.engine import make_url

        s = make_url(s).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: the regular expressions still apply
        pass
    return redact(s)


_SECRET_FIELD = re.compile(rf"(?:^|[._])(?:{'|'.join(SECRET_NAMES)}|salt)$", re.I)


def secret_field(name: str) -> bool:
    """Whether a settings field (a dotted path such as ``energy.agent_token``, ``privacy.salt``; not ``max_tokens``)
    holds a secret: its value is never shown in an error (a token YAML read as a number is a bare value that
    :func:`redact` cannot tell from any other)."""
    return _SECRET_FIELD.search(name) is not None
