"""This rank's part of the graph as the converted layers see it: :class:`PartGraph`.

The ``Data`` of :func:`~fullgraph.pyg.load.load_part` holds what a single-process PyG script
reads from its dataset, restricted to the rank's inner (owned) nodes: ``x``, ``y``,
``train_mask``, ``val_mask``, ``test_mask``, ``num_nodes``, ``num_classes``. Its
``edge_index`` is a :class:`PartGraph` instead of an edge tensor: the layers
:func:`fullgraph.pyg.distribute` puts in the model read the rank's edges, halo exchange plan
and global node ids from it, and refuse any other ``edge_index`` (so an edge tensor cannot be
silently ignored). ``data.fullgraph`` is the same object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from fullgraph.distributed import Communicator
from fullgraph.distributed.halo import HaloPlan
from fullgraph.errors import ConfigError
from fullgraph.models.context import GraphContext
from fullgraph.models.layers import LayerOptions
from fullgraph.partition import Partition
from fullgraph.precision import Precision
from fullgraph.training.assembly import rank_context

if TYPE_CHECKING:
    from torch_geometric.data import Data


class PartGraph:
    """This rank's edges as the converted layers see them (``data.edge_index``).

    Holds the part, the communicator, the halo exchange plan, one
    :class:`~fullgraph.models.context.GraphContext` per layer kind, device and dtype (built on
    first use), and the counters that key dropout: :attr:`step` (training forward passes so far;
    set it to continue the dropout streams of a resumed run) and the dropout call index within
    the current forward pass.

    Args:
        part: this rank's part (a partition's, or the whole graph's).
        comm: the communicator (``comm.size`` must equal the part count).
        seed: seed of the dropout streams.

    Attributes:
        comm: the communicator.
        seed: seed of the dropout streams.
        num_inner: rows of this rank (its inner nodes).
        global_ids: global id of every inner node, int64 [num_inner].
        num_train_global: training nodes of the whole graph.
        num_nodes_global: nodes of the whole graph, for a link split's part (node pairs);
            ``None`` otherwise.
        step: training forward passes so far; the next one uses ``step + 1``.
        plan: the halo exchange plan, at the part's precision (float32 until
            :meth:`set_precision`).
        precision: the policy (:class:`~fullgraph.precision.Precision`) every model of the
            part runs at once :func:`fullgraph.pyg.distribute` converted one (``None`` before):
            one per part, since :attr:`plan` carries it.
    """

    def __init__(self, part: Partition, comm: Communicator, seed: int) -> None:
        self.part, self.comm, self.seed = part, comm, int(seed)
        self.num_inner = int(part.num_inner)
        self.global_ids = np.asarray(part.global_ids[: self.num_inner], dtype=np.int64)
        self.num_train_global = int(part.num_train_global)
        self.num_nodes_global: int | None = None
        self.plan = HaloPlan.from_partition(part, comm)
        self.precision: Precision | None = None
        self.step = 0
        self.stream = 0
        self._contexts: dict[tuple, GraphContext] = {}
        self._edge_values: dict[str, torch.Tensor] = {}
        self._edge_list: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._checked: dict[tuple, bool] = {}
        self.adj_t = PartAdjT(self)

    def __repr__(self) -> str:
        return (
            f"PartGraph(rank={self.comm.rank} of {self.comm.size}, inner={self.num_inner}, "
            f"halo={int(self.part.num_halo)}, edges={self.num_edges})"
        )

    def check_precision(self, precision: Precision) -> None:
        """Refuse ``precision`` when this part's models already run at another.

        Raises:
            ConfigError: ``distribute``'s line naming both precisions.
        """
        if self.precision not in (None, precision):
            raise ConfigError(
                f"distribute: precision {precision.name!r}, but this part's models run at "
                f"{self.precision.name!r} (its halo plan carries the precision): convert every "
                f"model of a part at one precision, or load_part again for another"
            )

    def set_precision(self, precision: Precision) -> None:
        """Fix the precision every model of this part runs at (by
        :func:`fullgraph.pyg.distribute`, once): the halo plan is built anew with it (no
        collective) and the layer contexts built with the old one go.

        Raises:
            ConfigError: the part's models run at another precision (:meth:`check_precision`).
        """
        self.check_precision(precision)
        if self.precision == precision:
            return
        self.precision = precision
        self.plan = self.plan.with_precision(precision)
        self._contexts.clear()

    @property
    def num_edges(self) -> int:
        """Incoming edges of this rank's inner nodes."""
        return int(self.part.num_edges)

    def size(self, dim: int | None = None) -> torch.Size | int:
        """``(2, num_edges)`` like an ``edge_index`` tensor (PyG's ``num_edges`` asks this)."""
        shape = (2, self.num_edges)
        return torch.Size(shape) if dim is None else shape[dim]

    def edge_values(self, name: str) -> torch.Tensor | None:
        """The part's ``edge_weight`` [num_edges] or ``edge_attr`` [num_edges, edge_dim] as a
        float32 tensor aligned with its edges (``data.edge_weight`` / ``data.edge_attr``), or
        ``None`` when the graph has none."""
        if name not in self._edge_values:
            values = getattr(self.part, name)
            if values is None:
                return None
            self._edge_values[name] = torch.from_numpy(np.array(values, dtype=np.float32))
        return self._edge_values[name]

    def edges(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(source local id, target row)`` of every stored edge, int64 [num_edges] each, in
        the part's edge order (built once per device)."""
        if device not in self._edge_list:
            indptr = torch.from_numpy(np.asarray(self.part.indptr, dtype=np.int64))
            src = torch.from_numpy(np.asarray(self.part.indices, dtype=np.int64))
            dst = torch.repeat_interleave(torch.arange(self.num_inner), indptr.diff())
            self._edge_list[device] = (src.to(device), dst.to(device))
        return self._edge_list[device]

    def check_edge_values(self, given: torch.Tensor, name: str, where: str) -> torch.Tensor:
        """``given`` checked to be the part's ``name`` (``edge_weight`` / ``edge_attr``), in any
        floating dtype: the same values on the same edges (checked once per tensor version).

        Raises:
            ConfigError: the part has no such values, or ``given`` is not them (another shape,
                other values: e.g. the whole graph's, or edges in another order).
        """
        stored = self.edge_values(name)
        if stored is None:
            raise ConfigError(
                f"{where}: {name} was given but the part stores none (the graph had no {name} "
                f"when it was partitioned)"
            )
        if given is stored:
            return given
        if not isinstance(given, torch.Tensor) or given.shape != stored.shape:
            shape = tuple(given.shape) if isinstance(given, torch.Tensor) else type(given)
            raise ConfigError(
                f"{where}: {name} must be data.{name} of the rank's part "
                f"({tuple(stored.shape)}), got {shape}"
            )
        key = (name, id(given), given._version, given.dtype, given.device)
        if key not in self._checked:
            same = torch.equal(given.detach().cpu().to(stored.dtype), stored)
            if not same:
                raise ConfigError(
                    f"{where}: {name} differs from data.{name} of the rank's part; pass the "
                    f"part's own values (aligned with its edges)"
                )
            self._checked[key] = True
        return given

    def context(
        self,
        kind: str,
        like: torch.Tensor,
        *,
        options: LayerOptions | None = None,
    ) -> GraphContext:
        """The context of layer kind ``kind`` for inputs like ``like`` (device and dtype).

        Args:
            kind: a registered layer kind (``gcn``, ``sage``, ``gat``, ``gin``; :data:`SUM`,
                the ``gin`` kind, is the plain sum over every node's incoming neighbours:
                ``GINConv``, ``SAGEConv(aggr="sum")``).
            like: an input of the layer; its device and floating dtype are used.
            options: the layer options (``aggr``: ``sage`` / ``graphconv``'s aggregation; with
                ``max`` the context holds the edges and local global ids, no operator;
                ``edge_weight``, ``improved``: ``gcn``'s weights and self-loop fill).

        Returns:
            The operator (values in ``like``'s dtype), the halo plan and the dropout ids, built
            by the rank assembler of ``fullgraph train``
            (:func:`~fullgraph.training.assembly.rank_context`).
        """
        key = (kind, like.device, like.dtype, options)
        if key not in self._contexts:
            self._contexts[key] = rank_context(
                self.part,
                self.plan,
                kind,
                self.seed,
                like.device,
                like.dtype,
                options=options,
            )
        return self._contexts[key]

    def check_rows(self, x: torch.Tensor, where: str) -> None:
        """Refuse an input whose rows are not this rank's nodes.

        Raises:
            ConfigError: ``x`` is not 2-D with :attr:`num_inner` rows.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != self.num_inner:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ConfigError(
                f"{where}: expected this rank's node rows [{self.num_inner}, features], got "
                f"{shape}; converted layers take node features, one row per node of data.x"
            )


class PartAdjT:
    """``data.adj_t``: the part's edges as PyG's transposed adjacency (``T.ToSparseTensor()``).

    A script written for ``adj_t`` calls its layers as ``conv(x, data.adj_t)``; the converted
    layers take this object as they take ``data.edge_index`` (the same edges), with the
    meaning PyG gives an ``adj_t``: its values are the edge weights. So ``GCNConv(x,
    data.adj_t)`` weighs the edges with the part's ``edge_weight`` when the graph has one (as
    PyG's ``GCNConv`` weighs them with the values of a weighted ``adj_t``), and the layers
    without a weighted twin refuse a weighted ``adj_t`` instead of ignoring its values.

    Args:
        graph: the rank's :class:`PartGraph`.
    """

    def __init__(self, graph: PartGraph) -> None:
        self.graph = graph

    def __repr__(self) -> str:
        return f"PartAdjT(of {self.graph!r})"

    @property
    def weighted(self) -> bool:
        """Whether the part carries edge weights (the values of a weighted ``adj_t``)."""
        return self.graph.edge_values("edge_weight") is not None

    def size(self, dim: int | None = None) -> torch.Size | int:
        """As :meth:`PartGraph.size`."""
        return self.graph.size(dim)


#: The layer kind whose operator sums the incoming neighbours (one entry per in-edge, duplicates
#: kept, no self-loop, every value 1: PyG's ``aggr="add"``), for ``GINConv`` and
#: ``SAGEConv(aggr="sum")``.
SUM = "gin"


def part_graph_of(data: Data | PartGraph, where: str) -> PartGraph:
    """The :class:`PartGraph` of ``data`` (from :func:`~fullgraph.pyg.load.load_part`).

    Raises:
        ConfigError: ``data`` does not come from :func:`~fullgraph.pyg.load.load_part`.
    """
    pg = getattr(data, "fullgraph", None) if data is not None else None
    if isinstance(data, PartGraph):
        return data
    if not isinstance(pg, PartGraph):
        raise ConfigError(
            f"{where}: data must come from fullgraph.pyg.load_part (got {type(data).__name__})"
        )
    return pg
