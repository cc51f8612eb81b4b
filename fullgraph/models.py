"""GCN and GraphSAGE over a rank's part of the graph, exact against one process.

Every layer aggregates with :class:`~fullgraph.halo.HaloAggregate` (halo exchange overlapped
with the inner aggregation). A layer transforms before it aggregates when that narrows the rows
exchanged (``out <= in``), else after; both orders give the same result up to rounding.

- ``gcn`` (PyG ``GCNConv``): ``Y = Â (H W) + b`` with ``Â = D^-1/2 (A + I) D^-1/2``, glorot
  weights, zero bias.
- ``sage`` (PyG ``SAGEConv``, mean): ``Y = mean_{j in N(i)} H_j W_l + b_l + H_i W_r``.

Sparse input features (bag of words) are kept in CSR form when the first layer transforms
first: dropout and the product then touch only the stored entries.

Dropout precedes every layer (``input_dropout`` before the first, ``dropout`` before the others)
with masks from :func:`fullgraph.dropout.hashed_dropout`. When the first layer has no dropout
its aggregation of the static features can be computed once (``Â X`` or ``mean(X)``): exact, and
it removes the widest exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.dropout import ReluDropout, dropout_csr_values, hashed_dropout
from fullgraph.errors import ConfigError
from fullgraph.halo import HaloAggregate, HaloPlan, SplitOperator
from fullgraph.kernels import CSRMatrix, spmm

MODELS = ("gcn", "sage")


@dataclass
class GraphContext:
    """Per-rank data every forward pass needs.

    Attributes:
        op: the split aggregation operator of the model.
        plan: the halo exchange plan.
        global_ids: global id of every inner node, int64 [num_inner] (dropout streams).
        seed: the run's seed (dropout streams).
        first_aggregate: precomputed aggregation of the input features, or ``None``.
        sparse_x: the input features as a CSR matrix when they are sparse (the first layer
            then drops and multiplies only the stored entries), or ``None``.
    """

    op: SplitOperator
    plan: HaloPlan
    global_ids: np.ndarray
    seed: int
    first_aggregate: torch.Tensor | None = None
    sparse_x: CSRMatrix | None = None

    def aggregate(self, h: torch.Tensor) -> torch.Tensor:
        """``A_inner @ h + A_halo @ halo(h)``, differentiable, exchange overlapped."""
        return HaloAggregate.apply(h, self.op, self.plan)


class GNN(nn.Module):
    """An ``num_layers``-layer GCN or GraphSAGE with ReLU between layers.

    Args:
        kind: ``gcn`` or ``sage``.
        in_dim: input feature width.
        hidden: hidden width.
        out_dim: number of classes.
        num_layers: layers (>= 1).
        dropout: drop probability before every layer but the first.
        input_dropout: drop probability before the first layer.

    Shapes:
        - input: [num_inner, in_dim] -> logits [num_inner, out_dim]
    """

    def __init__(
        self,
        kind: str,
        in_dim: int,
        hidden: int,
        out_dim: int,
        num_layers: int,
        dropout: float,
        input_dropout: float,
    ) -> None:
        super().__init__()
        if kind not in MODELS:
            raise ConfigError(f"unknown model {kind!r} (choose from {', '.join(MODELS)})")
        if num_layers < 1:
            raise ConfigError(f"--layers must be >= 1, got {num_layers}")
        for name, p in (("dropout", dropout), ("input dropout", input_dropout)):
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"{name} {p} outside [0, 1)")
        self.kind = kind
        self.dropout = dropout
        self.input_dropout = input_dropout
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.dims = dims
        self.lin = nn.ModuleList()
        self.root = nn.ModuleList()
        for d_in, d_out in zip(dims[:-1], dims[1:], strict=True):
            if kind == "gcn":
                lin = nn.Linear(d_in, d_out, bias=True)
                nn.init.xavier_uniform_(lin.weight)
                nn.init.zeros_(lin.bias)
                self.lin.append(lin)
            else:
                self.lin.append(nn.Linear(d_in, d_out, bias=True))
                self.root.append(nn.Linear(d_in, d_out, bias=False))

    @property
    def num_layers(self) -> int:
        """Number of layers."""
        return len(self.lin)

    def _layer(
        self,
        i: int,
        h: torch.Tensor | CSRMatrix,
        ctx: GraphContext,
        precomputed: torch.Tensor | None,
    ) -> torch.Tensor:
        lin = self.lin[i]
        if precomputed is not None:
            out = lin(precomputed)
        elif lin.out_features <= lin.in_features:
            out = ctx.aggregate(_times_weight(h, lin.weight)) + lin.bias
        else:
            out = lin(ctx.aggregate(h))
        if self.kind == "sage":
            out = out + _times_weight(h, self.root[i].weight)
        return out

    def forward(
        self, x: torch.Tensor, ctx: GraphContext, epoch: int = 0, training: bool = False
    ) -> torch.Tensor:
        """Logits of the inner nodes.

        Args:
            x: input features of the inner nodes.
            ctx: operators, exchange plan and dropout ids of this rank.
            epoch: the epoch (selects the dropout masks).
            training: apply dropout.

        Returns:
            float [num_inner, out_dim].
        """
        h: torch.Tensor | CSRMatrix = x
        for i in range(self.num_layers):
            p = self.input_dropout if i == 0 else self.dropout
            precomputed = ctx.first_aggregate if i == 0 else None
            if precomputed is not None and training and p > 0:
                raise ConfigError(
                    "the first aggregation is precomputed, so input dropout must be 0"
                )
            if i == 0 and precomputed is None and ctx.sparse_x is not None:
                h = _sparse_input(ctx, p if training else 0.0, epoch, x.shape[1])
            elif i == 0 and training and p > 0:
                h = hashed_dropout(h, ctx.global_ids, p, ctx.seed, epoch, i)
            h = self._layer(i, h, ctx, precomputed)
            if i < self.num_layers - 1:
                if training and self.dropout > 0:  # the next layer's dropout, fused
                    h = ReluDropout.apply(h, ctx.global_ids, self.dropout, ctx.seed, epoch, i + 1)
                else:
                    h = F.relu(h)
        return h


def _times_weight(h: torch.Tensor | CSRMatrix, weight: torch.Tensor) -> torch.Tensor:
    """``h @ weight.T`` for dense or CSR ``h``."""
    if isinstance(h, CSRMatrix):
        return spmm(h, weight.t())
    return F.linear(h, weight)


def _sparse_input(ctx: GraphContext, p: float, epoch: int, width: int) -> CSRMatrix:
    """The sparse input features after dropout (the dense masks at the stored entries)."""
    sx = ctx.sparse_x
    if p <= 0.0:
        return sx
    vals = dropout_csr_values(
        sx.indptr.numpy(),
        sx.indices.numpy(),
        sx.values.numpy(),
        ctx.global_ids,
        width,
        p,
        ctx.seed,
        epoch,
        0,
    )
    return sx.with_values(torch.from_numpy(vals))


def sparse_features(x: torch.Tensor) -> CSRMatrix:
    """``x`` as a CSR matrix (stored entries = non-zeros), for sparse bag-of-words inputs."""
    m = sp.csr_matrix(x.numpy())
    return CSRMatrix(
        torch.from_numpy(m.indptr.astype(np.int64)),
        torch.from_numpy(m.indices.astype(np.int64)),
        torch.from_numpy(m.data.astype(np.float32)),
        num_cols=x.shape[1],
    )


def precompute_first_aggregate(x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
    """``Â X`` (or the neighbour mean of ``X``) over this rank's rows, computed once.

    Exchanges the halo feature rows one time; afterwards the first layer needs no exchange.
    """
    with torch.no_grad():
        return ctx.aggregate(x)


def parameter_vector(model: nn.Module) -> torch.Tensor:
    """All parameters flattened into one float32 vector (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def load_parameter_vector(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy ``flat`` (from :func:`parameter_vector`) into the model's parameters."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n
