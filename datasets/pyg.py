"""Converters between :class:`Graph` and ``torch_geometric.data.Data``.

PyG's ``edge_index`` row 0 holds sources and row 1 destinations, so the incoming-edge CSR maps
to ``edge_index = [indices, repeat(rows, in_degree)]``. Masks, labels and features keep their
names; ``num_classes`` travels as an attribute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fullgraph.datasets.edges import csr_to_edges, edges_to_csr_with_values
from fullgraph.datasets.graph import Graph
from fullgraph.errors import DataError

if TYPE_CHECKING:
    from torch_geometric.data import Data


def to_pyg(graph: Graph) -> Data:
    """A ``torch_geometric.data.Data`` holding the same graph (tensors share no memory).

    Args:
        graph: the graph.

    Returns:
        ``Data(x, edge_index, y, train_mask, val_mask, test_mask, num_nodes, num_classes)``;
        ``x`` is ``None`` when the graph has no features; ``edge_weight`` and ``edge_attr``
        are added when the graph has them (aligned with ``edge_index``).
    """
    import torch
    from torch_geometric.data import Data

    src, dst = csr_to_edges(graph.indptr, graph.indices)
    edge_index = torch.from_numpy(np.stack([src, dst]))
    edge_values = {
        k: torch.from_numpy(np.array(v))
        for k in ("edge_weight", "edge_attr")
        if (v := getattr(graph, k)) is not None
    }
    return Data(
        **edge_values,
        x=None if graph.x is None else torch.from_numpy(np.array(graph.x)),
        edge_index=edge_index,
        y=torch.from_numpy(np.array(graph.y)),
        train_mask=torch.from_numpy(np.array(graph.train_mask)),
        val_mask=torch.from_numpy(np.array(graph.val_mask)),
        test_mask=torch.from_numpy(np.array(graph.test_mask)),
        num_nodes=graph.num_nodes,
        num_classes=graph.num_classes,
    )


def from_pyg(
    data: Data, name: str, *, symmetric: bool = False, remove_self_loops: bool = False
) -> Graph:
    """A :class:`Graph` from a PyG ``Data`` object (edges kept as given unless asked).

    Args:
        data: needs ``edge_index`` and ``y``; ``x`` and the three masks are optional (missing
            masks become all-false).
        name: name of the graph.
        symmetric: add reverse edges.
        remove_self_loops: drop ``v -> v`` edges. Duplicates are always merged.

    ``edge_weight`` [E] and ``edge_attr`` [E, F] (a 1-D ``edge_attr`` is one column) are carried
    along with their edges when present (see
    :func:`~fullgraph.datasets.edges.edges_to_csr_with_values` for the rules).

    Returns:
        The validated graph.

    Raises:
        DataError: missing ``y`` or inconsistent sizes.
    """
    if getattr(data, "y", None) is None:
        raise DataError(f"{name}: the PyG data has no labels (y)")
    n = int(data.num_nodes)
    ei = data.edge_index.detach().cpu().numpy().astype(np.int64)
    values = {}
    for key in ("edge_weight", "edge_attr"):
        v = getattr(data, key, None)
        if v is not None:
            v = v.detach().cpu().numpy().astype(np.float32)
            values[key] = v.reshape(v.shape[0], -1) if key == "edge_attr" else v.reshape(-1)
    indptr, indices, values = edges_to_csr_with_values(
        ei[0], ei[1], n, values, symmetric=symmetric, remove_self_loops=remove_self_loops, what=name
    )
    y = data.y.detach().cpu().numpy().astype(np.int64).reshape(-1)
    x = None if data.x is None else data.x.detach().cpu().numpy().astype(np.float32)
    masks = {}
    for key in ("train_mask", "val_mask", "test_mask"):
        m = getattr(data, key, None)
        masks[key] = (
            np.zeros(n, dtype=np.bool_) if m is None else m.detach().cpu().numpy().astype(bool)
        )
    num_classes = getattr(data, "num_classes", None)
    if not isinstance(num_classes, int):
        num_classes = int(y.max()) + 1 if (y >= 0).any() else 0
    graph = Graph(
        name=name,
        num_nodes=n,
        indptr=indptr,
        indices=indices,
        x=x,
        y=y,
        num_classes=num_classes,
        meta={"format": "pyg", "missing": [] if x is not None else ["features"]},
        **masks,
        **values,
    )
    return graph.validate()
