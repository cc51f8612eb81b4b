"""The GCN / GraphSAGE layer body as one autograd function that keeps the least memory.

``Y = A (h W^T) + b [+ h R^T]`` (transform first: the narrower exchange when ``out <= in``) or
``Y = (A h) W^T + b [+ h R^T]`` (aggregate first), with ``A`` the rank's split operator and its
halo exchange (:mod:`fullgraph.distributed.halo`), ``R`` the optional root weight (SAGE).

What it holds, for ``n`` inner rows (the memory model of ``fullgraph plan`` counts these,
:mod:`fullgraph.memory.model`):

- saved for the backward pass: transform first, the input ``h`` (the previous layer's output,
  alive anyway, or nothing when ``h`` is a constant the caller can ``rebuild``); aggregate
  first, the aggregation ``M = A h`` ``[n, in]`` (nothing new when it was precomputed) and
  ``h`` only for the root weight's gradient (again nothing when it can be rebuilt). Never a
  halo row, never the pre-activation: the output is a new tensor the caller may overwrite.
- forward temporaries: ``Z = h W^T`` ``[n, out]`` while it is aggregated, the output, and the
  exchange's buffers (one or two slices in flight).
- backward: the input gradient ``[n, in]`` (when ``h`` needs one) and, transforming first, row
  blocks of ``A^T dY`` (at most :data:`BLOCK_ELEMENTS`), never the whole ``[n, out]`` matrix:
  each block's rows go straight into ``dW`` and ``dh``, and so do the rows other ranks return
  for this rank's boundary rows, slice by slice as they land.

Under ``--precision bf16-mixed`` (the plan's ``row_dtype`` is bfloat16) the forward products
read ``h``, ``W``, ``R`` and ``M`` in bfloat16 (``Z`` and the kept ``M`` are bfloat16), the
aggregation sums bfloat16 rows exactly (:func:`~fullgraph.distributed.halo.aggregate_rows`) and
the output is float32. Where the block tree is in force (below) the backward reads bfloat16
too (:attr:`~fullgraph.precision.Precision.backward_dtype`): ``dY``, ``W``, ``R`` and the kept
input in the per-block ``dY_b^T x_b`` and in ``dY W``, ``A^T dY`` summed in float64 in its fixed
order; every row and every block gives the same bits at any rank count, so rounding them
cannot set P ranks apart. Without the tree the backward is float32: its sums (``A^T dY`` with
the halo partial sums, ``dY^T h``) are split differently by P ranks, and rounding them to
bfloat16 would make P ranks differ from one process (docs/train.md, "Precision").

Inside a training step whose block tree is in force (the part has fixed node blocks:
:mod:`fullgraph.distributed.tree_sum`), the gradients of a leaf ``W``, ``b`` and ``R`` are
pushed into the tree as per-block partials ``dY_b^T x_b`` (and ``dY_b``'s row sums) instead of
being returned, and ``A^T`` is the ordered
:func:`~fullgraph.distributed.halo.aggregate_transpose`: the same bits at any rank count.
Transforming first, that backward holds ``A^T dY`` ``[n, out]`` whole (a block's rows must be
complete sums before its product).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fullgraph.distributed.halo import (
    HaloPlan,
    SplitOperator,
    accumulate_dtype,
    aggregate_rows,
    aggregate_transpose,
    exchange_halo_gradients,
)
from fullgraph.distributed.tree_sum import BlockGradients, active_gradients, row_sum
from fullgraph.kernels import CSRMatrix, spmm
from fullgraph.kernels.block_product import block_product

#: Elements of one row block of ``A_inner^T dY`` in the backward pass (8 MB of float32).
BLOCK_ELEMENTS = 1 << 21


@dataclass
class _Spec:
    """The non-tensor inputs of one :class:`GraphLinearFunction` call."""

    op: SplitOperator
    plan: HaloPlan
    transform_first: bool
    precomputed: torch.Tensor | None
    rebuild: Callable[[], torch.Tensor] | None
    sparse_input: CSRMatrix | None = None


def row_ranges(num_rows: int, width: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive row blocks of at most :data:`BLOCK_ELEMENTS` elements
    of ``width`` columns, covering ``0..num_rows``."""
    step = max(1, BLOCK_ELEMENTS // max(width, 1))
    return [(s, min(s + step, num_rows)) for s in range(0, num_rows, step)]


def _times(h: torch.Tensor | CSRMatrix, weight: torch.Tensor) -> torch.Tensor:
    """``h @ weight.T`` for dense or CSR ``h``."""
    if isinstance(h, CSRMatrix):
        return spmm(h, weight.t())
    return torch.mm(h, weight.t())


def _add_times(y: torch.Tensor, h: torch.Tensor | CSRMatrix, weight: torch.Tensor) -> None:
    """``y += h @ weight.T`` in place."""
    if isinstance(h, CSRMatrix):
        y.add_(spmm(h, weight.t()))
    else:
        y.addmm_(h, weight.t())


def _weight_grad(dy: torch.Tensor, h: torch.Tensor | CSRMatrix) -> torch.Tensor:
    """``dy^T h`` (the gradient of a weight applied as ``h W^T``)."""
    if isinstance(h, CSRMatrix):
        return spmm(h.t(), dy).t().contiguous()
    return torch.mm(dy.t(), h)


class GraphLinearFunction(torch.autograd.Function):
    """``A (h W^T) + b + h R^T`` or ``(A h) W^T + b + h R^T`` (see the module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        h: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        root: torch.Tensor | None,
        spec: _Spec,
    ) -> torch.Tensor:
        """The layer's output, a new float tensor [num_inner, out]."""
        src: torch.Tensor | CSRMatrix = spec.sparse_input if spec.sparse_input is not None else h
        plan, op = spec.plan, spec.op
        mixed = plan.row_dtype is not None
        w = plan.rows_in(weight)  # bf16-mixed: the products read bfloat16
        src_in = src if isinstance(src, CSRMatrix) else plan.rows_in(src)
        key = None
        if spec.transform_first:
            key = None if plan.comm.size == 1 else plan.next_key()
            z = _times(src_in, w)
            y = aggregate_rows(z, op, plan, key)
            del z
            if bias is not None:
                y.add_(bias)
            m = None
        else:
            m = spec.precomputed
            if m is None:
                key = None if plan.comm.size == 1 else plan.next_key()
                # kept for dW: in bfloat16 under bf16-mixed (rounded in the kernel)
                m = aggregate_rows(src_in, op, plan, key, rows_dtype=True)
            if mixed:
                y = torch.mm(plan.rows_in(m), w.t()).float()
                if bias is not None:
                    y.add_(bias)
            else:
                y = torch.mm(m, weight.t()) if bias is None else torch.addmm(bias, m, weight.t())
        if root is not None:
            if mixed:
                y.add_(_times(src_in, plan.rows_in(root)))
            else:
                _add_times(y, src, root)
        src_in_kept = src_in
        del src_in
        ctx.spec, ctx.key = spec, key
        tree = active_gradients()
        n = int(y.shape[0])
        to_tree = tree is not None and any(tree.handles(p, n) for p in (weight, bias, root))
        ctx.tree = tree if to_tree else None
        ctx.params = (weight, bias, root) if to_tree else None
        ctx.has_bias, ctx.has_root = bias is not None, root is not None
        needs_h = spec.transform_first or root is not None
        keep_h = needs_h and (spec.rebuild is None or ctx.needs_input_grad[0])
        if spec.sparse_input is not None:
            keep_h = False  # a static CSR matrix, kept by the context
        saved = [weight, root if root is not None else weight]
        # the block tree's bf16 backward reads the input as the forward product did
        kept_in = src_in_kept if to_tree and mixed and keep_h else h
        saved.append(kept_in if keep_h else weight)
        saved.append(m if m is not None else weight)
        ctx.keep_h, ctx.keep_m = keep_h, m is not None
        ctx.save_for_backward(*saved)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        """Gradients of ``h``, ``W``, ``b``, ``R``: row blocks, nothing ``[n, out]`` extra."""
        spec: _Spec = ctx.spec
        weight, root, h, m = ctx.saved_tensors
        root = root if ctx.has_root else None
        need_h, need_w, need_b, need_r = ctx.needs_input_grad[:4]
        dy = dy.contiguous()
        src: torch.Tensor | CSRMatrix | None
        if spec.sparse_input is not None:
            src = spec.sparse_input
        elif ctx.keep_h:
            src = h
        elif (spec.transform_first and need_w) or (root is not None and need_r):
            src = spec.rebuild() if spec.rebuild is not None else None
        else:
            src = None
        if ctx.tree is not None:
            return _tree_backward(ctx, dy, weight, root, m, src)
        db = dy.sum(0) if ctx.has_bias and need_b else None
        dr = _weight_grad(dy, src) if root is not None and need_r else None
        if spec.transform_first:
            dh, dw = _transform_first_backward(ctx, dy, weight, root, src, need_h, need_w)
        else:
            dw = torch.mm(dy.t(), m.to(dy.dtype)) if need_w else None  # bf16-mixed: M is bf16
            dh = None
            if need_h:
                dm = torch.mm(dy, weight)
                dh = _aggregate_backward(dm, spec.op, spec.plan, ctx.key)
                del dm
                if root is not None:
                    dh.addmm_(dy, root)
        return dh, dw, db, dr, None


def _dense(rows: torch.Tensor | sp.csr_matrix) -> torch.Tensor:
    """A block's rows as a dense float32 matrix (a sparse input's rows densified)."""
    if isinstance(rows, sp.csr_matrix):
        return torch.from_numpy(rows.toarray().astype(np.float32, copy=False))
    return rows.float()


def _block_product(dy_b: torch.Tensor, x_b: torch.Tensor | sp.csr_matrix) -> torch.Tensor:
    """One block's ``dY_b^T x_b``: float32, or a bfloat16 product of bfloat16 rows (its
    float32 accumulation rounded to bfloat16 by the kernel), widened to float32 for the tree."""
    if dy_b.dtype == torch.bfloat16 and isinstance(x_b, torch.Tensor):
        return torch.mm(dy_b.t(), x_b.to(torch.bfloat16)).float()
    return block_product(dy_b.float(), _dense(x_b))  # narrow outputs: thread-count invariant


def _push_or_sum(
    tree: BlockGradients,
    param: torch.Tensor | None,
    dy: torch.Tensor,
    x: torch.Tensor | CSRMatrix | None,
    in_order: Callable[[Any], Any],
) -> torch.Tensor | None:
    """``dY^T x`` (``x`` ``None``: the bias, ``dY``'s row sum) as per-block partials pushed
    into ``tree`` when ``param`` goes through it (then ``None``), else the whole product in
    today's order (returned to autograd). ``in_order`` gives a tensor's rows in block order
    (gathered once per tensor and call where the part's rows are not block-contiguous)."""
    n = int(dy.shape[0])
    if not tree.handles(param, n):
        if x is None:
            return dy.sum(0)
        if isinstance(x, CSRMatrix):
            return _weight_grad(dy.float(), x)
        return torch.mm(dy.float().t(), x.float())
    assert param is not None
    if x is None:
        tree.add(param, row_sum, in_order(dy), ordered=True)
    else:
        rows = in_order(x.to_scipy() if isinstance(x, CSRMatrix) else x)
        tree.add(param, _block_product, in_order(dy), rows, ordered=True)
    return None


def _block_order(tree: BlockGradients) -> Callable[[Any], Any]:
    """``tree.layout.in_block_order``, each tensor's result kept (one gather per tensor)."""
    kept: dict[int, tuple[Any, Any]] = {}

    def in_order(t: Any) -> Any:
        if id(t) not in kept:
            kept[id(t)] = (t, tree.layout.in_block_order(t))  # t held: its id stays its own
        return kept[id(t)][1]

    return in_order


def _tree_backward(
    ctx: Any,
    dy: torch.Tensor,
    weight: torch.Tensor,
    root: torch.Tensor | None,
    m: torch.Tensor,
    src: torch.Tensor | CSRMatrix | None,
) -> tuple:
    """The backward pass whose weight, bias and root gradients go into the step's block tree
    (:mod:`fullgraph.distributed.tree_sum`): ``dY^T x`` block by block, the input gradient as
    :meth:`GraphLinearFunction.backward` computes it.

    ``A^T`` is :func:`~fullgraph.distributed.halo.aggregate_transpose` (every row summed in
    ascending global id of its sources). Transforming first, ``A^T dY`` is formed whole
    (``[n, out]``) before any block product reads it: a block's rows must be complete sums.
    """
    spec: _Spec = ctx.spec
    tree: BlockGradients = ctx.tree
    w_param, b_param, r_param = ctx.params
    need_h, need_w, need_b, need_r = ctx.needs_input_grad[:4]
    order = _block_order(tree)
    db = _push_or_sum(tree, b_param, dy, None, order) if ctx.has_bias and need_b else None
    # bf16-mixed: the backward's products and A^T read bfloat16 (every row's and every
    # block's the same bits at any rank count); the bias's row sums stay float32
    low = spec.plan.precision.backward_dtype
    g_y = dy if low is None else dy.to(low)
    w = weight if low is None else weight.to(low)
    r = None if root is None else (root if low is None else root.to(low))
    dr = _push_or_sum(tree, r_param, g_y, src, order) if root is not None and need_r else None
    dh = dw = None
    # Memory: each [n, width] temporary goes as soon as the next is formed (``order`` keeps
    # the rows it gathered, ``G`` among them); ``dh`` is formed in the backward's dtype and
    # ``dY R`` added into it in place (bf16-mixed: autograd widens it to float32 after this
    # returns, when the temporaries are gone: the next layer rounds it to bf16 again).
    if spec.transform_first:
        g = aggregate_transpose(g_y, spec.op, spec.plan, ctx.key) if need_w or need_h else None
        if need_w:
            dw = _push_or_sum(tree, w_param, g, src, order)
        del order
        if need_h and not isinstance(src, CSRMatrix):
            dh = torch.mm(g, w)
            del g
            if r is not None:
                dh.addmm_(g_y, r)
        return dh, dw, db, dr, None
    if need_w:
        dw = _push_or_sum(tree, w_param, g_y, m, order)  # bf16-mixed: M bf16
    del order
    if need_h:
        dm = torch.mm(g_y, w)
        dh = aggregate_transpose(dm, spec.op, spec.plan, ctx.key)
        del dm
        if r is not None and dh.dtype == torch.bfloat16:
            dh.addmm_(g_y, r)
        elif r is not None:
            dh = dh.add_(torch.mm(g_y, r).float())
    return dh, dw, db, dr, None


def _aggregate_backward(
    grad: torch.Tensor, op: SplitOperator, plan: HaloPlan, key: tuple[int, int] | None
) -> torch.Tensor:
    """``A^T grad`` with the reverse exchange: this rank's rows of the input gradient."""
    out: list[torch.Tensor] = []

    def inner() -> None:
        out.append(spmm(op.inner_t, grad, accumulate_dtype(grad.dtype)))

    def receive(rows: torch.Tensor, index: torch.Tensor) -> None:
        out[0].index_add_(0, index, rows)

    exchange_halo_gradients(grad.contiguous(), op, plan, key, inner, receive)
    return out[0]


def _transform_first_backward(
    ctx: Any,
    dy: torch.Tensor,
    weight: torch.Tensor,
    root: torch.Tensor | None,
    src: torch.Tensor | CSRMatrix | None,
    need_h: bool,
    need_w: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``dh = (A^T dY) W [+ dY R]`` and ``dW = (A^T dY)^T h``, ``A^T dY`` a block at a time."""
    spec: _Spec = ctx.spec
    op, plan = spec.op, spec.plan
    n, width_in = int(dy.shape[0]), int(weight.shape[1])
    if isinstance(src, CSRMatrix):  # sparse input: no input gradient, dW through h^T
        g = _aggregate_backward(dy, op, plan, ctx.key) if need_w else None
        return None, (None if g is None else _weight_grad(g, src))
    dh = None
    if need_h:
        dh = torch.mm(dy, root) if root is not None else dy.new_empty((n, width_in))
    dw = torch.zeros_like(weight) if need_w else None
    inner_t = op.inner_t

    def inner() -> None:
        for start, stop in row_ranges(n, int(dy.shape[1])):
            block = spmm(inner_t.row_block(start, stop), dy)  # rows of A_inner^T dY
            if dw is not None:
                dw.addmm_(block.t(), src[start:stop])
            if dh is not None:
                if root is None:
                    torch.mm(block, weight, out=dh[start:stop])
                else:
                    dh[start:stop].addmm_(block, weight)

    def receive(rows: torch.Tensor, index: torch.Tensor) -> None:
        # in row blocks: the gathered input rows and their product stay block-sized
        for start, stop in row_ranges(int(rows.shape[0]), max(width_in, int(rows.shape[1]))):
            part, at = rows[start:stop], index[start:stop]
            if dw is not None:
                dw.addmm_(part.t(), src.index_select(0, at))
            if dh is not None:
                dh.index_add_(0, at, torch.mm(part, weight))

    exchange_halo_gradients(dy, op, plan, ctx.key, inner, receive)
    return dh, dw


def graph_linear(
    h: torch.Tensor | CSRMatrix,
    op: SplitOperator,
    plan: HaloPlan,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    root: torch.Tensor | None = None,
    *,
    precomputed: torch.Tensor | None = None,
    rebuild: Callable[[], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``A h W^T + b [+ h R^T]``, transforming first when that narrows the exchange.

    Both orders give the same result up to rounding; the narrower one (``out <= in``)
    exchanges fewer bytes. ``precomputed`` (``A h`` computed once) skips the aggregation.

    Args:
        h: this rank's input rows, float [num_inner, in] (or a CSR matrix: sparse features).
        op: the split aggregation operator.
        plan: the halo exchange plan.
        weight: ``W`` [out, in].
        bias: ``b`` [out] or ``None``.
        root: ``R`` [out, in] (the root term ``h R^T``) or ``None``.
        precomputed: ``A h`` computed once, or ``None``.
        rebuild: recomputes ``h`` (a constant: no gradient) in the backward pass, so that it
            is not kept in between; ``None`` keeps it.

    Returns:
        float [num_inner, out], a new tensor.
    """
    transform_first = precomputed is None and weight.shape[0] <= weight.shape[1]
    sparse = h if isinstance(h, CSRMatrix) else None
    dense = torch.empty(0) if sparse is not None else h
    if sparse is not None and not transform_first and precomputed is None:
        raise ValueError("graph_linear: sparse input needs out <= in (transform first)")
    spec = _Spec(op, plan, transform_first, precomputed, rebuild, sparse)
    return GraphLinearFunction.apply(dense, weight, bias, root, spec)
