"""This rank's part of a graph as PyG ``Data``: :func:`load_part` (a node task's ``Data``, or
a link split's three; :mod:`~fullgraph.pyg.part_data`, :mod:`~fullgraph.pyg.link_data`)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from fullgraph.datasets import Graph
from fullgraph.datasets.pyg_input import graph_of
from fullgraph.distributed import Communicator
from fullgraph.errors import ConfigError
from fullgraph.partition import Partition, PartitionDir, load_partition
from fullgraph.pyg.link_data import (
    agreed_pairs,
    is_link_splits,
    link_graph,
    link_splits,
    part_link_splits,
    split_pairs,
)
from fullgraph.pyg.pair_index import owners_of
from fullgraph.pyg.part_data import PartGraph
from fullgraph.pyg.process import alike, communicator
from fullgraph.pyg.sources import part_of_graph
from fullgraph.training.assembly import part_tensors
from fullgraph.watchdog import phase

if TYPE_CHECKING:
    from torch_geometric.data import Data


def load_part(
    source: str | os.PathLike[str] | Graph | Data | tuple[Data, Data, Data],
    comm: Communicator | None = None,
    *,
    seed: int = 0,
    method: str = "metis",
    threads: int | None = None,
    quiet: bool = True,
    timeout: float = 300.0,
    transport: str = "auto",
) -> Data:
    """This rank's part of a graph as a PyG ``Data`` object (a collective: every rank calls it).

    Args:
        source: a partition directory (``fullgraph partition``; one part per rank, read from
            disk: the way for large graphs), or a whole graph held by every rank, as a
            :class:`~fullgraph.datasets.Graph` or a PyG ``Data`` with ``edge_index`` and ``y``
            (one rank: the whole graph; several: partitioned here with ``method``), or the
            ``(train_data, val_data, test_data)`` of ``T.RandomLinkSplit`` (link prediction:
            the training graph partitioned, each split's pairs those whose first node the
            rank owns; :mod:`~fullgraph.pyg.link_data`).
        comm: the communicator; by default the launcher's (``mpirun``, ``srun``, ``torchrun``,
            or none: one process), created here and closed at exit.
        seed: seed of the dropout streams (:func:`fullgraph.pyg.dropout`).
        method: partitioning method when ``source`` is a whole graph and there are several
            ranks (``metis``, ``random``, ``contiguous``).
        threads: compute threads of this rank when the communicator is created here (default
            with several ranks: the node's cores divided by its ranks).
        quiet: with several ranks, ranks other than 0 send their standard output to
            ``os.devnull`` (the script's prints appear once; errors still reach stderr).
        timeout: seconds the set-up, the loading and any collective may wait for the other
            ranks when the communicator is created here (a rank that fails before it calls
            ``load_part`` ends the others within it, with a line naming the rank).

    Returns:
        ``Data(x, y, train_mask, val_mask, test_mask, num_nodes, num_classes, edge_index,
        fullgraph)`` of this rank's inner nodes; ``edge_index`` and ``fullgraph`` are the
        rank's :class:`PartGraph`; ``edge_weight`` [num_edges] and ``edge_attr``
        [num_edges, edge_dim] (float32) when the graph has them: the values of the part's
        edges (every edge into an inner node), in the part's edge order. For a link split, a
        tuple of three such ``Data`` (one part), each with the split's ``edge_label_index``
        (a :class:`~fullgraph.pyg.pair_index.PairIndex` of this rank's pairs) and
        ``edge_label`` (their labels).

    Raises:
        ConfigError: the rank count differs from the directory's part count, or the ranks were
            given different graphs.
        PartitionError: a missing or corrupted part (from the loader).
        DataError: a graph without features or training nodes.
    """
    from torch_geometric.data import Data

    comm = comm if comm is not None else communicator(threads, timeout, transport)
    link = is_link_splits(source)
    with phase("part loading"):
        if isinstance(source, (str, os.PathLike)):
            part = alike(comm, lambda: _load_dir(source, comm))
        else:
            make = link_graph if link else lambda s: graph_of(s, "load_part")
            graph = alike(comm, lambda: make(source))
            part = part_of_graph(graph, comm, method)
    if quiet and comm.rank > 0:
        sys.stdout = open(os.devnull, "w")  # for the rest of the process
    t = part_tensors(part)
    pg = PartGraph(part, comm, seed)
    data = Data(
        x=t["x"],
        y=t["y"],
        train_mask=t["train"],
        val_mask=t["val"],
        test_mask=t["test"],
        num_nodes=int(part.num_inner),
        num_classes=int(part.num_classes),
    )
    for name in ("edge_weight", "edge_attr"):  # aligned with the part's edges
        if (values := pg.edge_values(name)) is not None:
            data[name] = values
    data.edge_index = pg
    data.adj_t = pg.adj_t  # model(data.x, data.adj_t), as after T.ToSparseTensor()
    data.fullgraph = pg
    if getattr(part, "link", None) is not None:  # a link partition's directory
        pg.num_nodes_global = int(part.meta["link"]["num_nodes"])
        owners_of(pg)
        return alike(comm, lambda: part_link_splits(pg, data))
    if link:
        pg.num_nodes_global = int(graph.num_nodes)
        owners_of(pg)  # a collective: before the local work of the splits
        pairs = alike(comm, lambda: split_pairs(source, pg.num_nodes_global))
        pairs = agreed_pairs(comm, pairs)
        return alike(comm, lambda: link_splits(source, pairs, data, pg))
    return data


def _load_dir(source: str | os.PathLike[str], comm: Communicator) -> Partition:
    """This rank's part of the partition directory ``source`` (one part per rank); a file
    (a saved graph) gets its own advice."""
    path = os.fspath(source)
    if not os.path.exists(path):
        raise ConfigError(
            f"load_part: {path!r} does not exist; give a partition directory (`fullgraph "
            f"partition`, pyg.partition) or the whole graph itself (a PyG Data)"
        )
    if os.path.isfile(path) and not path.endswith("meta.json"):
        raise ConfigError(
            f"load_part: {path} is a file, not a partition directory; a torch.save'd PyG Data: "
            f"load_part(torch.load({path!r}, weights_only=False)), or partition it once: "
            f"`fullgraph partition --pyg {path} --parts P --out DIR`, then load_part(DIR)"
        )
    opened = PartitionDir.open(source)
    opened.check_ranks(comm.size, "start one rank per part")
    return load_partition(opened, comm.rank)
