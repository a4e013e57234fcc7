"""The longest silence of a command: run it, time every output line, report the longest gap between lines.

    python benchmarks/longest_gap.py [--quiet] [--top N] -- energy-router demo --quick --db sqlite:///x.db --workdir x

stdout and stderr are read together, line by line, as they come (the child runs with ``PYTHONUNBUFFERED=1``, so
a Python program's lines are not held in a pipe buffer it would not hold on a terminal). Each line is echoed with
its time since the start (``--quiet``: not echoed). The gaps counted are: start → first line, line → line, last
line → exit. Ends with the ``--top`` longest gaps (which line each followed) and one line
``longest_gap_s=... gap_after=... lines=... wall_s=... rc=...``. Exit status: the command's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def gaps(stamps: list[float], end: float) -> list[tuple[float, int]]:
    """``(seconds, index of the line the gap follows; -1 = the start)`` for every gap, start and exit included;
    ``stamps``: each line's time since the start (s), in order; ``end``: the exit time (s)."""
    points = [0.0, *stamps, end]
    return [(points[i + 1] - points[i], i - 1) for i in range(len(points) - 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quiet", action="store_true", help="do not echo the command's lines")
    ap.add_argument("--top", type=int, default=5, help="how many of the longest gaps to list")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command after --")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, bufsize=0)
    except OSError as e:
        print(f"longest_gap: cannot run {cmd[0]!r}: {e.strerror}", file=sys.stderr)
        return 2
    lines: list[str] = []
    stamps: list[float] = []
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        t = time.monotonic() - t0
        line = raw.decode("utf-8", "replace").rstrip("\n")
        lines.append(line)
        stamps.append(t)
        if not a.quiet:
            print(f"[{t:7.1f}s] {line}", flush=True)
    rc = proc.wait()
    end = time.monotonic() - t0
    g = gaps(stamps, end)
    order = sorted(range(len(g)), key=lambda i: -g[i][0])[: max(a.top, 1)]
    print(f"longest gaps between output lines ({len(lines)} lines, {end:.1f} s):")
    for i in order:
        s, after = g[i]
        where = "the start" if after < 0 else f"line {after + 1} ({lines[after][:90]!r})"
        print(f"  {s:6.1f} s after {where}")
    s, after = g[order[0]]
    print(
        f"longest_gap_s={s:.1f} gap_after={'start' if after < 0 else after + 1} lines={len(lines)} wall_s={end:.1f} rc={rc}"
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
