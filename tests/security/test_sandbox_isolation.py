"""The code sandbox (issue: trust in production, item 1). Model-written code is hostile: without real
isolation it is not run unless the config opts into process mode (and the graded rows say so); under
real isolation it cannot write outside its work dir, fill the disk, read the host's files, reach the
network or a socket of the host, or set up namespaces of its own. Every attack here really runs."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sysconfig
import tempfile
import uuid
from pathlib import Path

import pytest
from litellm_energy_router.profiling import sandbox_seccomp
from litellm_energy_router.profiling.config import parse_tournament_config
from litellm_energy_router.profiling.runner import Tournament, build_jobs
from litellm_energy_router.profiling.sandbox import Sandbox, SandboxConfig, SandboxError

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.demo.task_answers import TaskAnswers
from litellm_energy_router.table import open_store

TASKS = Path(__file__).parents[1] / "data" / "tasks"
GOOD = "def sum_squares(nums):\n    return sum(n * n for n in nums)\n"
MB = 1024 * 1024


def _run(sandbox: Sandbox, code: str, tests: str = "assert True"):
    return asyncio.run(sandbox.run(code, tests))


def _outside(suffix: str) -> Path:
    """A fresh path in the host's temp dir, outside any sandbox work dir."""
    return Path(tempfile.gettempdir()) / f"er-attack-{uuid.uuid4().hex[:12]}{suffix}"


@pytest.fixture
def no_namespace_tools(monkeypatch, tmp_path):
    """A host without namespace tools: PATH names only an empty directory (no unshare, no setpriv)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def _require_isolation(sandbox: Sandbox) -> Sandbox:
    """``sandbox`` once it has real isolation; else skip (fail under CI=true: CI's hosts provide it)."""
    try:
        asyncio.run(sandbox.isolation())
    except SandboxError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"namespace isolation unavailable under CI=true: {e}")
        pytest.skip(f"this host cannot provide namespace isolation: {e}")
    return sandbox


@pytest.fixture
def isolated() -> Sandbox:
    """Real isolation with the Python guard off: what holds is the OS layer alone."""
    return _require_isolation(Sandbox(SandboxConfig(timeout_s=10, isolation="namespaces", python_guard=False)))


@pytest.fixture(scope="module")
def backend():
    b = LocalBackend(TaskAnswers({"small": {"mbpp": 0.5}}, TASKS))
    b.start()
    yield b
    b.stop()


def _mbpp_config(backend: LocalBackend, **sandbox):
    return parse_tournament_config(
        {
            "candidates": [backend.deployment("small", energy_profile_key="mistralai/mistral-7b-chat")],
            "tasks": [{"name": "mbpp", "source": str(TASKS / "mbpp.jsonl")}],
            "generation": {"num_retries": 0},
            "sandbox": {"timeout_s": 10, **sandbox},
        }
    )


def _tournament(cfg, store):
    t = Tournament(cfg, store)
    try:
        return asyncio.run(t.run(build_jobs(cfg)))
    finally:
        t.close()


# -- (a) no real isolation: auto refuses, nothing runs ---------------------------------------------
def test_auto_without_isolation_refuses_to_run_untrusted_code(no_namespace_tools):
    target = _outside(".db")
    attack = f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t (x)')\n"
    try:
        with pytest.raises(SandboxError) as err:
            _run(Sandbox(SandboxConfig(timeout_s=5)), attack)
        msg = str(err.value)
        assert "\n" not in msg and "isolation" in msg and "process" in msg, msg
        assert not target.exists()  # the program never ran
    finally:
        target.unlink(missing_ok=True)


def test_tournament_without_isolation_stops_before_asking_any_candidate(no_namespace_tools, backend, sqlite_url):
    store = open_store(sqlite_url)
    n0 = len(backend.answers.log)
    with pytest.raises(SandboxError, match="isolation"):
        _tournament(_mbpp_config(backend), store)
    assert len(backend.answers.log) == n0 and store.count_runs() == 0
    store.close()


