"""The reductions over node rows made exact over the ranks, and those refused.

:data:`RULES` maps a torch function or method to its rule, called by
:meth:`NodeRows.__torch_function__ <fullgraph.pyg.node_rows.NodeRows.__torch_function__>`
with the :class:`~fullgraph.pyg.node_rows.Call`. A reduction over the node axis (no dim, or
dims holding 0) is taken over every rank: this rank's partial result, summed (or maximised) in
one fixed-order all-reduce of the part's communicator, is the global value on every rank; a
result that needs a gradient is :class:`GlobalValue` (value global, gradient through this
rank's share, which the converted model's gradient all-reduce then adds up). A reduction over
other dims keeps the node rows. Reductions that cannot be made exact are refused in one line.

The value of a loss and of a ``sum`` / ``mean`` over every element or over dim 0 of float32
(float16, bfloat16) rows is the exact sum rounded once (:func:`exact_sum`): the same bits at
any rank count. The gradient of a mean is the incoming one divided by the global count, the
same for every row at any rank count.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import torch
import torch.nn.functional as F

from fullgraph.pyg.node_rows import RULES, Call, NodeRows, Rule, TorchFunction, plain, tag

if TYPE_CHECKING:
    from fullgraph.pyg.part_data import PartGraph

#: A reduction's ``dim`` argument: one dim, several, or ``None`` (every dim).
Dims = int | Sequence[int] | None


class GlobalValue(torch.autograd.Function):
    """The global value as value, this rank's share as what the gradient flows through."""

    @staticmethod
    def forward(ctx: Any, share: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        """``total`` (a copy)."""
        return total.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """The gradient goes to ``share``."""
        return grad, None


def global_value(share: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``total`` (cast like ``share``), differentiable through ``share`` when it needs it."""
    total = total.to(dtype=share.dtype, device=share.device)
    return GlobalValue.apply(share, total) if share.requires_grad else total


def all_sum(part: PartGraph, *values: torch.Tensor) -> list[torch.Tensor]:
    """Each of ``values`` summed over the ranks, in float64 on the CPU (one all-reduce)."""
    flat = [v.detach().double().cpu().reshape(-1) for v in values]
    summed = part.comm.allreduce_(torch.cat(flat), "sum", tag="metrics")
    out, start = [], 0
    for v, f in zip(values, flat, strict=True):
        out.append(summed[start : start + f.numel()].reshape(v.shape))
        start += f.numel()
    return out


#: The dtypes :func:`exact_sum` sums exactly (at most 24 significant bits, exponents of
#: float32's range: a value is an integer of 24 bits times a power of two of 277).
_EXACT = (torch.float32, torch.float16, torch.bfloat16)
_SHIFT, _BUCKETS = 24 + 148, 277  # frexp exponents -148 .. 128 of a finite float32


def exact_sum(part: PartGraph, values: torch.Tensor) -> torch.Tensor | None:
    """The sum over every rank of ``values``' rows (dim 0; 1-D: every element), exact and
    rounded once to float64: the same bits at any rank count, whatever rows each rank holds;
    ``None`` (a collective too) where it cannot be (another dtype, or a non-finite value on
    some rank): the caller takes :func:`all_sum` then.

    Each value is ``m 2^e`` with ``m`` an integer of at most 24 bits; per column the ``m`` of
    each ``e`` are summed as integers (in float64, exact below ``2^29`` rows), those sums over
    the ranks in one all-reduce (exact again), and the buckets added as one Python integer.

    Returns:
        float64 ``values.shape[1:]`` on the CPU, or ``None``.
    """
    v = values.detach()
    ok = v.dtype in _EXACT and bool(torch.isfinite(v).all()) and v.shape[0] < (1 << 29)
    flags = part.comm.allreduce_(torch.tensor([0.0 if ok else 1.0]), "max", tag="metrics")
    if float(flags[0]) > 0:
        return None
    rows = v.double().cpu().numpy().reshape(v.shape[0], math.prod(v.shape[1:]))
    mant, exp = np.frexp(rows)
    ints = np.ldexp(mant, 24)  # integers of at most 24 bits, exact in float64
    columns = rows.shape[1]
    where = (np.arange(columns) * _BUCKETS)[None, :] + (exp + 148)
    buckets = np.bincount(where.reshape(-1), ints.reshape(-1), minlength=columns * _BUCKETS)
    buckets = buckets.astype(np.float64, copy=False)  # no rows: numpy's int64 zeros
    summed = part.comm.allreduce_(torch.from_numpy(buckets), "sum", tag="metrics").numpy()
    out = np.zeros(columns)
    for c, per in enumerate(summed.reshape(columns, _BUCKETS)):
        (used,) = np.nonzero(per)
        if len(used):
            low = int(used[0])
            total = sum(int(per[b]) << (int(b) - low) for b in used)
            out[c] = math.ldexp(float(total), low - _SHIFT)
    return torch.from_numpy(out).reshape(v.shape[1:])


def _dims(x: torch.Tensor, dim: Dims) -> tuple[int, ...] | None:
    """``dim`` as non-negative dims of ``x`` (``None``: every dim)."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = dim if isinstance(dim, (list, tuple)) else (dim,)
    n = max(x.dim(), 1)
    return tuple(int(d) % n for d in dims)


def over_nodes(call: Call, x: torch.Tensor, dim: Dims) -> bool:
    """Whether reducing ``x`` over ``dim`` reduces over its nodes (refused: a dim of a tensor
    whose node axis was moved away from dim 0)."""
    dims = _dims(x, dim)
    if dims is None:
        return True
    if not call.rows:
        raise call.refuse(f"over dim {dim} after the node axis was moved from dim 0")
    return 0 in dims


def _count(x: torch.Tensor, dims: tuple[int, ...] | None) -> int:
    return x.numel() if dims is None else math.prod(x.shape[d] for d in dims)


def _sum_like(mean: bool, nan: bool = False) -> Rule:
    def rule(call: Call) -> torch.Tensor:
        x, dim = call.arg(0, "input"), call.arg(1, "dim")
        if not over_nodes(call, x, dim):
            return call.kept()
        keepdim, dtype = call.arg(2, "keepdim", False), call.kwargs.get("dtype")
        px, dims = plain(x), _dims(x, dim)
        if mean:
            torch.mean(torch.zeros(0, dtype=dtype or px.dtype, device=px.device))  # its errors
            dtype = dtype or px.dtype
        summed = (torch.nansum if nan else torch.sum)(px, **_dim_kw(dim, keepdim), dtype=dtype)
        exact = None
        if not nan and (dtype is None or dtype == px.dtype) and dims in (None, (0,)):
            exact = exact_sum(call.part, px.reshape(-1) if dims is None else px)
            if exact is not None and keepdim and dims is not None:
                exact = exact.unsqueeze(0)
        if not mean:
            (total,) = all_sum(call.part, summed) if exact is None else (exact,)
            return global_value(summed, total)
        if nan:
            count = (~torch.isnan(px)).sum(**_dim_kw(dim, keepdim)).double()
        else:
            count = torch.tensor(float(_count(px, dims)))
        if exact is None:
            total, counts = all_sum(call.part, summed, count)
        else:
            total, (counts,) = exact, all_sum(call.part, count)
        return global_value(summed / counts.to(summed.device, summed.dtype), total / counts)

    return rule


def _dim_kw(dim: Dims, keepdim: bool) -> dict[str, Dims | bool]:
    return {} if dim is None else {"dim": dim, "keepdim": keepdim}


def _count_nonzero(call: Call) -> torch.Tensor:
    x, dim = call.arg(0, "input"), call.arg(1, "dim")
    if not over_nodes(call, x, dim):
        return call.kept()
    local = torch.count_nonzero(plain(x), **({} if dim is None else {"dim": dim}))
    return all_sum(call.part, local)[0].to(local.dtype)


def _any_all(every: bool) -> Rule:
    def rule(call: Call) -> torch.Tensor:
        x, dim = call.arg(0, "input"), call.arg(1, "dim")
        if not over_nodes(call, x, dim):
            return call.kept()
        local = call.plain()
        flag = (~local if every else local).double().cpu()
        found = call.part.comm.allreduce_(flag, "max", tag="metrics") > 0
        return (~found if every else found).to(local.device)

    return rule


def _extreme(largest: bool, values_only: bool) -> Rule:
    def rule(call: Call) -> Any:
        x, dim = call.arg(0, "input"), call.arg(1, "dim")
        if isinstance(dim, torch.Tensor):  # torch.max(a, b): elementwise
            return call.kept()
        if not over_nodes(call, x, dim):
            return call.kept()
        if not values_only and dim is not None:
            raise call.refuse("over the nodes (its indices are this rank's)")
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in call.args):
            raise call.refuse("with a gradient")
        px = plain(x)
        if px.dtype == torch.bool:
            neutral: float = not largest
        elif px.is_floating_point():
            neutral = -math.inf if largest else math.inf
        else:
            info = torch.iinfo(px.dtype)
            neutral = info.min if largest else info.max
        padded = torch.cat(
            [px.reshape(-1, *px.shape[1:]), px.new_full((1, *px.shape[1:]), neutral)]
        )
        keepdim = call.arg(2, "keepdim", False)
        reduce_dims = () if dim is None else dim
        local = (torch.amax if largest else torch.amin)(padded, dim=reduce_dims, keepdim=keepdim)
        sign = 1.0 if largest else -1.0
        found = call.part.comm.allreduce_(local.double().cpu() * sign, "max", tag="metrics")
        return (found * sign).to(device=px.device, dtype=px.dtype)

    return rule


def _bincount(call: Call) -> torch.Tensor:
    weights = call.arg(1, "weights")
    if isinstance(weights, torch.Tensor) and weights.requires_grad:
        raise call.refuse("with weights that need a gradient")
    x = plain(call.arg(0, "input"))
    top = x.max().double().cpu().reshape(1) if x.numel() else torch.full((1,), -1.0).double()
    top = int(call.part.comm.allreduce_(top, "max", tag="metrics")[0])
    size = max(int(call.arg(2, "minlength", 0)), top + 1)
    local = torch.bincount(x, plain(weights), minlength=size)
    return all_sum(call.part, local)[0].to(local.dtype)


def _one_hot(call: Call) -> torch.Tensor:
    x, classes = call.arg(0, "tensor"), call.arg(1, "num_classes", -1)
    if classes == -1:
        px = plain(x)
        top = px.max().double().cpu().reshape(1) if px.numel() else torch.full((1,), -1.0)
        classes = int(call.part.comm.allreduce_(top.double(), "max", tag="metrics")[0]) + 1
    return tag(F.one_hot(plain(x), classes), call.part, call.rows)


def _squeeze(call: Call) -> torch.Tensor:
    x, dim = call.arg(0, "input"), call.arg(1, "dim")
    if dim is not None or not call.rows or x.dim() == 0:
        return call.kept(rows=call.rows and _dims(x, dim) != (0,))
    dims = tuple(d for d in range(1, x.dim()) if x.shape[d] == 1)
    return tag(plain(x).squeeze(dims) if dims else plain(x).view_as(plain(x)), call.part, True)


#: Loss -> how its ``reduction="mean"`` divides: ``targets`` (the weights of the counted
#: targets), ``numel`` (every element of the unreduced loss).
_LOSSES = {
    F.cross_entropy: "targets",
    F.nll_loss: "targets",
    **dict.fromkeys(
        (
            F.mse_loss,
            F.l1_loss,
            F.smooth_l1_loss,
            F.huber_loss,
            F.binary_cross_entropy,
            F.binary_cross_entropy_with_logits,
            F.kl_div,
            F.soft_margin_loss,
            F.multilabel_soft_margin_loss,
            F.multi_margin_loss,
            F.multilabel_margin_loss,
            F.poisson_nll_loss,
            F.gaussian_nll_loss,
            F.hinge_embedding_loss,
            F.cosine_embedding_loss,
            F.margin_ranking_loss,
            F.triplet_margin_loss,
        ),
        "numel",
    ),
}


def _loss(call: Call) -> torch.Tensor:
    bound = inspect.signature(call.func).bind(*call.args, **call.kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if a.get("size_average") is not None or a.get("reduce") is not None:
        raise call.refuse("with the legacy size_average / reduce arguments (use reduction=)")
    reduction = a["reduction"]
    if reduction == "none":
        return call.kept()
    target = a.get("target")
    weight = a.get("weight")
    indices = _LOSSES[call.func] == "targets" and not target.is_floating_point()
    if indices and a.get("label_smoothing", 0.0) > 0 and weight is not None:
        raise call.refuse("with label_smoothing and class weights together")
    a["reduction"] = "none"
    per = _row_invariant_bce(a) if call.func is F.binary_cross_entropy_with_logits else None
    if per is None:
        per = call.func(*plain(bound.args), **plain(bound.kwargs))
    share_sum = per.sum()
    exact = exact_sum(call.part, per.reshape(-1))  # the value: the same bits at any P
    if reduction == "sum":
        (total,) = all_sum(call.part, share_sum) if exact is None else (exact,)
        return global_value(share_sum, total)
    if indices:
        t = plain(target)
        counted = t != a["ignore_index"]
        w = plain(weight)[torch.where(counted, t, 0)] if weight is not None else torch.ones_like(t)
        count = (w.double() * counted).sum()
    elif reduction == "batchmean":
        count = torch.tensor(float(plain(a["input"]).shape[0]))
    else:
        count = torch.tensor(float(per.numel()))
    if exact is None:
        total, counts = all_sum(call.part, share_sum, count)
    else:
        total, (counts,) = exact, all_sum(call.part, count)
    share = share_sum / counts.to(share_sum.device, share_sum.dtype)
    return global_value(share, total / counts)


def _row_invariant_bce(a: dict[str, Any]) -> torch.Tensor | None:
    """``F.binary_cross_entropy_with_logits(..., reduction="none")`` with every element a fixed
    function of its own input (:func:`~fullgraph.kernels.pair_loss.pair_bce`: torch's SIMD bulk
    and scalar tail differ in the last bit, so a row's loss and gradient would depend on how
    many rows the rank holds); ``None`` where torch's is taken (``pos_weight``, another device
    or dtype)."""
    from fullgraph.kernels.pair_loss import pair_bce

    x, y, w = plain(a["input"]), plain(a["target"]), plain(a.get("weight"))
    if a.get("pos_weight") is not None or x.device.type != "cpu":
        return None
    if x.dtype not in (torch.float32, torch.float64) or y.shape != x.shape:
        return None
    w = torch.ones_like(x) if w is None else torch.broadcast_to(w.to(x.dtype), x.shape)
    flat = [t.reshape(-1) for t in (x, y.to(x.dtype), w.contiguous())]
    return pair_bce(*flat).reshape(x.shape)


def _refused(dim_at: int, default: int | None = None, *, always: bool = False) -> Rule:
    """A refusal when the call reduces over the nodes (``dim_at``: position of its dim)."""

    def rule(call: Call) -> Any:
        x = call.arg(0, "input")
        if not isinstance(x, torch.Tensor):
            return call.kept()
        dim = call.arg(dim_at, "dim", default)
        if always or over_nodes(call, x, dim):
            raise call.refuse("reduces over the nodes")
        return call.kept()

    return rule


def _softmax(call: Call) -> torch.Tensor:
    x, dim = call.arg(0, "input"), call.arg(1, "dim")
    if dim is None:
        dim = 0 if x.dim() in (0, 1, 3) else 1  # torch's implicit choice
    if over_nodes(call, x, dim):
        raise call.refuse("normalises over the nodes")
    return call.kept()


def _product(call: Call) -> torch.Tensor:
    """``a @ b``: node rows may only be the rows of ``a`` (``out @ W``)."""
    first, rest = call.args[0], call.args[1:]
    if any(isinstance(t, NodeRows) for t in rest) or (
        isinstance(first, NodeRows) and (first.dim() < 2 or not first.fullgraph_rows)
    ):
        raise call.refuse("contracts the node axis")
    return call.kept()


def _number(call: Call) -> NoReturn:
    raise call.refuse("reads one node's value")


def _both(name: str) -> list[TorchFunction]:
    return [f for f in (getattr(torch, name, None), getattr(torch.Tensor, name, None)) if f]


for _name, _rule in {
    "sum": _sum_like(False),
    "nansum": _sum_like(False, nan=True),
    "mean": _sum_like(True),
    "nanmean": _sum_like(True, nan=True),
    "count_nonzero": _count_nonzero,
    "any": _any_all(False),
    "all": _any_all(True),
    "max": _extreme(True, values_only=False),
    "min": _extreme(False, values_only=False),
    "amax": _extreme(True, values_only=True),
    "amin": _extreme(False, values_only=True),
    "bincount": _bincount,
    "squeeze": _squeeze,
    **dict.fromkeys(("std", "var", "std_mean", "var_mean", "median", "nanmedian"), _refused(1)),
    **dict.fromkeys(("prod", "argmax", "argmin", "aminmax", "logsumexp"), _refused(1)),
    **dict.fromkeys(("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"), _refused(1)),
    **dict.fromkeys(("sort", "argsort", "mode"), _refused(1, -1)),
    **dict.fromkeys(("topk", "kthvalue", "diff"), _refused(2, -1)),
    **dict.fromkeys(("quantile", "nanquantile", "norm"), _refused(2)),
    **dict.fromkeys(
        ("unique", "unique_consecutive", "histc", "cov", "corrcoef", "msort"),
        _refused(1, always=True),
    ),
    **dict.fromkeys(("softmax", "log_softmax"), _softmax),
    **dict.fromkeys(("matmul", "mm", "bmm", "mv", "dot", "vdot", "inner", "tensordot"), _product),
    **dict.fromkeys(("einsum", "chain_matmul", "trace"), _refused(1, always=True)),
    **dict.fromkeys(("item", "__int__", "__float__"), _number),
}.items():
    for _f in _both(_name):
        RULES[_f] = _rule
for _f in (torch.Tensor.__matmul__, torch.Tensor.__rmatmul__):
    RULES[_f] = _product
for _f in _LOSSES:
    RULES[_f] = _loss
for _f in (F.softmax, F.log_softmax):
    RULES[_f] = _softmax
for _f, _at in ((F.normalize, 2), (torch.linalg.vector_norm, 2), (torch.linalg.norm, 2)):
    RULES[_f] = _refused(_at, 1 if _f is F.normalize else None)
for _f in (F.batch_norm, F.instance_norm):
    RULES[_f] = _refused(1, always=True)
RULES[F.one_hot] = _one_hot
