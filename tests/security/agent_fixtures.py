"""Helpers of the GPU-node agent's hostile-input tests: the test token, polling, one metric sample, the one-line
error of a refusal, a self-signed certificate made here, and the production entry point served on a thread."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import sys
import threading
import time
from pathlib import Path

import httpx

from litellm_energy_router.agent.server import EnergyAgent, serve

EXE = str(Path(sys.executable).with_name("energy-router"))
TOKEN = "agent-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "Content-Type": "application/json"}


def poll(fn, timeout=15.0, every=0.05):
    """``fn()`` until it returns something truthy (returned), or ``None`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(every)
    return None


def metric(url: str, name: str, headers=AUTH) -> float | None:
    """One sample of the agent's /metrics (``name`` with its labels, as exposed), or ``None``."""
    for line in httpx.get(f"{url}/metrics", headers=headers).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def one_line_error(r: httpx.Response) -> str:
    err = r.json()["error"]
    assert "\n" not in err
    return err


def make_cert(d: Path, name: str = "agent") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 / localhost and its key (PEM files in ``d``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"energy-router {name} test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    c, k = d / f"{name}.crt", d / f"{name}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return c, k


class Served:
    """``serve(agent)`` (the production entry point, TLS included) on its own loop and thread."""

    def __init__(self, agent: EnergyAgent) -> None:
        self.agent, self.port, self.error = agent, None, None

    def __enter__(self) -> "Served":
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def on_ready(p: int) -> None:
            self.port = p
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(serve(self.agent, ready=on_ready))
            try:
                self.loop.run_until_complete(self.task)
            except BaseException as e:  # noqa: BLE001 - cancelled at exit, or failed to start
                self.error = e
            finally:
                ready.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(30) and self.port, f"agent did not start: {self.error!r}"
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(10)
        self.loop.close()
