"""A real ``litellm --config`` proxy process on 127.0.0.1, shared by the integration tests and the
benchmarks (``benchmarks/`` puts ``tests/`` on ``sys.path``)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# The `litellm` console script run by this interpreter (the script's own shebang may name another venv).
LITELLM = [
    sys.executable,
    "-c",
    "import sys; from importlib.metadata import entry_points; "
    "sys.exit(next(iter(entry_points(group='console_scripts', name='litellm'))).load()())",
]


def default_sigint() -> None:
    """``preexec_fn`` of a child the tests interrupt: SIGINT back to its default. A test run started in the
    background by a non-interactive shell (``cmd &``, e.g. ``nohup .ci/run &``) ignores SIGINT, and children
    inherit that, so the child would never see the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProxyProcess:
    """One proxy at a fixed port, its output in ``<cwd>/<log_name>`` (``proxy-<n>.log`` after a restart);
    ``start`` again after :meth:`kill`."""

    def __init__(
        self,
        config: Path,
        env: dict[str, str],
        cwd: Path,
        *,
        log_name: str = "proxy.log",
        ready_timeout_s: float = 180.0,
    ) -> None:
        self.config, self.env, self.cwd, self.port = Path(config), env, Path(cwd), free_port()
        self.log_name, self.ready_timeout_s = log_name, ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self._log = None

    @property
    def log_path(self) -> Path:
        return self.cwd / (self.log_name if self.starts <= 1 else f"proxy-{self.starts}.log")

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text()[-n:]

    def start(self, *, wait_ready: bool = True) -> "ProxyProcess":
        """Spawn the proxy; with ``wait_ready``, return once ``/health/liveliness`` answers (raises with the
        log's tail when the process exits or is not ready within ``ready_timeout_s``)."""
        self.starts += 1
        if self._log is not None:
            self._log.close()
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [*LITELLM, "--config", str(self.config), "--host", "127.0.0.1", "--port", str(self.port)],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
            preexec_fn=default_sigint,
        )
        if wait_ready:
            self.wait_live()
        return self

    def wait_live(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited: {self.log_tail()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health/liveliness", timeout=2)
                return
            except OSError:
                time.sleep(0.2)
        self.proc.kill()
        raise RuntimeError(f"proxy not ready in {self.ready_timeout_s:.0f} s: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs (what a crash or the OOM killer does)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGINT (the proxy's shutdown: the writer flushes), then SIGKILL after ``timeout_s``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self._log is not None:
            self._log.close()
            self._log = None
