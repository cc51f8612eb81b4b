"""Layers that read edge values, converted by ``fullgraph.pyg``, on P = 1, 2, 4 ranks.

``pyg_worker``'s ``edges`` group (``GCNConv(improved=True)`` and ``GCNConv`` called with
``data.edge_weight``; two ``GINEConv(edge_dim=3, train_eps=True)``; two ``GATConv(edge_dim=3)``
with attention dropout) trains three SGD steps on the parts of a graph with edge weights and
features, over mpi and gloo: with dropout off its gradients, losses, parameters and accuracy
equal the ORIGINAL PyG model's on the whole graph; with dropout on, the converted model's on one
process.

Enters through :mod:`fullgraph.pyg.edge_twins`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from harness import run_task

pytest.importorskip("torch_geometric.nn")

import pyg_worker

from fullgraph import pyg
from fullgraph.datasets import to_pyg
from fullgraph.distributed import Communicator
from fullgraph.partition import partition_graph


@pytest.fixture(scope="module")
def edge_graph():
    return pyg_worker.edge_graph()


@pytest.fixture(scope="module")
def references(edge_graph) -> dict:
    with torch.random.fork_rng():
        original = pyg_worker.run_original(to_pyg(edge_graph), "edges")
        converted = pyg_worker.run_converted(pyg.load_part(edge_graph, Communicator()), "edges")
    return {"original": original, "converted": converted}


@pytest.fixture(scope="module")
def edge_partitions(edge_graph, tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("edge-partitions")
    paths = {}
    for P in (2, 4):
        paths[P] = root / f"p{P}"
        partition_graph(edge_graph, P, paths[P], method="metis", seed=0)
    return paths


def test_one_process_equals_the_original(references: dict) -> None:
    pyg_worker.compare(references["converted"], references["original"], "exact", "edges")


@pytest.mark.parametrize(
    ("ranks", "transports"),
    [(1, "mpi"), (2, "mpi,gloo"), pytest.param(4, "mpi,gloo", marks=pytest.mark.slow)],
)
def test_ranks_equal_one_process(
    ranks: int, transports: str, edge_partitions: dict, references: dict, tmp_path: Path
) -> None:
    source = "graph" if ranks == 1 else str(edge_partitions[ranks])
    got = run_task(
        pyg_worker.edges,
        ranks=ranks,
        out=tmp_path / "out.npz",
        timeout=300,
        source=source,
        transports=transports.split(","),
    )
    for transport in transports.split(","):
        mine = {k.split("/", 1)[1]: v for k, v in got.items() if k.startswith(f"{transport}/")}
        for key in (k for k in mine if k.endswith("same_on_every_rank")):
            assert bool(mine[key]), f"{transport}: {key}"
        where = f"P={ranks}, {transport}"
        pyg_worker.compare(mine, references["original"], "exact", "edges", where)
        pyg_worker.compare(mine, references["converted"], "dropout", "edges", where)
