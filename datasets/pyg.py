"""Converters between :class:`Graph` and ``torch_geometric.data.Data``.

PyG's ``edge_index`` row 0 holds sources and row 1 destinations, so the incoming-edge CSR maps
to ``edge_index = [indices, repeat(rows, in_degree)]``. Masks, labels and features keep their
names; ``num_classes`` travels as an attribute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fullgraph.datasets.edges import csr_to_edges, edges_to_csr_with_values
from fullgraph.datasets.graph import Graph
from fullgraph.errors import DataError

if TYPE_CHECKING:
    import torch
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
        data: needs ``y`` and its edges as ``edge_index`` or as ``adj_t`` (what
            ``T.ToSparseTensor()`` leaves: see :func:`_edges`); ``x`` and the three masks are
            optional (missing masks become all-false).
        name: name of the graph.
        symmetric: add reverse edges.
        remove_self_loops: drop ``v -> v`` edges. Duplicates are always merged.

    ``edge_weight`` [E] and ``edge_attr`` [E, F] (a 1-D ``edge_attr`` is one column) are carried
    along with their edges when present (see
    :func:`~fullgraph.datasets.edges.edges_to_csr_with_values` for the rules).

    Returns:
        The validated graph.

    Raises:
        DataError: missing ``y`` or edges, inconsistent sizes, or an ``adj_t`` whose values are
            not edge weights.
    """
    if getattr(data, "y", None) is None:
        raise DataError(f"{name}: the PyG data has no labels (y)")
    n = data.num_nodes
    if n is None:
        raise DataError(f"{name}: the PyG data has no node count (no x, num_nodes or edges)")
    n = int(n)
    src, dst, values = _edges(data, n, name)
    indptr, indices, values = edges_to_csr_with_values(
        src, dst, n, values, symmetric=symmetric, remove_self_loops=remove_self_loops, what=name
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


def _sparse_entries(adj: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """``(row, col, value)`` tensors of a torch_sparse ``SparseTensor`` or a torch sparse tensor
    (COO, CSR, CSC; ``value`` ``None`` when it has none), or ``None`` for anything else."""
    import torch

    if callable(getattr(adj, "coo", None)) and callable(getattr(adj, "sparse_sizes", None)):
        row, col, value = adj.coo()  # torch_sparse.SparseTensor (not imported here)
        return row, col, value
    if isinstance(adj, torch.Tensor) and adj.layout != torch.strided:
        coo = adj.to_sparse_coo().coalesce()
        row, col = coo.indices()
        return row, col, coo.values()
    return None


def _edges(data: Data, n: int, name: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(src, dst, values)`` of ``data``'s edges, from ``edge_index`` when it has one.

    Else from ``adj_t``, the transposed adjacency of ``T.ToSparseTensor()`` (a torch_sparse
    ``SparseTensor`` or a torch sparse tensor, [n, n]; row = target, col = source): the same
    edges. Its values are the edge weights that ``ToSparseTensor`` moved there: ``edge_weight``
    when they are one number per edge, not all 1 (no values, or all 1, is the unweighted graph:
    PyG's layers treat it so). Values of several columns, and edge values kept beside ``adj_t``
    (their order is not tied to its entries), are refused.
    """
    values: dict[str, np.ndarray] = {}
    ei = getattr(data, "edge_index", None)
    if ei is not None:
        ei = ei.detach().cpu().numpy().astype(np.int64)
        for key in ("edge_weight", "edge_attr"):
            v = getattr(data, key, None)
            if v is not None:
                v = v.detach().cpu().numpy().astype(np.float32)
                values[key] = v.reshape(v.shape[0], -1) if key == "edge_attr" else v.reshape(-1)
        return ei[0], ei[1], values
    adj = getattr(data, "adj_t", None)
    if adj is None:
        raise DataError(f"{name}: the PyG data has no edges (neither edge_index nor adj_t)")
    entries = _sparse_entries(adj)
    if entries is None:
        raise DataError(
            f"{name}: adj_t must be a torch_sparse SparseTensor or a torch sparse tensor, got "
            f"{type(adj).__name__}"
        )
    shape = tuple(int(s) for s in (adj.sparse_sizes() if hasattr(adj, "coo") else adj.shape[:2]))
    if shape != (n, n):
        raise DataError(f"{name}: adj_t is {shape[0]} x {shape[1]} but the graph has {n} nodes")
    beside = [k for k in ("edge_weight", "edge_attr") if getattr(data, k, None) is not None]
    if beside:
        raise DataError(
            f"{name}: data.{beside[0]} beside adj_t without edge_index: its order is not tied "
            f"to adj_t's entries; keep edge_index (T.ToSparseTensor(remove_edge_index=False))"
        )
    row, col, value = entries
    if value is not None:
        value = value.detach().cpu()
        if value.dim() > 1 and value[0].numel() != 1:
            raise DataError(
                f"{name}: adj_t holds {tuple(value.shape[1:])} values per edge; only one "
                f"number per edge (an edge weight) is taken from adj_t: give edge features as "
                f"edge_attr with edge_index"
            )
        value = value.numpy().astype(np.float32).reshape(-1)
        if not (value == 1).all():
            values["edge_weight"] = value
    dst = row.detach().cpu().numpy().astype(np.int64)
    src = col.detach().cpu().numpy().astype(np.int64)
    return src, dst, values
