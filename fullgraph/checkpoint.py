"""Training checkpoints: model, optimiser, epoch, RNG, config, partition hash; atomic writes.

Parameters are identical on every rank, so rank 0 writes one file, ``<dir>/checkpoint.pt``, and
every rank reads it on ``--resume``. The file is replaced atomically (temporary file, fsync,
rename), so an interrupted write leaves the previous checkpoint intact.

State that differs between ranks (the error-feedback residuals of compressed halo exchanges)
goes to one file per rank and epoch, ``<dir>/rank-<r>-epoch-<e>.pt``, written before
``checkpoint.pt`` names epoch ``e``; older ones are removed once a newer checkpoint is complete.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from fullgraph.atomic import atomic_write_bytes
from fullgraph.errors import ConfigError

CHECKPOINT_NAME = "checkpoint.pt"

#: Config keys that must match between the checkpoint and the resumed run (any of them changes
#: the losses from the resumed epoch on).
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
)


def _write(path: Path, state: dict[str, Any]) -> Path:
    """``torch.save`` ``state`` to ``path`` atomically; return ``path``."""
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _read(path: Path, missing: str, weights_only: bool) -> dict[str, Any]:
    """``torch.load`` ``path`` on the CPU; a :class:`ConfigError` saying ``missing`` when it is
    absent, or naming the file when it cannot be read."""
    if not path.is_file():
        raise ConfigError(missing)
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise ConfigError(f"--resume: cannot read {path} ({exc})") from exc


def save_checkpoint(directory: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``directory/checkpoint.pt`` atomically.

    Args:
        directory: the checkpoint directory (created when missing).
        state: ``model``, ``optimizer``, ``epoch``, ``rng``, ``config``, ``partition_hash``,
            ``history``.

    Returns:
        The path written.
    """
    return _write(Path(directory) / CHECKPOINT_NAME, state)


def load_checkpoint(
    directory: str | Path, config: dict[str, Any], partition_hash: str
) -> dict[str, Any]:
    """Read ``directory/checkpoint.pt`` and check it belongs to this run.

    Args:
        directory: the checkpoint directory.
        config: the resumed run's resolved config.
        partition_hash: hash of the partition this rank trains on.

    Returns:
        The saved state.

    Raises:
        ConfigError: no checkpoint, an unreadable one, another partition, or another model.
    """
    path = Path(directory) / CHECKPOINT_NAME
    state = _read(path, f"--resume: no checkpoint at {path}", weights_only=False)
    if state.get("partition_hash") != partition_hash:
        raise ConfigError(
            f"--resume: {path} was written for partition {state.get('partition_hash')}, "
            f"this run trains on {partition_hash}"
        )
    saved = state.get("config", {})
    for key in MODEL_KEYS:
        if saved.get(key) != config.get(key):
            raise ConfigError(
                f"--resume: {path} has {key}={saved.get(key)!r}, this run has {config.get(key)!r}"
            )
    return state


def rank_state_path(directory: str | Path, rank: int, epoch: int) -> Path:
    """Where rank ``rank`` keeps its own state of epoch ``epoch``."""
    return Path(directory) / f"rank-{rank}-epoch-{epoch}.pt"


def save_rank_state(directory: str | Path, rank: int, epoch: int, state: dict[str, Any]) -> Path:
    """Write this rank's ``state`` for ``epoch`` atomically (see the module docstring)."""
    return _write(rank_state_path(directory, rank, epoch), state)


def load_rank_state(directory: str | Path, rank: int, epoch: int) -> dict[str, Any]:
    """Read this rank's state of ``epoch``.

    Raises:
        ConfigError: the file is missing or unreadable.
    """
    path = rank_state_path(directory, rank, epoch)
    missing = (
        f"--resume: {path} is missing (rank {rank}'s error-feedback residuals of the "
        f"checkpoint's epoch {epoch})"
    )
    return _read(path, missing, weights_only=True)


def remove_rank_states(directory: str | Path, rank: int, before_epoch: int) -> None:
    """Delete this rank's state files of epochs before ``before_epoch``."""
    for path in Path(directory).glob(f"rank-{rank}-epoch-*.pt"):
        epoch = path.stem.rsplit("-", 1)[-1]
        if epoch.isdigit() and int(epoch) < before_epoch:
            path.unlink(missing_ok=True)
