"""The full-batch model: layers of one kind over a rank's part, exact against one process.

Every layer (:mod:`fullgraph.models.layers`) aggregates with
:class:`~fullgraph.distributed.halo.HaloAggregate` (halo exchange overlapped with the inner
aggregation), transforming before it aggregates when that narrows the rows exchanged.

Sparse input features (bag of words) are kept in CSR form when the first layer transforms
first: dropout and the product then touch only the stored entries.

Dropout precedes every layer (``input_dropout`` before the first, ``dropout`` before the others)
with masks from :func:`fullgraph.models.dropout.hashed_dropout`. When the first layer has no
dropout its aggregation of the static features can be computed once (``Â X`` or ``mean(X)``):
exact, and it removes the widest exchange. SGC's and SIGN's first layer always reads such a
precomputation, the hops of the features (:attr:`~fullgraph.models.layers.GraphLayer.hop_input`),
and their input dropout drops the hops' values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.config import check_number, check_probability
from fullgraph.errors import ConfigError
from fullgraph.kernels import CSRMatrix
from fullgraph.models.batch_norm_relu import batch_norm_relu_dropout
from fullgraph.models.context import GraphContext
from fullgraph.models.dropout import ReluDropout, dropout_csr_values, hashed_dropout
from fullgraph.models.layers import layer_class
from fullgraph.models.layers.base import LayerOptions
from fullgraph.models.mixed_linear import mixed_linear
from fullgraph.models.norm import make_norm


class GNN(nn.Module):
    """A stack of ``num_layers`` layers of one kind, ReLU between them, optional normalisation
    and residual connections.

    Between layers: ``h = relu(norm(layer(drop(h)) + res(drop(h))))`` where ``norm`` is the
    ``--norm`` of :mod:`fullgraph.models.norm` and ``res`` the identity when the widths match,
    else a linear projection without bias (``--residual``).

    Args:
        kind: a registered layer kind (``gcn``, ``sage``, ...; :mod:`fullgraph.models.layers`).
        in_dim: input feature width.
        hidden: hidden width (per head for kinds with heads).
        out_dim: number of classes.
        num_layers: layers (>= 1).
        dropout: drop probability before every layer but the first.
        input_dropout: drop probability before the first layer.
        options: per-kind layer options (heads, attention dropout).
        norm: ``none``, ``batch`` or ``layer`` after every layer but the last.
        residual: add every layer's input to its output (projected when the widths differ).

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
        *,
        options: LayerOptions | None = None,
        norm: str = "none",
        residual: bool = False,
    ) -> None:
        super().__init__()
        layer = layer_class(kind)
        check_number("--layers", num_layers, low=1, integer=True)
        check_probability("--dropout", dropout)
        check_probability("--input-dropout", input_dropout)
        options = options or LayerOptions()
        self.kind = kind
        self.dropout = dropout
        self.input_dropout = input_dropout
        self.norm_kind = norm
        self.layers = nn.ModuleList()
        self.norms = nn.ModuleList()
        self.residuals = nn.ModuleList()
        width_in = in_dim
        for i in range(num_layers):
            last = i == num_layers - 1
            build = layer.build_first if i == 0 else layer.build  # SIGN's inception first
            lay = build(width_in, out_dim if last else hidden, last=last, options=options)
            self.layers.append(lay)
            if residual:
                same = width_in == lay.out_dim
                self.residuals.append(
                    nn.Identity() if same else nn.Linear(width_in, lay.out_dim, bias=False)
                )
            if not last:
                n = make_norm(norm, lay.out_dim)
                self.norms.append(n if n is not None else nn.Identity())
            width_in = lay.out_dim
        self.dims = [in_dim] + [lay.out_dim for lay in self.layers]

    @property
    def num_layers(self) -> int:
        """Number of layers."""
        return len(self.layers)

    def forward(
        self,
        x: torch.Tensor,
        ctx: GraphContext,
        epoch: int = 0,
        training: bool = False,
        on_layer: Callable[[int, torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """Logits of the inner nodes.

        Args:
            x: input features of the inner nodes.
            ctx: operators, exchange plan and dropout ids of this rank.
            epoch: the epoch (selects the dropout masks).
            training: apply dropout (and normalise with the batch's statistics).
            on_layer: called as ``on_layer(k, h)`` once layer ``k`` (1-based) is done, with
                ``h`` what the next layer receives (after the residual, norm and ReLU, and in
                training the next layer's dropout), the logits for ``k = num_layers``. A
                callee copies what it keeps: ``h``'s buffer may be reused once the call
                returns (``fullgraph predict`` writes the rows out at once).

        Returns:
            float [num_inner, out_dim].
        """
        h: torch.Tensor | CSRMatrix = x
        for i, layer in enumerate(self.layers):
            p = self.input_dropout if i == 0 else self.dropout
            precomputed = ctx.first_aggregate if i == 0 else None
            if precomputed is not None and training and p > 0:
                if layer.hop_input is None:
                    raise ConfigError(
                        "the first aggregation is precomputed, so input dropout must be 0"
                    )
                # SGC's and SIGN's hops: the input dropout drops the hops' values
                precomputed = hashed_dropout(precomputed, ctx.stream_ids, p, ctx.seed, epoch, 0)
            rebuild = None
            if i == 0 and precomputed is None and ctx.sparse_x is not None:
                h = _sparse_input(ctx, p if training else 0.0, epoch, x.shape[1])
            elif i == 0 and training and p > 0 and (layer.hop_input is None or len(self.residuals)):
                h = hashed_dropout(h, ctx.stream_ids, p, ctx.seed, epoch, i)
                if not x.requires_grad:  # a constant: the layer may recompute it
                    rebuild = functools.partial(
                        hashed_dropout, x, ctx.stream_ids, p, ctx.seed, epoch, i
                    )
            out = layer(
                h, ctx, precomputed, epoch=epoch, training=training, index=i, rebuild=rebuild
            )
            if len(self.residuals):
                res = self.residuals[i]
                if isinstance(res, nn.Linear):  # bf16-mixed: a bf16 product (Precision)
                    out = out + mixed_linear(h, res.weight, ctx.plan.row_dtype)
                else:
                    out = out + h
            if i < self.num_layers - 1:
                if self.norm_kind == "batch":  # with ReLU and the next dropout, fused
                    h = batch_norm_relu_dropout(
                        self.norms[i],
                        out,
                        ctx.plan.comm,
                        global_ids=ctx.stream_ids,
                        p=self.dropout if training else 0.0,
                        seed=ctx.seed,
                        epoch=epoch,
                        layer=i + 1,
                        training=training,
                        inplace_grad=self.layers[i + 1].fresh_input_grad and not self.residuals,
                    )
                    del out  # not alive while the next layer computes
                    if on_layer is not None:
                        on_layer(i + 1, h)
                    continue
                if self.norm_kind != "none":
                    out = self.norms[i](out, ctx.plan.comm)
                # In place when only the next layer uses ``out`` and ``h`` (no norm, no
                # residual): no activation-sized buffer for ReLU-dropout in either pass.
                alone = self.norm_kind == "none" and not len(self.residuals)
                alone = alone and self.layers[i + 1].fresh_input_grad
                if training and self.dropout > 0:  # the next layer's dropout, fused
                    h = ReluDropout.apply(
                        out, ctx.stream_ids, self.dropout, ctx.seed, epoch, i + 1, alone
                    )
                else:
                    h = torch.relu_(out) if alone else F.relu(out)
            else:
                h = out
            del out  # not alive while the next layer computes
            if on_layer is not None:
                on_layer(i + 1, h)
        return h


def _sparse_input(ctx: GraphContext, p: float, epoch: int, width: int) -> CSRMatrix:
    """The sparse input features after dropout (the dense masks at the stored entries)."""
    sx = ctx.sparse_x
    if p <= 0.0:
        return sx
    vals = dropout_csr_values(
        sx.indptr.numpy(),
        sx.indices.numpy(),
        sx.values.numpy(),
        ctx.stream_ids,
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
