"""TLS for the GPU-node agent: the server's context (certificate chain + key) and the client's
(verifying, against the system CAs or a given CA bundle). Both refuse TLS older than 1.2. Problems
raise :class:`TLSConfigError` with one line naming the setting and the file."""

from __future__ import annotations

import ssl
from pathlib import Path

from litellm_energy_router.errors import UserError


class TLSConfigError(UserError, ValueError):
    """An unusable TLS setting (missing half, unreadable file, not a PEM certificate/key)."""


def _readable(path: str | Path, setting: str) -> str:
    p = Path(path)
    try:
        with p.open("rb"):
            pass
    except OSError as e:
        raise TLSConfigError(f"{setting} {str(p)!r}: cannot read ({e.strerror or type(e).__name__})") from None
    return str(p)


def server_context(cert: str | Path | None, key: str | Path | None) -> ssl.SSLContext | None:
    """The agent's server TLS context, or ``None`` when neither ``cert`` nor ``key`` is set."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        missing = (
            "tls_cert (--tls-cert, energy.agent_tls_cert)"
            if cert is None
            else "tls_key (--tls-key, energy.agent_tls_key)"
        )
        raise TLSConfigError(f"agent TLS needs a certificate and its key: {missing} is not set")
    c, k = _readable(cert, "agent tls_cert"), _readable(key, "agent tls_key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(c, k)
    except ssl.SSLError as e:
        raise TLSConfigError(
            f"agent tls_cert {c!r} / tls_key {k!r}: not a PEM certificate chain and its key ({e.reason or e})"
        ) from None
    return ctx


def client_context(ca_bundle: str | Path | None) -> ssl.SSLContext:
    """A verifying client context: system CAs, or only those of ``ca_bundle`` (PEM) when given."""
    cafile = _readable(ca_bundle, "energy.agent_ca_bundle") if ca_bundle is not None else None
    try:
        ctx = ssl.create_default_context(cafile=cafile)
    except ssl.SSLError as e:
        raise TLSConfigError(f"energy.agent_ca_bundle {cafile!r}: no PEM certificates ({e.reason or e})") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