# -- (b) process mode only when opted into, loudly, and the graded rows record it ------------------
@pytest.mark.parametrize("isolation", ["process", "auto"])
def test_graded_rows_record_an_unisolated_sandbox(isolation, backend, sqlite_url, caplog):
    if isolation == "auto":
        _require_isolation(Sandbox())
    store = open_store(sqlite_url)
    with caplog.at_level(logging.WARNING):
        summary = _tournament(_mbpp_config(backend, isolation=isolation), store)
    rows = list(store.iter_runs())
    assert summary.complete and rows and all(r["status"] == "success" for r in rows)
    assert {r["score"] for r in rows} == {0.0, 1.0}  # graded for real: right and wrong answers
    warned = [r.getMessage() for r in caplog.records if "not isolated" in r.getMessage()]
    if isolation == "process":
        assert warned and "sandbox.isolation" in warned[0]
        assert all("isolation=process" in (r["grade_note"] or "") for r in rows), rows[0]
    else:  # real isolation on this host: nothing to flag
        assert not warned and all(r["grade_note"] is None for r in rows)
    store.close()


def test_process_mode_guard_blocks_file_creation_the_audit_hook_missed(tmp_path):
    """Process mode is a weak opt-in, but the writes review found (sqlite3, mkfifo) are refused."""
    sandbox = Sandbox(SandboxConfig(timeout_s=5, isolation="process"))
    db, fifo, attached = _outside(".db"), _outside(".fifo"), _outside(".db")
    pth = Path(sysconfig.get_paths()["purelib"]) / f"er_attack_{uuid.uuid4().hex[:8]}.pth"
    attacks = {
        "sqlite": f"import sqlite3\nsqlite3.connect({str(db)!r}).execute('create table t (x)')\n",
        "sqlite_pth": f"import sqlite3\nsqlite3.connect({str(pth)!r}).execute('create table t (x)')\n",
        "attach": f"import sqlite3\nsqlite3.connect(':memory:').execute(\"attach '{attached}' as a\")\n",
        "mkfifo": f"import os\nos.mkfifo({str(fifo)!r})\n",
        "posix_mkfifo": f"import posix\nposix.mkfifo({str(fifo)!r})\n",
    }
    try:
        results = {k: _run(sandbox, code) for k, code in attacks.items()}
        assert not any(r.passed for r in results.values()), results
        for p in (db, fifo, attached, pth):
            assert not p.exists(), p
    finally:
        for p in (db, fifo, attached, pth):
            p.unlink(missing_ok=True)


# -- (c) real isolation: the OS layer alone contains hostile code ----------------------------------
def _write_outside(path: Path, how: str) -> str:
    if how == "sqlite":
        return f"import sqlite3\nsqlite3.connect({str(path)!r}).execute('create table t (x)')\n"
    if how == "mkfifo":
        return f"import os\nos.mkfifo({str(path)!r})\n"
    return f"open({str(path)!r}, 'w').write('import os\\n')\n"


@pytest.mark.parametrize(
    "where,how",
    [
        ("tmp", "sqlite"),
        ("tmp", "mkfifo"),
        ("tmp", "open"),
        ("site-packages", "open"),
        ("site-packages", "sqlite"),
        ("dev-shm", "open"),
        ("home", "open"),
    ],
)
def test_isolated_code_cannot_create_files_outside_its_work_dir(isolated, where, how):
    name = f"er_attack_{uuid.uuid4().hex[:8]}"
    base = {
        "tmp": Path(tempfile.gettempdir()),
        "site-packages": Path(sysconfig.get_paths()["purelib"]),
        "dev-shm": Path("/dev/shm"),
        "home": Path.home(),
    }[where]
    target = base / (name + (".pth" if where == "site-packages" else ".db"))
    try:
        r = _run(isolated, _write_outside(target, how))
        assert not r.passed, r
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


def test_isolated_code_cannot_fill_the_disk(isolated):
    """Many files, each under the file-size limit: the work dir's size cap stops them."""
    fill = (
        "import os\nwritten = 0\nchunk = b'x' * (4 * 1024 * 1024)\n"
        "for i in range(128):\n"
        "    with open(f'f{i}', 'wb') as f:\n        f.write(chunk)\n"
        "    written += len(chunk)\n"
    )
    r = _run(isolated, fill, f"assert written >= {512 * MB}")
    assert not r.passed
    assert "No space left on device" in r.reason, r


