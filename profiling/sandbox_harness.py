"""The program that runs inside the MBPP sandbox (stdlib only; started by :mod:`.sandbox`).

Run as ``python -I sandbox_harness.py '<json config>'`` with the job on stdin as one JSON object
``{"nonce": str, "code": str, "tests": str}``. Steps:

1. ``isolation == "namespaces"`` (we are PID 1 of fresh PID/net/mount/IPC/UTS namespaces made by
   ``unshare``): build a new root on a small tmpfs holding read-only binds of ``visible`` only (the
   system's ``/usr``..., the Python installation) and a few ``/dev`` nodes, mount the work dir as a
   tmpfs of ``work_dir_mb`` MB (the one writable place), ``pivot_root`` into it and detach the host's
   root; then drop every capability, switch to ``uid`` (``nobody``, when the runner is root) and set
   no_new_privs, so nothing of this can be undone.
2. Resource limits: CPU seconds, address space (bytes), file size (bytes), open files, processes.
3. The seccomp filter of :mod:`.sandbox_seccomp` (``seccomp``: the BPF program, hex), in every mode.
4. A Python audit hook (``python_guard``) refusing process creation, sockets, native code
   (ctypes, sqlite3, dbm, multiprocessing), FIFOs, raising limits and file writes/removals outside
   the work dir.
5. Execute the candidate's code, then the tests, in one namespace. Only when every test passes is
   the nonce printed — a program that exits early (``sys.exit(0)``, ``os._exit(0)``) never passes.
   Every comparison and assertion of the tests first checks its values hold nothing whose comparison
   the solution defines (an object equal to anything fails). (The nonce and the checks guard against
   accidents and lazy hacks; code written to fool the grader could find the nonce in memory. The
   sandbox protects the machine, not the score, from adversarial code.)

Exit codes: 0 = passed, 1 = failed (the reason is on stderr), 3 = sandbox setup failed.
"""

import json
import os
import resource
import stat
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # read now: the host's paths vanish in step 1
from sandbox_asserts import SOLUTION_FILE, checked, compare, tests_tree  # noqa: E402

del sys.path[0]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
_FLAG = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
_DEVICES = ("null", "zero", "full", "random", "urandom")
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_PDEATHSIG = 38, 22, 2, 1


def _unescape(s):
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p]
    return libc


def _check(rc, what):
    import ctypes

    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, src, target, fstype, flags, data=None):
    enc = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
    _check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _make_parents(root, path):
    """Create the directories of ``root + path`` one by one, refusing to pass a symlink or a mount
    (so nothing is ever created through a bind of the host). False when the path cannot be made."""
    cur, dev = root, os.lstat(root).st_dev
    for part in [p for p in path.split("/") if p]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_dev != dev:
            return False
    return True


def _expose(libc, root, path):
    """Make host ``path`` visible at the same place under ``root``: a symlink is copied, a file or a
    directory is bind-mounted (made read-only later with every other mount under ``root``)."""
    if not os.path.lexists(path):
        return
    parent, name = os.path.split(path.rstrip("/"))
    if not _make_parents(root, parent):
        return
    dest = os.path.join(root + parent, name)
    if os.path.lexists(dest):
        return
    if os.path.islink(path):
        os.symlink(os.readlink(path), dest)
        return
    if os.path.isdir(path):
        os.mkdir(dest, 0o755)
    else:
        os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    _mount(libc, path, dest, None, MS_BIND | MS_REC)


def _remount_read_only(libc, root, keep):
    """Every mount at or under ``root`` except ``keep`` becomes read-only (children first)."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in reversed(mounts):
        target = _unescape(fields[4])
        if target == keep or not (target == root or target.startswith(root + "/")):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        for opt in fields[5].split(","):
            flags |= _FLAG.get(opt, 0)
        _mount(libc, None, target, None, flags)


def lock_down_filesystem(cfg):
    """Pivot into a new read-only root showing only ``cfg["visible"]``, the work dir a size-capped
    tmpfs; then give up every privilege (needs the private namespaces ``unshare`` made)."""
    libc, work, uid = _libc(), cfg["workdir"], cfg.get("uid")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    root = work  # the new root: a small tmpfs over the (empty, private) work dir of the host
    _mount(libc, "er-sandbox-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for path in cfg["visible"]:
        _expose(libc, root, path)
    for dev in _DEVICES:
        _expose(libc, root, "/dev/" + dev)
    inner = root + work
    if not _make_parents(root, work):
        raise OSError(f"work dir {work}: cannot be made inside the new root")
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    _mount(
        libc,
        "er-sandbox-work",
        inner,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={cfg['work_dir_mb']}m,nr_inodes=16384,mode=0700{owner}",
    )
    _remount_read_only(libc, root, keep=inner)
    os.chdir(root)
    _check(libc.syscall(cfg["pivot_root_nr"], b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "detach the host root")
    os.chdir("/")
    drop_privileges(libc, uid)


def drop_privileges(libc, uid):
    """No capabilities (bounding, ambient, permitted, effective), then ``uid`` when given."""
    import ctypes

    PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        # a change of credentials clears the parent-death signal unshare --kill-child set: set it again, so the
        # runner's kill of unshare still takes this namespace down
        _check(libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "pdeathsig")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    _check(libc.capset(ctypes.byref(Header(0x20080522, 0)), data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def install_seccomp(program):
    """Load the BPF ``program`` (bytes of ``struct sock_filter[]``) as this process's seccomp filter."""
    import ctypes

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = _libc()
    buf = ctypes.create_string_buffer(program, len(program))
    prog = Fprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp filter")


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
    # no new processes or threads; never enforced on the host's root (process mode as root), where the
    # guard covers it (in a user namespace uid 0 is an ordinary user of the host)
    if os.getuid() != 0 or cfg["isolation"] == "namespaces":
        lim(resource.RLIMIT_NPROC, 0)


