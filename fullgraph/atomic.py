"""Atomic writes that never replace a result by accident and never leave debris for ever.

Every result (a dataset, a partition, a checkpoint, a log) is written to a temporary sibling and
renamed into place at the end. Three rules:

- **No accidental replacement.** Without ``force`` the final rename refuses to replace a target
  that appeared while this run was writing (Linux ``renameat2(RENAME_NOREPLACE)`` for
  directories, ``link`` + ``unlink`` for files), so two runs to one output cannot both succeed.
- **Whole or nothing.** With ``force`` an existing directory is swapped with the new one in one
  step (``renameat2(RENAME_EXCHANGE)``): the old result stays whole until the new one is in
  place, then the old copy (now under the temporary name) is removed.
- **Debris has an owner.** Temporary names carry the writer's host and pid
  (``.NAME.tmp-<pid>-<random>@<host>``); before writing, a run removes the temporaries of
  ``NAME`` whose writer on this host is dead (a SIGKILL, an OOM kill).

Where ``renameat2`` is missing (not Linux, or a file system without it) the checks fall back to
test-then-rename, which is atomic except against a second writer in the same instant.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fullgraph.errors import ConfigError

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_TMP_MARK = ".tmp-"


def _libc_renameat2() -> Any | None:
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
    aside = _temporary_name(b)
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def _hostname() -> str:
    return socket.gethostname().replace("/", "_") or "localhost"


def _temporary_name(target: Path) -> Path:
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


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_stale(target: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries of ``target`` left by dead writers on this host.

    Only names written by :func:`atomic_dir` / :func:`atomic_write_bytes` count, and only those
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
            _remove(path)
            removed.append(path)
    return removed


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike[str], force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``target``; move it to ``target`` on success.

    Args:
        target: the directory to create.
        force: replace an existing ``target`` (swapped in one step: the old one stays whole
            until the new one is in place); without it an existing target is an error, also
            when it appears while the caller writes.

    Raises:
        FileExistsError: ``target`` exists (at the start or at the final rename) and ``force``
            is false. The temporary directory is removed.
    """
    target = Path(target)
    if os.path.lexists(target) and not force:
        raise FileExistsError(f"{target} already exists (use --force to replace it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = _temporary_name(target)
    tmp.mkdir(mode=0o755)
    os.chmod(tmp, 0o755)  # a dataset or partition is shared by every rank (and the umask)
    try:
        yield tmp
        try:
            rename_no_replace(tmp, target)
        except FileExistsError:
            if not force:
                raise
            exchange(tmp, target)
            _remove(tmp)  # the old result, now under the temporary name
        _fsync_dir(target.parent)
    except BaseException:
        _remove(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, replace: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: temporary file beside it, fsync, rename.

    Args:
        path: the file to write.
        data: its new content.
        replace: replace an existing file (the default, for a run's own files); when false an
            existing ``path`` (also one that appears meanwhile) is an error.

    Raises:
        FileExistsError: ``replace`` is false and ``path`` exists.
    """
    path = Path(path)
    if not replace and os.path.lexists(path):
        raise FileExistsError(f"{path} already exists (use --force to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path)
    tmp = _temporary_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            rename_no_replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, replace: bool = True) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    data = (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()
    atomic_write_bytes(path, data, replace=replace)


def check_output(
    path: str | os.PathLike[str], option: str, *, kind: str = "file", exist_ok: bool = False
) -> Path:
    """Check before any work that ``path`` can be written as an output of kind ``kind``.

    Creates missing parent directories and probes that a file can be created beside ``path``
    (the probe is removed).

    Args:
        path: where the output will go.
        option: the command-line option naming it, for the message (``--log-json``).
        kind: ``file`` or ``dir``: what ``path`` will be.
        exist_ok: an existing output is fine (``--force``, ``--resume``); it must still be of
            the right kind.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ConfigError: ``path`` is of the wrong kind, lies under a regular file or in a place
            that cannot be written.
        FileExistsError: ``path`` exists and ``exist_ok`` is false.
    """
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise ConfigError(f"{option} {path}: needs a {kind} name, not {path.name or '/'!r}")
    if os.path.lexists(path):
        if kind == "file" and path.is_dir():
            raise ConfigError(f"{option} {path} is a directory; give a file path")
        if kind == "dir" and not path.is_dir():
            raise ConfigError(f"{option} {path} is a file; give a directory path")
        if not exist_ok:
            raise FileExistsError(f"{option} {path} already exists (use --force to replace it)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{option} {path}: {parent} is a file, not a directory")
            break
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = _temporary_name(path)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        os.unlink(probe)
        if kind == "dir" and path.is_dir():
            probe = _temporary_name(path / "probe")
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"{option} {path}: cannot write there ({reason})") from None
    return path