def test_isolated_code_cannot_reach_the_network(isolated):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    s.settimeout(0.5)
    try:
        r = _run(isolated, f"import socket\nsocket.create_connection(('127.0.0.1', {s.getsockname()[1]}), timeout=2)\n")
        assert not r.passed
        with pytest.raises((socket.timeout, TimeoutError)):
            s.accept()[0].close()
    finally:
        s.close()


def test_isolated_code_cannot_connect_to_a_host_unix_socket(isolated):
    """A read-only mount does not stop connect() to an existing socket file (e.g. a container
    runtime's); the sandbox must."""
    d = tempfile.mkdtemp(prefix="er-sock-")
    path = os.path.join(d, "s")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(1)
    s.settimeout(0.5)
    try:
        r = _run(isolated, f"import socket\nc = socket.socket(socket.AF_UNIX)\nc.connect({path!r})\nc.sendall(b'x')\n")
        assert not r.passed, r
        with pytest.raises((socket.timeout, TimeoutError)):
            s.accept()[0].close()
    finally:
        s.close()
        os.unlink(path)
        os.rmdir(d)


def test_isolated_code_cannot_read_the_hosts_files(isolated, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("api-key-123")
    r = _run(isolated, f"data = open({str(secret)!r}).read()\n", "assert data == 'api-key-123'")
    assert not r.passed, r
    assert os.path.exists("/etc/passwd") and os.path.exists("/proc/1")
    # Beside its work directory it may see only the path down to this Python's read-only bind (a venv
    # under /tmp, e.g. a CI clone in /tmp/<repo>/.venv): each such directory holds the next step alone.
    look = (
        "import os, sys\nseen = [p for p in ('/etc/passwd', '/proc/1') if os.path.exists(p)]\n"
        "here = os.path.basename(os.getcwd())\nup = os.path.dirname(os.getcwd())\n"
        "py = [os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]\n"
        "bad = []\nfor n in os.listdir(up):\n"
        "    d = os.path.join(up, n)\n"
        "    if n == here:\n        continue\n"
        "    steps = [p for p in py if p.startswith(d + os.sep)]\n"
        "    while steps and d not in steps:\n"
        "        nxt = {p[len(d) + 1:].split(os.sep)[0] for p in steps}\n"
        "        if set(os.listdir(d)) != nxt:\n            bad.append(d)\n            break\n"
        "        d = os.path.join(d, next(iter(nxt))) if len(nxt) == 1 else d\n"
        "        if len(nxt) != 1:\n            break\n"
        "    if not steps:\n        bad.append(d)\n"
    )
    r = _run(isolated, look, "assert not seen, seen\nassert not bad, bad")
    assert r.passed, r  # the root it sees holds the system and Python, not the host's files or processes


def test_isolated_code_cannot_make_namespaces_of_its_own(isolated):
    """seccomp: unshare() and mount() are refused even where an unprivileged user namespace would be allowed."""
    probe = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.unshare(0x10000000 | 0x00020000)\n"  # CLONE_NEWUSER | CLONE_NEWNS
        "err = ctypes.get_errno()\nmode = libc.prctl(21, 0, 0, 0, 0)\n"  # PR_GET_SECCOMP
    )
    r = _run(isolated, probe, "assert rc == -1 and err == 1, (rc, err)\nassert mode == 2, mode")
    assert r.passed, r


