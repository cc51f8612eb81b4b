"""One writer per output file: a run claims the files it will write before any work.

A model file is written at the run's end (and at each new best), a log from its first
epoch: two runs started together with the same ``--save-model`` or ``--log-json`` would both
pass the checks of :class:`~fullgraph.run.outputs.RunOutputs` and the later rename would
silently replace the other's result. :class:`FileClaim` holds an exclusive ``flock`` on the
sibling ``.NAME.lock`` for the whole run, so the second run is refused at once with one line
naming the first. The lock file is removed when the claim ends (unlinked while still held; a
run that finds the file it locked unlinked meanwhile locks the new one), so a finished run
leaves nothing beside its output; the lock of a killed run is free again (the kernel drops
it) and the next run takes it over and removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path

from fullgraph.errors import ConfigError


def claim_path(target: Path) -> Path:
    """Where the claim of ``target`` lives: ``.NAME.lock`` beside it."""
    return target.with_name(f".{target.name}.lock")


class FileClaim:
    """An exclusive claim on writing ``target`` (see the module docstring).

    Args:
        target: the output file.
        option: the command-line option naming it, for the message (``--save-model``).
    """

    def __init__(self, target: str | os.PathLike[str], option: str) -> None:
        self.target = Path(target)
        self.option = option
        self.path = claim_path(self.target)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the claim (the parent directory must exist).

        Raises:
            ConfigError: another run holds it (one line naming that run's pid and host), or
                the lock file cannot be made.
        """
        while self._fd is None:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise ConfigError(
                    f"{self.option} {self.target}: cannot write there ({exc.strerror or exc})"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another run"
                os.close(fd)
                raise ConfigError(
                    f"{self.option} {self.target} is being written by another run ({holder}); "
                    f"wait for it or choose another {self.option}"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # its last holder removed it after we opened it: lock the new one
                os.close(fd)
                continue
            with contextlib.suppress(OSError):  # who holds it, for the message (a full disk: none)
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
            self._fd = fd

    def release(self) -> None:
        """End the claim: the lock file is removed (while still held), then unlocked."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None
