"""The program that runs inside the MBPP sandbox (stdlib only; started by :mod:`.sandbox`).

Run as ``python -I sandbox_harness.py '<json config>'`` with the job on stdin as one JSON object
``{"nonce": str, "code": str, "tests": str}``. Steps:

1. ``isolation == "namespaces"`` (we are PID 1 of fresh PID/net/mount namespaces made by
   ``unshare``): bind the work dir onto itself, remount every other mount read-only, drop every
   capability and set no_new_privs, so the read-only mounts cannot be undone.
2. Resource limits: CPU seconds, address space (bytes), file size (bytes), open files, processes.
3. A Python audit hook (``python_guard``) refusing process creation, sockets, native code
   (ctypes), raising limits and any file write/removal outside the work dir.
4. Execute the candidate's code, then the tests, in one namespace. Only when every test passes is
   the nonce printed — a program that exits early (``sys.exit(0)``, ``os._exit(0)``) never passes.
   (The nonce guards against accidents; code written to fool the grader could find it. The
   sandbox protects the machine, not the score, from adversarial code.)

Exit codes: 0 = passed, 1 = failed (the reason is on stderr), 3 = sandbox setup failed.
"""

import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
_FLAG = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
         "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}  # fmt: skip
# pseudo file systems a remount may refuse; nothing under them is writable without capabilities
_PSEUDO = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "debugfs", "tracefs", "securityfs",
           "pstore", "bpf", "fusectl", "configfs", "binfmt_misc", "autofs", "hugetlbfs", "nsfs"}  # fmt: skip


def _unescape(s):
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def lock_down_filesystem(workdir):
    """Make everything but ``workdir`` read-only and drop capabilities (needs a private mount ns)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]

    def mount(src, target, flags):
        if libc.mount(src, target.encode(), None, flags, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {target}: {os.strerror(err)}")

    mount(workdir.encode(), workdir, MS_BIND | MS_REC)
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in reversed(mounts):  # children first
        target = _unescape(fields[4])
        fstype = fields[fields.index("-") + 1]
        if target == workdir or "ro" in fields[5].split(","):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in fields[5].split(","):
            flags |= _FLAG.get(opt, 0)
        try:
            mount(None, target, flags)
        except OSError:
            if fstype not in _PSEUDO:
                raise
    # no capabilities from here on: the read-only mounts cannot be undone
    PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def set_limits(cfg):
    def lim(res, value):
        value = int(value)
        hard = resource.getrlimit(res)[1]
        if hard != resource.RLIM_INFINITY and hard < value:
            value = hard
        resource.setrlimit(res, (value, value))

    lim(resource.RLIMIT_CPU, cfg["cpu_s"])
    lim(resource.RLIMIT_AS, cfg["memory_mb"] * 1024 * 1024)
    lim(resource.RLIMIT_FSIZE, cfg["file_size_mb"] * 1024 * 1024)
    lim(resource.RLIMIT_NOFILE, 64)
    lim(resource.RLIMIT_CORE, 0)
    if os.getuid() != 0:  # not enforced for root; the PID namespace and the guard cover that case
        lim(resource.RLIMIT_NPROC, 0)


_BLOCKED = {
    "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "subprocess.Popen",
    "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn", "os.setuid", "os.setgid",
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr",
    "ctypes.dlopen", "ctypes.dlsym", "resource.setrlimit", "resource.prlimit",
}
_PATH_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.rename": 2, "os.truncate": 1, "os.chmod": 1, "os.chown": 1,
                "os.link": 2, "os.symlink": 2, "os.mkdir": 1, "os.utime": 1, "os.setxattr": 1,
                "os.removexattr": 1, "shutil.rmtree": 1, "os.chflags": 1, "os.lchflags": 1}  # fmt: skip
_NATIVE = {"ctypes", "_ctypes", "cffi", "_cffi_backend", "_posixsubprocess", "_xxsubinterpreters"}


def install_guard(workdir):
    """Audit hook: refuse processes, network, native code and writes outside ``workdir``."""
    root = os.path.realpath(workdir) + os.sep
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def inside(p):
        if isinstance(p, int):
            return True
        try:
            p = fspath(p)
            if isinstance(p, bytes):
                p = p.decode("utf-8", "surrogateescape")
            return (realpath(p) + sep).startswith(root)
        except Exception:  # noqa: BLE001
            return False

    def hook(event, args):
        if event in _BLOCKED:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and str(args[0]).split(".")[0] in _NATIVE:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (flags or 0) & write_flags
            if writing and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed")
        n = _PATH_EVENTS.get(event)
        if n and not all(inside(p) for p in args[:n]):
            raise PermissionError(f"sandbox: {event} outside the work directory is not allowed")

    sys.addaudithook(hook)


def main():
    cfg = json.loads(sys.argv[1])
    job = json.loads(sys.stdin.readline())
    workdir = cfg["workdir"]
    try:
        if cfg["isolation"] == "namespaces":
            lock_down_filesystem(workdir)
        set_limits(cfg)
        # self-destruct should the runner be gone (PID 1 of a namespace needs an explicit handler)
        import signal

        signal.signal(signal.SIGALRM, lambda *_: os._exit(124))
        signal.alarm(max(1, int(cfg["wall_s"]) + 1))
        os.chdir(workdir)
        for var in ("HOME", "TMPDIR", "TMP", "TEMP"):
            os.environ[var] = workdir
        import tempfile

        tempfile.tempdir = workdir
        for name in [m for m in sys.modules if m.split(".")[0] in _NATIVE]:
            del sys.modules[name]
        if cfg["python_guard"]:
            install_guard(workdir)
    except Exception as e:  # noqa: BLE001
        sys.stderr.write(f"sandbox setup failed: {type(e).__name__}: {e}\n")
        sys.stderr.flush()
        os._exit(3)
    if cfg.get("probe"):
        print(job["nonce"], flush=True)
        os._exit(0)
    run(job["code"], job["tests"], job["nonce"])


def run(code, tests, nonce):
    scope = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(code, "solution.py", "exec"), scope)
        exec(compile(tests, "tests.py", "exec"), scope)
    except BaseException as e:  # noqa: BLE001  (SystemExit and KeyboardInterrupt included: a fail)
        sys.stdout.flush()
        sys.stderr.write(f"{type(e).__name__}: {str(e)[:500]}\n")
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.write("\n" + nonce + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
