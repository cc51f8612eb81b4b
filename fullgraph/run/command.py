"""The scaffold of every command that runs on ranks: :class:`Command` and its :class:`Job`.

A command is a :class:`Command` subclass with two methods of its own: :meth:`Command.check`
(bad input found before the communicator exists) and :meth:`Command.run` (the work, given the
:class:`Job`). :meth:`Command.execute` does the rest, the same way for every command:

1. environment defaults for the OpenMP pools and allocations, before torch or numba load;
2. the options read from the command line (:meth:`Command.configure`), the transport and the
   device resolved once (:attr:`Command.transport`, :attr:`Command.device`) and checked, then
   the command's own checks, alike on every rank, so that only rank 0 prints a failure;
3. the rank start-up that ``fullgraph.pyg`` scripts share
   (:func:`~fullgraph.run.rank_start.start_rank`): the memory policy, threads per rank from the
   launcher's ranks per node, the communicator; from here on the process watchdog
   (:mod:`fullgraph.watchdog`) knows the rank: it ends it when its launcher dies, and when a
   start-up phase (the connections, then the command's own) outlasts ``--timeout``;
4. the work itself, under one failure policy
   (:func:`~fullgraph.distributed.faults.run_on_every_rank`): bad input agreed on by every rank
   ends them all with one line; anything else on one rank aborts the job naming the rank;
5. in the work, :class:`Job` checks rank 0's outputs before anything is computed, writes the
   resolved configuration beside the run once set-up succeeded, and opens the JSON-lines log.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TextIO, TypeVar

from fullgraph.run.checkpoint import CheckpointDir
from fullgraph.run.options import RunOptions, RuntimeOptions
from fullgraph.run.outputs import RunOutputs

if TYPE_CHECKING:
    from fullgraph.distributed import Communicator, LaunchInfo
    from fullgraph.precision import Precision

T = TypeVar("T")


class Job:
    """One run of a command on this rank: communicator, threads, device, rank 0's outputs.

    Attributes:
        command: the subcommand (``train``, ``minibatch``).
        comm: the communicator.
        info: launch information.
        threads: compute threads of this rank.
        device: where tensors live.
        run: the run's I/O options.
        checkpoints: the checkpoint directory (``--checkpoint``), or ``None``.
    """

    def __init__(
        self,
        command: str,
        comm: Communicator,
        info: LaunchInfo,
        threads: int,
        device: str,
        run: RunOptions,
        writes_model: bool = False,
    ) -> None:
        self.command, self.comm, self.info = command, comm, info
        self.threads, self.device, self.run = threads, device, run
        self.checkpoints: CheckpointDir | None = None
        if run.checkpoint:
            self.checkpoints = CheckpointDir(
                run.checkpoint, comm.rank, resume=run.resume, force=run.force
            )
        self.outputs = RunOutputs(
            comm.rank,
            run.log_json,
            self.checkpoints,
            resume=run.resume,
            force=run.force,
            model=run.model_path() if writes_model else None,
        )
        self.started = False

    def agree(self, fn: Callable[[], T]) -> T:
        """Run local work that may fail with bad input on some ranks; fail alike on all."""
        from fullgraph.distributed.faults import agree

        return agree(self.comm, fn)

    def open_outputs(self) -> None:
        """Check rank 0's outputs (and lock the checkpoint directory) before any work."""
        self.agree(self.outputs.open)

    def start(self, resolved: dict[str, Any], start_epoch: int = 1) -> TextIO | None:
        """Write the resolved config beside the run and open the log (rank 0)."""
        resolved = {
            **resolved,
            "transport": self.comm.transport,
            "ranks": self.comm.size,
            "threads_per_rank": self.threads,
            "launch": self.info.to_dict(),
        }
        log = self.outputs.start(resolved, start_epoch)
        self.started = True
        return log

    def start_line(self, details: str) -> None:
        """Rank 0's first line of a run, unless ``--quiet``: ``fullgraph COMMAND: P rank(s),
        transport T, N thread(s)/rank, DETAILS`` (the model, epochs, metric, precision...)."""
        if self.comm.rank == 0 and not self.run.quiet:
            print(
                f"fullgraph {self.command}: {self.comm.size} rank(s), transport "
                f"{self.comm.transport}, {self.threads} thread(s)/rank, {details}",
                flush=True,
            )

    def close(self, failed: bool = False) -> None:
        """Close the log and release the outputs (removing the checkpoint directory when this
        run made it and failed before its first checkpoint)."""
        self.outputs.close(discard=failed or not self.started)


