"""The configuration of a training run (saved beside it as ``config.json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved beside it as ``config.json``)."""

    model: str = "gcn"
    layers: int = 2
    hidden: int = 16
    dropout: float = 0.5
    input_dropout: float | None = None  # None: same as dropout
    lr: float = 0.01
    weight_decay: float = 5e-4
    weight_decay_scope: str = "first"  # "first" layer only (PyG/Kipf GCN) or "all"
    epochs: int = 200
    seed: int = 0
    precompute_first: str = "auto"  # auto | on | off
    normalize_features: bool = False  # PyG NormalizeFeatures: x - global min, rows sum to 1
    eval_every: int = 1
    checkpoint: str | None = None
    checkpoint_every: int = 10
    resume: bool = False
    log_json: str | None = None
    quiet: bool = False
    device: str = "cpu"  # cpu | cuda (nccl needs cuda; mpi needs cpu)
    extra: dict = field(default_factory=dict)

    def resolved_input_dropout(self) -> float:
        """Input dropout, defaulting to :attr:`dropout`."""
        return self.dropout if self.input_dropout is None else self.input_dropout

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with ``input_dropout`` resolved."""
        d = asdict(self)
        d["input_dropout"] = self.resolved_input_dropout()
        return d
