"""The file system's atomic steps: renames that never replace by accident, and temporaries
that name their writer.

- **No accidental replacement.** :func:`rename_no_replace` refuses to replace a target that
  appeared meanwhile (Linux ``renameat2(RENAME_NOREPLACE)`` for directories, ``link`` +
  ``unlink`` for files), so two runs to one output cannot both succeed.
- **Whole or nothing.** :func:`exchange` swaps two paths in one step
  (``renameat2(RENAME_EXCHANGE)``).
- **Debris has an owner.** :func:`temporary_name` carries the writer's host and pid
  (``.NAME.tmp-<pid>-<random>@<host>``); :func:`remove_stale` removes the temporaries of
  ``NAME`` whose writer on this host is dead (a SIGKILL, an OOM kill).

Where ``renameat2`` is missing (not Linux, or a file system without it) the steps fall back to
test-then-rename, which is atomic except against a second writer in the same instant. The
writers built on these steps, and what they may replace, are in :mod:`fullgraph.atomic`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_TMP_MARK = ".tmp-"


def _libc_renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    """glibc's ``renameat2`` (None where the C library has none)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _libc_renameat2()


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``; False where the kernel or file system lacks it.

    Raises:
        FileExistsError: ``RENAME_NOREPLACE`` and ``dst`` exists.
        OSError: any other failure.
    """
    if _RENAMEAT2 is None:
        return False
    rc = _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def _appeared(target: Path) -> FileExistsError:
    return FileExistsError(
        f"{target} appeared while this run was writing it (another run?); it was left as it "
        f"is and nothing was written (use --force to replace it)"
    )


def rename_no_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Rename ``src`` to ``dst``, refusing to replace an existing ``dst``.

    Raises:
        FileExistsError: ``dst`` exists (nothing is renamed).
    """
    src, dst = Path(src), Path(dst)
    try:
        if _renameat2(src, dst, _RENAME_NOREPLACE):
            return
    except FileExistsError:
        raise _appeared(dst) from None
    if src.is_dir() and not src.is_symlink():
        if os.path.lexists(dst):
            raise _appeared(dst)
        os.rename(src, dst)
        return
    try:
        os.link(src, dst)  # atomic and never replaces: fails with EEXIST
    except FileExistsError:
        raise _appeared(dst) from None
    os.unlink(src)


def exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> None:
    """Swap the paths ``a`` and ``b`` (both exist) in one step where the system allows it.

    The fallback (no ``renameat2``) moves ``b`` aside to a temporary name first, so a crash in
    between leaves ``b`` missing but its content whole under a name :func:`remove_stale`
    recognises.
    """
    a, b = Path(a), Path(b)
    if _renameat2(a, b, _RENAME_EXCHANGE):
        return
    aside = temporary_name(b)
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def _hostname() -> str:
    return socket.gethostname().replace("/", "_") or "localhost"


def temporary_name(target: Path) -> Path:
    """A fresh sibling name ``.NAME.tmp-<pid>-<random>@<host>`` owned by this process."""
    token = f"{os.getpid()}-{secrets.token_hex(4)}@{_hostname()}"
    return target.with_name(f".{target.name}{_TMP_MARK}{token}")


def _owner(name: str, target_name: str) -> tuple[str, int] | None:
    """``(host, pid)`` of a temporary sibling of ``target_name``, or None if it is not one."""
    prefix = f".{target_name}{_TMP_MARK}"
    if not name.startswith(prefix):
        return None
    token = name[len(prefix) :]
    pid_part, at, host = token.partition("@")
    pid = pid_part.split("-", 1)[0]
    if not at or not pid.isdigit():
        return None
    return host, int(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_path(path: Path) -> None:
    """Remove the file or directory tree ``path``; nothing there is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_stale(target: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries of ``target`` left by dead writers on this host.

    Only names of :func:`temporary_name` count, and only those
    whose writer (host and pid in the name) is this host and no longer runs.

    Returns:
        The paths removed.
    """
    target = Path(target)
    host, removed = _hostname(), []
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return removed
    for path in siblings:
        owner = _owner(path.name, target.name)
        if owner is not None and owner[0] == host and not _alive(owner[1]):
            remove_path(path)
            removed.append(path)
    return removed


def fsync_dir(directory: Path) -> None:
    """Flush ``directory``'s entries (a rename into it) to disk, where the system allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def is_temporary_name(name: str) -> bool:
    """Whether ``name`` is a temporary of :func:`temporary_name` (a writer's work in progress)."""
    return name.startswith(".") and _TMP_MARK in name
