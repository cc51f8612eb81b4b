"""The trained model as one file: weights, normalisation statistics and the model's config.

``fullgraph train`` writes the best-validation model (``--save-model PATH``; by default
``<log stem>.model.pt`` beside ``--log-json``). The file is ``torch.save`` of a plain dict, so
``torch.load(path, weights_only=True)`` opens it without fullgraph::

    {"format": "fullgraph-model", "version": 1,
     "config": {...TrainConfig fields, "precision" too...}, "num_features": F, "num_classes": C,
     "state_dict": {"layers.0.lin.weight": tensor, ..., "norms.0.running_mean": tensor},
     "epoch": best epoch, "metric": "acc", "val": ..., "test": ..., "data": "...",
     "partition_hash": "..."}

The model does not depend on the partition it was trained on: ``fullgraph predict`` runs it at
any rank count, and ``fullgraph export --to pyg`` rebuilds it from PyG layers. Like every
checkpoint it carries its sha256 in the zip archive's comment
(:mod:`fullgraph.run.torch_file`), checked before anything is unpickled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from fullgraph.atomic import atomic_write_bytes
from fullgraph.errors import ConfigError
from fullgraph.models.gnn import GNN
from fullgraph.run.torch_file import (
    check_values,
    encode_torch_file,
    read_torch_file,
)
from fullgraph.training.config import TrainConfig

FORMAT = "fullgraph-model"
VERSION = 1


def model_state(
    model: torch.nn.Module,
    config: TrainConfig,
    num_features: int,
    num_classes: int,
    info: dict[str, Any],
) -> dict[str, Any]:
    """The dict a model file holds (see the module docstring), its tensors copied to the CPU.

    Args:
        model: the trained :class:`~fullgraph.models.gnn.GNN`.
        config: its configuration.
        num_features: input width.
        num_classes: output width.
        info: ``epoch``, ``metric``, ``val``, ``test``, ``data``, ``partition_hash``.
    """
    state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    return {
        "format": FORMAT,
        "version": VERSION,
        "config": config.to_dict(),
        "num_features": int(num_features),
        "num_classes": int(num_classes),
        "state_dict": state,
        **info,
    }


def save_model_file(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (from :func:`model_state`) to ``path`` atomically, with its checksum.

    The caller checked and claimed the path before the run (``--force`` replaces only a model
    file: :data:`fullgraph.run.outputs.MODEL`; one writer: :mod:`fullgraph.run.claim`).
    """
    path = Path(path)
    atomic_write_bytes(path, encode_torch_file(state))
    return path


@dataclass
class ModelFile:
    """A model file, read and checked.

    Attributes:
        path: where it was read.
        sha256: the digest of the whole file (what ``predict`` names in its summary).
        config: the model's :class:`~fullgraph.training.config.TrainConfig`.
        num_features: input width.
        num_classes: output width.
        state_dict: weights and normalisation statistics.
        info: the rest (``epoch``, ``metric``, ``val``, ``test``, ``data``, ...).
    """

    path: Path
    sha256: str
    config: TrainConfig
    num_features: int
    num_classes: int
    state_dict: dict[str, torch.Tensor]
    info: dict[str, Any]

    def build(self) -> GNN:
        """The model with its trained weights (on the CPU, in evaluation mode).

        Raises:
            ConfigError: the weights do not fit the configured model (a damaged file).
        """
        model = self.config.build_model(self.num_features, self.num_classes)
        try:
            model.load_state_dict(self.state_dict, strict=True)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0]
            raise ConfigError(
                f"{self.path}: the weights do not fit the model it describes ({first})"
            ) from None
        return model.eval()


def expected_state(
    config: TrainConfig, num_features: int, num_classes: int, path: Path
) -> dict[str, torch.Tensor]:
    """The state_dict the model a file describes holds, as meta tensors (dtypes and shapes,
    nothing allocated).

    Raises:
        ConfigError: the widths or the config build no model.
    """
    try:
        with torch.device("meta"):
            return dict(config.build_model(num_features, num_classes).state_dict())
    except (ConfigError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"{path}: the model it describes cannot be built ({num_features} features, "
            f"{num_classes} classes: {exc})"
        ) from None


def load_model_file(path: str | Path) -> ModelFile:
    """Read a model file written by ``fullgraph train``.

    Raises:
        ConfigError: missing, unreadable, truncated or corrupted (checksum), not a model file
            (a checkpoint, another format or version), a config fullgraph cannot build, or
            weights the model cannot take: missing, extra, another dtype or shape, NaN or
            infinity (:func:`~fullgraph.run.torch_file.check_values`).
    """
    path = Path(path)
    obj = read_torch_file(path, what="model file")
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        what = "a checkpoint" if isinstance(obj, dict) and "optimizer" in obj else "another file"
        raise ConfigError(
            f"{path} is {what}, not a model file written by `fullgraph train` (--save-model)"
        )
    if obj.get("version") != VERSION:
        raise ConfigError(
            f"{path} is a model file of version {obj.get('version')!r}; this fullgraph reads "
            f"version {VERSION}"
        )
    known = {f.name for f in fields(TrainConfig)}
    raw = obj.get("config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the model file holds no config")
    try:
        config = TrainConfig(**{k: v for k, v in raw.items() if k in known})
    except (ConfigError, TypeError) as exc:
        raise ConfigError(f"{path}: the model's config is not valid ({exc})") from None
    state = obj.get("state_dict")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{path}: the model file holds no state_dict of tensors")
    num_features, num_classes = int(obj.get("num_features", 0)), int(obj.get("num_classes", 0))
    check_values(state, expected_state(config, num_features, num_classes, path), where=path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    info = {
        k: v
        for k, v in obj.items()
        if k not in ("config", "state_dict", "format", "version", "num_features", "num_classes")
    }
    return ModelFile(
        path=path,
        sha256=digest,
        config=config,
        num_features=num_features,
        num_classes=num_classes,
        state_dict=state,
        info=info,
    )
