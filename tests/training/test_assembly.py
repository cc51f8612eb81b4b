"""Weighted GCN's ``D^-1/2`` needs every node's degree (self-loop + weighted in-degree) above
0: edge weights that leave one at or below 0 are refused in one line before any step (they
would zero the node's row, and PyG's ``gcn_norm`` gives NaN); negative weights that keep the
degrees positive are data."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from mp_utils import one_thread

from fullgraph.datasets.synthetic import with_edge_values
from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import ConfigError
from fullgraph.partition import whole_graph_part
from fullgraph.training import RunOptions, TrainConfig, Trainer

CFG = TrainConfig(model="gcn", epochs=2, edge_weight=True)


def _trainer(graph, config: TrainConfig = CFG) -> Trainer:
    with one_thread():
        return Trainer(whole_graph_part(graph), Communicator(), config, RunOptions(quiet=True))


@pytest.fixture(scope="module")
def weighted(small_graph):
    return with_edge_values(small_graph, seed=3)


@pytest.mark.parametrize("improved", [False, True])
def test_all_negative_weights_are_refused(weighted, improved: bool) -> None:
    graph = replace(weighted, edge_weight=-np.abs(weighted.edge_weight) * 3)
    with pytest.raises(ConfigError) as info:
        _trainer(graph, replace(CFG, improved=improved))
    message = str(info.value)
    fill = "2" if improved else "1"
    assert f"(self-loop {fill} + weighted in-degree) <= 0" in message, message
    assert f"{graph.edge_weight.size} of its {graph.edge_weight.size} stored edge" in message


def test_one_node_whose_weights_cancel_its_self_loop_is_refused(weighted) -> None:
    w = weighted.edge_weight.copy()
    node = 5
    w[weighted.indptr[node] : weighted.indptr[node + 1]] = -1.0  # incoming edges of node 5
    with pytest.raises(ConfigError, match=f"1 of .* nodes have a degree .* \\(node {node}: "):
        _trainer(replace(weighted, edge_weight=w))


def test_negative_weights_that_keep_degrees_positive_train(weighted) -> None:
    w = weighted.edge_weight.copy()
    w[::7] *= -0.1  # some negative, every degree still above 0
    loss = _trainer(replace(weighted, edge_weight=w)).train_step(1).loss
    assert np.isfinite(loss)
