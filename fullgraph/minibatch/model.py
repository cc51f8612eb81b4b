"""GraphSAGE (mean) of :class:`fullgraph.models.GNN` run on sampled blocks and layer-wise.

The parameters and the layer are those of the full-batch model (``model.layers[i].lin`` for the
neighbour mean, ``model.layers[i].root`` for the node itself, PyG ``SAGEConv`` semantics), with
the same counter-based dropout (:func:`fullgraph.models.dropout.hashed_dropout`, keyed by global
node id).
A layer maps the source rows of a bipartite operator (columns) to its destination rows, whose
local ids are the first ``num_dst`` source ids: :func:`block_forward` runs it on the sampled
blocks of training. Evaluation (:func:`fullgraph.minibatch.inference.layerwise_inference`) runs
the same layer parameters over every node with the full adjacency, in row blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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
