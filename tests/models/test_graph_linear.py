"""The GCN / SAGE layer body (:mod:`fullgraph.models.graph_linear`) on one process, tiny shapes.

Both orders, product then aggregate (``A (h W^T)``, when ``out <= in``) and aggregate then
product (``(A h) W^T``), and the precomputed aggregation give the layer ``A h W^T + b + h R^T``
and its four gradients against a dense float64 reference written here; the order follows the
widths. Under bf16-mixed the forward products read bfloat16 and the aggregation sums them
exactly (the output float32); the backward pass stays the float32 one. Inside a step's block
tree the parameter gradients go into the tree as per-block partials (contiguous and permuted
block rows, dense and sparse input) whose root is float64 autograd's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import build_sbm_graph

from fullgraph.distributed import Communicator
from fullgraph.distributed.halo import HaloPlan
from fullgraph.distributed.tree_sum import BlockGradients, BlockLayout, collecting
from fullgraph.kernels import CSRMatrix
from fullgraph.models import graph_linear as gl
from fullgraph.models.gnn import sparse_features
from fullgraph.partition import whole_graph_part
from fullgraph.precision import Precision, bf16_unsupported
from fullgraph.training.assembly import build_operator

IN = 6
#: out -> the order graph_linear picks: out <= in transforms first
WIDTHS = {"transform-first": 3, "same-width": IN, "aggregate-first": 8}
needs_bf16 = pytest.mark.skipif(bf16_unsupported("cpu") is not None, reason="no CPU bfloat16")


@pytest.fixture(scope="module")
def layer():
    """A 40-node graph's GCN operator on one process, its dense ``A`` and its plan."""
    part = whole_graph_part(build_sbm_graph(num_nodes=40, num_features=IN, num_isolated=2))
    op = build_operator(part, "gcn")
    dense = op.inner.to_torch_sparse().to_dense().double()
    return op, dense, HaloPlan.from_partition(part, Communicator())


def _inputs(out: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"h": (40, IN), "weight": (out, IN), "bias": (out,), "root": (out, IN)}
    return {k: torch.randn(s, generator=g).requires_grad_(True) for k, s in shapes.items()}


def _grads(y: torch.Tensor, t: dict[str, torch.Tensor], dy: torch.Tensor) -> dict:
    return dict(zip(t, torch.autograd.grad(y, list(t.values()), dy), strict=True))


def _exact_rows(a: CSRMatrix, x: torch.Tensor) -> torch.Tensor:
    """``A @ x`` of bfloat16 ``x`` as bf16-mixed sums it: float32 products ``w * x`` added in
    float64 (exact here) and rounded once to float32."""
    products = (a.values[:, None] * x.float().index_select(0, a.indices.long())).double()
    out = torch.zeros((a.num_rows, x.shape[1]), dtype=torch.float64)
    return out.index_add_(0, a.row_of_entry(), products).float()


