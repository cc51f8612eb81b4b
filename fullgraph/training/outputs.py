"""The files a training run writes on rank 0: JSONL log, resolved config, checkpoint directory.

They are checked before any work (:meth:`RunOutputs.open`: right kind, writable, not holding an
earlier run's result unless ``--force`` or ``--resume``; the checkpoint directory locked) and
written only once the run's set-up has succeeded (:meth:`RunOutputs.start`), so a run that fails
early leaves nothing behind and one that is refused overwrites nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from fullgraph.atomic import atomic_write_bytes, atomic_write_json, check_output
from fullgraph.training.checkpoint import CheckpointDir


def config_path_of_log(log_json: str | Path) -> Path:
    """Where the resolved config of a run logging to ``log_json`` goes (``<stem>.config.json``)."""
    log = Path(log_json)
    return log.with_name(log.stem + ".config.json")


def truncate_log(path: Path, start_epoch: int) -> None:
    """Keep the epochs before ``start_epoch`` in a resumed run's JSONL log (atomically)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the interruption
        if not isinstance(rec, dict) or rec.get("final"):
            continue
        epoch = rec.get("epoch")
        if isinstance(epoch, int) and epoch < start_epoch:
            kept.append(line + "\n")
    atomic_write_bytes(path, "".join(kept).encode())


class RunOutputs:
    """Rank 0's outputs of one run; on other ranks every method does nothing.

    Args:
        rank: this process's rank.
        log_json: the ``--log-json`` path, or ``None``.
        checkpoints: the run's checkpoint directory, or ``None``.
        resume: the run continues an earlier one (its log is kept up to the resumed epoch).
        force: outputs of an earlier run may be replaced.
    """

    def __init__(
        self,
        rank: int,
        log_json: str | None,
        checkpoints: CheckpointDir | None = None,
        *,
        resume: bool = False,
        force: bool = False,
    ) -> None:
        self.rank = rank
        self.log_json = Path(log_json) if log_json else None
        self.checkpoints = checkpoints
        self.resume = resume
        self.force = force
        self.log: TextIO | None = None

    def open(self) -> None:
        """Check every output before any work; lock the checkpoint directory.

        Raises:
            ConfigError: an output of the wrong kind, under a file, or in a place that cannot
                be written; the checkpoint directory in use by another run.
            FileExistsError: an earlier run's log or checkpoint without ``--force`` /
                ``--resume``.
        """
        if self.rank != 0:
            return
        if self.log_json is not None:
            keep = self.force or self.resume
            check_output(self.log_json, "--log-json", kind="file", exist_ok=keep)
            config = config_path_of_log(self.log_json)
            check_output(config, "--log-json (its config file)", kind="file", exist_ok=True)
        if self.checkpoints is not None:
            self.checkpoints.open()

    def start(self, resolved: dict[str, Any], start_epoch: int = 1) -> TextIO | None:
        """Write the resolved config beside the log and in the checkpoint directory; open the
        log (appending after the kept epochs when resuming).

        Returns:
            The open log (rank 0 with ``--log-json``), else ``None``.

        Raises:
            FileExistsError: a log appeared since :meth:`open` (another run) without
                ``--force`` / ``--resume``.
        """
        if self.rank != 0:
            return None
        if self.log_json is not None:
            if self.resume:
                truncate_log(self.log_json, start_epoch)
                mode = "a"
            else:
                mode = "w" if self.force else "x"
            try:
                self.log = open(self.log_json, mode)
            except FileExistsError:
                raise FileExistsError(
                    f"--log-json {self.log_json} appeared since the run started (another run?); "
                    f"left as it is (use --force to replace it)"
                ) from None
            atomic_write_json(config_path_of_log(self.log_json), resolved)
        if self.checkpoints is not None:
            atomic_write_json(self.checkpoints.path / "config.json", resolved)
        return self.log

    def close(self, discard: bool = False) -> None:
        """Close the log and release the checkpoint lock.

        Args:
            discard: the run failed before :meth:`start`: remove the checkpoint directory if
                this run created it and wrote nothing there.
        """
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.checkpoints is not None:
            self.checkpoints.close(discard=discard)
