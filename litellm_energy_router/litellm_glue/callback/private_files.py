"""Files only the proxy's user may read: the writer's spool, its offsets, ``rejected.jsonl`` and the
generated hashing salt. Directories 0700, files 0600 whatever the umask; a directory or file found
with wider permissions is narrowed. Creations and renames are made durable (the file, then its
directory, fsynced)."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Any

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | Path) -> Path:
    """Create ``path`` (and parents) if missing; make it 0700."""
    p = Path(path)
    p.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(p.stat().st_mode) != DIR_MODE:
        os.chmod(p, DIR_MODE)
    return p


def fsync_dir(path: str | Path) -> None:
    """Make the directory's entries (a created, renamed or deleted file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_private(path: str | Path, flags: int) -> int:
    """``os.open`` with mode 0600 (an existing file with wider permissions is narrowed); returns the fd."""
    fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically and durably (temporary file fsynced, renamed, directory
    fsynced)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` to the private file ``path`` and fsync it (and the directory when it was created); a write that
    fails half way is cut back off."""
    existed = path.exists()
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        size = os.fstat(fd).st_size
        try:
            write_all(fd, data)
            os.fsync(fd)
        except OSError:  # a disk full half way: cut the torn line off, so the next append starts a line of its own
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)
    if not existed:
        fsync_dir(path.parent)


def load_or_create_salt(path: str | Path) -> str:
    """The salt kept in ``path``; on first use a random one (256 bits, hex) is generated and stored
    there, 0600. Several processes starting together agree on one (created with a hard link, which
    fails when another process was first)."""
    p = Path(path)
    try:
        salt = p.read_text(encoding="ascii").strip()
        if salt:
            _narrow(p)
            return salt
    except FileNotFoundError:
        pass
    p.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        write_all(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, p)
    except FileExistsError:
        pass  # another process stored its salt first: use that one
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(p.parent)
    salt = p.read_text(encoding="ascii").strip()
    if not salt:
        raise ValueError(f"privacy.salt_file {p}: empty (remove it to generate a new salt)")
    return salt


def _narrow(p: Path) -> None:
    if stat.S_IMODE(p.stat().st_mode) & 0o077:
        os.chmod(p, FILE_MODE)


def query_salt(privacy: Any, spool_dir: str | Path, *, create: bool = True) -> str | None:
    """The salt of production query hashes: ``privacy.salt``, else the one generated once in ``privacy.salt_file``
    (default ``<spool_dir>/salt``); ``create=False`` (a process other than the proxy: a shadow tournament) reads
    that file and never makes one (None when it is not there)."""
    if privacy.salt:
        return str(privacy.salt)
    path = Path(privacy.salt_file or Path(spool_dir) / "salt")
    if create:
        return load_or_create_salt(path)
    try:
        return path.read_text(encoding="ascii").strip() or None
    except (FileNotFoundError, PermissionError, UnicodeDecodeError):
        return None
