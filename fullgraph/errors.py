"""Exception types of fullgraph.

Every error that bad input can cause is a :class:`FullgraphError` (or subclass) whose message is
one line naming the problem; the command line prints it and exits non-zero.
"""

from __future__ import annotations


class FullgraphError(Exception):
    """Base class of user-facing errors: bad input, mismatched sizes, corrupted files."""


class DataError(FullgraphError):
    """A dataset on disk is missing, malformed or inconsistent."""


class PartitionError(FullgraphError):
    """A partition directory is missing, corrupted or does not match its metadata."""


class ConfigError(FullgraphError):
    """Options that cannot work together (rank count against part count, unknown names)."""
