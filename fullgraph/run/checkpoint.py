"""Training checkpoints: model, optimiser, epoch, RNG, config, partition hash; checksummed,
atomic, and never replaced by another run.

Parameters are identical on every rank, so rank 0 writes one file, ``<dir>/checkpoint.pt``, and
every rank reads it on ``--resume``. State that differs between ranks (the error-feedback
residuals of compressed halo exchanges) goes to one file per rank and epoch,
``<dir>/rank-<r>-epoch-<e>.pt``, written before ``checkpoint.pt`` names epoch ``e``; older ones
are removed once a newer checkpoint is complete.

File format (3): the zip archive of ``torch.save(state)`` whose archive comment carries its
sha256 (:mod:`fullgraph.run.torch_file`): ``torch.load(path, weights_only=True)`` opens it as it
is, and :func:`read_checkpoint_file` checks the digest before unpickling, so a flipped bit is an
error instead of a weight of -3.7e37. Format-2 files (a header line before the archive) are
still read. Files are replaced atomically (temporary file, fsync, rename).

:class:`CheckpointDir` guards the directory for the run: rank 0 holds an exclusive lock on
``<dir>/.lock`` (a second run on the same directory is refused at once), a fresh run refuses a
directory that holds a checkpoint unless ``--force`` (or ``--resume``), and every save first
checks that ``checkpoint.pt`` is still the file this run last wrote or resumed from. Files of
these names that fullgraph did not write (no fullgraph checksum, a foreign ``.lock``) or that
another writer of fullgraph's wrote (a model file, an export's weights) are never overwritten,
``--force`` or not (:data:`CHECKPOINT`, :data:`LOCK`), nor is a directory that holds other
files (another command's output, such as a prediction: :data:`CHECKPOINT_DIR`). A run that
fails before its first checkpoint removes what it created (its ``config.json``, its lock, the
directory), never an earlier run's files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fullgraph.atomic import (
    OutputKind,
    atomic_write_bytes,
    atomic_write_json,
    check_output,
    holds,
    is_plain_file,
)
from fullgraph.errors import ConfigError, mark_replicated
from fullgraph.renames import is_temporary_name
from fullgraph.run.torch_file import encode_torch_file, not_of_kinds, read_torch_file

CHECKPOINT_NAME = "checkpoint.pt"
LOCK_NAME = ".lock"
CONFIG_NAME = "config.json"
_LOCK_TEXT = re.compile(rb"(pid \d+ on [^\n]*\n?)?")
_RANK_STATE = re.compile(r"rank-\d+-epoch-\d+\.pt")


def _not_a_checkpoint(path: Path) -> str | None:
    """``None`` for a checkpoint or a rank's state that fullgraph wrote (whole, or too damaged
    to say what it is; any format version), else why not (a model file, an export, not
    fullgraph's)."""
    return not_of_kinds(path, "checkpoint", "rank state")


def _not_a_checkpoint_dir(path: Path) -> str | None:
    """``None`` for a directory holding only what a checkpointing run writes there
    (``checkpoint.pt``, ``rank-<r>-epoch-<e>.pt``, ``config.json``, ``.lock``, temporaries) or
    an empty one, else what else it holds."""
    if not path.is_dir():
        return "it is a file" if path.is_file() else "it is not a directory"
    own = (CHECKPOINT_NAME, LOCK_NAME, CONFIG_NAME)
    unexpected = [
        e
        for e in path.iterdir()
        if not (e.name in own or _RANK_STATE.fullmatch(e.name) or is_temporary_name(e.name))
    ]
    return holds(path, unexpected)


def _not_a_lock(path: Path) -> str | None:
    """``None`` for an empty file or one holding ``pid N on HOST`` (the lock a run writes)."""
    if not is_plain_file(path):
        return "it is not a regular file"
    with open(path, "rb") as f:
        text = f.read(512)
    return None if _LOCK_TEXT.fullmatch(text) else "it holds other text than a run's pid and host"


#: ``checkpoint.pt`` and ``rank-<r>-epoch-<e>.pt``: replaced only when fullgraph wrote them.
CHECKPOINT = OutputKind("a checkpoint", _not_a_checkpoint)
#: ``.lock``: rewritten by every run, so only when a run wrote it.
LOCK = OutputKind("a checkpoint lock", _not_a_lock)
#: ``--checkpoint`` itself: a directory of the files above only (never another output's).
CHECKPOINT_DIR = OutputKind("a checkpoint directory", _not_a_checkpoint_dir)

#: Config keys that must match between the checkpoint and the resumed run (any of them changes
#: the losses from the resumed epoch on: the model, its data, the optimiser and the learning-rate
#: schedule).
MODEL_KEYS = (
    "model",
    "layers",
    "hidden",
    "dropout",
    "input_dropout",
    "seed",
    "lr",
    "weight_decay",
    "weight_decay_scope",
    "normalize_features",
    "compress_fwd",
    "compress_bwd",
    "error_feedback",
    "heads",
    "output_heads",
    "attention_dropout",
    "aggr",
    "norm",
    "residual",
    "edge_weight",
    "improved",
    "lr_warmup",
    "lr_schedule",
    "epochs",
)
#: Keys of :data:`MODEL_KEYS` that must match only where the checkpoint's config says so:
#: key -> (whether it applies, given the saved config; why, for the message).
MATCH_WHEN: dict[str, tuple[Callable[[dict[str, Any]], bool], str]] = {
    "epochs": (
        lambda saved: saved.get("lr_schedule") == "cosine",
        "under --lr-schedule cosine the epochs are the schedule's length",
    ),
}


def encode_checkpoint(state: dict[str, Any]) -> bytes:
    """The file bytes of ``state``: ``torch.save`` output with the checksum comment
    (:func:`~fullgraph.run.torch_file.encode_torch_file`)."""
    return encode_torch_file(state)


def read_checkpoint_file(path: str | Path, *, weights_only: bool = True) -> dict[str, Any]:
    """Read a checkpoint file written by fullgraph, checking its sha256 first.

    Args:
        path: ``checkpoint.pt`` or a ``rank-<r>-epoch-<e>.pt`` file.
        weights_only: unpickle tensors and plain containers only.

    Returns:
        The saved state, on the CPU.

    Raises:
        ConfigError: the file is missing, unreadable, of another format, fails its checksum or
            cannot be unpickled.
    """
    state = read_torch_file(
        path, weights_only=weights_only, what="checkpoint", remedy="start over with --force"
    )
    if not isinstance(state, dict):
        raise ConfigError(f"{path} does not hold a checkpoint dictionary")
    return state


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class CheckpointDir:
    """The checkpoint directory of one run, as seen from one rank.

    Args:
        directory: the ``--checkpoint`` directory.
        rank: this process's rank (rank 0 locks the directory and writes ``checkpoint.pt``).
        resume: the run continues from the checkpoint in ``directory``.
        force: a fresh run may replace the checkpoint already in ``directory``.
    """

    def __init__(
        self, directory: str | Path, rank: int, *, resume: bool = False, force: bool = False
    ) -> None:
        self.path = Path(directory)
        self.rank = rank
        self.resume = resume
        self.force = force
        self.created = False
        self.saved = False
        self._before: set[str] = set()
        self._lock_fd: int | None = None
        self._expected: tuple[int, int, int, int] | None = None
        self._pending_config: dict[str, Any] | None = None

    @property
    def file(self) -> Path:
        """``<dir>/checkpoint.pt``."""
        return self.path / CHECKPOINT_NAME

    def open(self) -> None:
        """Rank 0, before any work: check the directory can be written, lock it, and refuse a
        previous result unless ``resume`` or ``force``.

        Raises:
            ConfigError: unwritable place, a file where the directory should be, another run
                holding the lock, ``--resume`` without a checkpoint, a ``checkpoint.pt``,
                ``rank-*.pt`` or ``.lock`` there that fullgraph did not write.
            FileExistsError: a fresh run without ``--force`` on a directory with a checkpoint.
        """
        if self.rank != 0:
            return
        self.created = not self.path.exists()
        with contextlib.suppress(OSError):  # what an earlier run left: never removed by this one
            self._before = {e.name for e in self.path.iterdir()}
        check_output(self.path, "--checkpoint", kind="dir", exist_ok=True, ours=CHECKPOINT_DIR)
        LOCK.check_replaceable(self.path / LOCK_NAME, "--checkpoint")
        if not self.resume:  # a fresh run replaces these (--resume reads and checks them)
            for path in (self.file, *sorted(self.path.glob("rank-*-epoch-*.pt"))):
                CHECKPOINT.check_replaceable(path, "--checkpoint")
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        has_previous = self.file.exists() or any(self.path.glob("rank-*-epoch-*.pt"))
        if self.resume and not self.file.exists():
            self.close(discard=True)
            raise ConfigError(f"--resume: no checkpoint at {self.file}")
        if has_previous and not (self.resume or self.force):
            epoch = ""
            with contextlib.suppress(ConfigError):
                epoch = f" of epoch {int(read_checkpoint_file(self.file)['epoch'])}"
            self.close()
            raise FileExistsError(
                f"--checkpoint {self.path} holds the checkpoint{epoch} of an earlier run: use "
                f"--resume to continue it, --force to start over (it is replaced at this run's "
                f"first checkpoint), or another directory"
            )
        self._expected = _identity(self.file)

    def _lock(self) -> None:
        fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"--checkpoint {self.path} is in use by another run ({holder}); wait for it or "
                f"use another directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._lock_fd = fd

    def close(self, discard: bool = False) -> None:
        """Release the lock; with ``discard`` (the run failed) and no checkpoint written by
        this run, remove what this run created: its ``config.json``, rank states and lock, and
        the directory if it made it (an earlier run's files stay)."""
        if discard and not self.saved and self.rank == 0 and self._lock_fd is not None:
            made = [self.path / CONFIG_NAME, *self.path.glob("rank-*-epoch-*.pt")]
            made = [p for p in made if p.name not in self._before]
            if LOCK_NAME not in self._before:
                made.append(self.path / LOCK_NAME)  # the lock last, while still held
            for path in made:
                with contextlib.suppress(OSError):
                    path.unlink()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if discard and self.created and self.rank == 0:
            with contextlib.suppress(OSError):
                (self.path / LOCK_NAME).unlink(missing_ok=True)
                self.path.rmdir()

    # -- the run's files ---------------------------------------------------------------------
    def write_config(self, resolved: dict[str, Any]) -> None:
        """Rank 0: the run's resolved config as ``config.json``. A fresh run that replaces an
        earlier checkpoint (``--force``) writes it only with its first checkpoint, so a run that
        fails before then leaves the earlier run's checkpoint and config as a pair."""
        if self.resume or not self.file.exists():
            atomic_write_json(self.path / CONFIG_NAME, resolved)
        else:
            self._pending_config = resolved

    def save(self, state: dict[str, Any]) -> Path:
        """Rank 0: write ``state`` to ``checkpoint.pt``, if it is still this run's file.

        Raises:
            ConfigError: ``checkpoint.pt`` changed since this run last wrote or read it (another
                run or a person replaced it); nothing is written.
        """
        if _identity(self.file) != self._expected:
            raise mark_replicated(
                ConfigError(
                    f"{self.file} was replaced by someone else since this run last wrote it; "
                    f"left as it is, this run's checkpoint of epoch {state.get('epoch')} was "
                    f"not written"
                )
            )
        if self._pending_config is not None:
            atomic_write_json(self.path / CONFIG_NAME, self._pending_config)
            self._pending_config = None
        atomic_write_bytes(self.file, encode_checkpoint(state))
        self._expected = _identity(self.file)
        self.created, self.saved = False, True
        return self.file

    def load(self, config: dict[str, Any], partition_hash: str) -> dict[str, Any]:
        """Read ``checkpoint.pt`` and check it belongs to this run.

        Args:
            config: the resumed run's resolved config.
            partition_hash: hash of the partition this rank trains on.

        Returns:
            The saved state.

        Raises:
            ConfigError: no checkpoint, an unreadable or corrupted one, another partition,
                another model, or nothing left to train.
        """
        if not self.file.is_file():
            raise ConfigError(f"--resume: no checkpoint at {self.file}")
        state = read_checkpoint_file(self.file)
        if state.get("partition_hash") != partition_hash:
            raise ConfigError(
                f"--resume: {self.file} was written for partition "
                f"{state.get('partition_hash')}, this run trains on {partition_hash}"
            )
        saved = state.get("config", {})
        for key in MODEL_KEYS:
            applies, why = MATCH_WHEN.get(key, (lambda _: True, ""))
            if saved.get(key) != config.get(key) and applies(saved):
                raise ConfigError(
                    f"--resume: {self.file} has {key}={saved.get(key)!r}, this run has "
                    f"{config.get(key)!r}{f' ({why})' if why else ''}"
                )
        epoch, epochs = int(state["epoch"]), int(config.get("epochs", 0))
        if epochs <= epoch:
            raise ConfigError(
                f"--resume: {self.file} is at epoch {epoch}, so --epochs {epochs} leaves nothing "
                f"to train; give --epochs above {epoch}"
            )
        if self.rank == 0:
            self._expected = _identity(self.file)
            before, now = saved.get("precision", "32"), config.get("precision", "32")
            if before != now:  # the master weights and Adam's moments are float32 either way
                print(
                    f"fullgraph: --resume: {self.file} was trained at --precision {before}, "
                    f"continuing at {now} (parameters and optimiser state are float32)",
                    file=sys.stderr,
                    flush=True,
                )
        return state

    def rank_state_path(self, rank: int, epoch: int) -> Path:
        """Where rank ``rank`` keeps its own state of epoch ``epoch``."""
        return self.path / f"rank-{rank}-epoch-{epoch}.pt"

    def save_rank_state(self, epoch: int, state: dict[str, Any]) -> Path:
        """Write this rank's ``state`` for ``epoch`` atomically (see the module docstring)."""
        path = self.rank_state_path(self.rank, epoch)
        atomic_write_bytes(path, encode_checkpoint(state))
        return path

    def load_rank_state(self, epoch: int) -> dict[str, Any]:
        """Read this rank's state of ``epoch``.

        Raises:
            ConfigError: the file is missing, corrupted or unreadable.
        """
        path = self.rank_state_path(self.rank, epoch)
        if not path.is_file():
            raise ConfigError(
                f"--resume: {path} is missing (rank {self.rank}'s error-feedback residuals of "
                f"the checkpoint's epoch {epoch})"
            )
        return read_checkpoint_file(path, weights_only=True)

    def remove_rank_states(self, keep_epoch: int) -> None:
        """Delete this rank's state files of every epoch but ``keep_epoch``."""
        for path in self.path.glob(f"rank-{self.rank}-epoch-*.pt"):
            epoch = path.stem.rsplit("-", 1)[-1]
            if epoch.isdigit() and int(epoch) != keep_epoch:
                path.unlink(missing_ok=True)
