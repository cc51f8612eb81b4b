"""Torch calls inside the forward pass of a converted model: dropout made exact, draws refused.

While a model converted by :func:`fullgraph.pyg.distribute` runs its forward pass, a
``torch.overrides.TorchFunctionMode`` (:class:`ForwardCalls`) sees every torch call its code
makes, the user's and PyG's alike, so a script keeps its calls as written:

- ``F.dropout`` / ``torch.nn.functional.dropout`` (also through ``nn.Dropout``),
  ``torch.dropout`` and ``torch.dropout_`` draw hashed masks (:func:`drop`): keyed by (seed,
  training step, index of the dropout call in the pass, global node id, column) for node rows,
  by (seed, step, call index, position) for a parameter (the same on every rank), so P ranks
  drop what one process drops. Any other tensor (per edge, per head, a product of weights) is
  refused with one line naming the call and where it is made;
- the calls that draw from torch's generator (:data:`DRAWS`: ``torch.rand``,
  ``F.alpha_dropout``, ``Tensor.bernoulli_``, ...) are refused in a training pass, at the call,
  with one line naming it: their draws differ between ranks;
- under ``precision="bf16-mixed"`` (the part's plan has ``row_dtype`` bfloat16),
  ``F.linear`` (``nn.Linear``, PyG's ``Linear``, the twins' own products) of float32 input and
  weight runs its product in bfloat16 with a float32 output and backward
  (:func:`mixed_linear_call`, :func:`~fullgraph.models.mixed_linear.mixed_linear`): the rule
  ``fullgraph train``'s layers follow, made for every weight product of the user's model as
  ``torch.autocast`` would, but with the float32 backward that keeps P ranks exact;
- in a training pass under the step's block tree (:mod:`~fullgraph.pyg.runtime`), ``F.linear``
  of float32 node rows (every inner row of the part) takes
  :class:`~fullgraph.models.mixed_linear.BlockLinearFunction` (through
  :func:`~fullgraph.models.mixed_linear.mixed_linear`): the same forward bits, its weight and
  bias gradients per-block partials of the tree (the same bits at any rank count); so does
  ``F.layer_norm`` of node rows (torch's and PyG's ``LayerNorm(mode="node")``:
  :func:`layer_norm_call`);
- every other call runs unchanged.

The table of the docs (``docs/pyg.md``) is :func:`calls_table`, generated from :data:`DROPOUTS`
and :data:`DRAWS`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fullgraph.distributed.tree_sum import active_gradients
from fullgraph.errors import ConfigError
from fullgraph.models.dropout import hashed_dropout
from fullgraph.models.mixed_linear import mixed_linear
from fullgraph.models.norm import _NodeLayerNormFunction, norm_tree

if TYPE_CHECKING:
    from fullgraph.pyg.node_rows import TorchFunction
    from fullgraph.pyg.part_data import PartGraph

#: A dropout call's arguments bound to ``(input, p, training, inplace)``; ``input`` is what the
#: user's code passed (:func:`drop` refuses anything but node rows and parameters).
Binder = Callable[[tuple, dict[str, Any]], tuple[Any, float, bool, bool]]


def _binder(*names: str) -> Binder:
    """A binder of a dropout call's arguments, named ``names`` (input, p, training[, inplace]),
    to ``(input, p, training, inplace)`` (defaults: ``F.dropout``'s)."""
    defaults = (None, 0.5, True, False)

    def bind(args: tuple, kwargs: dict[str, Any]) -> tuple[Any, float, bool, bool]:
        got = dict(zip(names, args, strict=False)) | kwargs
        x, p, training, inplace = (
            got.get(n, d) for n, d in zip((*names, ""), defaults, strict=False)
        )
        return x, float(p), bool(training), bool(inplace)

    return bind


#: The dropout calls made exact: function -> (name in messages and docs, argument binder,
#: whether it works in place). ``nn.Dropout`` calls ``F.dropout``.
DROPOUTS: dict[TorchFunction, tuple[str, Binder, bool]] = {
    F.dropout: (
        "torch.nn.functional.dropout",
        _binder("input", "p", "training", "inplace"),
        False,
    ),
    torch.dropout: ("torch.dropout", _binder("input", "p", "train"), False),
    torch.dropout_: ("torch.dropout_", _binder("input", "p", "train"), True),
}

_T = torch.Tensor
#: The calls refused in a training pass: they draw from torch's random generator.
DRAWS: dict[TorchFunction, str] = {
    F.alpha_dropout: "torch.nn.functional.alpha_dropout",
    F.feature_alpha_dropout: "torch.nn.functional.feature_alpha_dropout",
    F.dropout1d: "torch.nn.functional.dropout1d",
    F.dropout2d: "torch.nn.functional.dropout2d",
    F.dropout3d: "torch.nn.functional.dropout3d",
    F.rrelu: "torch.nn.functional.rrelu",
    F.gumbel_softmax: "torch.nn.functional.gumbel_softmax",
    torch.alpha_dropout: "torch.alpha_dropout",
    torch.feature_dropout: "torch.feature_dropout",
    torch.feature_alpha_dropout: "torch.feature_alpha_dropout",
    torch.native_dropout: "torch.native_dropout",
    torch.rrelu: "torch.rrelu",
    torch.rand: "torch.rand",
    torch.rand_like: "torch.rand_like",
    torch.randn: "torch.randn",
    torch.randn_like: "torch.randn_like",
    torch.randint: "torch.randint",
    torch.randint_like: "torch.randint_like",
    torch.randperm: "torch.randperm",
    torch.bernoulli: "torch.bernoulli",
    torch.multinomial: "torch.multinomial",
    torch.normal: "torch.normal",
    torch.poisson: "torch.poisson",
    _T.bernoulli: "Tensor.bernoulli",
    _T.bernoulli_: "Tensor.bernoulli_",
    _T.multinomial: "Tensor.multinomial",
    _T.uniform_: "Tensor.uniform_",
    _T.normal_: "Tensor.normal_",
    _T.random_: "Tensor.random_",
    _T.exponential_: "Tensor.exponential_",
    _T.geometric_: "Tensor.geometric_",
    _T.cauchy_: "Tensor.cauchy_",
    _T.log_normal_: "Tensor.log_normal_",
}

#: Frames of these directories are not the call site a message names.
_LIBRARY_DIRS = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep)


