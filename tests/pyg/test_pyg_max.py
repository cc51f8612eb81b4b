"""``fullgraph.pyg`` with the maximum over neighbours and ``GraphConv``.

``GraphConv`` called with edge weights is refused in one line; PyG's ``GraphSAGE(aggr="max")``
and a ``GraphConv`` model (maximum, then mean) converted on one process and trained on 2 ranks
equal the original models on one process (dropout off) and the converted ones (dropout on).
The twins against PyG's layers, in float64: ``tests/models/test_aggr_kinds.py``.

Enters through :mod:`fullgraph.pyg.twins`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from harness import run_task

pyg_nn = pytest.importorskip("torch_geometric.nn")

import pyg_worker  # noqa: E402

from fullgraph import pyg  # noqa: E402
from fullgraph.datasets import Graph  # noqa: E402
from fullgraph.distributed import Communicator  # noqa: E402
from fullgraph.errors import ConfigError  # noqa: E402


def test_graphconv_edge_weights_are_refused_in_one_line(small_graph: Graph) -> None:
    data = pyg.load_part(small_graph, Communicator())
    conv = pyg.distribute(pyg_nn.GraphConv(data.num_features, 4), data)
    weight = torch.ones(data.edge_index.num_edges)
    with pytest.raises(ConfigError, match="GraphConvTwin: edge_weight is not supported") as info:
        conv(data.x, data.edge_index, weight)
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def max_references(small_graph: Graph) -> dict:
    """The ``max`` group's models, original and converted, on one process."""
    return pyg_worker.references(small_graph, "max")


def test_one_process_max_models_equal_the_original(max_references: dict) -> None:
    pyg_worker.compare(max_references["converted"], max_references["original"], "exact", "max")


@pytest.mark.timeout(300)
def test_max_models_on_two_ranks_equal_one_process(
    small_partitions: dict, max_references: dict, tmp_path: Path
) -> None:
    got = run_task(
        pyg_worker.converted,
        ranks=2,
        out=tmp_path / "out.npz",
        timeout=240,
        source=str(small_partitions[2]),
        group="max",
    )
    for key in (k for k in got if k.endswith("same_on_every_rank")):
        assert bool(got[key]), key
    pyg_worker.compare(got, max_references["original"], "exact", "max", "P=2")
    pyg_worker.compare(got, max_references["converted"], "dropout", "max", "P=2")
    assert np.abs(got["GraphSAGE-max/exact/grads"]).max() > 1e-4
