"""MBPP grading in the code sandbox: hazards score 0, leave the machine unchanged, and the run goes on."""

from __future__ import annotations

import asyncio
import glob
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest
from litellm_energy_router.profiling.sandbox import Sandbox, SandboxConfig, SandboxError
from litellm_energy_router.profiling.tasks import GradeContext, get_task

TASKS = Path(__file__).parent / "data" / "tasks"
GOOD = "def sum_squares(nums):\n    return sum(n * n for n in nums)\n"


def _procs() -> set[int]:
    """PIDs of running sandbox harness processes (and anything they started, which shares the cmdline)."""
    out = set()
    for d in glob.glob("/proc/[0-9]*"):
        try:
            if b"sandbox_harness" in Path(d, "cmdline").read_bytes():
                out.add(int(d.rsplit("/", 1)[1]))
        except OSError:
            pass
    return out


def _sandbox_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "er-sandbox-*")))


@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that records whether anyone connected."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.settimeout(0.5)
    yield s
    s.close()


def _no_connection(s: socket.socket) -> bool:
    try:
        conn, _ = s.accept()
    except (socket.timeout, TimeoutError):
        return True
    conn.close()
    return False


def _hazards(sentinel: Path, port: int) -> dict[str, str]:
    fence = lambda code: f"```python\n{code}\n```"  # noqa: E731
    return {
        "wrong": fence("def sum_squares(nums):\n    return sum(nums)"),
        "infinite_loop": fence("def sum_squares(nums):\n    while True:\n        pass"),
        "fork_bomb": fence("import os\nwhile True:\n    os.fork()\n" + GOOD),
        "network": fence(
            f"import socket, urllib.request\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n"
            f"urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2)\n" + GOOD
        ),
        "remove_outside": fence(f"import os\nos.remove({str(sentinel)!r})\n" + GOOD),
        "early_exit": fence("import os\nos._exit(0)\n" + GOOD.replace("n * n", "n")),
        # an answer equal to anything, and a number subclass that says so: wrong code must not pass the asserts
        "always_equal": fence("class _Any:\n    __eq__ = lambda s, o: True\ndef sum_squares(nums):\n    return _Any()"),
        "equal_int": fence("class N(int):\n    __eq__ = lambda s, o: True\ndef sum_squares(nums):\n    return N(0)"),
        # the harness's own setup-failure code: an ordinary failure, not an error that stops the tournament
        "exit_three": fence("import os, sys\nsys.stderr.write('sandbox setup failed: forged\\n')\nos._exit(3)\n"),
        # leave the process group and cancel the harness's alarm, then outlive the run's kill
        "escape_kill": fence(
            "import os, signal, time\nfor f in (os.setsid, lambda: signal.alarm(0)):\n    try:\n        f()\n"
            "    except OSError:\n        pass\ntime.sleep(25)\n" + GOOD
        ),
    }


def test_mbpp_grader_hazards_score_zero_machine_unchanged(tmp_path, listener):
    sentinel = tmp_path / "keep_me.txt"
    sentinel.write_text("precious")
    procs0, dirs0 = _procs(), _sandbox_dirs()
    mbpp = get_task("mbpp")
    item = next(i for i in mbpp.load(TASKS / "mbpp.jsonl") if i.id == "9201")
    sandbox = Sandbox(SandboxConfig(timeout_s=3, max_parallel=2))
    ctx = GradeContext(sandbox=sandbox)
    answers = {
        "correct_first": f"```python\n{GOOD}```",
        **_hazards(sentinel, listener.getsockname()[1]),
        "correct_after": f"Here you go:\n```python\n{GOOD}```",
    }

    async def grade_all():
        t0 = time.monotonic()
        grades = await asyncio.gather(*(mbpp.grade(item, text, ctx) for text in answers.values()))
        return dict(zip(answers, grades)), time.monotonic() - t0

    grades, seconds = asyncio.run(grade_all())
    scores = {k: g.score for k, g in grades.items()}
    assert scores == {
        "correct_first": 1.0,
        "wrong": 0.0,
        "infinite_loop": 0.0,
        "fork_bomb": 0.0,
        "network": 0.0,
        "remove_outside": 0.0,
        "early_exit": 0.0,
        "exit_three": 0.0,
        "always_equal": 0.0,
        "equal_int": 0.0,
        "escape_kill": 0.0,
        "correct_after": 1.0,
    }, {k: g.detail for k, g in grades.items()}
    assert "forged" in grades["exit_three"].detail
    assert "timed out" in grades["infinite_loop"].detail
    assert seconds < 15  # the hanging program was killed at its 3 s limit; nothing waited on it longer
    # the machine is unchanged: file intact, nobody connected, no process or temp dir left behind
    assert sentinel.read_text() == "precious"
    assert _no_connection(listener)
    assert _procs() == procs0
    assert _sandbox_dirs() == dirs0


