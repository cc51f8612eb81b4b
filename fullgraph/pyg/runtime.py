"""What happens around every forward and backward pass of a converted model.

:func:`fullgraph.pyg.distribute` gives the model a :class:`ModelRun`, which hooks its forward:

- before: a training pass advances the part's step (it keys the dropout masks with the index
  of each dropout call in the pass), the part becomes the one :func:`fullgraph.pyg.dropout`
  draws for, and the torch calls of the pass are watched
  (:class:`~fullgraph.pyg.functional.ForwardCalls`: ``F.dropout``, ``torch.dropout`` and
  ``nn.Dropout`` draw hashed masks, ``torch.rand`` and the other draws are refused at the call);
- after: a training pass that still drew from torch's random generator (a call not watched by
  name) is refused: its draws differ between ranks, so P ranks would not compute what one
  process computes; the outputs are marked so that their backward pass ends with the gradient
  all-reduce;
- at the end of the backward pass (``loss.backward()``): every gradient of the model is summed
  over the ranks (:func:`fullgraph.run.epochs.reduce_gradients`, which stops on a non-finite
  value), so every rank holds the one-process gradient before ``optimizer.step()``. A
  parameter without a gradient on every rank keeps none.

Bit-identical at any rank count (docs/train.md): on a part with fixed node blocks (every
partition ``fullgraph partition`` and :func:`~fullgraph.pyg.load_part` cut, one process
included) at float32 (bf16-mixed keeps the rank-order all-reduce, as ``fullgraph train``'s
does) a training pass with a gradient runs with the part's
:class:`~fullgraph.distributed.tree_sum.BlockGradients` in force
(:func:`~fullgraph.distributed.tree_sum.collecting`): the weight products over every inner row
(``F.linear`` seen by :class:`~fullgraph.pyg.functional.ForwardCalls`: ``nn.Linear``, PyG's
``Linear``, the twins' own) and the twins' biases push per-block partials, and the end of the
backward sums them in the block tree (``reduce_gradients(..., tree=...)``): the same bits at
any rank count. The aggregations are summed in ascending global id already
(:class:`~fullgraph.distributed.halo.HaloAggregate`), the script's loss gives every row the
same gradient (its sum divided by the global count: :mod:`~fullgraph.pyg.node_reductions`),
``GINConv``'s trained ``eps`` its own per-block sums, ``F.layer_norm`` of node rows
:class:`~fullgraph.models.norm.NodeLayerNorm`'s, and the twins' ``BatchNorm`` and ``GATConv``
take their tree paths. Any other parameter (one that autograd gives a gradient: a product over
other rows or of a transformed weight, ``RMSNorm``'s weight, ...) keeps the fixed-order
all-reduce: P ranks equal one process to float rounding there.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from fullgraph.distributed.tree_sum import BlockGradients, BlockLayout, collecting
from fullgraph.errors import ConfigError
from fullgraph.precision import FLOAT32, Precision
from fullgraph.pyg.functional import ForwardCalls
from fullgraph.pyg.part_data import PartGraph
from fullgraph.run.epochs import reduce_gradients

#: The parts of the converted models whose forward pass is running (innermost last).
_ACTIVE: list[PartGraph] = []


def active_part() -> PartGraph | None:
    """The part of the converted model whose forward pass is running, or ``None``."""
    return _ACTIVE[-1] if _ACTIVE else None


def part_blocks(part: PartGraph) -> BlockLayout | None:
    """The part's fixed node blocks, or ``None`` (a partition written without them, or by
    ``random`` / ``contiguous``: the gradients are all-reduced in rank order)."""
    return BlockLayout.of_part(part.part)


def _rng_states() -> list[torch.Tensor]:
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.append(torch.cuda.get_rng_state())
    return states


class _ReduceAfterBackward(torch.autograd.Function):
    """Identity on a model output; its backward schedules the gradient all-reduce."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, run: ModelRun) -> torch.Tensor:
        """``out`` unchanged."""
        ctx.run = run
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """``grad`` unchanged; the all-reduce runs once the whole backward pass is done."""
        ctx.run.schedule_reduce()
        return grad, None


