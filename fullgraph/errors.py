"""Exception types of fullgraph.

Every error that bad input can cause is a :class:`FullgraphError` (or subclass) whose message is
one line naming the problem; the command line prints it and exits with its ``exit_code``.
"""

from __future__ import annotations


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


def mark_replicated(exc: BaseException) -> BaseException:
    """Mark ``exc`` as raised the same way by every rank, so that only rank 0 prints it.

    Returns:
        ``exc`` itself.
    """
    exc.replicated = True  # type: ignore[attr-defined]
    return exc


def is_replicated(exc: BaseException) -> bool:
    """Whether ``exc`` was marked by :func:`mark_replicated`."""
    return bool(getattr(exc, "replicated", False))


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line; OS errors as ``PATH: reason``."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split())
