"""The configuration of a training run (saved beside it as ``config.json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fullgraph.compression import check_codec
from fullgraph.errors import ConfigError
from fullgraph.option_checks import check_number, check_probability


class InputDropoutConfig:
    """Methods shared by the run configurations that hold ``dropout`` and ``input_dropout``."""

    dropout: float
    input_dropout: float | None

    def resolved_input_dropout(self) -> float:
        """Input dropout, defaulting to :attr:`dropout`."""
        return self.dropout if self.input_dropout is None else self.input_dropout

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with ``input_dropout`` resolved, for logs and ``config.json``."""
        d = asdict(self)
        d["input_dropout"] = self.resolved_input_dropout()
        return d


@dataclass
class TrainConfig(InputDropoutConfig):
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
    force: bool = False  # a fresh run may replace an earlier run's checkpoint and log
    log_json: str | None = None
    quiet: bool = False
    device: str = "cpu"  # cpu | cuda (nccl needs cuda; mpi needs cpu)
    compress_fwd: str = "none"  # halo activations: none | fp16 | bf16 | int8 | int4 | int2
    compress_bwd: str = "none"  # halo gradients: same choices
    error_feedback: bool = False  # carry each sent row's quantization residual to the next step
    exchange_buffer_mb: float = 256.0  # larger uncompressed halo exchanges go in slices
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model not in ("gcn", "sage"):
            raise ConfigError(f"--model must be gcn or sage, not {self.model!r}")
        for name in ("layers", "hidden", "epochs", "eval_every", "checkpoint_every"):
            check_number(f"--{name.replace('_', '-')}", getattr(self, name), low=1, integer=True)
        check_number("--seed", self.seed, low=0, high=2**63 - 1, integer=True)
        check_number("--lr", self.lr, low=0.0, low_open=True)
        check_number("--weight-decay", self.weight_decay, low=0.0)
        check_probability("--dropout", self.dropout)
        check_probability("--input-dropout", self.input_dropout, optional=True)
        check_number("--exchange-buffer-mb", self.exchange_buffer_mb, low=0.0, low_open=True)
        if self.weight_decay_scope not in ("first", "all"):
            raise ConfigError(
                f"--weight-decay-scope must be first or all, not {self.weight_decay_scope!r}"
            )
        if self.precompute_first not in ("auto", "on", "off"):
            raise ConfigError(
                f"--precompute-first must be auto, on or off, not {self.precompute_first!r}"
            )
        if self.resume and self.force:
            raise ConfigError("--resume continues the checkpoint and --force starts over: give one")
        if self.resume and not self.checkpoint:
            raise ConfigError("--resume needs --checkpoint DIR")
        check_codec(self.compress_fwd, "--compress-fwd")
        check_codec(self.compress_bwd, "--compress-bwd")
        if self.error_feedback and self.compress_fwd == self.compress_bwd == "none":
            raise ConfigError(
                "--error-feedback needs --compress-fwd or --compress-bwd other than none"
            )

    @property
    def compressed(self) -> bool:
        """Whether training exchanges are compressed in either direction."""
        return self.compress_fwd != "none" or self.compress_bwd != "none"
