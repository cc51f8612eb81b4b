"""Atomic writes that never replace a result by accident and never leave debris for ever.

Every result (a dataset, a partition, a checkpoint, a log) is written to a temporary sibling and
renamed into place at the end, with the steps of :mod:`fullgraph.renames`:

- **No accidental replacement.** Without ``force`` the final rename refuses to replace a target
  that appeared while this run was writing, so two runs to one output cannot both succeed.
- **Whole or nothing.** With ``force`` an existing directory is swapped with the new one in one
  step: the old result stays whole until the new one is in place, then the old copy (now under
  the temporary name) is removed.
- **Debris has an owner.** Temporary names carry the writer's host and pid; before writing, a
  run removes the temporaries of ``NAME`` whose writer on this host is dead.

Two more rules say what ``force`` may replace and where outputs may go:

- **Only what fullgraph wrote, of the same kind.** Each writer describes its output as an
  :class:`OutputKind`: a noun and a recogniser that looks at what is there now. ``force``
  replaces an existing output only when the recogniser says this writer wrote it (a partition
  directory of ``meta.json`` and ``part-<r>/*.npy`` files, a dataset ``data synth`` wrote, a
  checkpoint with its header, a log of epoch records); anything else (a user's folder, a
  dataset being read, a folder holding other partitions) is refused with one line, and
  nothing is touched.
- **Outputs apart from inputs and from each other** (:func:`check_apart`): an output is never
  an input of the same command, never inside one, and a directory replaced as a whole never
  holds one; no output lies inside another.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullgraph.errors import ConfigError, no_room
from fullgraph.renames import (
    exchange,
    fsync_dir,
    remove_path,
    remove_stale,
    rename_no_replace,
    temporary_name,
)


def _kept(target: Path) -> str:
    """What a failed atomic write of ``target`` left as it was, for its message."""
    if not os.path.lexists(target):
        return "nothing was written"
    return f"the {'directory' if target.is_dir() else 'file'} there before is unchanged"


@dataclass(frozen=True)
class OutputKind:
    """What one writer writes, so that ``force`` replaces only that (see the module docstring).

    Attributes:
        noun: the kind with its article, for messages (``a partition``).
        foreign: looks at an existing path; returns ``None`` when this writer wrote what is
            there, else a short phrase saying what makes it someone else's
            (``it holds thesis.tex``). It may raise :class:`OSError` (reported as unreadable).
    """

    noun: str
    foreign: Callable[[Path], str | None]

    def check_replaceable(
        self, path: str | os.PathLike[str], option: str | None = None, *, advice: str = ""
    ) -> None:
        """Refuse ``path`` unless nothing is there or this kind's writer wrote what is there.

        Args:
            path: the output about to be written.
            option: the command-line option naming it, for the message (``--out``).
            advice: what to do instead (default: choose another ``option`` or remove it).

        Raises:
            ConfigError: one line naming the path, the kind and what is there instead.
        """
        path = Path(path)
        if not os.path.lexists(path):
            return
        try:
            reason = self.foreign(path)
        except OSError as exc:
            reason = f"it cannot be read: {exc.strerror or exc}"
        if reason is None:
            return
        named = f"{option} {path}" if option else str(path)
        advice = advice or f"choose another {option or 'path'} or remove it yourself"
        raise ConfigError(f"{named} is not {self.noun} written by fullgraph ({reason}); {advice}")


def is_plain_file(path: Path) -> bool:
    """A regular file, not a symbolic link (what a writer of ours leaves)."""
    return path.is_file() and not path.is_symlink()


def is_plain_dir(path: Path) -> bool:
    """A directory, not a symbolic link to one."""
    return path.is_dir() and not path.is_symlink()


def read_marker(path: Path) -> Any | None:
    """The JSON in the plain file ``path`` (a writer's ``meta.json``), or ``None`` when it is
    missing, a link or not JSON (an :class:`OutputKind` recogniser then says it is not ours)."""
    if not is_plain_file(path):
        return None
    try:
        return json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return None


def holds(directory: Path, unexpected: Sequence[Path], shown: int = 3) -> str | None:
    """``it holds a, b/ and 2 more`` for the entries of ``directory`` no writer of it made.

    Args:
        directory: the directory looked at.
        unexpected: the paths under it that its writer would not have written.
        shown: how many to name.

    Returns:
        The phrase, or ``None`` when ``unexpected`` is empty.
    """
    if not unexpected:
        return None
    names = []
    for p in sorted(unexpected)[:shown]:
        rel = str(p.relative_to(directory)) if p != directory else p.name
        names.append(rel + ("/" if is_plain_dir(p) else ""))
    more = len(unexpected) - len(names)
    listed = ", ".join(names) + (f" and {more} more" if more else "")
    return f"it holds {listed}"


@dataclass(frozen=True)
class Place:
    """A path one command reads or writes, named as the command line names it.

    Attributes:
        path: the path.
        named: how the command line names it (``--out parts/x``, ``--dataset cora --root d``).
        what: for an input, what it is (``the dataset directory``).
        whole: for an output, a directory replaced as a whole: it must not hold an input.
        inside_ok: for an input, outputs may lie inside it (a dataset root: only the dataset's
            own directory is read).
    """

    path: Path
    named: str
    what: str = ""
    whole: bool = False
    inside_ok: bool = False


def _relations(a: Path, b: Path) -> set[str]:
    """How ``a`` lies to ``b``: ``same``, ``inside`` (``a`` in ``b``) or ``holds`` (``b`` in
    ``a``), as written (absolute) or with symbolic links resolved: either counts."""
    found = set()
    as_written = (Path(os.path.abspath(a)), Path(os.path.abspath(b)))
    resolved = (Path(os.path.realpath(a)), Path(os.path.realpath(b)))
    for x, y in (as_written, resolved):
        if x == y:
            found.add("same")
        elif y in x.parents:
            found.add("inside")
        elif x in y.parents:
            found.add("holds")
    return found


def check_apart(outputs: Sequence[Place], inputs: Sequence[Place] = ()) -> None:
    """Refuse outputs that overlap an input of the same command or each other, before any work.

    An output may not be an input, nor lie inside one (unless the input allows it), nor, when
    it is replaced as a whole, hold one; no output may be or lie inside another. Paths are
    compared as written and with symbolic links resolved.

    Raises:
        ConfigError: one line naming both places.
    """
    for o in outputs:
        choose = f"choose another {o.named.split()[0]}"
        for i in inputs:
            found = _relations(o.path, i.path)
            if "same" in found:
                raise ConfigError(f"{o.named} is {i.what} this command reads ({i.named}); {choose}")
            if "inside" in found and not i.inside_ok:
                raise ConfigError(
                    f"{o.named} is inside {i.what} this command reads ({i.named}); {choose}"
                )
            if "holds" in found and o.whole:
                raise ConfigError(
                    f"{o.named} holds {i.what} this command reads ({i.named}), which replacing "
                    f"it would delete; {choose}"
                )
    for a in outputs:
        for b in outputs:
            found = _relations(a.path, b.path) if a is not b else set()
            if "same" in found:
                raise ConfigError(f"{a.named} and {b.named} are one path; give each its own")
            if "inside" in found:
                raise ConfigError(f"{a.named} is inside {b.named}; give each output its own place")


@contextlib.contextmanager
def atomic_dir(
    target: str | os.PathLike[str],
    force: bool = False,
    *,
    ours: OutputKind | None = None,
    option: str | None = None,
) -> Iterator[Path]:
    """Yield a temporary directory beside ``target``; move it to ``target`` on success.

    Args:
        target: the directory to create.
        force: replace an existing ``target`` (swapped in one step: the old one stays whole
            until the new one is in place); without it an existing target is an error, also
            when it appears while the caller writes.
        ours: the kind of output written: an existing ``target`` (at the start and again at
            the final rename) is replaced only if this kind's writer wrote it.
        option: the command-line option naming ``target``, for messages.

    Raises:
        FileExistsError: ``target`` exists (at the start or at the final rename) and ``force``
            is false. The temporary directory is removed.
        ConfigError: ``target`` exists and is not an output of kind ``ours``; nothing is
            replaced.
        OutputError: the file system ran out of room while the body wrote (one line naming
            ``target``); the temporary directory is removed, an existing ``target`` kept.
    """
    target = Path(target)
    if ours is not None:
        ours.check_replaceable(target, option)
    if os.path.lexists(target) and not force:
        raise FileExistsError(f"{target} already exists (use --force to replace it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = temporary_name(target)
    tmp.mkdir(mode=0o755)
    os.chmod(tmp, 0o755)  # a dataset or partition is shared by every rank (and the umask)
    try:
        yield tmp
        try:
            rename_no_replace(tmp, target)
        except FileExistsError:
            if not force:
                raise
            if ours is not None:  # what is there now, which may have appeared meanwhile
                ours.check_replaceable(target, option)
            exchange(tmp, target)
            remove_path(tmp)  # the old result, now under the temporary name
        fsync_dir(target.parent)
    except BaseException as exc:
        remove_path(tmp)
        full = no_room(exc, target, _kept(target))
        if full is not None:
            raise full from None
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
        OutputError: the file system has no room for ``data`` (one line naming ``path``); the
            temporary file is removed, an existing ``path`` kept.
    """
    path = Path(path)
    if not replace and os.path.lexists(path):
        raise FileExistsError(f"{path} already exists (use --force to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path)
    tmp = temporary_name(path)
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
        fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        full = no_room(exc, path, _kept(path))
        if full is not None:
            raise full from None
        raise


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, replace: bool = True) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    data = (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()
    atomic_write_bytes(path, data, replace=replace)


def check_named(path: str | os.PathLike[str], option: str, kind: str) -> Path:
    """``path`` as a :class:`~pathlib.Path` if it ends in a name of its own (not ``.``, ``..``
    or ``/``: directories that hold other things), for an output of ``kind`` (``file``,
    ``dir``) given as ``option``.

    Raises:
        ConfigError: one line naming the path as given and a path that would do.
    """
    given = str(path)
    if Path(given).name in ("", ".", ".."):
        last = given.rstrip("/").rsplit("/", 1)[-1] or "/"
        raise ConfigError(
            f"{option} {given}: needs a {'directory' if kind == 'dir' else kind} name of its "
            f"own, not {last!r} (a directory that "
            f"holds other things); give a new path such as {option} {Path(given) / 'out'}"
        )
    return Path(given)


def check_output(
    path: str | os.PathLike[str],
    option: str,
    *,
    kind: str = "file",
    exist_ok: bool = False,
    ours: OutputKind | None = None,
    advice: str = "",
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
        ours: the kind of output written: an existing ``path`` must be one this kind's writer
            wrote (with or without ``exist_ok``: a refusal then says it is someone else's).
        advice: what to do instead when ``ours`` refuses (see
            :meth:`OutputKind.check_replaceable`).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ConfigError: ``path`` is of the wrong kind, not written by ``ours``'s writer, lies
            under a regular file or in a place that cannot be written.
        FileExistsError: ``path`` exists and ``exist_ok`` is false.
    """
    path = check_named(path, option, kind)
    if os.path.lexists(path):
        if kind == "file" and path.is_dir():
            raise ConfigError(f"{option} {path} is a directory; give a file path")
        if kind == "dir" and not path.is_dir():
            raise ConfigError(f"{option} {path} is a file; give a directory path")
        if ours is not None:
            ours.check_replaceable(path, option, advice=advice)
        if not exist_ok:
            raise FileExistsError(f"{option} {path} already exists (use --force to replace it)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{option} {path}: {parent} is a file, not a directory")
            break
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = temporary_name(path)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        os.unlink(probe)
        if kind == "dir" and path.is_dir():
            probe = temporary_name(path / "probe")
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"{option} {path}: cannot write there ({reason})") from None
    return path
