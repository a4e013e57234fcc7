"""Run untrusted Python (MBPP answers) against its tests in a subprocess sandbox.

Model-written code is hostile. It runs only under real isolation, unless the config explicitly
opts into ``isolation: process``:

* **namespaces** (``isolation="namespaces"``, chosen by ``auto`` when ``unshare`` works): the program
  runs as PID 1 of new PID, network, mount, IPC and UTS namespaces (every process it starts dies with
  it; no network interface), in a new root holding read-only binds of the system and the Python
  installation only (the host's data is not there to read), its work dir a tmpfs of ``work_dir_mb``
  MB (the one writable place); capabilities dropped, as ``nobody`` when the runner is root, with
  no_new_privs and a seccomp filter (:mod:`.sandbox_seccomp`: no sockets, mounts, namespaces,
  FIFOs, ptrace, bpf, io_uring...). A non-root runner needs unprivileged user namespaces.
* **resource limits**: CPU seconds, address space (MB), written file size (MB), open files, and
  (not root) no new processes. A wall-clock timeout kills the whole process tree.
* **Python guard** (``python_guard``): an audit hook refusing process creation, sockets, native code
  (ctypes, sqlite3, dbm, multiprocessing), FIFOs and file writes/removals outside the work dir.

``auto`` without working namespaces refuses to run anything (:class:`SandboxError`): it never falls
back silently. ``process`` (an explicit opt-in, warned about) keeps the limits, the guard and the
seccomp filter but not the namespaces: reads are unrestricted and the work dir is on the host's
disk, so it is not a defence against code written to escape. Each result says which isolation ran
it (``SandboxResult.isolation``) and graders mark what ``process`` graded. A program passes only when
every test ran (the harness prints a per-run nonce after the last assert).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from . import sandbox_seccomp

HARNESS = Path(__file__).with_name("sandbox_harness.py")
log = logging.getLogger(__name__)
#: host paths shown (read-only) inside the namespaces' root, besides the Python installation
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/localtime")
NOBODY = 65534


class SandboxError(RuntimeError):
    """The sandbox cannot be set up as configured (one line)."""


class SandboxConfig(BaseModel):
    """Limits of the code sandbox. Units: seconds, megabytes."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(10.0, gt=0, description="wall-clock limit per program, seconds")
    memory_mb: int = Field(1024, ge=64, description="address-space limit, MB")
    file_size_mb: int = Field(16, ge=1, description="largest file the program may write, MB")
    work_dir_mb: int = Field(64, ge=1, le=4096, description="size of the work dir (a tmpfs) under namespaces, MB")
    max_parallel: int = Field(2, ge=1, description="programs run at the same time")
    timeout_retries: int = Field(
        1,
        ge=0,
        le=3,
        description="a program that hit the wall-clock limit runs again, alone, this many times (a loaded host "
        "must not grade a correct answer 0)",
    )
    isolation: Literal["auto", "namespaces", "process"] = Field(
        "auto", description="auto/namespaces: real isolation or refuse to run; process: NOT isolated, explicit opt-in"
    )
    python_guard: bool = Field(True, description="audit-hook guard; disable only to test the OS layer alone")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one program: ``passed`` only when every test ran; ``reason`` says why not;
    ``isolation`` is the mode that ran it."""

    passed: bool
    reason: str
    seconds: float
    isolation: str = ""
    timed_out: bool = False


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def visible_paths() -> list[str]:
    """Host paths to bind read-only into the namespaces' root: the system and this Python's prefixes
    (each as given and resolved), without a path already inside another one."""
    py = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    wanted = [*SYSTEM_PATHS, *py, *(os.path.realpath(p) for p in py)]
    out: list[str] = []
    for p in map(os.path.abspath, wanted):
        if p == "/" or p in out or not os.path.lexists(p):
            continue
        if any(p.startswith(q + "/") for q in out if not os.path.islink(q)):
            continue
        out.append(p)
    return out


class Sandbox:
    """Async runner of (code, tests) pairs; at most ``max_parallel`` at a time."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._sem: asyncio.Semaphore | None = None
        self._alone: asyncio.Lock | None = None
        self._lock: asyncio.Lock | None = None
        self._isolation: str | None = None

    def _unshare_cmd(self) -> list[str]:
        exe = shutil.which("unshare")
        if exe is None:
            raise SandboxError("the util-linux 'unshare' command is not on PATH")
        cmd = [exe, "--fork", "--pid", "--net", "--mount", "--ipc", "--uts", "--kill-child"]
        if os.geteuid() != 0:
            cmd += ["--user", "--map-root-user"]
        return cmd + ["--"]

    def _seccomp(self) -> str | None:
        """The seccomp program (hex) for this machine; None where the architecture is unknown."""
        try:
            return sandbox_seccomp.build_filter().hex()
        except ValueError:
            return None

    async def isolation(self) -> str:
        """The isolation in use, decided once. ``auto`` and ``namespaces`` probe the namespaces and
        raise :class:`SandboxError` when they do not work (no silent fallback); ``process`` runs
        unisolated, as configured, with a warning."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._isolation is None:
                self._isolation = await self._resolve()
        return self._isolation

    async def _resolve(self) -> str:
        want = self.config.isolation
        if want == "process":
            if not self.config.python_guard:
                raise SandboxError(
                    "sandbox.python_guard=false needs real isolation (sandbox.isolation: auto or namespaces)"
                )
            log.warning(
                "sandbox.isolation=process: model-written code runs not isolated (limits, seccomp and a Python "
                "guard only; it can read the host's files and fill its disk); the rows it grades are marked"
            )
            return "process"
        ok, why = await self._probe("namespaces")
        if ok:
            return "namespaces"
        raise SandboxError(
            f"sandbox.isolation={want}: no real isolation on this host ({_one_line(why)}); refusing to run "
            "model-written code; make namespaces work (util-linux unshare; user namespaces for a non-root user) or "
            "set sandbox.isolation: process to run it not isolated"
        )

    async def _probe(self, isolation: str) -> tuple[bool, str]:
        try:
            r = await self._execute("", "", isolation, probe=True)
        except (SandboxError, OSError) as e:
            return False, str(e)
        return r.passed, r.reason

    async def run(self, code: str, tests: str) -> SandboxResult:
        """Execute ``code`` then ``tests`` (asserts); passed when all ran without error. A program that hit the
        wall-clock limit runs again, alone (no other program of this sandbox beside it), up to ``timeout_retries``
        times: what timed out because the host was busy passes, an endless loop times out each time (its reason
        says how many tries)."""
        isolation = await self.isolation()
        if self._sem is None:
            self._sem, self._alone = asyncio.Semaphore(self.config.max_parallel), asyncio.Lock()
        async with self._sem:
            r = await self._execute(code, tests, isolation)
        tries = 1
        while r.timed_out and tries <= self.config.timeout_retries:
            r, tries = await self._alone_run(code, tests, isolation), tries + 1
        if tries > 1:
            r = replace(r, reason=f"{r.reason} (try {tries}, run alone after {tries - 1} timeout{'s' * (tries > 2)})")
        return r

    async def _alone_run(self, code: str, tests: str, isolation: str) -> SandboxResult:
        """One run holding every slot of the sandbox (one such run at a time): nothing of ours beside it."""
        assert self._sem is not None and self._alone is not None
        held = 0
        async with self._alone:
            try:
                while held < self.config.max_parallel:  # cancelled half way: the finally gives back what it holds
                    await self._sem.acquire()
                    held += 1
                return await self._execute(code, tests, isolation)
            finally:
                for _ in range(held):
                    self._sem.release()

    def _spec(self, work: Path, isolation: str, probe: bool) -> dict:
        cfg = self.config
        spec = {
            "workdir": str(work),
            "isolation": isolation,
            "python_guard": cfg.python_guard,
            "probe": probe,
            "cpu_s": int(cfg.timeout_s) + 1,
            "wall_s": cfg.timeout_s + 1,
            "memory_mb": cfg.memory_mb,
            "file_size_mb": cfg.file_size_mb,
            "seccomp": self._seccomp(),
        }
        if isolation == "namespaces":
            if spec["seccomp"] is None:
                raise SandboxError(
                    f"no seccomp filter for architecture {sandbox_seccomp.machine()!r} (x86_64, aarch64)"
                )
            spec.update(
                visible=visible_paths(),
                work_dir_mb=cfg.work_dir_mb,
                pivot_root_nr=sandbox_seccomp.syscall_number("pivot_root"),
                uid=NOBODY if os.geteuid() == 0 else None,
            )
        return spec

    async def _execute(self, code: str, tests: str, isolation: str, probe: bool = False) -> SandboxResult:
        cfg = self.config
        work = Path(tempfile.mkdtemp(prefix="er-sandbox-"))
        logs = Path(tempfile.mkdtemp(prefix="er-sandbox-log-"))
        nonce = secrets.token_hex(16)
        # die with the runner (PR_SET_PDEATHSIG via setpriv: a preexec_fn would force a slow fork of
        # this large process and block the event loop)
        setpriv = shutil.which("setpriv")
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        t0 = time.monotonic()
        try:
            spec = self._spec(work, isolation, probe)
            cmd = ([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []) + (
                self._unshare_cmd() if isolation == "namespaces" else []
            )
            cmd += [sys.executable, "-I", str(HARNESS), json.dumps(spec)]
            with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    *cmd,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=work,
                    env=env,
                    start_new_session=True,
                )
                timed_out = await self._feed_and_wait(proc, {"nonce": nonce, "code": code, "tests": tests})
            seconds = time.monotonic() - t0
            stdout = (logs / "out").read_bytes()[-4096:].decode("utf-8", "replace")
            stderr = (logs / "err").read_bytes()[-2048:].decode("utf-8", "replace").strip()
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(logs, ignore_errors=True)
        if timed_out:
            return SandboxResult(False, f"timed out after {cfg.timeout_s:g} s", seconds, isolation, timed_out=True)
        lines = stdout.strip().splitlines()
        if proc.returncode == 0 and lines and lines[-1] == nonce:
            return SandboxResult(True, "all tests passed", seconds, isolation)
        if proc.returncode == 3:  # the harness's setup failure, or the program's own exit code 3
            if probe:
                raise SandboxError(
                    f"sandbox setup failed ({isolation}): {stderr.splitlines()[-1] if stderr else 'no message'}"
                )
            ok, why = await self._probe(isolation)  # the verdict of an empty program, never the model's stderr
            if not ok:
                raise SandboxError(_one_line(why))
            stderr = stderr or "exit code 3"
        last = stderr.splitlines()[-1] if stderr else ""
        if proc.returncode is not None and proc.returncode < 0:
            last = f"killed by signal {-proc.returncode}" + (f" ({last})" if last else "")
        return SandboxResult(
            False, last or f"exit code {proc.returncode} without finishing the tests", seconds, isolation
        )

    async def _feed_and_wait(self, proc: asyncio.subprocess.Process, job: dict) -> bool:
        """Send the job, wait at most ``timeout_s``, kill the process tree; True when it timed out."""
        timed_out = False
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(job).encode() + b"\n")
            await proc.stdin.drain()
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), self.config.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            if proc.returncode is None:
                _kill_tree(proc.pid)
                await proc.wait()
            _kill_tree(proc.pid)  # stragglers left in the session, if any
        return timed_out


def _kill_tree(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (with namespaces, ``unshare --kill-child`` takes
    the PID namespace down with it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
