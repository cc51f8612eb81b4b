"""Node rows: the tag that makes a script's own reductions over nodes see every rank.

On P ranks each rank holds only its own nodes' rows, so a reduction a script writes by hand
(``F.cross_entropy(out[mask], y[mask])``, ``.mean()``, ``(pred[m] == y[m]).sum() / m.sum()``)
would give this rank's value, and the gradients the converted model sums over the ranks would
be P local means added up. :func:`fullgraph.pyg.distribute` therefore returns the model's
output, and sets ``data.y`` and the masks, as :class:`NodeRows`: a ``torch.Tensor`` subclass
(``as_subclass``, attached to autograd) whose ``__torch_function__``

- keeps the tag through what keeps one row per node (elementwise ops, indexing by a node mask
  or node ids, ``log_softmax(dim=-1)``, ``argmax(dim=-1)``, reductions over other dims);
- computes a reduction over the node axis (a full reduction, or one over dim 0) over ALL ranks
  (:mod:`~fullgraph.pyg.node_reductions`): ``sum`` / ``mean`` / ``nansum`` / ``nanmean`` /
  ``count_nonzero`` / ``any`` / ``all``, the losses of ``torch.nn.functional`` with
  ``reduction="mean"`` or ``"sum"``, and without a gradient ``max`` / ``min`` / ``amax`` /
  ``amin``, ``bincount`` and ``one_hot``: the global value on every rank, its gradient
  flowing through this rank's share (a collective: SPMD scripts call it on every rank alike);
- refuses, in one line naming the call and the fix, a reduction over node rows it cannot make
  exact (``std``, ``var``, ``norm``, ``median``, ``topk``, ``sort``, ``argmax`` over nodes,
  ``softmax`` over nodes, a product contracting the node axis, ``.item()`` of a node row, ...)
  and any other call that turns node rows into a 0-d value.

The tag marks a tensor whose elements are this rank's share of a tensor split by nodes;
``rows`` says whether dim 0 is still the node axis (after a transpose or a reshape that moves
it, only full reductions are made exact, reductions over a dim are refused). The converted
model's forward pass never sees the tag (its inputs are unwrapped), so it costs nothing there.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, SupportsIndex

import numpy as np
import torch

from fullgraph.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn
    from torch_geometric.data import Data

    from fullgraph.pyg.part_data import PartGraph

#: A torch function or method as ``__torch_function__`` receives it (``torch.sum``,
#: ``Tensor.__getitem__``, ``F.nll_loss``, a property's ``__get__``); it returns whatever that
#: call returns (a tensor, a tuple of them, a number).
TorchFunction = Callable[..., Any]

#: A rule over node rows: what the call returns over every rank (the torch call's result: a
#: tensor, or a tuple of them for ``max`` / ``sort`` over a dim), or it raises the refusal.
Rule = Callable[["Call"], Any]

#: torch function or method -> its rule over node rows, filled by
#: :mod:`~fullgraph.pyg.node_reductions` when it is imported (``fullgraph.pyg`` imports it).
RULES: dict[TorchFunction, Rule] = {}

#: The fix a refusal names.
FIX = (
    "use pyg.loss(out, data) / pyg.accuracy(out, data, mask), or sum / mean / a "
    "torch.nn.functional loss (made exact over the ranks)"
)


class NodeRows(torch.Tensor):
    """This rank's node rows of a tensor split by nodes over the ranks (see the module).

    Attributes:
        fullgraph_part: the rank's :class:`~fullgraph.pyg.part_data.PartGraph`.
        fullgraph_rows: dim 0 is the node axis (else only the elements are split by nodes).
        fullgraph_keys: the global order key of every row when the rows are node pairs'
            (:mod:`~fullgraph.pyg.pair_index`), else ``None`` (node rows: the part's global
            ids); :func:`fullgraph.pyg.gather` orders by it.
    """

    fullgraph_part: PartGraph
    fullgraph_rows: bool
    fullgraph_keys: np.ndarray | None = None

    @classmethod
    def __torch_function__(
        cls,
        func: TorchFunction,
        types: Collection[type],
        args: tuple = (),
        kwargs: dict | None = None,
    ) -> Any:
        """Dispatch ``func``: global reduction, refusal, or the plain call with the tag kept."""
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():  # no dispatch inside the rules
            return cls._dispatch(func, args, kwargs)

    @classmethod
    def _dispatch(cls, func: TorchFunction, args: tuple, kwargs: dict) -> Any:
        if func is torch.Tensor.__getitem__ and hasattr(args[1], "take_rows"):
            return args[1].take_rows(args[0])  # z[edge_label_index[0]]: the pairs' rows
        tagged = [t for t in _tensors(args, kwargs) if isinstance(t, NodeRows)]
        if not tagged:
            return func(*args, **kwargs)
        part = tagged[0].fullgraph_part
        rule = RULES.get(func)
        if rule is not None:
            return rule(Call(func, args, kwargs, part, all(t.fullgraph_rows for t in tagged)))
        result = plain_call(func, args, kwargs)
        rows = _rows_after(func, args, tagged, result)
        if rows is None:
            return result
        if isinstance(result, torch.Tensor) and result.dim() == 0 and tagged[0].dim() > 0:
            raise refusal(name_of(func), "turns node rows into one value")
        keys = None if func == torch.Tensor.__getitem__ else _keys_after(tagged, result, rows)
        return _retag(result, part, rows, keys)

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        """Pickle (``torch.save``) as a plain tensor: the tag holds the communicator."""
        return plain(self).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        """A deep copy with the same tag (the part is shared, not copied)."""
        copy = plain(self).__deepcopy__(memo)
        return tag(copy, self.fullgraph_part, self.fullgraph_rows, self.fullgraph_keys)


class Call:
    """One call of a torch function on node rows, as the rules of
    :mod:`~fullgraph.pyg.node_reductions` receive it.

    Args:
        func: the torch function or method.
        args: its positional arguments (tagged tensors among them).
        kwargs: its keyword arguments.
        part: the part of the first tagged argument.
        rows: every tagged argument has its node axis at dim 0.
    """

    def __init__(
        self, func: TorchFunction, args: tuple, kwargs: dict, part: PartGraph, rows: bool
    ) -> None:
        self.func, self.args, self.kwargs, self.part, self.rows = func, args, kwargs, part, rows

    @property
    def name(self) -> str:
        """The call as a script writes it (``Tensor.std``, ``torch.sum``, ``F.nll_loss``)."""
        return name_of(self.func)

    def arg(self, position: int, name: str, default: Any = None) -> Any:
        """Argument ``name`` (at ``position`` when given positionally)."""
        if len(self.args) > position:
            return self.args[position]
        return self.kwargs.get(name, default)

    def plain(self) -> Any:
        """The call on plain tensors."""
        return plain_call(self.func, self.args, self.kwargs)

    def kept(self, rows: bool | None = None) -> Any:
        """The plain call, its tensors tagged (``rows``: default this call's; the pairs'
        keys kept while the rows are still one per pair)."""
        rows = self.rows if rows is None else rows
        result = self.plain()
        tagged = [t for t in _tensors(self.args, self.kwargs) if isinstance(t, NodeRows)]
        return _retag(result, self.part, rows, _keys_after(tagged, result, rows))

    def refuse(self, why: str) -> ConfigError:
        """The one-line refusal of this call."""
        return refusal(self.name, why)


def refusal(name: str, why: str) -> ConfigError:
    """``ConfigError``: ``name`` on node rows ``why``, with the fix.

    Marked ``alike``: every rank of an SPMD script makes the same call and the decision rests
    only on the call, its dims and whether it needs a gradient (never on a rank's row count),
    so every rank raises it at the same point and rank 0 alone prints it.
    """
    error = ConfigError(
        f"{name} on the node rows of a converted model (or data.y / a mask) {why}: each rank "
        f"holds only its own nodes, so it would not be the one-process value; {FIX}"
    )
    error.alike = True  # type: ignore[attr-defined]
    return error


def name_of(func: TorchFunction) -> str:
    """``func`` as a script names it."""
    name = getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", "")
    if module == "torch.nn.functional":
        return f"F.{name}"
    if qual.startswith(("TensorBase.", "Tensor.")) or module == "torch._tensor":
        return f"Tensor.{name}"
    if "getset_descriptor" in qual or name == "__get__":
        return f"Tensor.{getattr(getattr(func, '__self__', None), '__name__', 'attribute')}"
    return f"{module.replace('torch._C._linalg', 'torch.linalg') or 'torch'}.{name}"


def tag(
    t: torch.Tensor, part: PartGraph, rows: bool = True, keys: np.ndarray | None = None
) -> NodeRows:
    """``t`` as node rows of ``part`` (the same storage and autograd history); ``keys``: the
    global order key of every row, for rows of node pairs."""
    out = t if isinstance(t, NodeRows) else t.as_subclass(NodeRows)
    out.fullgraph_part, out.fullgraph_rows, out.fullgraph_keys = part, rows, keys
    return out


def plain(t: Any) -> Any:
    """``t`` without the tag (a plain ``torch.Tensor``; tuples, lists and dicts walked)."""
    if isinstance(t, NodeRows):
        with torch._C.DisableTorchFunctionSubclass():
            return t.as_subclass(torch.Tensor)
    if isinstance(t, (tuple, list)) and not hasattr(t, "_fields"):
        return type(t)(plain(v) for v in t)
    if isinstance(t, dict):
        return {k: plain(v) for k, v in t.items()}
    return t


def plain_call(func: TorchFunction, args: tuple, kwargs: dict) -> Any:
    """``func`` on plain tensors (the result holds no tag)."""
    with torch._C.DisableTorchFunctionSubclass():
        return func(*plain(args), **plain(kwargs))


def tag_outputs(output: Any, part: PartGraph) -> Any:
    """Every tensor of a model ``output`` with one row per node of ``part``, tagged."""
    if isinstance(output, torch.Tensor):
        rows = output.dim() > 0 and output.shape[0] == part.num_inner
        return tag(output, part) if rows else output
    if isinstance(output, tuple) and not hasattr(output, "_fields"):
        return tuple(tag_outputs(o, part) for o in output)
    if isinstance(output, list):
        return [tag_outputs(o, part) for o in output]
    if isinstance(output, dict):
        return {k: tag_outputs(v, part) for k, v in output.items()}
    return output


def watch(model: nn.Module, data: Data | PartGraph, part: PartGraph) -> None:
    """Tag the outputs of converted ``model`` and ``data``'s labels and masks as node rows of
    ``part``; the model's forward pass receives its inputs untagged (no dispatch inside)."""

    def unwrap(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return plain(args), plain(kwargs)

    model.register_forward_pre_hook(unwrap, with_kwargs=True)
    model.register_forward_hook(lambda module, args, output: tag_outputs(output, part))
    for name in ("y", "train_mask", "val_mask", "test_mask"):
        value = getattr(data, name, None) if not isinstance(data, type(part)) else None
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            if value.shape[0] == part.num_inner:
                data[name] = tag(value, part)


def _tensors(args: tuple, kwargs: dict) -> list[Any]:
    """The arguments, and the items of list and tuple arguments (``torch.cat([a, b])``)."""
    found = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            found.extend(a)
        else:
            found.append(a)
    return found


def _keys_after(tagged: list[NodeRows], result: Any, rows: bool) -> np.ndarray | None:
    """The pairs' keys of ``result`` when the first tagged argument has them and the result
    still has one row per pair (dim 0 kept); ``None`` otherwise."""
    keys = tagged[0].fullgraph_keys if tagged else None
    if keys is None or not rows or not isinstance(result, torch.Tensor) or result.dim() == 0:
        return None
    return keys if result.shape[0] == len(keys) else None


def _retag(result: Any, part: PartGraph, rows: bool, keys: np.ndarray | None = None) -> Any:
    if isinstance(result, torch.Tensor):
        return tag(result, part, rows, keys)
    if isinstance(result, (tuple, list)):
        items = [_retag(r, part, rows) for r in result]
        try:
            return type(result)(items)
        except TypeError:
            return tuple(items)
    return result


#: Calls whose result may move the node axis away from dim 0 (the elements stay this rank's).
_LAYOUT = {
    getattr(torch.Tensor, n)
    for n in (
        "view",
        "reshape",
        "flatten",
        "ravel",
        "unsqueeze",
        "squeeze",
        "expand",
        "view_as",
        "reshape_as",
        "expand_as",
        "unflatten",
        "repeat",
        "tile",
        "unfold",
        "as_strided",
        "t",
        "transpose",
        "swapaxes",
        "swapdims",
        "permute",
        "movedim",
        "moveaxis",
        "adjoint",
    )
} | {
    getattr(torch, n)
    for n in (
        "reshape",
        "flatten",
        "ravel",
        "unsqueeze",
        "squeeze",
        "stack",
        "broadcast_to",
        "unflatten",
        "tile",
        "t",
        "transpose",
        "swapaxes",
        "swapdims",
        "permute",
        "movedim",
        "moveaxis",
        "adjoint",
        "atleast_2d",
        "atleast_3d",
        "hstack",
        "column_stack",
    )
}
_LAYOUT |= {getattr(torch.Tensor, n).__get__ for n in ("T", "mT", "H", "mH")}
#: Calls whose tensors are new, not rows of their input.
_UNTAGGED_PREFIX = ("new_",)


def _rows_after(
    func: TorchFunction, args: tuple, tagged: list[NodeRows], result: Any
) -> bool | None:
    """Whether ``result`` of ``func`` keeps dim 0 as the node axis; ``None``: no tag at all."""
    rows = all(t.fullgraph_rows for t in tagged)
    name = getattr(func, "__name__", "")
    if name.startswith(_UNTAGGED_PREFIX):
        return None
    if func == torch.Tensor.__getitem__:
        first = args[1][0] if isinstance(args[1], tuple) and args[1] else args[1]
        if isinstance(first, int) or (
            isinstance(first, torch.Tensor)
            and first.dim() == 0
            and not first.is_floating_point()
            and first.dtype != torch.bool
        ):
            return None  # one node's row: not rows of the part any more
        return rows and first is not None
    if func in _LAYOUT:  # dim 0 kept: the other dims unchanged (never the row count)
        source = tagged[0]
        same = (
            isinstance(result, torch.Tensor)
            and result.dim() == source.dim() > 0
            and result.shape[1:] == source.shape[1:]
        )
        moved = name in ("t", "transpose", "swapaxes", "swapdims", "permute", "movedim")
        moved = moved or name in ("moveaxis", "adjoint", "__get__")
        return rows and same and not (moved and source.dim() > 1)
    return rows
