"""Converting a PyG model for a rank's part: :func:`distribute`.

Every module of the model is looked at, from the root down, and treated by the first rule of
:data:`~fullgraph.pyg.rules.RULES` that matches it:

- ``twin``: replaced by its distributed twin (:mod:`fullgraph.pyg.twins`) holding the same
  parameters (``GCNConv``, ``SAGEConv``, ``GraphConv``, ``GATConv``, ``GINConv``, ``BatchNorm1d``,
  ``Dropout``);
- ``kept``: kept as it is, because it acts on every node's row alone, which is exact on any
  number of ranks (``Linear``, activations, per-node normalisations, ``JumpingKnowledge``);
- ``walked``: kept, its children looked at in turn (containers, PyG's ``BasicGNN`` models
  ``GCN`` / ``GraphSAGE`` / ``GAT`` / ``GIN``, ``MLP``, the user's own modules);
- ``refused``: a :class:`~fullgraph.errors.ConfigError` of one line naming its path, class and
  why (other message-passing layers, whole-graph normalisation and pooling, ...).

The user's own ``forward`` code is not inspected: it must treat nodes row by row (no
``x.mean(dim=0)``, no global pooling). Its dropout calls and random draws are watched while it
runs (:mod:`fullgraph.pyg.functional`). The rules live in :mod:`fullgraph.pyg.rules` (their
record in :mod:`~fullgraph.pyg.rule`, their handlers in :mod:`~fullgraph.pyg.handlers`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch
from torch import nn

from fullgraph.errors import ConfigError
from fullgraph.precision import FLOAT32, Precision, resolve_precision
from fullgraph.pyg.node_rows import watch
from fullgraph.pyg.part_data import PartGraph, part_graph_of
from fullgraph.pyg.rule import Conversion
from fullgraph.pyg.rules import twin_of
from fullgraph.pyg.runtime import ModelRun, route_methods

if TYPE_CHECKING:
    from torch_geometric.data import Data


def distribute(model: nn.Module, data: Data | PartGraph, *, precision: str = "32") -> nn.Module:
    """Convert ``model`` in place to compute this rank's rows of what it computes on one process.

    Supported layers are replaced by distributed twins holding the same parameter objects (the
    optimiser keeps working, ``state_dict`` keys stay), every rank takes rank 0's parameters
    and buffers (a collective), and the model is hooked so that
    ``loss.backward()`` ends with the gradients summed over all ranks (one fixed-order
    all-reduce; every rank then holds the one-process gradient). Call the converted model as
    before, ``model(data.x, data.edge_index)``.

    Args:
        model: a PyG model (see :mod:`fullgraph.pyg.convert` for what it may hold).
        data: this rank's part (:func:`fullgraph.pyg.load_part`).
        precision: ``"32"`` (float32), ``"bf16-mixed"`` (the forward pass's weight products
            and aggregations read bfloat16, forward halo rows travel in bfloat16; parameters,
            gradients, optimiser state, loss and the output stay float32:
            :func:`fullgraph.pyg.functional.mixed_linear_call`) or ``"auto"`` (bf16-mixed
            where it pays on the device of ``data.x``, else 32, saying which on rank 0:
            :func:`fullgraph.precision.auto_precision`),
            as ``fullgraph train --precision``. The resolved value is
            ``model.fullgraph_precision``. Every model of one part runs at one precision (the
            part's halo plan carries it).

    Returns:
        The converted model (``model`` itself unless ``model`` is a single supported layer).

    Raises:
        ConfigError: an unknown ``precision``, or ``bf16-mixed`` on a device without bfloat16
            (the line of ``fullgraph train``, before anything is converted), a module that
            cannot be distributed exactly (its path, class and why), each on every rank alike
            when any rank refuses; a model already converted for another part or precision,
            or a part whose models run at another precision.
    """
    part = part_graph_of(data, "fullgraph.pyg.distribute")
    policy = _agreed_precision(part, precision, _device_of(data))
    done = getattr(model, "_fullgraph_run", None)
    if done is not None:
        if done.part is not part:
            raise ConfigError("distribute: the model was already converted for another part")
        if done.precision != policy:
            raise ConfigError(
                f"distribute: the model was already converted at precision "
                f"{done.precision.name!r}, not {policy.name!r}"
            )
        return model
    part.check_precision(policy)  # before anything is converted
    conversion = Conversion(part)

    def convert(module: nn.Module, path: str) -> nn.Module:
        twin = twin_of(path, module, conversion)
        if isinstance(twin, nn.Module):
            for name in getattr(twin, "CONVERT_CHILDREN", ()):
                setattr(twin, name, convert(getattr(twin, name), f"{path}.{name}"))
            return twin
        if twin:
            for name, child in list(module.named_children()):
                setattr(module, name, convert(child, f"{path}.{name}"))
        return module

    try:
        model = convert(model, "model")
        refused = None
    except ConfigError as error:
        refused = error
    _agree(part, refused)
    part.set_precision(policy)  # its halo plan, built anew at this precision
    _broadcast_state(model, part)
    model._fullgraph_run = ModelRun(model, part, policy)
    watch(model, data, part)  # the script's own reductions over nodes: exact
    route_methods(model, part)  # model.encode(...) runs through the same hooks
    model.fullgraph_precision = policy.name
    return model


def _device_of(data: Data | PartGraph) -> str:
    """The device type of the part's rows (``data.x``), where the products run; ``cpu``
    when ``data`` holds no rows."""
    x = getattr(data, "x", None)
    return x.device.type if isinstance(x, torch.Tensor) else "cpu"


def _agreed_precision(part: PartGraph, requested: object, device: str) -> Precision:
    """``requested`` resolved on ``device`` (:func:`~fullgraph.precision.resolve_precision`)
    and agreed by the ranks (a collective with several): ``auto`` is bf16-mixed only where
    it is on every rank; rank 0 prints the line of an ``auto`` (what it resolved to, why).

    Raises:
        ConfigError: an unknown value, or ``bf16-mixed`` without bfloat16 on some rank (the
            first rank's line in rank order, on every rank alike).
    """
    if requested is None or type(requested) is int:  # None: the default; 32 as Lightning
        requested = "32" if requested is None else str(requested)
    resolved, note, refused = None, None, None
    try:
        resolved, note = resolve_precision(requested, device)  # type: ignore[arg-type]
    except ConfigError as error:
        refused = error
    values = _agree(part, refused, None if resolved is None else resolved.name)
    if "32" in values and resolved != FLOAT32:  # auto, and another rank has no bfloat16
        resolved = FLOAT32
        rank = values.index("32")
        note = f"--precision auto: float32, as on rank {rank} (one precision for every rank)"
    if note is not None and part.comm.rank == 0:
        print(f"fullgraph.pyg: {note}", file=sys.stderr, flush=True)
    assert resolved is not None
    return resolved


def _agree(
    part: PartGraph, refused: ConfigError | None, value: str | None = None
) -> list[str | None]:
    """Raise alike on every rank when any rank refused (a collective with several ranks);
    else return every rank's ``value``, in rank order.

    Raises:
        ConfigError: the first refusal in rank order, marked ``alike`` (printed once, by rank
            0, by the one-line hook of :func:`fullgraph.pyg.load_part`).
    """
    mine = (None if refused is None else str(refused), value)
    gathered = [mine] if part.comm.size == 1 else part.comm.allgather_object(mine)
    first = next((m for m, _ in gathered if m is not None), None)
    if first is None:
        return [v for _, v in gathered]
    error = refused if refused is not None and str(refused) == first else ConfigError(first)
    error.alike = True  # type: ignore[attr-defined]
    raise error


def _broadcast_state(model: nn.Module, part: PartGraph) -> None:
    """Give every rank rank 0's parameters and buffers (whatever seed each rank used)."""
    if part.comm.size == 1:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            buf = t.detach().cpu().contiguous().clone()
            part.comm.broadcast_(buf, 0)
            t.copy_(buf)
