"""The files a training run writes on rank 0: JSONL log, resolved config, checkpoint directory,
model file.

They are checked before any work (:meth:`RunOutputs.open`: right kind, writable, not holding an
earlier run's result unless ``--force`` or ``--resume``; the checkpoint directory locked) and
written only once the run's set-up has succeeded (:meth:`RunOutputs.start`), so a run that fails
early leaves nothing behind and one that is refused overwrites nothing. A log or config file
that fullgraph did not write (:data:`LOG`, :data:`RUN_CONFIG`), or another writer's file
(a checkpoint or an export's weights at ``--save-model``: :data:`MODEL`), is never replaced,
``--force`` or not; no output goes inside another command's output directory
(:mod:`fullgraph.run.nesting`); the log and the model file are claimed for the run, so a
second run writing the same file is refused at once (:mod:`fullgraph.run.claim`). A run that
fails removes what it created and holds nothing yet (an empty log, a checkpoint directory
without a checkpoint), never an earlier run's files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from fullgraph.atomic import (
    OutputKind,
    atomic_write_bytes,
    atomic_write_json,
    check_output,
    is_plain_file,
)
from fullgraph.run.checkpoint import CheckpointDir
from fullgraph.run.claim import FileClaim
from fullgraph.run.nesting import check_not_inside_output
from fullgraph.run.torch_file import not_of_kinds

#: How a record of the log begins (``json.dumps`` of an epoch's or the final record).
_RECORD_STARTS = (b'{"epoch": ', b'{"final": ')
_LINE_LIMIT = 1 << 20


def _not_a_log(path: Path) -> str | None:
    """``None`` for a JSON-lines log of epoch records (an empty one too; the last line may be
    cut short by an interruption), else why not."""
    if not is_plain_file(path):
        return "it is not a regular file"
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(_LINE_LIMIT), b""), 1):
            try:
                rec = json.loads(line)
            except ValueError:  # not JSON, or not UTF-8
                if not line.endswith(b"\n") and line.startswith(_RECORD_STARTS):
                    continue  # the last record, cut short
                return f"line {number} is not a JSON record"
            ours = isinstance(rec, dict) and (
                isinstance(rec.get("epoch"), int) or rec.get("final") is True
            )
            if not ours:
                return f"line {number} is not an epoch record"
    return None


def _not_a_run_config(path: Path) -> str | None:
    """``None`` for a run's resolved configuration (``{"config": {...}, "data": ...}``)."""
    if not is_plain_file(path):
        return "it is not a regular file"
    try:
        obj = json.loads(path.read_bytes())
    except ValueError:
        return "it is not JSON"
    if isinstance(obj, dict) and isinstance(obj.get("config"), dict) and "data" in obj:
        return None
    return "it is other JSON"


#: The ``--log-json`` file: ``--force`` / ``--resume`` replace or cut only a log fullgraph wrote.
LOG = OutputKind("a training log", _not_a_log)
#: ``<log stem>.config.json`` and ``<checkpoint>/config.json``: rewritten by every run, so only
#: when a run wrote them.
RUN_CONFIG = OutputKind("a run's configuration", _not_a_run_config)
#: ``--save-model`` (``<log stem>.model.pt``): replaced only when ``fullgraph train`` wrote a
#: model file there (by its content: never a checkpoint or an export's weights,
#: :func:`fullgraph.run.torch_file.torch_file_kind`).
MODEL = OutputKind("a model file", lambda path: not_of_kinds(path, "fullgraph-model"))


def _is_empty(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size == 0
    except OSError:
        return False


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
        model: where the run writes its model file, or ``None``.
    """

    def __init__(
        self,
        rank: int,
        log_json: str | None,
        checkpoints: CheckpointDir | None = None,
        *,
        resume: bool = False,
        force: bool = False,
        model: Path | None = None,
    ) -> None:
        self.rank = rank
        self.model = model
        self.log_json = Path(log_json) if log_json else None
        self.checkpoints = checkpoints
        self.resume = resume
        self.force = force
        self.log: TextIO | None = None
        self.claims: list[FileClaim] = []
        self._config_existed = True

    def open(self) -> None:
        """Check every output before any work; claim the log and the model file; lock the
        checkpoint directory.

        Raises:
            ConfigError: an output of the wrong kind, under a file, inside another command's
                output, or in a place that cannot be written; a log, config, model or
                checkpoint file there that fullgraph's writer of it did not write; the log,
                model file or checkpoint directory in use by another run.
            FileExistsError: an earlier run's log, model or checkpoint without ``--force`` /
                ``--resume``.
        """
        if self.rank != 0:
            return
        try:
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> None:
        keep = self.force or self.resume
        ckpt = self.checkpoints.path if self.checkpoints is not None else None
        places = [(self.log_json, "--log-json"), (self.model, "--save-model")]
        for path, option in [*places, (ckpt, "--checkpoint")]:
            if path is not None:
                check_not_inside_output(path, f"{option} {path}")
        if self.log_json is not None:
            check_output(self.log_json, "--log-json", kind="file", exist_ok=keep, ours=LOG)
            self._claim(self.log_json, "--log-json")
            check_output(self.log_json, "--log-json", kind="file", exist_ok=keep, ours=LOG)
            config = config_path_of_log(self.log_json)
            check_output(
                config,
                "--log-json (its config file)",
                kind="file",
                exist_ok=True,
                ours=RUN_CONFIG,
                advice="choose another --log-json or remove it yourself",
            )
            self._config_existed = config.exists()
        if self.model is not None:
            check_output(self.model, "--save-model", kind="file", exist_ok=keep, ours=MODEL)
            self._claim(self.model, "--save-model")  # then again: a run may have ended since
            check_output(self.model, "--save-model", kind="file", exist_ok=keep, ours=MODEL)
        if self.checkpoints is not None:
            if self.checkpoints.path.is_dir():
                RUN_CONFIG.check_replaceable(self.checkpoints.path / "config.json", "--checkpoint")
            self.checkpoints.open()

    def _claim(self, path: Path, option: str) -> None:
        claim = FileClaim(path, option)
        claim.acquire()
        self.claims.append(claim)

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
            self.checkpoints.write_config(resolved)
        return self.log

    def close(self, discard: bool = False) -> None:
        """Close the log (removed when this run created it and it holds no record, as when a
        full disk failed its first write, with the config file this run wrote beside it),
        release the claims and the checkpoint lock.

        Args:
            discard: the run failed: remove the checkpoint directory if this run created it
                and wrote no checkpoint there (:meth:`CheckpointDir.close`).
        """
        if self.log is not None:
            try:
                self.log.close()
            except OSError:  # the records the last flush could not write (a full disk, said)
                pass
            created, self.log = self.log.mode != "a", None
            if created and self.log_json is not None and _is_empty(self.log_json):
                self.log_json.unlink()  # this run's log, and it holds no record
                if not self._config_existed:
                    config_path_of_log(self.log_json).unlink(missing_ok=True)
        if self.checkpoints is not None:
            self.checkpoints.close(discard=discard)
        for claim in self.claims:
            claim.release()
        self.claims = []
