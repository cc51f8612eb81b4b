"""What defines a mini-batch run (the baseline), with each option's default, help and check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fullgraph.config import (
    NON_NEGATIVE,
    OPTIONAL_PROBABILITY,
    POSITIVE,
    POSITIVE_INT,
    PROBABILITY,
    SEED,
    Config,
    check_path,
    option,
)
from fullgraph.errors import ConfigError
from fullgraph.metrics import METRIC_CHOICES
from fullgraph.precision import check_precision
from fullgraph.training.config import (
    METRIC_HELP,
    OPTIONAL_SPLIT,
    SPLIT_HELP,
    InputDropoutConfig,
)

if TYPE_CHECKING:
    from fullgraph.training.config import TrainConfig

#: ``--precision`` of the baseline: what bf16-mixed does there (no halo rows: every rank holds
#: the whole graph).
PRECISION_HELP = (
    "32 (float32) or bf16-mixed: the training forward of the sampled blocks under "
    "torch.autocast to bfloat16 (weight products in bfloat16; a neighbour mean of bfloat16 "
    "rows summed in float32), parameters, optimiser state, loss and gradient all-reduce in "
    "float32; the layer-wise evaluation (and the saved model) is float32 at any precision; "
    "auto: what `fullgraph train --precision auto` picks on this CPU (docs/train.md, Precision)"
)


def parse_fanouts(text: str) -> list[int]:
    """``"15,10,5"`` -> ``[15, 10, 5]`` (``-1`` takes all neighbours).

    Raises:
        ConfigError: an entry is not an integer, is 0 or is below -1.
    """
    try:
        fanouts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--fanouts must be comma-separated integers, got {text!r}") from None
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise ConfigError(f"--fanouts needs positive counts (or -1 for all), got {text!r}")
    return fanouts


def _check_fanouts(option_name: str, value: list[int]) -> None:
    if not value or any(not isinstance(f, int) or f == 0 or f < -1 for f in value):
        raise ConfigError(f"{option_name} needs positive counts (or -1 for all), got {value}")


@dataclass
class MinibatchConfig(InputDropoutConfig, Config):
    """The experiment of a mini-batch run (``fanouts[0]`` applies to the seeds)."""

    fanouts: list[int] = option(
        [15, 10, 5],
        "neighbours sampled per node at hop 1,2,...; one hop per layer",
        parse=parse_fanouts,
        check=_check_fanouts,
    )
    batch_size: int = option(1024, "global seeds per step", check=POSITIVE_INT)
    hidden: int = option(256, "hidden width", check=POSITIVE_INT)
    lr: float = option(0.003, "Adam learning rate", check=POSITIVE)
    weight_decay: float = option(0.0, "Adam weight decay on all parameters", check=NON_NEGATIVE)
    dropout: float = option(0.5, "dropout before hidden layers", check=PROBABILITY)
    input_dropout: float | None = option(
        None, "dropout of the input features (default --dropout)", check=OPTIONAL_PROBABILITY
    )
    epochs: int = option(20, "passes over the training nodes", check=POSITIVE_INT)
    eval_every: int = option(1, "evaluate every N epochs", check=POSITIVE_INT)
    metric: str = option("auto", METRIC_HELP, choices=METRIC_CHOICES)
    seed: int = option(0, "seed of weights, batches and sampling", check=SEED)
    precision: str = option(
        "32", PRECISION_HELP, check=check_precision, metavar="{32,bf16-mixed,auto}"
    )

    def model_config(self) -> TrainConfig:
        """The :class:`~fullgraph.training.config.TrainConfig` of the same GraphSAGE (mean)
        model: what the trainer builds (:meth:`~fullgraph.training.config.TrainConfig.
        build_model`) and what its model file holds, so that ``fullgraph predict`` and
        ``fullgraph export`` run it (its fanouts and batch size are kept in ``extra``)."""
        from fullgraph.training.config import TrainConfig

        return TrainConfig(
            model="sage",
            layers=len(self.fanouts),
            hidden=self.hidden,
            dropout=self.dropout,
            input_dropout=self.input_dropout,
            lr=self.lr,
            weight_decay=self.weight_decay,
            weight_decay_scope="all",
            epochs=self.epochs,
            seed=self.seed,
            eval_every=self.eval_every,
            metric=self.metric,
            precision=self.precision,
            extra={
                "trained_by": "fullgraph minibatch",
                "fanouts": list(self.fanouts),
                "batch_size": self.batch_size,
            },
        )


@dataclass
class ProgressOptions(Config):
    """How ``fullgraph minibatch`` reports an epoch while it runs (rank 0)."""

    progress_every: float = option(
        10.0,
        "seconds between progress lines within an epoch (batches done, loss so far, time "
        "left), rank 0; 0: none; none with --quiet",
        check=NON_NEGATIVE,
        metavar="S",
    )


@dataclass
class MinibatchData(Config):
    """What ``fullgraph minibatch`` trains on (every rank holds the whole graph)."""

    dataset: str = option(None, "dataset name, as `fullgraph data` knows it")
    root: str = option(None, "dataset root directory (<root>/<name>/raw)")
    split: int | None = option(None, SPLIT_HELP, check=OPTIONAL_SPLIT, metavar="K")

    def check(self) -> None:
        """Both given and not empty."""
        for name in ("dataset", "root"):
            value = getattr(self, name)
            if value is None:
                raise ConfigError(f"--{name} is required")
            check_path(f"--{name}", value)
