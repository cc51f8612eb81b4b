"""The layer registry (:mod:`fullgraph.models.layers`): what every kind declares for the other
wings (its options, its PyG export, its memory replay) is whole, and the one generic check of
the options gives the one-line refusals the command line pins, for a kind a user registers too.
"""

from __future__ import annotations

import pytest
import torch

from fullgraph.errors import ConfigError
from fullgraph.memory.model import REPLAYS
from fullgraph.models.layers import (
    LayerOptions,
    check_options,
    kinds_with,
    layer_class,
    layer_kinds,
    option_names,
)
from fullgraph.models.layers.base import LAYERS, GraphLayer, register_layer
from fullgraph.training.config import TrainConfig


@pytest.mark.parametrize("kind", layer_kinds())
def test_every_kind_declares_its_options_export_and_replay(kind: str) -> None:
    cls = layer_class(kind)
    assert set(cls.accepts) <= set(option_names()), kind
    assert cls.replay in REPLAYS, kind
    for variant in getattr(cls, "VARIANTS", {}).values():
        assert variant.replay in REPLAYS, variant
    if cls.pyg is None:  # no PyG export: the kind says why (its refusal's reason)
        assert cls.export_note, kind
        return
    layer = cls.build(6, 4, last=False, options=LayerOptions())
    for ours in cls.pyg.keys.values():  # every exported key names one of our parameters
        assert isinstance(layer.get_parameter(ours), torch.nn.Parameter), (kind, ours)
    params = {name for name, _ in layer.named_parameters()}
    assert params == set(cls.pyg.keys.values()), kind  # and every parameter is exported


@pytest.mark.parametrize(
    ("model", "option", "value", "line"),
    [
        ("sage", "edge_weight", True, "--edge-weight applies to --model gcn only, not --model sa"),
        ("gat", "improved", True, "--improved applies to --model gcn only, not --model gat"),
        ("gcn", "heads", 2, "--heads applies to --model gat only, not --model gcn"),
        ("gin", "output_heads", 2, "--output-heads applies to --model gat only, not --model gin"),
        ("graphconv", "attention_dropout", 0.1, "--attention-dropout applies to --model gat only"),
        ("gcn", "aggr", "max", "--aggr applies to --model sage and graphconv only, not --model g"),
    ],
)
def test_an_option_of_another_kind_is_refused_in_one_line(model, option, value, line) -> None:
    with pytest.raises(ConfigError, match=f"^{line}"):
        TrainConfig(model=model, **{option: value}).check()


def test_options_the_kind_takes_pass_and_its_own_check_applies() -> None:
    TrainConfig(model="gcn", edge_weight=True, improved=True).check()
    TrainConfig(model="gat", heads=2, output_heads=1, attention_dropout=0.1).check()
    TrainConfig(model="graphconv", aggr="max").check()
    with pytest.raises(ConfigError, match="^--aggr lstm: --model sage aggregates by mean, sum"):
        check_options("sage", {"aggr": "lstm"}, LayerOptions(aggr="lstm"))  # SAGE's variant()


def test_a_kind_a_user_registers_joins_the_lines_by_declaring_its_options() -> None:
    @register_layer
    class WeightedLayer(GraphLayer):
        kind = "weighted-test"
        accepts = ("edge_weight",)

    try:
        assert kinds_with(lambda c: "edge_weight" in c.accepts) == ["gcn", "weighted-test"]
        check_options("weighted-test", {"edge_weight": True}, LayerOptions(edge_weight=True))
        line = "--edge-weight applies to --model gcn and weighted-test only, not --model sage"
        with pytest.raises(ConfigError, match=f"^{line}$"):
            check_options("sage", {"edge_weight": True}, LayerOptions(edge_weight=True))
        with pytest.raises(ConfigError, match="--heads applies to --model gat only"):
            check_options("weighted-test", {"heads": 2}, LayerOptions(heads=2))
    finally:
        del LAYERS["weighted-test"]
