"""The seccomp filter of the code sandbox: a classic-BPF program, built here, installed by the harness.

The filter refuses (``EPERM``) the system calls model-written code has no use for and that widen
what it can reach: every ``socket()`` (no network, no connecting to a host's Unix sockets; a
``socketpair()`` stays allowed), mounts and namespaces (``mount``, ``unshare``, ``setns``, ``clone``
with a ``CLONE_NEW*`` flag, the new mount API), device nodes and FIFOs (``mknod``), ``ptrace`` and
cross-process memory access, kernel surfaces that have carried exploits (``bpf``, ``perf_event_open``,
``userfaultfd``, ``io_uring``, keyrings), machine administration (modules, reboot, swap, clock), and what
would outlive the run's kill or reach the runner: leaving the process group (``setsid``, ``setpgid``), cancelling
the harness's alarm (``alarm``, ``setitimer``), clearing its parent-death signal (``prctl(PR_SET_PDEATHSIG)``),
pidfds (``pidfd_open``, ``pidfd_send_signal``); and memory the address-space limit does not count (System V shared
memory, message queues and semaphores, ``memfd_create``).
``clone3`` answers ``ENOSYS`` (its flags live in memory a filter cannot read), so the C library falls
back to ``clone``, which is checked. A call made for another ABI (x32 on x86-64) kills the process.

Only x86-64 and AArch64 are known; :func:`build_filter` raises :class:`ValueError` on others.
"""

from __future__ import annotations

import platform
import struct

_DENY = (
    "socket",
    "ptrace",
    "syslog",
    "mknod",
    "mknodat",
    "chroot",
    "mount",
    "umount2",
    "swapon",
    "swapoff",
    "reboot",
    "sethostname",
    "setdomainname",
    "iopl",
    "ioperm",
    "init_module",
    "finit_module",
    "delete_module",
    "quotactl",
    "acct",
    "settimeofday",
    "adjtimex",
    "clock_settime",
    "clock_adjtime",
    "pivot_root",
    "modify_ldt",
    "vhangup",
    "lookup_dcookie",
    "kexec_load",
    "kexec_file_load",
    "add_key",
    "request_key",
    "keyctl",
    "unshare",
    "setns",
    "perf_event_open",
    "fanotify_init",
    "name_to_handle_at",
    "open_by_handle_at",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "bpf",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "pidfd_getfd",
    "mount_setattr",
    "pidfd_open",
    "pidfd_send_signal",
    "setsid",
    "setpgid",
    "alarm",
    "setitimer",
    # memory RLIMIT_AS does not count: System V shared memory (a detached segment outlives the run and belongs to no
    # process the OOM killer would pick), message queues, semaphore sets, memfd pages
    "shmget",
    "shmat",
    "msgget",
    "semget",
    "memfd_create",
)
_NEW_CALLS = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_send_signal": 424,
    "pidfd_open": 434,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}