class ModelRun:
    """The forward hooks and the gradient all-reduce of one converted model.

    Args:
        model: the converted model (its root module).
        part: the rank's part.
        precision: the resolved policy (the part's plan carries it).
    """

    def __init__(self, model: nn.Module, part: PartGraph, precision: Precision = FLOAT32) -> None:
        self.model, self.part, self.precision = model, part, precision
        self._rng: list[torch.Tensor] | None = None
        self._calls: list[ForwardCalls] = []
        self._scheduled = False
        self._reduced_step = -1
        self.layout = part_blocks(part)
        self._tree: BlockGradients | None = None  # the tree of the passes not reduced yet
        self._collecting: list[contextlib.AbstractContextManager] = []
        model.register_forward_pre_hook(self._before)
        model.register_forward_hook(self._after, always_call=True)

    def _before(self, module: nn.Module, args: tuple) -> None:
        if module.training:
            self.part.step += 1
        self.part.stream = 0
        _ACTIVE.append(self.part)
        self._rng = _rng_states() if module.training else None
        calls = ForwardCalls(self.part, module.training)
        calls.__enter__()
        self._calls.append(calls)
        tree = None
        float32 = self.part.plan.row_dtype is None  # bf16-mixed: rank order, as fullgraph train
        if module.training and torch.is_grad_enabled() and self.layout is not None and float32:
            if self._tree is None:  # a second pass before a backward adds to the same tree
                self._tree = BlockGradients(self.layout)
            tree = self._tree
        scope = collecting(tree)
        scope.__enter__()
        self._collecting.append(scope)

    def _after(self, module: nn.Module, args: tuple, output: Any) -> Any:
        if self._collecting:
            self._collecting.pop().__exit__(None, None, None)
        if self._calls:
            self._calls.pop().__exit__(None, None, None)
        if _ACTIVE and _ACTIVE[-1] is self.part:
            _ACTIVE.pop()
        if output is None or not module.training:
            return output
        before, self._rng = self._rng, None
        if before is not None and any(
            not torch.equal(a, b) for a, b in zip(before, _rng_states(), strict=True)
        ):
            raise ConfigError(
                f"{type(module).__name__}.forward drew from torch's random generator in a "
                f"training pass: the draws differ between ranks, so P ranks would not compute "
                f"what one process computes (F.dropout, torch.dropout and nn.Dropout are made "
                f"exact; other draws are refused)"
            )
        if torch.is_grad_enabled():
            return self._mark(output)
        return output

    def _mark(self, output: Any) -> Any:
        """``output`` with every tensor that requires a gradient passed through the marker."""
        if isinstance(output, torch.Tensor):
            if output.requires_grad:
                return _ReduceAfterBackward.apply(output, self)
            return output
        if isinstance(output, tuple) and not hasattr(output, "_fields"):
            return tuple(self._mark(o) for o in output)
        if isinstance(output, list):
            return [self._mark(o) for o in output]
        if isinstance(output, dict):
            return {k: self._mark(v) for k, v in output.items()}
        return output

    def schedule_reduce(self) -> None:
        """Run :meth:`reduce` once at the end of the backward pass now running."""
        if not self._scheduled:
            self._scheduled = True
            torch.autograd.Variable._execution_engine.queue_callback(self.reduce)

    def reduce(self) -> None:
        """Sum every gradient of the model over the ranks, in place (a collective).

        Raises:
            ConfigError: a second backward pass through the same training forward pass (its
                gradients would be summed over the ranks twice).
            TrainingDiverged: a summed gradient is not finite.
        """
        self._scheduled = False
        step = self.part.step
        if self._reduced_step == step:
            raise ConfigError(
                f"a second backward pass through training forward pass {step}: run one "
                f"backward per forward (the gradients are summed over the ranks at its end)"
            )
        self._reduced_step = step
        tree, self._tree = self._tree, None
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            return
        derived = tree.derived_params() if tree is not None else []

        def in_tree(p: torch.Tensor) -> bool:
            return tree is not None and (tree.holds(p) or any(p is q for q in derived))

        like = params[0]
        present = torch.tensor(
            [float(p.grad is not None or in_tree(p)) for p in params],
            dtype=like.dtype,
            device=like.device,
        )
        flags = nn.Parameter(torch.zeros_like(present), requires_grad=False)
        flags.grad = present
        for p in params:
            if p.grad is None and not in_tree(p):  # the tree's get theirs from its root
                p.grad = torch.zeros_like(p)
        loss = torch.zeros((), dtype=like.dtype, device=like.device)
        if tree is not None:  # the script's loss is global already; the tree's path wants one
            tree.add_loss(torch.zeros(tree.layout.num_rows, dtype=like.dtype, device=like.device))
        reduce_gradients([*params, flags], loss, self.part.comm, step, "training step", tree)
        for p, seen in zip(params, flags.grad.tolist(), strict=True):
            if seen == 0:
                p.grad = None


#: Methods of a model that a script calls instead of ``forward`` and that run the model's
#: pass (PyG's GAE-style link models: ``z = model.encode(x, edge_index)``).
PASS_METHODS = ("encode",)


def route_methods(model: nn.Module, part: PartGraph) -> None:
    """Make ``model.encode(...)`` (each of :data:`PASS_METHODS` its class defines) run as a
    call of the model: through its hooks (the training step, hashed dropout, the gradient
    all-reduce at the end of the backward pass, node rows tagged). Called from within the
    model's own pass (``forward`` calling ``self.encode``), it is the plain method."""
    for name in PASS_METHODS:
        method = getattr(type(model), name, None)
        if not callable(method) or isinstance(method, nn.Module):
            continue
        bound = method.__get__(model, type(model))

        def call(*args: Any, _bound: Any = bound, **kwargs: Any) -> Any:
            if active_part() is part:  # inside the model's pass already
                return _bound(*args, **kwargs)
            model.forward = _bound  # the instance's forward for this one call
            try:
                return model(*args, **kwargs)
            finally:
                del model.forward

        call.__doc__ = method.__doc__
        setattr(model, name, call)
