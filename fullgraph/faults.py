"""What a rank does when it fails mid-job: say why in one piece, then end the whole job."""

from __future__ import annotations

import sys
import time
import traceback

from fullgraph.comm import Communicator
from fullgraph.errors import FullgraphError

#: Seconds a failing rank waits after writing its error, so the launcher forwards it before the
#: abort tears the job down.
FLUSH_GRACE_S = 0.5


def abort_job(comm: Communicator, command: str, exc: BaseException) -> None:
    """Print ``exc`` as ``fullgraph COMMAND: ...`` naming this rank, then abort every rank.

    Bad input (:class:`FullgraphError`) is one line; anything else carries its traceback. The
    message goes out in a single write, since a launcher such as MPICH's hydra may drop what a
    rank writes after another process has started aborting the job.

    Args:
        comm: the job's communicator (its ``abort`` ends every rank; it never returns).
        command: the subcommand name, for the message prefix.
        exc: the exception that ended this rank's work.
    """
    if isinstance(exc, FullgraphError):
        message = f"fullgraph {command}: error: rank {comm.rank}: {exc}\n"
        code = 2
    else:
        details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        message = f"fullgraph {command}: rank {comm.rank} failed:\n{details}"
        code = 1
    sys.stderr.write(message)
    sys.stderr.flush()
    time.sleep(FLUSH_GRACE_S)
    comm.abort(code)
