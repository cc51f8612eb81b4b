"""``verify`` of a receptive-field cut (:mod:`~fullgraph.partition.receptive_cut`).

Without the source graph: the kept nodes' whole-graph ids (``node_ids``) ascend with the cut's
global ids and hash to ``meta.json``'s ``cut.node_ids_sha256``; with blocks, every row's
position in its whole-graph block ascends within the block and lies below the block's size
there. With the source graph, the cut is made again (the whole graph's blocks cut again with the
recorded block size, seed and METIS library) and the parts are checked against the cut graph.
"""

from __future__ import annotations

import numpy as np

from fullgraph.datasets.graph import Graph
from fullgraph.errors import PartitionError
from fullgraph.partition.blocks import node_blocks
from fullgraph.partition.format import REWRITE
from fullgraph.partition.load import Partition
from fullgraph.partition.receptive_cut import CutSpec, cut_graph, ids_digest


def check_cut_parts(parts: list[Partition], meta: dict) -> None:
    """The cut's arrays of every part against each other and ``meta.json``.

    Raises:
        PartitionError: one line naming the part and what differs.
    """
    n = int(meta["num_nodes"])
    whole = np.full(n, -1, dtype=np.int64)
    for p in parts:
        if p.node_ids is None:
            raise PartitionError(f"part-{p.rank} has no node_ids but meta.json records a cut")
        local = np.asarray(p.node_ids)
        seen = whole[p.global_ids]
        if np.any((seen >= 0) & (seen != local)):
            raise PartitionError(f"part-{p.rank}: a node's node_ids differ from its owner's")
        whole[p.global_ids] = local
        if p.block_pos is not None and p.block_full is not None:
            for k in range(p.block_ids.size):
                pos = np.asarray(p.block_pos[p.block_ptr[k] : p.block_ptr[k + 1]])
                if pos.size and (
                    pos[0] < 0 or pos[-1] >= p.block_full[k] or np.any(np.diff(pos) <= 0)
                ):
                    raise PartitionError(
                        f"part-{p.rank}: block {int(p.block_ids[k])}'s block_pos do not ascend "
                        f"within [0, {int(p.block_full[k])}); {REWRITE}"
                    )
    if np.any(np.diff(whole) <= 0) or (n and whole[0] < 0):
        raise PartitionError(
            f"the parts' node_ids do not ascend with the global ids (the cut keeps the whole "
            f"graph's order); {REWRITE}"
        )
    if ids_digest(whole) != meta["cut"]["node_ids_sha256"]:
        raise PartitionError(
            f"the parts' node_ids differ from meta.json's cut.node_ids_sha256; {REWRITE}"
        )


def recut(meta: dict, graph: Graph) -> tuple[Graph, np.ndarray | None]:
    """The cut ``meta.json`` records, made again from the whole ``graph``: the cut graph and,
    with blocks, its block vector.

    Raises:
        PartitionError: the graph is not the one the cut was made of, or the cut differs.
    """
    cut = meta["cut"]
    if graph.num_nodes != cut["whole_num_nodes"] or graph.num_edges != cut["whole_num_edges"]:
        raise PartitionError(
            f"the partition is cut from a graph of {cut['whole_num_nodes']} nodes and "
            f"{cut['whole_num_edges']} edges; {graph.name} has {graph.num_nodes} and "
            f"{graph.num_edges}"
        )
    blocks = None
    if "num_blocks" in meta:
        library = meta["block_metis"]
        blocks = node_blocks(
            graph,
            int(meta["block_size"]),
            int(meta["block_seed"]),
            library if library in ("libmetis", "pymetis", "rcm") else "auto",
        )
    again = cut_graph(graph, CutSpec(int(cut["hops"]), tuple(cut["splits"])), blocks)
    if again.record["node_ids_sha256"] != cut["node_ids_sha256"]:
        raise PartitionError(
            f"the cut made again from {graph.name} ({again.record['num_nodes']} nodes) differs "
            f"from the stored one ({cut['num_nodes']} nodes); {REWRITE}"
        )
    return again.graph, None if again.blocks is None else again.blocks.block