@pytest.mark.parametrize("order", sorted(WIDTHS))
@pytest.mark.parametrize("precomputed", [False, True], ids=["aggregated", "precomputed"])
def test_each_order_is_the_layer_and_its_gradients(layer, order: str, precomputed: bool) -> None:
    """``y = (A h) W^T + b + h R^T`` and the gradients of ``h``, ``W``, ``b`` and ``R`` against
    float64 autograd (``precomputed``: ``A h`` given, the same layer)."""
    op, dense, plan = layer
    t = _inputs(WIDTHS[order])
    given = (dense @ t["h"].detach().double()).float() if precomputed else None
    y = gl.graph_linear(t["h"], op, plan, t["weight"], t["bias"], t["root"], precomputed=given)
    assert y.dtype == torch.float32 and y.shape == (40, WIDTHS[order])
    ref = {k: v.detach().double().requires_grad_(True) for k, v in t.items()}
    want = dense @ ref["h"] @ ref["weight"].T + ref["bias"] + ref["h"] @ ref["root"].T
    torch.testing.assert_close(y.double(), want.detach(), rtol=1e-5, atol=1e-5)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    got, expected = _grads(y, t, dy), _grads(want, ref, dy.double())
    for name in t:
        torch.testing.assert_close(got[name].double(), expected[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", sorted(WIDTHS))
def test_the_order_follows_the_widths(layer, order: str, monkeypatch) -> None:
    """``out <= in``: the product ``h W^T`` [n, out] is aggregated, else ``h`` [n, in] is; a
    precomputed ``A h`` is not aggregated again."""
    op, _, plan = layer
    out = WIDTHS[order]
    t = _inputs(out)
    aggregated: list[tuple[str, int]] = []
    aggregate = gl.aggregate_rows

    def recorded(rows: torch.Tensor, *args, **kwargs):
        aggregated.append(("h" if rows is t["h"] else "h W^T", int(rows.shape[1])))
        return aggregate(rows, *args, **kwargs)

    monkeypatch.setattr(gl, "aggregate_rows", recorded)
    gl.graph_linear(t["h"], op, plan, t["weight"], t["bias"])
    assert aggregated == [("h W^T", out) if out <= IN else ("h", IN)]
    aggregated.clear()
    gl.graph_linear(t["h"], op, plan, t["weight"], t["bias"], precomputed=torch.zeros(40, IN))
    assert aggregated == []


@needs_bf16
@pytest.mark.parametrize("order", ["transform-first", "aggregate-first"])
def test_bf16_reads_bfloat16_and_keeps_the_float32_backward(layer, order: str) -> None:
    """Forward: the products of the bfloat16 operands, aggregated exactly and rounded once
    (:func:`_exact_rows`), bit for bit, and not float32's result; backward: the input gradient
    of the float32 layer, bit for bit (its sums are never rounded to bfloat16), and the weight
    gradient float32's too, except that aggregating first it reads the kept bfloat16 ``A h``."""
    op, _, plan = layer
    mixed = plan.with_precision(Precision("bf16-mixed"))
    assert mixed.row_dtype is torch.bfloat16
    t = _inputs(WIDTHS[order])
    h, w, b = t["h"], t["weight"], t["bias"]
    y = gl.graph_linear(h, op, mixed, w, b)
    y32 = gl.graph_linear(h, op, plan, w, b)
    assert y.dtype == torch.float32
    h16, w16 = h.detach().bfloat16(), w.detach().bfloat16()
    if order == "transform-first":
        want = _exact_rows(op.inner, torch.mm(h16, w16.T)) + b.detach()
    else:
        m = _exact_rows(op.inner, h16).bfloat16()  # kept in bfloat16 for dW
        want = torch.mm(m, w16.T).float() + b.detach()
    assert torch.equal(y.detach(), want)
    assert not torch.equal(y.detach(), y32.detach())
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    dh, dw = torch.autograd.grad(y, [h, w], dy)
    dh32, dw32 = torch.autograd.grad(y32, [h, w], dy)
    assert dh.dtype == dw.dtype == torch.float32 and torch.equal(dh, dh32)
    if order == "transform-first":
        assert torch.equal(dw, dw32)  # (A^T dY)^T h: float32 throughout
    else:
        assert torch.equal(dw, torch.mm(dy.t(), m.float()))  # dY^T M of the kept bfloat16 M


def test_sparse_input_needs_the_product_first(layer) -> None:
    op, _, plan = layer
    x = CSRMatrix(torch.tensor([0] * 41), torch.tensor([], dtype=torch.int64), None, IN)
    with pytest.raises(ValueError, match="sparse input needs out <= in"):
        gl.graph_linear(x, op, plan, torch.zeros(8, IN), None)


#: rows of each block of the 40-node graph, for the block-tree checks
BLOCK_SIZES = np.array([3, 5, 2, 6, 4, 7, 3, 10])


def _layout(permuted: bool) -> BlockLayout:
    """The 40 rows in :data:`BLOCK_SIZES` blocks: consecutive rows, or a fixed permutation
    (as a whole graph whose rows are not block-contiguous gives)."""
    rows = np.random.default_rng(5).permutation(40) if permuted else np.arange(40)
    ptr = np.concatenate([[0], np.cumsum(BLOCK_SIZES)])
    for k in range(len(BLOCK_SIZES)):  # ascending within a block, as the partition gives
        rows[ptr[k] : ptr[k + 1]] = np.sort(rows[ptr[k] : ptr[k + 1]])
    return BlockLayout(len(BLOCK_SIZES), np.arange(len(BLOCK_SIZES)), rows, ptr)


@pytest.mark.parametrize("order", sorted(WIDTHS))
@pytest.mark.parametrize("permuted", [False, True], ids=["contiguous", "permuted"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_the_block_tree_takes_the_parameter_gradients(
    layer, order: str, permuted: bool, sparse: bool
) -> None:
    """Inside a step's block tree the weight, bias and root gradients are per-block partials
    (none reaches ``.grad``), whose root is float64 autograd's to float32 rounding; the input
    gradient is the one of the layer without a tree."""
    if sparse and order != "transform-first":
        pytest.skip("sparse input transforms first")
    op, dense, plan = layer
    t = _inputs(WIDTHS[order])
    names = ("weight", "bias", "root")
    params = [torch.nn.Parameter(t[k].detach().clone()) for k in names]
    layout = _layout(permuted)
    tree = BlockGradients(layout)
    h = sparse_features(t["h"].detach()) if sparse else t["h"]
    with collecting(tree):
        y = gl.graph_linear(h, op, plan, *params)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    y.backward(dy)
    assert all(p.grad is None for p in params)
    root = Communicator().tree_sum_(tree.nodes(params), layout.labels, layout.num_blocks)
    ref = {k: v.detach().double().requires_grad_(True) for k, v in t.items()}
    want = dense @ ref["h"] @ ref["weight"].T + ref["bias"] + ref["h"] @ ref["root"].T
    want.backward(dy.double())
    expected = torch.cat([ref[k].grad.reshape(-1) for k in names])
    torch.testing.assert_close(root.double(), expected, rtol=1e-5, atol=1e-5)
    if not sparse:
        plain = t["h"].detach().clone().requires_grad_(True)
        gl.graph_linear(plain, op, plan, *(p.detach() for p in params)).backward(dy)
        torch.testing.assert_close(t["h"].grad, plain.grad, rtol=1e-6, atol=1e-6)
