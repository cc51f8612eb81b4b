"""Exception types of fullgraph.

Every error that bad input can cause is a :class:`FullgraphError` (or subclass) whose message is
one line naming the problem; the command line prints it and exits with its ``exit_code``.
"""

from __future__ import annotations

import errno


class FullgraphError(Exception):
    """Base class of user-facing errors: bad input, mismatched sizes, corrupted files.

    Attributes:
        exit_code: the command's exit status when this error ends it (2: bad input).
    """

    exit_code = 2


class DataError(FullgraphError):
    """A dataset on disk is missing, malformed or inconsistent."""


class PartitionError(FullgraphError):
    """A partition directory is missing, corrupted or does not match its metadata."""


class ConfigError(FullgraphError):
    """Options that cannot work together (rank count against part count, unknown names)."""


class TrainingDiverged(FullgraphError):
    """The loss or a gradient became NaN or infinite; training stopped before the update."""

    exit_code = 3


class PeerUnreachable(FullgraphError):
    """Another rank did not answer within the timeout: it never joined, its node or link is
    down, or it died. The message names the ranks that do not answer a connection probe.

    Attributes:
        unreachable: rank -> why, for the ranks that did not answer (may be empty).
        speaker: whether this rank is the one of its connected group that reports the failure
            (the lowest rank that still answers); the others abort without repeating it.
    """

    exit_code = 4

    def __init__(
        self, message: str, unreachable: dict[int, str] | None = None, speaker: bool = True
    ) -> None:
        super().__init__(message)
        self.unreachable = dict(unreachable or {})
        self.speaker = speaker


class OutputError(FullgraphError):
    """An output could not be written for lack of room: its file system is full or over
    quota. Nothing already written was replaced (the writes are atomic), so the run's earlier
    checkpoint, log records and results stay as they were."""

    exit_code = 1


#: errno -> what it says, of the write failures that mean "no room for this output"
_NO_ROOM = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for its file system",
}


def no_room(exc: BaseException, path: object, kept: str = "") -> OutputError | None:
    """``exc`` as one line naming ``path`` when it says the disk is full, else ``None``.

    Args:
        exc: the error a write raised.
        path: the output being written (not the temporary file it went to).
        kept: what is unchanged, for the message (default: ``nothing was replaced``).

    Returns:
        ``PATH: no space left on device (nothing was replaced); free space or write elsewhere``
        as an :class:`OutputError`, or ``None`` for any other error.
    """
    if not isinstance(exc, OSError) or exc.errno not in _NO_ROOM:
        return None
    return OutputError(
        f"{path}: {_NO_ROOM[exc.errno]} ({kept or 'nothing was replaced'}); free some space "
        f"or choose another place"
    )


class OutOfMemory(FullgraphError):
    """An allocation failed: the run needs more memory than this process could get (a run
    started with ``--memory-check warn`` or ``off``, or a plan that fell short)."""

    exit_code = 1


#: How torch and the C library say an allocation failed.
_OOM_TEXTS = ("can't allocate memory", "out of memory", "failed to allocate")


#: What each command can change when it runs out of memory: its own options only (``data
#: synth`` has no ranks, ``train`` no --batch-size); a command not named gets the generic line.
MEMORY_LEVERS: dict[str, str] = {
    "train": (
        "`fullgraph plan` predicts every rank's peak (use more ranks or a narrower model, or "
        "leave --memory-check at refuse)"
    ),
    "minibatch": (
        "use a smaller --batch-size or --fanouts, a narrower --hidden, or more ranks, or leave "
        "--memory-check at refuse"
    ),
    "predict": (
        "use a partition of more parts on as many ranks (mpirun -n P fullgraph predict --parts "
        "DIR), or leave --memory-check at refuse"
    ),
    "plan": "plan holds one part's sizes at a time; run it where more memory is free",
    "partition": (
        "partitioning holds the whole graph in one process; run it where more memory is free"
    ),
    "verify": "verify holds one part (and with --root the graph); run it where more is free",
    "export": "export holds the model only; run it where more memory is free",
    "data synth": "ask for a smaller --preset, --scale or --edge-dim, or --format npy",
    "data": "the dataset is read whole into this process; run it where more memory is free",
}
_GENERIC_LEVERS = "free memory, or run it where more is free"


def out_of_memory(exc: BaseException, command: str = "") -> OutOfMemory | None:
    """``exc`` as one line when it is a failed allocation (``MemoryError``, torch's
    ``DefaultCPUAllocator: can't allocate memory``, CUDA out of memory), else ``None``.

    Args:
        exc: the error.
        command: the subcommand that ran (``train``, ``data synth``): the line names its own
            levers (:data:`MEMORY_LEVERS`); ``""`` or another name: the generic advice.
    """
    if isinstance(exc, OutOfMemory):
        return exc
    text = str(exc)
    if not isinstance(exc, MemoryError) and not (
        isinstance(exc, RuntimeError) and any(t in text.lower() for t in _OOM_TEXTS)
    ):
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    levers = MEMORY_LEVERS.get(command) or MEMORY_LEVERS.get(command.split(" ")[0], "")
    return OutOfMemory(f"out of memory: {first[:200]}; {levers or _GENERIC_LEVERS}")


def mark_replicated(exc: BaseException, *, presumed: bool = False) -> BaseException:
    """Mark ``exc`` as raised the same way by every rank, so that only rank 0 prints it.

    Args:
        exc: the error.
        presumed: the ranks did not compare outcomes (a check before the communicator
            exists): every rank checked the same input, but node-local state (a file missing on
            one node) may differ, so the first rank of every other node prints it too.

    Returns:
        ``exc`` itself.
    """
    exc.replicated = "presumed" if presumed else True  # type: ignore[attr-defined]
    return exc


def is_presumed_replicated(exc: BaseException) -> bool:
    """Whether ``exc`` was marked by :func:`mark_replicated` with ``presumed=True``."""
    return getattr(exc, "replicated", False) == "presumed"


def is_replicated(exc: BaseException) -> bool:
    """Whether ``exc`` was marked by :func:`mark_replicated`."""
    return bool(getattr(exc, "replicated", False))


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line; OS errors as ``PATH: reason``."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split())