class Command:
    """A subcommand run on every rank (see the module docstring for the steps).

    Subclasses name the command (:attr:`name`), read their own configurations in
    :meth:`configure`, check what needs no communicator in :meth:`check`, and do the work in
    :meth:`run`. The argparse handler is :meth:`main`.

    Args:
        args: the parsed command line.

    Attributes:
        runtime: the runtime options (transport, device, threads, timeout, memory check).
        io: the run's outputs (log, checkpoint, resume, force, quiet).
        launch: what the launcher says of this process (rank, size, ranks per node).
        transport: the resolved transport (``auto`` decided once, here).
        device: the resolved device.
    """

    #: the subcommand's name, for messages
    name: ClassVar[str] = ""
    #: the command writes a model file (``--save-model``), checked with the other outputs
    writes_model: ClassVar[bool] = False

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.runtime: RuntimeOptions
        self.io: RunOptions
        self.launch: LaunchInfo
        self.transport = ""
        self.device = ""

    @classmethod
    def main(cls, args: argparse.Namespace) -> int:
        """The argparse handler: run the command; returns the exit status."""
        cls(args).execute()
        return 0

    def configure(self) -> None:
        """Read the configurations from the command line (each checks itself)."""
        self.runtime = RuntimeOptions.from_args(self.args)
        self.io = RunOptions.from_args(self.args)

    def check(self) -> None:
        """Checks before the communicator exists (the rank count against the part count, the
        outputs apart from the inputs); they must behave alike on every rank."""

    def resolve_precision(self, requested: str) -> Precision:
        """``--precision`` on :attr:`device` as the run's one policy: ``auto`` decided,
        bfloat16 support checked (:func:`fullgraph.precision.resolve_precision`); rank 0
        prints the line of an ``auto`` (what it resolved to, and why). Call it once, from
        :meth:`check`, and hand the policy on."""
        from fullgraph.precision import resolve_precision

        precision, note = resolve_precision(requested, self.device)
        if note is not None and self.launch.rank == 0:
            print(f"fullgraph {self.name}: {note}", file=sys.stderr, flush=True)
        return precision

    def run(self, job: Job) -> dict[str, Any]:
        """The command's work on this rank."""
        raise NotImplementedError

    def execute(self) -> dict[str, Any]:
        """Run the command on this rank with the shared scaffold; returns what :meth:`run`
        returned."""
        from fullgraph.resources import process_defaults

        process_defaults()  # before the OpenMP pools start and the first large allocation
        from fullgraph.distributed import check_device, detect_launch, resolve_transport
        from fullgraph.distributed.faults import run_on_every_rank
        from fullgraph.run.rank_start import checked_alike, start_rank

        self.launch = info = detect_launch()
        with checked_alike():  # every rank checks the same options; only rank 0 prints
            self.configure()
            self.transport = resolve_transport(self.runtime.transport, info)
            self.device = self.runtime.resolved_device(self.transport)
            check_device(self.device, self.transport)
            self.check()
        comm, threads = start_rank(
            f"fullgraph {self.name}",
            info,
            self.transport,
            self.runtime.timeout,
            self.runtime.threads,
            notices=not self.io.quiet,
        )
        job = Job(self.name, comm, info, threads, self.device, self.io, self.writes_model)

        def body() -> dict[str, Any]:
            try:
                result = self.run(job)
            except BaseException:
                job.close(failed=True)
                raise
            job.close()
            return result

        return run_on_every_rank(comm, self.name, body)