def test_os_layer_alone_contains_the_program(tmp_path, listener):
    """With the Python guard off, the namespaces and the seccomp filter alone stop network, writes
    outside (the host's files are not even visible), and stray processes."""
    sandbox = Sandbox(SandboxConfig(timeout_s=3, isolation="auto", python_guard=False))
    try:
        iso = asyncio.run(sandbox.isolation())
    except SandboxError as e:
        pytest.skip(f"no namespaces here: {e}")
    assert iso == "namespaces"
    sentinel = tmp_path / "keep_me.txt"
    sentinel.write_text("precious")
    port = listener.getsockname()[1]
    procs0 = _procs()
    progs = {
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n",
        "remove": f"import os\nos.remove({str(sentinel)!r})\n",
        "write": f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')\n",
        "orphans": "import os, time\nfor _ in range(20):\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(600)\n",
        "ok": "x = 1\n",
    }

    async def run_all():
        return await asyncio.gather(
            *(sandbox.run(code, "assert x == 1" if k == "ok" else "assert False") for k, code in progs.items())
        )

    results = dict(zip(progs, asyncio.run(run_all())))
    assert results["ok"].passed
    assert "Operation not permitted" in results["network"].reason  # seccomp: no socket() at all
    assert (
        "No such file or directory" in results["remove"].reason
        and "No such file or directory" in results["write"].reason
    )
    assert not results["orphans"].passed
    time.sleep(0.2)
    assert sentinel.read_text() == "precious" and not (tmp_path / "new.txt").exists()
    assert _no_connection(listener)
    assert _procs() == procs0  # the 20 detached sleepers died with the PID namespace


def test_guard_off_without_namespaces_is_refused():
    sandbox = Sandbox(SandboxConfig(isolation="process", python_guard=False))
    with pytest.raises(SandboxError, match="python_guard=false needs"):
        asyncio.run(sandbox.isolation())


def test_process_isolation_still_grades_and_contains(tmp_path):
    sentinel = tmp_path / "keep_me.txt"
    sentinel.write_text("precious")
    sandbox = Sandbox(SandboxConfig(timeout_s=3, isolation="process"))
    ok = asyncio.run(sandbox.run(GOOD, "assert sum_squares([1, 2]) == 5"))
    bad = asyncio.run(sandbox.run(f"import os\nos.remove({str(sentinel)!r})", "assert True"))
    fork = asyncio.run(sandbox.run("import subprocess\nsubprocess.run(['true'])", "assert True"))
    # inside the work dir every file operation works (shutil.rmtree goes through dir_fds)
    inside = (
        "import os, shutil, tempfile\nos.makedirs('t/u')\nopen('t/u/f', 'w').write('x')\nos.rename('t/u/f', 't/g')\n"
        "shutil.rmtree('t')\ntempfile.TemporaryDirectory(dir='.').cleanup()\nx = 1"
    )
    assert asyncio.run(sandbox.run(inside, "assert x == 1")).passed
    # through a directory's fd: the 'open' audit event carries no dir_fd, os.remove's does
    d = f"import os\nd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
    via_fd = asyncio.run(sandbox.run(d + "os.remove('keep_me.txt', dir_fd=d)", "assert True"))
    made = asyncio.run(
        sandbox.run(d + "os.close(os.open('new.txt', os.O_WRONLY | os.O_CREAT, dir_fd=d))", "assert True")
    )
    assert ok.passed and not bad.passed and not fork.passed and not via_fd.passed and not made.passed
    assert all("not allowed" in r.reason for r in (bad, fork, via_fd, made)), [bad, fork, via_fd, made]
    assert sentinel.read_text() == "precious" and not (tmp_path / "new.txt").exists()


def _graded(code: str, tests: str) -> str:
    """Run ``code`` then ``tests`` as the harness does (its checks, no sandbox): "passed" or the failure."""
    import operator

    from litellm_energy_router.profiling.sandbox_asserts import SOLUTION_FILE, checked, compare, tests_tree

    scope = {"__name__": "solution"}
    saved = dict(vars(operator))  # a solution may patch the module: this process is the test run's own
    try:
        tree = tests_tree(tests)
        exec(compile(code, SOLUTION_FILE, "exec"), scope)
        scope.update(__er_compare__=compare, __er_checked__=checked)
        exec(compile(tree, "tests.py", "exec"), scope)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    finally:
        vars(operator).update(saved)
    return "passed"


