"""One-line messages for pydantic validation errors: every bad input is reported as a single line
naming where it came from (file, line or row), the field and the value."""

from __future__ import annotations

import errno
import gzip
import os
import re
import shutil
import threading
import zlib
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pydantic import ValidationError

from litellm_energy_router.redact import redact, secret_field


def one_line(err: ValidationError, where: str, *, key: str = "field", whole: str = "<root>") -> str:
    """The first error of ``err`` as ``{where}: {key} '{loc}' = {value!r}: {msg}``.

    ``loc`` is the dotted field path (``whole`` when the error is about the whole object); a dict or
    list value is shown by its type name, and pydantic's ``Value error, `` prefix is dropped. An unknown field reads ``{where}: unknown {key} '{loc}'``, a
    missing one ``{where}: {key} '{loc}' is required``, and a check on the whole object (a
    ``ValueError`` from a model validator, of the root or of a section) ``{where}: {msg}``. Credentials in the value (a URL's
    password, a token) are masked.
    """
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or whole
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        return f"{where}: unknown {key} '{loc}'"
    if e["type"] == "missing":
        return f"{where}: {key} '{loc}' is required"
    if e["type"] == "value_error" and (not e["loc"] or isinstance(e.get("input"), dict)):
        return f"{where}: {msg}"  # a check on a whole (sub)object: its message names the fields
    value = e.get("input")
    if secret_field(loc):
        shown = "<redacted>"
    else:
        shown = type(value).__name__ if isinstance(value, (dict, list)) else redact(repr(value))
    return f"{where}: {key} '{loc}' = {shown}: {msg}"


class UserError(Exception):
    """Bad input that a user typed or pointed to: a URL, a path, a file, a YAML key or value.

    ``str(err)`` is one line naming it. The ``energy-router`` command turns any ``UserError`` that a
    command lets through into that line on stderr and exit status 2 (:func:`user_error_line`); the
    configuration, table, row, profile, checkpoint and input-file errors of the package derive from it
    (beside their own base, ``ValueError`` or ``RuntimeError``, which their callers catch).
    """


class UnreadableFile(UserError, ValueError):
    """A file whose bytes are not the text or format it should hold (not UTF-8, not gzip, truncated, not Parquet)."""


def _unreadable_why(e: BaseException) -> str | None:
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text ({e.reason} at byte {e.start})"
    if isinstance(e, gzip.BadGzipFile):
        return "not a gzip file"
    if isinstance(e, EOFError):
        return "truncated (its compressed stream ends early)"
    if isinstance(e, zlib.error):
        return "corrupt compressed data"
    if type(e).__name__ == "ArrowInvalid":  # pyarrow, imported only where Parquet is read
        return f"not a readable Parquet file ({(str(e).splitlines() or [''])[0][:120]})"
    return None


@contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Turn an error about the bytes of the file at ``path``, met while reading it in this block, into one line
    naming the file (:class:`UnreadableFile`, exit 2 from the CLI); any other error passes as it is."""
    try:
        yield
    except (UnicodeDecodeError, OSError, EOFError, zlib.error, ValueError) as e:
        why = _unreadable_why(e) if not isinstance(e, UserError) else None
        if why is None:
            raise
        raise UnreadableFile(f"{path}: {why}") from None


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """The output twin of :func:`reading`: yields a temporary path beside ``path`` (``.<name>.tmp-<pid>``) to write (a
    file, or a directory such as a checkpoint), moved over ``path`` when the block ends without error, removed
    otherwise: a write that fails or is interrupted half way leaves ``path`` as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        _swap_in(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def _swap_in(tmp: Path, path: Path) -> None:
    """``tmp`` in place of ``path``: a file in one rename; a directory (which a rename cannot put over an existing
    one) after the old one moves aside, which is removed once the new one is in."""
    if not tmp.is_dir() or not (path.exists() or path.is_symlink()):
        os.replace(tmp, path)
        return
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    os.replace(path, old)
    os.replace(tmp, path)
    _remove(old)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def user_error_line(err: BaseException) -> str | None:
    """The one line to print for ``err`` when it is the user's mistake, else ``None`` (a bug: let the
    traceback show). A :class:`UserError` gives its message (newlines folded); an ``OSError`` about a
    path (missing file, unwritable directory) gives ``{path}: {reason}``."""
    if isinstance(err, UserError):
        return " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.filename is not None:
        return f"{err.filename}: {err.strerror or type(err).__name__}"
    code = err.errno if isinstance(err, OSError) else _wrapped_errno(err)
    if code in _MACHINE_ERRNOS:  # the machine's state, not a bug: no traceback
        why = err.strerror if isinstance(err, OSError) and err.strerror else os.strerror(code)
        return f"{why} (errno {errno.errorcode.get(code, code)})"
    return None


def _wrapped_errno(err: BaseException) -> int | None:
    """The errno a library's own error wraps (safetensors: ``I/O error: No space left on device (os error 28)``)."""
    m = re.search(r"\(os error (\d+)\)", str(err)) if type(err).__name__ == "SafetensorError" else None
    return int(m.group(1)) if m else None


#: OSErrors about the machine (a full disk, a quota, a read-only file system) that name no file
_MACHINE_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG") if hasattr(errno, n))


class RefusalLines:
    """The texts of the refusals a proxy hook of ours just raised, for the proxy's own log line about each
    (:func:`~litellm_energy_router.litellm_glue.litellm_compat.quiet_refusals`): a line is ours when it ends with
    one of them, and each text covers one line. Releases that log the exception pre-formatted leave the filter
    only the message, which also holds what the caller sent (its call id), so the match is on the exact text of
    a refusal raised here, never on a pattern a caller could write. Bounded (the oldest texts drop out)."""

    def __init__(self, size: int = 256) -> None:
        self._texts: deque[str] = deque(maxlen=size)
        self._lock = threading.Lock()

    def note(self, err: BaseException) -> None:
        with self._lock:
            self._texts.append(str(err))

    def take(self, message: str) -> bool:
        """Whether ``message`` is the line about a noted refusal (that refusal is then used up)."""
        with self._lock:
            for t in self._texts:
                if t and message.endswith(t):
                    self._texts.remove(t)
                    return True
        return False


REFUSAL_LINES = RefusalLines()
