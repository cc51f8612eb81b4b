"""What a model may do on a receptive-field cut (:mod:`fullgraph.partition.receptive_cut`).

A partition cut to the ``L``-hop receptive field of its labelled nodes trains and evaluates
exactly what the whole graph would for a model that reads at most ``L`` hops. Refused, each in
one line naming the fix: a model reading more hops than the cut kept; BatchNorm (its statistics
are over every node, the cut changes them); Correct & Smooth (it propagates over the whole graph
for many steps); link prediction (a pair may end at any node).
"""

from __future__ import annotations

from fullgraph.errors import ConfigError
from fullgraph.models.layers.appnp import APPNPLayer, propagation_steps
from fullgraph.models.layers.mlp import MLPLayer
from fullgraph.training.config import TrainConfig

#: The fix every refusal names.
WHOLE = "partition without --cut-hops"


def receptive_depth(config: TrainConfig) -> int:
    """How many hops of in-edges a node's output reads under ``config``: the layers of a
    message-passing model, SGC's and SIGN's precomputed hops, APPNP's propagation steps, 0 for
    an MLP."""
    kind = config.layer_kind()
    options = config.layer_options()
    if kind.hop_input is not None:
        return int(kind.hop_options(options)[1])
    if issubclass(kind, APPNPLayer):
        return int(propagation_steps(options)[0])
    if issubclass(kind, MLPLayer):
        return 0
    return int(config.layers)


def check_cut_training(meta: dict, config: TrainConfig, where: str) -> None:
    """Refuse a run the cut recorded in ``meta`` (a partition's ``meta.json``) would change.

    Args:
        meta: the partition's metadata (nothing is checked without ``cut``).
        config: the run's configuration.
        where: the partition, as messages name it.

    Raises:
        ConfigError: one line naming the fix.
    """
    cut = meta.get("cut")
    if cut is None:
        return
    hops = int(cut["hops"])
    of = f"{where} is cut to the {hops}-hop receptive field of {'/'.join(cut['splits'])}"
    if config.task == "link":
        raise ConfigError(f"--task link: {of}, and a pair may end at any node; {WHOLE}")
    depth = receptive_depth(config)
    if depth > hops:
        raise ConfigError(
            f"--model {config.model} reads {depth} hops but {of}: use at most {hops} "
            f"(--layers / --hops), or partition again with --cut-hops {depth}"
        )
    if config.norm == "batch":
        raise ConfigError(
            f"--norm batch: {of}; BatchNorm's statistics are over every node, which the cut "
            f"changes: use --norm layer, or {WHOLE}"
        )
    if config.correct_smooth:
        raise ConfigError(
            f"--correct-smooth: {of}; Correct & Smooth propagates over the whole graph: {WHOLE}"
        )