def call_site() -> str:
    """``file:line`` of the innermost frame outside torch and ``fullgraph.pyg`` (the call)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    if "site-packages" + os.sep in path:
        path = path.split("site-packages" + os.sep, 1)[1]
    else:
        rel = os.path.relpath(path) if os.path.isabs(path) else path
        path = path if rel.startswith("..") else rel
    return f"{path}:{frame.f_lineno}"


def drop(part: PartGraph, x: torch.Tensor, p: float, training: bool, name: str) -> torch.Tensor:
    """``x`` after inverted dropout with hashed masks (the next dropout call index of ``part``).

    Node rows (``x.shape[0]`` is the part's inner node count; trailing dimensions are the
    columns) are keyed by their global ids, a parameter by the positions of its rows (the same
    on every rank): one process draws the same masks.

    Args:
        part: the :class:`~fullgraph.pyg.part_data.PartGraph` whose forward pass is running.
        x: the tensor dropped.
        p: drop probability, ``0 <= p < 1``.
        training: drop (else ``x`` is returned unchanged).
        name: the call, for messages.

    Raises:
        ConfigError: ``p`` outside ``[0, 1)``, or ``x`` neither node rows nor a parameter (one
            line naming the call and its site).
    """
    stream = part.stream
    part.stream += 1  # every call takes a stream, so the numbering does not depend on p
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ConfigError(
            f"{name} at {call_site()}: p={p}: the drop probability must be in [0, 1) in a "
            f"distributed model"
        )
    if isinstance(x, nn.Parameter) and x.dim() > 0:
        ids = np.arange(x.shape[0], dtype=np.int64)
    elif isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == part.num_inner:
        ids = part.global_ids
    else:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ConfigError(
            f"{name} at {call_site()}: dropout of a tensor of shape {shape} cannot be made "
            f"exact across ranks; a distributed model drops node rows [{part.num_inner}, ...] "
            f"(one row per node of data.x) or a parameter"
        )
    rows = x.reshape(x.shape[0], -1)
    return hashed_dropout(rows, ids, p, part.seed, part.step, stream).view_as(x)


def mixed_linear_call(
    args: tuple, kwargs: dict[str, Any], dtype: torch.dtype | None
) -> torch.Tensor:
    """``F.linear(input, weight, bias)`` with its product in ``dtype`` (bfloat16: float32
    accumulation, the output widened to float32, bias added in float32) and a float32 backward
    (:func:`~fullgraph.models.mixed_linear.mixed_linear`), when ``input`` and ``weight`` are
    float32; any other call (a product already in bfloat16, float64) runs as it is.

    Args:
        args: the call's positional arguments (``input, weight[, bias]``).
        kwargs: its keyword arguments.
        dtype: the product's dtype (the plan's ``row_dtype``; ``None``: float32, under the
            block tree).
    """
    got = dict(zip(("input", "weight", "bias"), args, strict=False)) | kwargs
    x, weight, bias = got.get("input"), got.get("weight"), got.get("bias")
    if not (
        isinstance(x, torch.Tensor)
        and isinstance(weight, torch.Tensor)
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and x.dim() >= 1
    ):
        return F.linear(*args, **kwargs)
    rows = x.reshape(-1, x.shape[-1])  # the product's backward takes 2-D rows
    out = mixed_linear(rows, weight, dtype, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def layer_norm_call(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    """``F.layer_norm(input, normalized_shape, weight, bias, eps)`` (torch's and PyG's
    ``LayerNorm(mode="node")``): of node rows ``[n, width]`` with a weight and a bias under the
    step's block tree, :class:`~fullgraph.models.norm.NodeLayerNorm`'s function (torch's
    forward and input gradient, the same bits; the weight and bias gradients per-block
    partials); any other call as it is."""
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    got = dict(zip(names, args, strict=False)) | kwargs
    x, weight, bias = got.get("input"), got.get("weight"), got.get("bias")
    if isinstance(x, torch.Tensor) and x.dim() == 2 and weight is not None and bias is not None:
        tree = norm_tree(int(x.shape[0]), weight, bias)
        shape = list(got["normalized_shape"])
        if tree is not None and shape == [int(x.shape[1])]:
            eps = float(got.get("eps", 1e-5))
            return _NodeLayerNormFunction.apply(x, weight, bias, shape, eps, tree)
    return F.layer_norm(*args, **kwargs)


class ForwardCalls(TorchFunctionMode):
    """The calls of a converted model's forward pass (entered and left by its hooks).

    Args:
        part: the rank's part (its dropout counters; its plan's ``row_dtype``: the dtype of
            the weight products, bfloat16 under bf16-mixed).
        training: the pass trains (random draws are refused).
    """

    def __init__(self, part: PartGraph, training: bool) -> None:
        super().__init__()
        self.part, self.training = part, training
        self.row_dtype: torch.dtype | None = part.plan.row_dtype

    def __torch_function__(
        self,
        func: TorchFunction,
        types: Collection[type],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear and (
            self.row_dtype is not None
            or (torch.is_grad_enabled() and active_gradients() is not None)  # not in a backward
        ):
            return mixed_linear_call(args, kwargs, self.row_dtype)
        if func is F.layer_norm and torch.is_grad_enabled():
            return layer_norm_call(args, kwargs)
        seen = DROPOUTS.get(func)
        if seen is not None:
            name, bind, inplace = seen
            x, p, training, in_place = bind(args, kwargs)
            out = drop(self.part, x, p, training, name)
            if (inplace or in_place) and out is not x:
                return x.copy_(out)
            return out
        if self.training and func in DRAWS:
            raise ConfigError(
                f"{DRAWS[func]} at {call_site()} draws from torch's random generator in a "
                f"training pass of a distributed model: the draws differ between ranks, so P "
                f"ranks would not compute what one process computes (F.dropout, torch.dropout "
                f"and nn.Dropout are made exact)"
            )
        return func(*args, **kwargs)


def calls_table() -> str:
    """The docs' table of the torch calls inside a converted model's forward (markdown)."""
    made = ", ".join(f"`{name}`" for name, _, _ in DROPOUTS.values())
    refused = ", ".join(f"`{name}`" for name in DRAWS.values())
    return "\n".join(
        [
            "| call inside `forward` | treatment |",
            "|---|---|",
            f"| {made}, `torch.nn.Dropout` | exact: hashed masks keyed by (seed, step, call "
            f"index, global node id, column) for node rows, by position for a parameter; any "
            f"other tensor refused at the call |",
            f"| {refused} | refused at the call in a training pass (draws from torch's "
            f"generator) |",
            "| any other call drawing from torch's generator | refused when the training "
            "pass ends (the generator's state is compared) |",
            "| `torch.nn.functional.linear` (`nn.Linear`, PyG's `Linear`, the twins' products) "
            '| with `precision="bf16-mixed"`: float32 input and weight multiplied in bfloat16 '
            "(float32 accumulation), output, bias and backward in float32 (`mixed_linear`); "
            "else unchanged |",
        ]
    )
