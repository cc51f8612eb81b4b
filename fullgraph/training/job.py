"""The job scaffold shared by ``fullgraph train`` and ``fullgraph minibatch``.

A command describes its run with configurations (:class:`RuntimeOptions`: transport, device,
threads, timeout; :class:`RunOptions`: log, checkpoint, resume, quiet) and hands its work to
:func:`run_job`, which does the rest the same way for both:

1. environment defaults for the OpenMP pools and allocations, before torch or numba load;
2. checks that need no communicator (options, rank count against part count), alike on every
   rank, so that only rank 0 prints a failure;
3. threads per rank from the launcher's ranks per node, the transport rule
   (:func:`~fullgraph.distributed.resolve_transport`), the communicator; from here on the
   process watchdog (:mod:`fullgraph.watchdog`) knows the rank: it ends it when its launcher
   dies, and when a start-up phase (the connections, then the command's own) outlasts
   ``--timeout``;
4. the work itself, under one failure policy
   (:func:`~fullgraph.distributed.faults.run_on_every_rank`): bad input agreed on by every rank
   ends them all with one line; anything else on one rank aborts the job naming the rank;
5. in the work, :class:`Job` checks rank 0's outputs before anything is computed, writes the
   resolved configuration beside the run once set-up succeeded, and opens the JSON-lines log.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

from fullgraph.atomic import Place, check_apart
from fullgraph.config import OPTIONAL_POSITIVE_INT, POSITIVE, POSITIVE_INT, Config, option
from fullgraph.errors import ConfigError, FullgraphError, PeerUnreachable, mark_replicated
from fullgraph.training.checkpoint import CheckpointDir
from fullgraph.training.outputs import RunOutputs, config_path_of_log

T = TypeVar("T")


@dataclass
class RuntimeOptions(Config):
    """Where and how a rank runs: transport, device, threads, timeout."""

    transport: str = option(
        "auto",
        "halo/all-reduce transport (auto: mpi with several ranks under an MPI launcher, gloo "
        "under torchrun, else local)",
        choices=("auto", "local", "mpi", "gloo", "nccl"),
    )
    device: str = option(
        "auto",
        "where tensors live (auto: cuda with --transport nccl, else cpu)",
        choices=("auto", "cpu", "cuda"),
    )
    threads: int | None = option(
        None, "threads per rank (default cores/ranks on the node)", check=OPTIONAL_POSITIVE_INT
    )
    timeout: float = option(300.0, "seconds the set-up and any collective may wait", check=POSITIVE)
    memory_check: str = option(
        "refuse",
        "when the predicted peak memory of a node's ranks exceeds the node's memory (checked "
        "from the sizes before anything large is allocated): refuse to start (exit status 2), "
        "warn and run anyway, or off (no prediction); default refuse",
        choices=("refuse", "warn", "off"),
    )

    def resolved_device(self, transport: str) -> str:
        """``cuda`` for ``auto`` with nccl, else ``cpu``; an explicit device as given."""
        if self.device != "auto":
            return self.device
        return "cuda" if transport == "nccl" else "cpu"


@dataclass
class RunOptions(Config):
    """A run's I/O: where it logs and checkpoints, whether it resumes or replaces."""

    log_json: str | None = option(
        None, "write one JSON object per epoch (and a final one) here; rank 0"
    )
    checkpoint: str | None = option(None, "checkpoint directory (config.json is saved there too)")
    checkpoint_every: int = option(10, "epochs between checkpoints", check=POSITIVE_INT)
    resume: bool = option(False, "continue from --checkpoint")
    force: bool = option(
        False,
        "start over where --checkpoint or --log-json hold an earlier run's result (the old "
        "checkpoint is replaced at this run's first checkpoint); only files fullgraph wrote "
        "are replaced",
    )
    quiet: bool = option(False, "no per-epoch lines")

    def check(self) -> None:
        """No empty paths; ``--resume`` with a checkpoint and without ``--force``; outputs
        apart from each other (no log inside the checkpoint directory)."""
        for name in ("log_json", "checkpoint"):
            value = getattr(self, name)
            if value is not None and not str(value).strip():
                raise ConfigError(f"--{name.replace('_', '-')} needs a value, got {value!r}")
        if self.resume and not self.checkpoint:
            raise ConfigError("--resume needs --checkpoint DIR")
        if self.resume and self.force:
            raise ConfigError("--resume continues the checkpoint and --force starts over: give one")
        self.check_apart_from([])

    def check_apart_from(self, inputs: Sequence[Place]) -> None:
        """Refuse outputs that are, or lie inside, an input of the run or each other.

        Args:
            inputs: what the run reads (its partition, or its dataset and root).

        Raises:
            ConfigError: one line naming both places.
        """
        outputs = []
        if self.log_json:
            config = config_path_of_log(self.log_json)
            outputs.append(Place(Path(self.log_json), f"--log-json {self.log_json}"))
            outputs.append(Place(config, f"--log-json {self.log_json} (its config file {config})"))
        if self.checkpoint:
            outputs.append(Place(Path(self.checkpoint), f"--checkpoint {self.checkpoint}"))
        check_apart(outputs, inputs)