# system call numbers (asm/unistd_64.h; asm-generic/unistd.h for AArch64); a name missing on an arch does not exist there
_X86_64 = {
    "socket": 41,
    "ptrace": 101,
    "syslog": 103,
    "mknod": 133,
    "mknodat": 259,
    "chroot": 161,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "quotactl": 179,
    "acct": 163,
    "settimeofday": 164,
    "adjtimex": 159,
    "clock_settime": 227,
    "clock_adjtime": 305,
    "pivot_root": 155,
    "modify_ldt": 154,
    "vhangup": 153,
    "lookup_dcookie": 212,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "setns": 308,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "bpf": 321,
    "userfaultfd": 323,
    "clone": 56,
    "setsid": 112,
    "setpgid": 109,
    "alarm": 37,
    "setitimer": 38,
    "shmget": 29,
    "shmat": 30,
    "msgget": 68,
    "semget": 64,
    "memfd_create": 319,
    "prctl": 157,
    **_NEW_CALLS,
}
_AARCH64 = {
    "socket": 198,
    "ptrace": 117,
    "syslog": 116,
    "mknodat": 33,
    "chroot": 51,
    "mount": 40,
    "umount2": 39,
    "swapon": 224,
    "swapoff": 225,
    "reboot": 142,
    "sethostname": 161,
    "setdomainname": 162,
    "init_module": 105,
    "finit_module": 273,
    "delete_module": 106,
    "quotactl": 60,
    "acct": 89,
    "settimeofday": 170,
    "adjtimex": 171,
    "clock_settime": 112,
    "clock_adjtime": 266,
    "pivot_root": 41,
    "vhangup": 58,
    "lookup_dcookie": 18,
    "kexec_load": 104,
    "kexec_file_load": 294,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "unshare": 97,
    "setns": 268,
    "perf_event_open": 241,
    "fanotify_init": 262,
    "name_to_handle_at": 264,
    "open_by_handle_at": 265,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "kcmp": 272,
    "bpf": 280,
    "userfaultfd": 282,
    "clone": 220,
    "setsid": 157,
    "setpgid": 154,
    "setitimer": 103,
    "shmget": 194,
    "shmat": 196,
    "msgget": 186,
    "semget": 190,
    "memfd_create": 279,
    "prctl": 167,
    **_NEW_CALLS,
}
# machine name -> (AUDIT_ARCH_*, syscall table, lowest number of a foreign ABI to kill or None)
ARCHES = {"x86_64": (0xC000003E, _X86_64, 0x40000000), "aarch64": (0xC00000B7, _AARCH64, None)}
ARCHES["amd64"], ARCHES["arm64"] = ARCHES["x86_64"], ARCHES["aarch64"]

_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_PR_SET_PDEATHSIG = 1  # prctl option: clearing the parent-death signal let the program outlive a killed runner
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data: nr, arch, instruction_pointer, args[6]


def machine() -> str:
    return platform.machine().lower()


def syscall_number(name: str, arch: str | None = None) -> int:
    """The number of system call ``name`` on ``arch`` (default: this machine); ValueError if unknown."""
    arch = arch or machine()
    if arch not in ARCHES:
        raise ValueError(f"seccomp filter: architecture {arch!r} is not supported (x86_64, aarch64)")
    return ARCHES[arch][1][name]


def build_filter(arch: str | None = None) -> bytes:
    """The BPF program (``struct sock_filter[]`` in native byte order) for ``arch`` (default: this machine)."""
    arch = arch or machine()
    if arch not in ARCHES:
        raise ValueError(f"seccomp filter: architecture {arch!r} is not supported (x86_64, aarch64)")
    audit_arch, table, foreign = ARCHES[arch]
    deny = [table[n] for n in _DENY if n in table]
    prog: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 1, 0, audit_arch),
        (_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if foreign is not None:
        prog += [(_JGE_K, 0, 1, foreign), (_RET_K, 0, 0, _RET_KILL_PROCESS)]
    # one jump per denied number to the EPERM return of the prctl check (the 6th instruction after the list)
    for i, nr in enumerate(deny):
        prog.append((_JEQ_K, len(deny) - i + 4, 0, nr))  # over the rest and 5 instructions: EPERM
    prog += [
        (_JEQ_K, 0, 1, table["clone3"]),
        (_RET_K, 0, 0, _RET_ERRNO | _ENOSYS),
        (_JEQ_K, 0, 3, table["prctl"]),  # prctl(PR_SET_PDEATHSIG, ...): EPERM (the harness set it before)
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
        (_JEQ_K, 0, 5, _PR_SET_PDEATHSIG),  # another prctl option: allowed
        (_RET_K, 0, 0, _RET_ERRNO | _EPERM),
        (_JEQ_K, 0, 3, table["clone"]),
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
        (_JSET_K, 0, 1, _CLONE_NEW),
        (_RET_K, 0, 0, _RET_ERRNO | _EPERM),
        (_RET_K, 0, 0, _RET_ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)
