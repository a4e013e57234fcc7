"""Run untrusted Python (MBPP answers) against its tests in a subprocess sandbox.

Layers (each one alone stops the common accidents; together they are defence in depth):

* **namespaces** (``isolation="namespaces"``, chosen by ``auto`` when ``unshare`` works): the
  program runs as PID 1 of a new PID namespace (every process it starts dies with it), in a network
  namespace with no interfaces up (no network), in a mount namespace where every file system except
  its temporary work directory is remounted read-only; then all capabilities are dropped, so the
  read-only mounts cannot be undone. As a non-root user a user namespace is created first.
* **resource limits**: CPU seconds, address space (MB), written file size (MB), open files, and
  (non-root) no new processes. A wall-clock timeout kills the whole process tree.
* **Python guard** (``python_guard``): an audit hook refusing process creation, sockets, ctypes
  and file writes/removals outside the work directory.

Without working namespaces (``isolation="process"``) only the limits, the guard and the timeout
apply — enough against accidents, not against code written to escape. A program passes only when
every test ran (the harness prints a per-run nonce after the last assert).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HARNESS = Path(__file__).with_name("sandbox_harness.py")


class SandboxError(RuntimeError):
    """The sandbox cannot be set up as configured (one line)."""


class SandboxConfig(BaseModel):
    """Limits of the code sandbox. Units: seconds, megabytes."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(10.0, gt=0, description="wall-clock limit per program, seconds")
    memory_mb: int = Field(1024, ge=64, description="address-space limit, MB")
    file_size_mb: int = Field(16, ge=1, description="largest file the program may write, MB")
    max_parallel: int = Field(2, ge=1, description="programs run at the same time")
    isolation: Literal["auto", "namespaces", "process"] = Field(
        "auto", description="namespaces: PID/net/mount namespaces via unshare; process: limits + guard only"
    )
    python_guard: bool = Field(True, description="audit-hook guard; disable only to test the OS layer alone")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one program: ``passed`` only when every test ran; ``reason`` says why not."""

    passed: bool
    reason: str
    seconds: float


class Sandbox:
    """Async runner of (code, tests) pairs; at most ``max_parallel`` at a time."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._sem: asyncio.Semaphore | None = None
        self._lock: asyncio.Lock | None = None
        self._isolation: str | None = None

    def _unshare_cmd(self) -> list[str]:
        exe = shutil.which("unshare")
        if exe is None:
            raise SandboxError("sandbox isolation 'namespaces' needs the util-linux 'unshare' command")
        cmd = [exe, "--fork", "--pid", "--mount-proc", "--net", "--mount", "--kill-child"]
        if os.geteuid() != 0:
            cmd += ["--user", "--map-root-user"]
        return cmd + ["--"]

    async def isolation(self) -> str:
        """The isolation in use. ``auto`` probes namespaces once and falls back to ``process`` with a
        warning; an explicit ``namespaces`` that does not work raises :class:`SandboxError`."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._isolation is None:
                want = self.config.isolation
                if want == "process":
                    self._isolation = "process"
                else:
                    ok, why = await self._probe("namespaces")
                    if not ok and want == "namespaces":
                        raise SandboxError(f"sandbox isolation 'namespaces' does not work here: {why}")
                    if not ok:
                        print(f"warning: sandbox namespaces unavailable ({why}); using process limits only", file=sys.stderr)
                    self._isolation = "namespaces" if ok else "process"
                if self._isolation == "process" and not self.config.python_guard:
                    raise SandboxError("sandbox python_guard=false needs working isolation 'namespaces'")
        return self._isolation

    async def _probe(self, isolation: str) -> tuple[bool, str]:
        try:
            r = await self._execute("", "", isolation, probe=True)
        except (SandboxError, OSError) as e:
            return False, str(e)
        return r.passed, r.reason

    async def run(self, code: str, tests: str) -> SandboxResult:
        """Execute ``code`` then ``tests`` (asserts); passed when all ran without error."""
        isolation = await self.isolation()
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.config.max_parallel)
        async with self._sem:
            return await self._execute(code, tests, isolation)

    async def _execute(self, code: str, tests: str, isolation: str, probe: bool = False) -> SandboxResult:
        cfg = self.config
        work = Path(tempfile.mkdtemp(prefix="er-sandbox-"))
        logs = Path(tempfile.mkdtemp(prefix="er-sandbox-log-"))
        nonce = secrets.token_hex(16)
        spec = {
            "workdir": str(work), "isolation": isolation, "python_guard": cfg.python_guard, "probe": probe,
            "cpu_s": int(cfg.timeout_s) + 1, "wall_s": cfg.timeout_s + 1, "memory_mb": cfg.memory_mb, "file_size_mb": cfg.file_size_mb,
        }  # fmt: skip
        # die with the runner (PR_SET_PDEATHSIG via setpriv: a preexec_fn would force a slow fork of
        # this large process and block the event loop)
        setpriv = shutil.which("setpriv")
        cmd = ([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []) + (self._unshare_cmd() if isolation == "namespaces" else [])
        cmd += [sys.executable, "-I", str(HARNESS), json.dumps(spec)]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        t0 = time.monotonic()
        try:
            with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    *cmd, stdin=asyncio.subprocess.PIPE, stdout=out, stderr=err, cwd=work, env=env,
                    start_new_session=True,
                )  # fmt: skip
                timed_out = False
                try:
                    assert proc.stdin is not None
                    proc.stdin.write(json.dumps({"nonce": nonce, "code": code, "tests": tests}).encode() + b"\n")
                    await proc.stdin.drain()
                    proc.stdin.close()
                    await asyncio.wait_for(proc.wait(), cfg.timeout_s)
                except asyncio.TimeoutError:
                    timed_out = True
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    if proc.returncode is None:
                        _kill_tree(proc.pid)
                        await proc.wait()
                    _kill_tree(proc.pid)  # stragglers left in the session, if any
            seconds = time.monotonic() - t0
            stdout = (logs / "out").read_bytes()[-4096:].decode("utf-8", "replace")
            stderr = (logs / "err").read_bytes()[-2048:].decode("utf-8", "replace").strip()
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(logs, ignore_errors=True)
        if timed_out:
            return SandboxResult(False, f"timed out after {cfg.timeout_s:g} s", seconds)
        lines = stdout.strip().splitlines()
        if proc.returncode == 0 and lines and lines[-1] == nonce:
            return SandboxResult(True, "all tests passed", seconds)
        if proc.returncode == 3:
            raise SandboxError(f"sandbox setup failed ({isolation}): {stderr.splitlines()[-1] if stderr else 'no message'}")
        last = stderr.splitlines()[-1] if stderr else ""
        if proc.returncode is not None and proc.returncode < 0:
            last = f"killed by signal {-proc.returncode}" + (f" ({last})" if last else "")
        return SandboxResult(False, last or f"exit code {proc.returncode} without finishing the tests", seconds)


def _kill_tree(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (with namespaces, ``unshare --kill-child`` takes
    the PID namespace down with it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