def _set_threads(threads: int) -> None:
    import numba
    import torch

    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def _check_device(device: str, transport: str) -> None:
    """The device exists and the transport can move its tensors."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}, but torch {torch.__version__} sees no CUDA device")
    if transport == "mpi" and device != "cpu":
        raise ConfigError("transport mpi exchanges host buffers: use --device cpu (or nccl)")


class Job:
    """One run of a command on this rank: launch, communicator, threads, rank 0's outputs.

    Attributes:
        command: the subcommand (``train``, ``minibatch``).
        comm: the communicator.
        info: launch information.
        threads: compute threads of this rank.
        device: where tensors live.
        run: the run's I/O options.
    """

    def __init__(self, command: str, comm: Any, info: Any, threads: int, device: str,
                 run: RunOptions) -> None:  # fmt: skip
        self.command, self.comm, self.info = command, comm, info
        self.threads, self.device, self.run = threads, device, run
        self.checkpoints: CheckpointDir | None = None
        if run.checkpoint:
            self.checkpoints = CheckpointDir(
                run.checkpoint, comm.rank, resume=run.resume, force=run.force
            )
        self.outputs = RunOutputs(
            comm.rank, run.log_json, self.checkpoints, resume=run.resume, force=run.force
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

    def close(self) -> None:
        """Close the log and release the checkpoint directory (removing it when this run made
        it and failed before writing anything there)."""
        self.outputs.close(discard=not self.started)


def run_job(
    command: str,
    runtime: Callable[[], RuntimeOptions],
    run: Callable[[], RunOptions],
    prepare: Callable[[Any], None],
    work: Callable[[Job], T],
) -> T:
    """Run one command on this rank with the shared scaffold (see the module docstring).

    Args:
        command: the subcommand name, for messages.
        runtime: builds the runtime options (checked, alike on every rank).
        run: builds the run's I/O options (checked, alike on every rank).
        prepare: more checks before the communicator exists, given the launch information
            (e.g. the rank count against the part count); must behave alike on every rank.
        work: the command's work; it gets the :class:`Job` and returns its result.

    Returns:
        What ``work`` returned.
    """
    from fullgraph.resources import process_defaults

    process_defaults()  # before the OpenMP pools start and the first large allocation
    from fullgraph.distributed import (
        create_communicator,
        default_threads,
        detect_launch,
        resolve_transport,
    )
    from fullgraph.distributed.faults import abort_setup, run_on_every_rank
    from fullgraph.resources import release_freed_memory
    from fullgraph.watchdog import current as current_watchdog
    from fullgraph.watchdog import phase

    release_freed_memory()
    info = detect_launch()
    try:
        rt, io = runtime(), run()
        transport = resolve_transport(rt.transport, info)
        device = rt.resolved_device(transport)
        _check_device(device, transport)
        prepare(info)
    except (FullgraphError, FileExistsError, FileNotFoundError) as exc:
        raise mark_replicated(exc) from None
    watchdog = current_watchdog()
    if watchdog is not None:  # the launcher watch and the start-up deadlines from here on
        watchdog.attach(info, rt.timeout, notices=not io.quiet)
    threads = rt.threads or default_threads(info)
    _set_threads(threads)
    try:
        with phase("connection set-up"):
            comm = create_communicator(transport, info, rt.timeout, label=f"fullgraph {command}")
    except PeerUnreachable as exc:
        if info.size == 1:
            raise
        abort_setup(command, info.rank, info.under_mpi, exc)
        raise
    job = Job(command, comm, info, threads, device, io)

    def body() -> T:
        try:
            return work(job)
        finally:
            job.close()

    return run_on_every_rank(comm, command, body)


def add_options(
    parser: argparse.ArgumentParser, *sections: tuple[str, type, tuple[str, ...]]
) -> None:
    """Add the options of several configurations, one argument group each.

    Args:
        parser: the subcommand's parser.
        sections: ``(title, config class, fields to leave out)``.
    """
    for title, cls, exclude in sections:
        cls.add_arguments(parser.add_argument_group(title), exclude=exclude)