_BLOCKED = {
    "os.system",
    "os.exec",
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.spawn",
    "subprocess.Popen",
    "os.kill",
    "os.killpg",
    "signal.pthread_kill",
    "pty.spawn",
    "os.setuid",
    "os.setgid",
    "socket.__new__",
    "socket.connect",
    "socket.bind",
    "socket.sendto",
    "socket.sendmsg",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyname_ex",
    "socket.gethostbyaddr",
    "ctypes.dlopen",
    "ctypes.dlsym",
    "resource.setrlimit",
    "resource.prlimit",
}
_PATH_EVENTS = {
    "os.remove": 1,
    "os.rmdir": 1,
    "os.rename": 2,
    "os.truncate": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.link": 2,
    "os.symlink": 2,
    "os.mkdir": 1,
    "os.utime": 1,
    "os.setxattr": 1,
    "os.removexattr": 1,
    "shutil.rmtree": 1,
    "os.chflags": 1,
    "os.lchflags": 1,
}
# where each event's dir_fd arguments sit (CPython's audit arguments; -1 or None when the call gave none)
_DIR_FD_ARGS = {
    "os.remove": (1,),
    "os.rmdir": (1,),
    "os.rename": (2, 3),
    "os.chmod": (2,),
    "os.chown": (3,),
    "os.link": (2, 3),
    "os.symlink": (2,),
    "os.mkdir": (2,),
    "os.utime": (3,),
    "shutil.rmtree": (1,),
}
# native code, and C libraries that create files the audit hook never hears of (sqlite3's ATTACH,
# dbm files, POSIX semaphores in /dev/shm)
_NATIVE = {
    "ctypes",
    "_ctypes",
    "cffi",
    "_cffi_backend",
    "_posixsubprocess",
    "_xxsubinterpreters",
    "_sqlite3",
    "sqlite3",
    "_dbm",
    "_gdbm",
    "dbm",
    "_multiprocessing",
    "_posixshmem",
}
_NO_AUDIT_EVENT = ("mkfifo", "mknod")  # os functions that raise no audit event: removed


def install_guard(workdir):
    """Audit hook: refuse processes, network, native code, FIFOs and writes outside ``workdir``."""
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

    def fd_path(fd):
        try:
            return os.readlink(f"/proc/self/fd/{int(fd)}")
        except (OSError, TypeError, ValueError):
            return "/"  # unknown: outside

    def hook(event, args):
        if event in _BLOCKED or event.startswith("ctypes."):  # every ctypes event: string_at, cdata, dlopen...
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and str(args[0]).split(".")[0] in _NATIVE:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (flags or 0) & write_flags
            if writing and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed")
            if not isinstance(path, int) and not inside(path) and os.path.isdir(path):  # a dir_fd to write through
                raise PermissionError(f"sandbox: opening the directory {path!r} is not allowed")
        n = _PATH_EVENTS.get(event)
        if n and not all(inside(p) for p in args[:n]):
            raise PermissionError(f"sandbox: {event} outside the work directory is not allowed")
        for i in _DIR_FD_ARGS.get(event, ()):  # a dir_fd must name a directory inside (shutil.rmtree uses them)
            fd = args[i] if i < len(args) else None
            if fd not in (None, -1) and not inside(fd_path(fd)):
                raise PermissionError(f"sandbox: {event} through a directory outside the work directory")

    sys.addaudithook(hook)
    import posix

    for mod in (os, posix):
        for name in _NO_AUDIT_EVENT:
            if hasattr(mod, name):
                delattr(mod, name)


def main():
    cfg = json.loads(sys.argv[1])
    job = json.loads(sys.stdin.readline())
    workdir = cfg["workdir"]
    try:
        if cfg["isolation"] == "namespaces":
            if not cfg.get("seccomp"):
                raise ValueError("isolation 'namespaces' needs the seccomp filter")
            lock_down_filesystem(cfg)
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
        if cfg.get("seccomp"):
            install_seccomp(bytes.fromhex(cfg["seccomp"]))
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
        tree = tests_tree(tests)
        exec(compile(code, SOLUTION_FILE, "exec"), scope)
        scope.update(__er_compare__=compare, __er_checked__=checked)
        exec(compile(tree, "tests.py", "exec"), scope)
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
