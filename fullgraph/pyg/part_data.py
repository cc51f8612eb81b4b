"""This rank's part of the graph as a PyG ``Data`` object: :func:`load_part`.

The ``Data`` holds what a single-process PyG script reads from its dataset, restricted to the
rank's inner (owned) nodes: ``x``, ``y``, ``train_mask``, ``val_mask``, ``test_mask``,
``num_nodes``, ``num_classes``. Its ``edge_index`` is a :class:`PartGraph` instead of an edge
tensor: the layers :func:`fullgraph.pyg.distribute` puts in the model read the rank's edges, halo
exchange plan and global node ids from it, and refuse any other ``edge_index`` (so an edge
tensor cannot be silently ignored). ``data.fullgraph`` is the same object.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sys
import tempfile
from typing import Any

import numba
import numpy as np
import torch

from fullgraph.datasets import Graph, from_pyg
from fullgraph.distributed import (
    Communicator,
    create_communicator,
    default_threads,
    detect_launch,
    resolve_transport,
)
from fullgraph.distributed.halo import HaloPlan
from fullgraph.errors import ConfigError, FullgraphError
from fullgraph.models.context import GraphContext
from fullgraph.models.layers import LayerOptions
from fullgraph.partition import (
    Partition,
    PartitionDir,
    assign_parts,
    load_partition,
    whole_graph_part,
    write_partitions,
)
from fullgraph.training.assembly import part_tensors, rank_context
from fullgraph.watchdog import Watchdog, phase
from fullgraph.watchdog import current as current_watchdog


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
        step: training forward passes so far; the next one uses ``step + 1``.
        precision: ``32`` or ``bf16-mixed`` once :func:`fullgraph.pyg.distribute` converted a
            model for the part (``None`` before): the precision every model of the part runs
            at, since :attr:`plan` carries its ``row_dtype``.
    """

    def __init__(self, part: Partition, comm: Communicator, seed: int) -> None:
        self.part, self.comm, self.seed = part, comm, int(seed)
        self.num_inner = int(part.num_inner)
        self.global_ids = np.asarray(part.global_ids[: self.num_inner], dtype=np.int64)
        self.num_train_global = int(part.num_train_global)
        self.plan = HaloPlan.from_partition(part, comm)
        self.precision: str | None = None
        self.step = 0
        self.stream = 0
        self._contexts: dict[tuple, GraphContext] = {}
        self._edge_values: dict[str, torch.Tensor] = {}
        self._edge_list: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._checked: dict[tuple, bool] = {}

    def __repr__(self) -> str:
        return (
            f"PartGraph(rank={self.comm.rank} of {self.comm.size}, inner={self.num_inner}, "
            f"halo={int(self.part.num_halo)}, edges={self.num_edges})"
        )

    @property
    def num_edges(self) -> int:
        """Incoming edges of this rank's inner nodes."""
        return int(self.part.num_edges)

    def size(self, dim: int | None = None) -> Any:
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

    def check_edge_values(self, given: Any, name: str, where: str) -> torch.Tensor:
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
        edge_weight: bool = False,
        improved: bool = False,
        options: LayerOptions | None = None,
    ) -> GraphContext:
        """The context of layer kind ``kind`` for inputs like ``like`` (device and dtype).

        Args:
            kind: a registered layer kind (``gcn``, ``sage``, ``gat``, ``gin``; :data:`SUM`,
                the ``gin`` kind, is the plain sum over every node's incoming neighbours:
                ``GINConv``, ``SAGEConv(aggr="sum")``).
            like: an input of the layer; its device and floating dtype are used.
            edge_weight: ``gcn``: weigh the edges with the part's edge weights.
            improved: ``gcn``: self-loop fill 2.
            options: the layer options (``aggr``: ``sage`` / ``graphconv``'s aggregation; with
                ``max`` the context holds the edges and local global ids, no operator).

        Returns:
            The operator (values in ``like``'s dtype), the halo plan and the dropout ids, built
            by the rank assembler of ``fullgraph train``
            (:func:`~fullgraph.training.assembly.rank_context`).
        """
        key = (kind, like.device, like.dtype, edge_weight, improved, options)
        if key not in self._contexts:
            self._contexts[key] = rank_context(
                self.part,
                self.plan,
                kind,
                self.seed,
                like.device,
                like.dtype,
                edge_weight=edge_weight,
                improved=improved,
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


#: The layer kind whose operator sums the incoming neighbours (one entry per in-edge, duplicates
#: kept, no self-loop, every value 1: PyG's ``aggr="add"``), for ``GINConv`` and
#: ``SAGEConv(aggr="sum")``.
SUM = "gin"


def _graph_digest(graph: Graph) -> str:
    """A hash of the graph's arrays, to check that every rank was given the same graph."""
    h = hashlib.sha256()
    arrays = (graph.indptr, graph.indices, graph.x, graph.y, graph.train_mask)
    for a in (*arrays, graph.edge_weight, graph.edge_attr):
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _part_of_graph(graph: Graph, comm: Communicator, method: str) -> Partition:
    """This rank's part of ``graph``: the whole graph on one rank, else partitioned here.

    Rank 0 assigns the owners (``method``, seed 0) and sends them to every rank; each rank
    builds the parts in a private temporary directory, loads its own and removes the rest.
    """
    if comm.size == 1:
        return whole_graph_part(graph)
    digests = comm.allgather_object(_graph_digest(graph))
    if len(set(digests)) != 1:
        raise ConfigError(
            "load_part: the ranks were given different graphs; give every rank the same"
        )
    owner = assign_parts(graph, comm.size, method=method, seed=0) if comm.rank == 0 else None
    owner = comm.allgather_object(owner)[0]
    tmp = tempfile.mkdtemp(prefix=f"fullgraph-part-{os.getpid()}-")
    try:
        out = os.path.join(tmp, "parts")
        write_partitions(graph, owner, out, method=method, seed=0, num_parts=comm.size)
        return load_partition(out, comm.rank, mmap=False, verify_checksums=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _one_line_errors(rank: int, size: int) -> None:
    """Print an uncaught :class:`~fullgraph.errors.FullgraphError` of the script as one line.

    ``fullgraph.pyg: error: MESSAGE`` on standard error instead of a traceback (the process
    still exits with status 1). An error every rank raised alike (``alike``: agreed by a
    collective, e.g. a refusal of :func:`fullgraph.pyg.distribute`) is printed by rank 0 only;
    any other by the rank that raised it, naming the rank when there are several. Other
    exceptions keep the previous hook.
    """
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not isinstance(value, FullgraphError):
            previous(kind, value, tb)
            return
        alike = getattr(value, "alike", False)
        if alike and rank > 0:
            return
        where = f"rank {rank}: " if size > 1 and not alike else ""
        sys.stderr.flush()
        # one write: the lines of several ranks sharing a pipe never interleave
        os.write(2, f"fullgraph.pyg: error: {where}{value}\n".encode())

    sys.excepthook = hook


def _communicator(threads: int | None, timeout_s: float) -> Communicator:
    """The communicator of the launcher that started us (closed at exit); sets the threads.

    The process watchdog (:mod:`fullgraph.watchdog`, installed here unless the process has one)
    bounds the set-up and :func:`load_part` by ``timeout_s`` and ends the rank if its launcher
    dies; it leaves the script's signal handling alone. The script's uncaught fullgraph errors
    are printed in one line (:func:`_one_line_errors`).
    """
    info = detect_launch()
    watchdog = current_watchdog() or Watchdog("fullgraph.pyg").install(signals=False)
    watchdog.attach(info, timeout_s)
    with phase("connection set-up"):
        comm = create_communicator(resolve_transport("auto", info), info, timeout_s)
    atexit.register(comm.close)
    _one_line_errors(comm.rank, comm.size)
    if threads is not None or info.size > 1:
        n = threads or default_threads(info)
        torch.set_num_threads(n)
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    return comm


def load_part(
    source: str | os.PathLike[str] | Graph | Any,
    comm: Communicator | None = None,
    *,
    seed: int = 0,
    method: str = "metis",
    threads: int | None = None,
    quiet: bool = True,
    timeout: float = 300.0,
) -> Any:
    """This rank's part of a graph as a PyG ``Data`` object (a collective: every rank calls it).

    Args:
        source: a partition directory (``fullgraph partition``; one part per rank, read from
            disk: the way for large graphs), or a whole graph held by every rank, as a
            :class:`~fullgraph.datasets.Graph` or a PyG ``Data`` with ``edge_index`` and ``y``
            (one rank: the whole graph; several: partitioned here with ``method``).
        comm: the communicator; by default the launcher's (``mpirun``, ``srun``, ``torchrun``,
            or none: one process), created here and closed at exit.
        seed: seed of the dropout streams (:func:`fullgraph.pyg.dropout`).
        method: partitioning method when ``source`` is a whole graph and there are several
            ranks (``metis``, ``random``, ``contiguous``).
        threads: compute threads of this rank when the communicator is created here (default
            with several ranks: the node's cores divided by its ranks).
        quiet: with several ranks, ranks other than 0 send their standard output to
            ``os.devnull`` (the script's prints appear once; errors still reach stderr).
        timeout: seconds the set-up, the loading and any collective may wait for the other
            ranks when the communicator is created here (a rank that fails before it calls
            ``load_part`` ends the others within it, with a line naming the rank).

    Returns:
        ``Data(x, y, train_mask, val_mask, test_mask, num_nodes, num_classes, edge_index,
        fullgraph)`` of this rank's inner nodes; ``edge_index`` and ``fullgraph`` are the
        rank's :class:`PartGraph`; ``edge_weight`` [num_edges] and ``edge_attr``
        [num_edges, edge_dim] (float32) when the graph has them: the values of the part's
        edges (every edge into an inner node), in the part's edge order.

    Raises:
        ConfigError: the rank count differs from the directory's part count, or the ranks were
            given different graphs.
        PartitionError: a missing or corrupted part (from the loader).
        DataError: a graph without features or training nodes.
    """
    from torch_geometric.data import Data

    comm = comm if comm is not None else _communicator(threads, timeout)
    with phase("part loading"):
        if isinstance(source, (str, os.PathLike)):
            opened = PartitionDir.open(source)
            opened.check_ranks(comm.size, "start one rank per part")
            part = load_partition(opened, comm.rank)
        else:
            graph = source if isinstance(source, Graph) else from_pyg(source, "pyg")
            part = _part_of_graph(graph, comm, method)
    if quiet and comm.rank > 0:
        sys.stdout = open(os.devnull, "w")  # for the rest of the process
    t = part_tensors(part)
    pg = PartGraph(part, comm, seed)
    data = Data(
        x=t["x"],
        y=t["y"],
        train_mask=t["train"],
        val_mask=t["val"],
        test_mask=t["test"],
        num_nodes=int(part.num_inner),
        num_classes=int(part.num_classes),
    )
    for name in ("edge_weight", "edge_attr"):  # aligned with the part's edges
        if (values := pg.edge_values(name)) is not None:
            data[name] = values
    data.edge_index = pg
    data.fullgraph = pg
    return data


def part_graph_of(data: Any, where: str) -> PartGraph:
    """The :class:`PartGraph` of ``data`` (from :func:`load_part`).

    Raises:
        ConfigError: ``data`` does not come from :func:`load_part`.
    """
    pg = getattr(data, "fullgraph", None) if data is not None else None
    if isinstance(data, PartGraph):
        return data
    if not isinstance(pg, PartGraph):
        raise ConfigError(
            f"{where}: data must come from fullgraph.pyg.load_part (got {type(data).__name__})"
        )
    return pg
