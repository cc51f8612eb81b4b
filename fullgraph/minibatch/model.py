"""GraphSAGE (mean) of :class:`fullgraph.models.GNN` run on sampled blocks and layer-wise.

The parameters and the layer are those of the full-batch model (``model.layers[i].lin`` for the
neighbour mean, ``model.layers[i].root`` for the node itself, PyG ``SAGEConv`` semantics), with
the same counter-based dropout (:func:`fullgraph.models.dropout.hashed_dropout`, keyed by global
node id).
Only the rows differ: a layer maps the source rows of a bipartite operator (columns) to its
destination rows, whose local ids are the first ``num_dst`` source ids. So the same function
serves

- training on sampled blocks (:func:`block_forward`), and
- evaluation by layer-wise full-graph inference (:func:`layerwise_inference`): every layer over
  all nodes with the full mean adjacency, each rank computing a contiguous range of rows and
  all-gathering them before the next layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.distributed.communicator import Communicator
from fullgraph.kernels import CSRMatrix, spmm
from fullgraph.minibatch.sampler import Block
from fullgraph.models.dropout import hashed_dropout
from fullgraph.models.gnn import GNN


def sage_layer(
    lin: nn.Linear, root: nn.Linear, a: CSRMatrix, h_src: torch.Tensor, h_dst: torch.Tensor
) -> torch.Tensor:
    """``mean_{j in N(i)} h_j W_l + b_l + h_i W_r`` for the rows of ``a``.

    The cheaper order is chosen: transform the source rows then aggregate, or aggregate then
    transform the destination rows (same result up to rounding).

    Args:
        lin: the neighbour transform (with bias).
        root: the self transform (no bias).
        a: mean-normalised operator, rows = destination nodes, columns = source nodes.
        h_src: source features [a.num_cols, d_in].
        h_dst: destination features [a.num_rows, d_in].

    Returns:
        [a.num_rows, d_out].
    """
    d_in, d_out = lin.in_features, lin.out_features
    transform_first = a.num_cols * d_in * d_out + a.nnz * d_out
    aggregate_first = a.nnz * d_in + a.num_rows * d_in * d_out
    if transform_first < aggregate_first:
        out = spmm(a, F.linear(h_src, lin.weight)) + lin.bias
    else:
        out = lin(spmm(a, h_src))
    return out + root(h_dst)


def block_operator(block: Block) -> CSRMatrix:
    """The mean-normalised operator of a sampled block (rows dst, columns src)."""
    counts = np.diff(block.indptr)
    values = np.repeat((1.0 / np.maximum(counts, 1)).astype(np.float32), counts)
    index_dtype = np.int32 if block.num_src < 2**31 else np.int64
    return CSRMatrix(
        torch.from_numpy(block.indptr),
        torch.from_numpy(block.indices.astype(index_dtype)),
        torch.from_numpy(values),
        num_cols=block.num_src,
    )


def _check_sage(model: GNN) -> None:
    if model.kind != "sage":
        raise ValueError(f"mini-batch training needs a sage model, got {model.kind!r}")


def block_forward(
    model: GNN,
    blocks: Sequence[Block],
    x_src: torch.Tensor,
    nodes: np.ndarray,
    *,
    seed: int = 0,
    stream: int = 0,
    training: bool = False,
) -> torch.Tensor:
    """Logits of the seed nodes of one sampled batch.

    Args:
        model: a ``sage`` :class:`GNN` with ``len(blocks)`` layers.
        blocks: the batch's blocks in layer order (outermost hop first).
        x_src: input features of ``nodes[:blocks[0].num_src]``.
        nodes: global ids of the batch's nodes (dropout masks are keyed by them).
        seed: the run's seed (dropout streams).
        stream: the dropout stream of this batch (e.g. ``epoch * 2**20 + batch``).
        training: apply dropout.

    Returns:
        float [blocks[-1].num_dst, num_classes].
    """
    _check_sage(model)
    if len(blocks) != model.num_layers:
        raise ValueError(f"{len(blocks)} blocks for a {model.num_layers}-layer model")
    h = x_src
    for i, (block, layer) in enumerate(zip(blocks, model.layers, strict=True)):
        p = model.input_dropout if i == 0 else model.dropout
        if training and p > 0:
            h = hashed_dropout(h, nodes[: block.num_src], p, seed, stream, i)
        h = sage_layer(layer.lin, layer.root, block_operator(block), h, h[: block.num_dst])
        if i < model.num_layers - 1:
            h = F.relu(h)
    return h


def row_range(num_nodes: int, rank: int, size: int) -> tuple[int, int]:
    """The contiguous rows ``[lo, hi)`` rank ``rank`` computes in layer-wise inference."""
    bounds = np.linspace(0, num_nodes, size + 1).round().astype(np.int64)
    return int(bounds[rank]), int(bounds[rank + 1])


def rows_operator(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int) -> CSRMatrix:
    """Mean-normalised operator of the rows ``[lo, hi)`` of a whole graph (all columns)."""
    ptr = np.asarray(indptr[lo : hi + 1], dtype=np.int64)
    idx = np.asarray(indices[ptr[0] : ptr[-1]], dtype=np.int64)
    num_cols = int(indptr.shape[0] - 1)
    index_dtype = torch.int32 if num_cols < 2**31 else torch.int64
    return CSRMatrix(
        torch.from_numpy(ptr - ptr[0]), torch.from_numpy(idx).to(index_dtype), num_cols=num_cols
    ).mean_normalized()


def _allgather_rows(comm: Communicator, mine: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Every rank's rows stacked in rank order (an all-to-all sending ``mine`` to everyone)."""
    if comm.size == 1:
        return mine
    send = mine.contiguous().repeat(comm.size, 1)
    return comm.alltoallv_start(send, [mine.shape[0]] * comm.size, counts, tag="eval").wait()


@torch.no_grad()
def layerwise_inference(
    model: GNN, a_rows: CSRMatrix, x: torch.Tensor, comm: Communicator
) -> torch.Tensor:
    """Logits of this rank's rows from full-graph, layer-by-layer inference (no dropout).

    Args:
        model: a ``sage`` :class:`GNN`.
        a_rows: :func:`rows_operator` of this rank's :func:`row_range`.
        x: input features of all nodes [N, F].
        comm: the communicator (every rank must call this together).

    Returns:
        float [hi - lo, num_classes] for this rank's rows.
    """
    _check_sage(model)
    n = x.shape[0]
    lo, hi = row_range(n, comm.rank, comm.size)
    counts = [b - a for a, b in (row_range(n, r, comm.size) for r in range(comm.size))]
    h = x
    for i, layer in enumerate(model.layers):
        out = sage_layer(layer.lin, layer.root, a_rows, h, h[lo:hi])
        if i == model.num_layers - 1:
            return out
        h = _allgather_rows(comm, F.relu(out), counts)
    raise AssertionError("unreachable: a GNN has at least one layer")
