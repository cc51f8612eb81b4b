"""The options every command that runs on ranks shares: runtime and run outputs.

:class:`RuntimeOptions` says where and how a rank runs (transport, device, threads, timeout,
memory check); :class:`RunOptions` says where a run writes (log, checkpoint) and whether it
resumes or starts over. Both are :class:`~fullgraph.config.Config` dataclasses: the command
line is generated from their fields (:func:`add_options`), and constructing one checks it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fullgraph.atomic import Place, check_apart, check_named
from fullgraph.config import OPTIONAL_POSITIVE_INT, POSITIVE, POSITIVE_INT, Config, option
from fullgraph.errors import ConfigError
from fullgraph.run.outputs import config_path_of_log


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
    save_model: str | None = option(
        None,
        "write the best-validation model here (torch.load opens it; `fullgraph predict` and "
        "`fullgraph export` read it); default <log stem>.model.pt beside --log-json",
        metavar="PATH",
    )
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
        for name in ("log_json", "checkpoint", "save_model"):
            value = getattr(self, name)
            if value is not None and not str(value).strip():
                raise ConfigError(f"--{name.replace('_', '-')} needs a value, got {value!r}")
        if self.resume and not self.checkpoint:
            raise ConfigError("--resume needs --checkpoint DIR")
        if self.resume and self.force:
            raise ConfigError("--resume continues the checkpoint and --force starts over: give one")
        self.check_apart_from([])

    def check_apart_from(self, inputs: Sequence[Place], model: bool = False) -> None:
        """Refuse outputs that are, or lie inside, an input of the run or each other.

        Args:
            inputs: what the run reads (its partition, or its dataset and root).
            model: the run writes a model file (:meth:`model_path`).

        Raises:
            ConfigError: one line naming both places.
        """
        outputs = []
        if self.log_json:
            config = config_path_of_log(check_named(self.log_json, "--log-json", "file"))
            outputs.append(Place(Path(self.log_json), f"--log-json {self.log_json}"))
            outputs.append(Place(config, f"--log-json {self.log_json} (its config file {config})"))
        if self.checkpoint:
            outputs.append(Place(Path(self.checkpoint), f"--checkpoint {self.checkpoint}"))
        path = self.model_path() if model else None
        if path is not None:
            outputs.append(Place(path, f"--save-model {path}"))
        check_apart(outputs, inputs)

    def model_path(self) -> Path | None:
        """Where the best-validation model goes: ``--save-model``, else ``<log stem>.model.pt``
        beside ``--log-json``, else nowhere."""
        if self.save_model:
            return Path(self.save_model)
        if self.log_json:
            log = Path(self.log_json)
            return log.with_name(log.stem + ".model.pt")
        return None


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