def test_isolated_code_gets_no_memory_beyond_its_limit_and_cannot_outlive_the_runner(isolated):
    """seccomp: System V shared memory (768 MB held under memory_mb 128, outliving the run), message queues,
    semaphores and memfd pages are not counted by the address-space limit: refused; and the parent-death signal the
    harness set cannot be cleared (the program outlived a SIGKILLed runner). Other prctl options still work."""
    probe = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def err(rc):\n    return (rc, ctypes.get_errno())\n"
        "shm = err(libc.shmget(0, 64 << 20, 0o1600))\n"  # IPC_PRIVATE, IPC_CREAT | 0600
        "msg = err(libc.msgget(0, 0o1600))\nsem = err(libc.semget(0, 1, 0o1600))\n"
        "memfd = err(libc.memfd_create(b'x', 0))\n"
        "try:\n    os.memfd_create('y')\n    os_memfd = 'allowed'\nexcept OSError as e:\n    os_memfd = e.errno\n"
        "death = err(libc.prctl(1, 0, 0, 0, 0))\n"  # PR_SET_PDEATHSIG, 0: clear it
        "deathsig = ctypes.c_int(-1)\nlibc.prctl(2, ctypes.byref(deathsig), 0, 0, 0)\n"  # PR_GET_PDEATHSIG
        "mode = libc.prctl(21, 0, 0, 0, 0)\n"  # PR_GET_SECCOMP: an allowed option
    )
    checks = (
        "assert shm == (-1, 1) and msg == (-1, 1) and sem == (-1, 1) and memfd == (-1, 1), (shm, msg, sem, memfd)\n"
        "assert os_memfd == 1, os_memfd\n"
        "assert death == (-1, 1) and deathsig.value == 9, (death, deathsig.value)\n"
        "assert mode == 2, mode"
    )
    r = _run(isolated, probe, checks)
    assert r.passed, r


def test_isolated_sandbox_still_grades_ordinary_programs(isolated):
    code = (
        "import math, re, collections, heapq, itertools, functools, bisect, string, datetime, decimal, fractions\n"
        "import random, statistics, json, typing, copy, operator, array, cmath, tempfile\n"
        "with tempfile.TemporaryFile() as f:\n    f.write(b'ok')\n" + GOOD
    )
    r = _run(isolated, code, "assert sum_squares([1, 2, 3]) == 14\nassert math.gcd(12, 18) == 6")
    assert r.passed, r
    assert _run(isolated, GOOD, "assert sum_squares([1]) == 2").passed is False


@pytest.mark.skipif(sandbox_seccomp.machine() != "x86_64", reason="the x32 ABI exists on x86-64 only")
def test_isolated_code_cannot_use_another_abi(isolated):
    """A system call through the x32 ABI would slip past a filter keyed on x86-64 numbers: it kills."""
    r = _run(isolated, "import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\n")  # x32 getpid
    assert not r.passed and "killed by signal 31" in r.reason, r  # SIGSYS


def test_seccomp_filter_is_built_for_known_architectures_only():
    for arch in ("x86_64", "aarch64"):
        prog = sandbox_seccomp.build_filter(arch)
        assert len(prog) % 8 == 0 and 60 < len(prog) // 8 < 256
    with pytest.raises(ValueError, match="architecture 'riscv64' is not supported"):
        sandbox_seccomp.build_filter("riscv64")


def test_the_guard_refuses_ctypes_reached_without_an_import_event():
    """Pure Python loaded the C extension by file name (no ``import`` event the guard sees) and scanned memory with
    ``string_at`` to reach raw system calls under the default config; every ``ctypes.*`` audit event is refused."""
    sandbox = _require_isolation(Sandbox(SandboxConfig(timeout_s=10, isolation="namespaces")))
    code = (
        "import importlib.util, sys, glob, os, types\n"
        "d = os.path.dirname(os.__file__)\n"
        "spec = importlib.util.spec_from_file_location('_ctypes', glob.glob(d + '/lib-dynload/_ctypes.*.so')[0])\n"
        "_ct = importlib.util.module_from_spec(spec)\nsys.modules['_ctypes'] = _ct\nspec.loader.exec_module(_ct)\n"
        "src = open(d + '/ctypes/__init__.py').read()\n"
        "src = src.replace('pythonapi = PyDLL(None)', 'pythonapi = None').replace('from ctypes._endian import', '#')\n"
        "ct = types.ModuleType('ctypes')\nct.__path__ = [d + '/ctypes']\nsys.modules['ctypes'] = ct\n"
        "exec(compile(src, 'copy.py', 'exec'), ct.__dict__)\n"
        "head = ct.string_at(_ct._memmove_addr & ~0xFFF, 4)\n"
    )
    r = _run(sandbox, code)
    assert not r.passed and "ctypes." in r.reason and "is not allowed" in r.reason, r