@pytest.mark.parametrize(
    "code, tests",
    [
        ("from collections import Counter\ndef f(s):\n    return Counter(s)", "assert f('aab') == {'a': 2, 'b': 1}"),
        (
            "from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f():\n    return P(1, 2)",
            "assert f() == (1, 2)",
        ),
        (
            "from collections import defaultdict\ndef f():\n    d = defaultdict(int)\n    d['a'] += 1\n    return d",
            "assert f() == {'a': 1}",
        ),
        ("import numpy as np\ndef f(x):\n    return np.float64(x) * 2", "assert f(1.5) == 3.0"),
        ("import numpy as np\ndef f():\n    return np.array([1, 2])", "assert (f() == np.array([1, 2])).all()"),
        ("def f(x):\n    return x", "assert 1 < f(2) < 3\nassert f(None) is None\nassert 2 in [f(2)]\nassert not f(0)"),
        ("import math\ndef f():\n    return 0.1 + 0.2", "assert math.isclose(f(), 0.3)\nassert set([f()]) == {f()}"),
        (
            "def f(n):\n    return [i * i for i in range(n)]",
            "assert all(x >= 0 for x in f(4))\nassert f(3) == [0, 1, 4]",
        ),
        ("def f():\n    return 3", "class Node:\n    def __eq__(self, o):\n        return True\nassert Node() == f()"),
    ],
)
def test_the_assert_checks_pass_correct_answers(code, tests):
    """Standard and library types (Counter, namedtuple, defaultdict, numpy) compare as anywhere, a comparison keeps
    its own result (a numpy array), chains, ``in``, ``is``, ``not``, generator expressions and classes the tests
    define: correct code passes."""
    assert _graded(code, tests) == "passed"


@pytest.mark.parametrize(
    "code",
    [
        "class _Any:\n    __eq__ = lambda s, o: True\ndef f(x):\n    return _Any()",
        "class N(int):\n    def __eq__(s, o):\n        return True\ndef f(x):\n    return N(0)",
        "def f(x):\n    return [type('T', (), {'__eq__': lambda s, o: True})()]",
        "def f(x):\n    class B:\n        __bool__ = lambda s: True\n    return B()",
        "import operator\noperator.eq = lambda a, b: True\ndef f(x):\n    return 0",
    ],
)
def test_the_assert_checks_fail_values_that_say_they_are_right(code):
    """A value whose comparison or truth the solution wrote (a class, an int subclass, one made by type(), one
    nested in a list, one made inside the function), and a patched operator module: the asserts fail."""
    assert _graded(code, "assert f(2) == [5]\nassert f(2) == 5 or f(2)") != "passed"


def test_a_program_that_timed_out_on_a_busy_host_runs_again_alone(tmp_path):
    """A correct program slowed past the wall-clock limit (here: held while a file on the host exists, which only
    ``process`` isolation can see) is run again alone and passes; an endless loop times out on every try, and with
    ``timeout_retries: 0`` the first timeout is the verdict (the earlier behaviour)."""
    busy = tmp_path / "busy"
    busy.write_text("")
    held = f"import os, time\nwhile os.path.exists({str(busy)!r}):\n    time.sleep(0.02)\n" + GOOD
    test = "assert sum_squares([1, 2]) == 5"

    async def free_later():
        cfg = SandboxConfig(timeout_s=1, isolation="process", timeout_retries=2)
        run = asyncio.ensure_future(Sandbox(cfg).run(held, test))
        await asyncio.sleep(1.3)  # after the first try's timeout (1 s)
        busy.unlink()
        return await run

    r = asyncio.run(free_later())
    assert r.passed and r.reason.startswith("all tests passed (try ") and "run alone after " in r.reason, r
    loop = "while True:\n    pass\n"
    r = asyncio.run(Sandbox(SandboxConfig(timeout_s=1, isolation="process")).run(loop, test))
    assert not r.passed and r.reason == "timed out after 1 s (try 2, run alone after 1 timeout)", r
    busy.write_text("")
    r = asyncio.run(Sandbox(SandboxConfig(timeout_s=1, isolation="process", timeout_retries=0)).run(held, test))
    assert not r.passed and r.reason == "timed out after 1 s", r


def test_a_retry_cancelled_while_it_waits_for_the_slots_gives_back_what_it_took():
    """The alone retry takes every slot one by one; cancelled half way (a tournament stopped), it gives back the
    slots it held, so the sandbox still runs ``max_parallel`` programs at once."""

    async def scenario():
        sandbox = Sandbox(SandboxConfig(timeout_s=2, isolation="process", max_parallel=2))
        loop = asyncio.ensure_future(sandbox.run("while True:\n    pass\n", "assert True"))
        await asyncio.sleep(1.6)
        long = asyncio.ensure_future(sandbox.run("import time\ntime.sleep(1.2)\n", "assert True"))  # holds a slot
        await asyncio.sleep(0.7)  # the loop timed out (2 s); its retry holds the free slot and waits for the other
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
        assert (await long).passed
        both = await asyncio.gather(*[sandbox.run("import time\ntime.sleep(0.3)\n", "assert True") for _ in range(2)])
        return both, sandbox._sem._value

    both, free = asyncio.run(scenario())
    assert all(r.passed for r in both) and free == 2, (both, free)
