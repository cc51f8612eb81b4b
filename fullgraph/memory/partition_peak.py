"""The peak resident memory of ``fullgraph partition``, predicted from the graph's sizes.

``fullgraph partition`` reads the graph memory-mapped and holds, at its largest:

- **assign** (the owners): with METIS (``--method metis``; blocks or k-way) METIS's own copy of
  the graph: ``xadj`` and ``adjncy`` in its index width (4 bytes for a 32-bit libmetis, 8 for
  pymetis), a weight per constraint and node, the unit edge weights it allocates, and its
  coarsening hierarchy: every level an adjacency and an edge weight per entry,
  :data:`METIS_LEVELS` times the input's entries over all levels (measured). With
  KaMinPar, the symmetric CSR it is handed (64-bit, mapped: the ParHIP file is written from
  it in chunks) and its own graph and buffers, :data:`KAMINPAR_EDGE_BYTES` a stored edge,
  :data:`KAMINPAR_NODE_BYTES` a node and :data:`KAMINPAR_BASE_BYTES` (measured). ``random``
  and ``contiguous``: one permutation.
- **build** (the parts, one after another): the builder's node-sized arrays (owner, order,
  local ids, a mark, a cursor, the in-degrees: :data:`BUILD_NODE_BYTES` a node), every part's
  halo ids kept for the send lists (at most the cut edges, 8 bytes each), one part's own arrays
  (its ids, row pointer, labels, masks, degrees: about 41 bytes per inner node), and the
  write buffers (a part's chunk of at most :data:`CHUNK_VALUES` values); and the graph's
  mapped pages one part reads (dropped after each part; a part's rows lie all over the graph,
  so up to all of them).

The mapped pages count in the resident set but are clean file pages the kernel takes back
under pressure: :attr:`PartitionPeak.total` counts them (what ``/usr/bin/time`` reports),
:attr:`PartitionPeak.needed` (what must fit) does not.

Plus the process floor (the plan measures its own: the interpreter with the partitioning
modules imported). The coefficients were measured with ``python -m bench.partitioners`` on
products-synth and arxiv-synth (docs/partition.md, "The partition's memory plan"); the plan is
checked there against three sizes. A receptive-field cut (``--cut-hops``) is planned at the
whole graph's size: its blocks are cut on the whole graph, and the cut graph is smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

#: All levels of METIS's coarsening hierarchy together, in entries per input entry: it depends
#: on how well the graph coarsens, which its sizes do not tell (measured with the blocks: 3.5 on
#: products-synth, 5.3 on papers-synth at 1/64 and 5.5 at 1/8, whose hubs and weaker
#: communities coarsen slowly); the plan takes the larger with a margin, an upper bound for
#: graphs that coarsen well.
METIS_LEVELS = 5.6
#: KaMinPar's own bytes per stored (directed) edge and per node, beyond the mapped CSR it is
#: given (measured).
KAMINPAR_EDGE_BYTES = 31.0
KAMINPAR_NODE_BYTES = 64.0
#: KaMinPar's fixed part (its threads' buffers and context), bytes (measured).
KAMINPAR_BASE_BYTES = 100 << 20
#: The build's node-sized arrays: owner, order, local ids (8 each), in-degrees (8), the local
#: id map (8) and the mark (1).
BUILD_NODE_BYTES = 41
#: Bytes a part's own arrays take per inner node (ids, row pointer, degrees, labels, masks).
PART_NODE_BYTES = 41
#: The most values the builder writes at once (``partition.build.CHUNK_ELEMENTS``).
CHUNK_VALUES = 1 << 24
#: Constraints METIS balances (nodes, training nodes, edges).
CONSTRAINTS = 3


@dataclass(frozen=True)
class PartitionSizes:
    """What the plan needs of a graph: nodes, stored (directed) edges, feature width and the
    bytes of one feature on disk (2 for float16 features)."""

    num_nodes: int
    num_edges: int
    num_features: int
    feature_bytes: int = 4


@dataclass(frozen=True)
class PartitionPeak:
    """The predicted peak of each stage, bytes: its own memory (``assign``, ``build``) and
    the graph's memory-mapped pages it has resident (``*_mapped``: counted in the resident set,
    but clean file pages the kernel reclaims under pressure)."""

    floor: int
    assign: int
    build: int
    assign_mapped: int = 0
    build_mapped: int = 0

    @property
    def total(self) -> int:
        """The run's peak resident set: the larger stage, mapped pages included, on the floor."""
        return self.floor + max(self.assign + self.assign_mapped, self.build + self.build_mapped)

    @property
    def needed(self) -> int:
        """What must fit in memory: the floor and the larger stage's own memory."""
        return self.floor + max(self.assign, self.build)

    @property
    def stage(self) -> str:
        """The stage that peaks."""
        a, b = self.assign + self.assign_mapped, self.build + self.build_mapped
        return "assign" if a >= b else "build"


def graph_bytes(sizes: PartitionSizes) -> int:
    """The graph's arrays on disk (row pointer, sources, features, labels, masks), what a
    part whose rows lie all over the graph reads pages of."""
    n, e = sizes.num_nodes, sizes.num_edges
    return 8 * (n + 1) + 8 * e + sizes.feature_bytes * n * sizes.num_features + 8 * n + 3 * n


def assign_bytes(sizes: PartitionSizes, method: str, library: str) -> int:
    """The assignment's memory beyond the floor (see the module docstring).

    Args:
        sizes: the graph's sizes.
        method: ``metis``, ``kaminpar``, ``random`` or ``contiguous``.
        library: METIS's: ``libmetis`` (32-bit) or ``pymetis`` (64-bit); ignored otherwise.
    """
    n, e = sizes.num_nodes, sizes.num_edges
    if method == "metis":
        idx = 4 if library == "libmetis" else 8
        graph = idx * (n + 1) + 2 * idx * e + idx * CONSTRAINTS * n
        return int(graph + METIS_LEVELS * 2 * idx * e + 8 * n)
    if method == "kaminpar":
        return int(KAMINPAR_BASE_BYTES + KAMINPAR_EDGE_BYTES * e + KAMINPAR_NODE_BYTES * n)
    return 16 * n  # a permutation and the owners


def build_bytes(sizes: PartitionSizes, num_parts: int) -> int:
    """The build's memory beyond the floor (see the module docstring)."""
    n, e = sizes.num_nodes, sizes.num_edges
    per_part = -(-n // max(1, num_parts))
    halo = min(e, n * max(0, num_parts - 1))
    # a chunk of a part's edges or feature rows, and its converted copy, 8 bytes a value
    chunk = min(CHUNK_VALUES, max(-(-e // max(1, num_parts)), per_part * sizes.num_features))
    return int(BUILD_NODE_BYTES * n + 8 * halo + PART_NODE_BYTES * per_part + 16 * chunk)


def predict_partition(
    sizes: PartitionSizes, num_parts: int, method: str, library: str, floor: int
) -> PartitionPeak:
    """The predicted peak of ``fullgraph partition`` on a graph of ``sizes``.

    Args:
        sizes: nodes, stored edges and features of the graph.
        num_parts: P.
        method: the partitioning method.
        library: the METIS library ``--metis`` resolves to (``libmetis`` or ``pymetis``).
        floor: the process's resident memory before the graph is read, bytes.
    """
    n, e = sizes.num_nodes, sizes.num_edges
    return PartitionPeak(
        floor=int(floor),
        assign=assign_bytes(sizes, method, library),
        build=build_bytes(sizes, num_parts),
        # KaMinPar's ParHIP file is written from the mapped CSR; METIS copies it and drops it
        assign_mapped=8 * (n + 1 + e) if method == "kaminpar" else 0,
        build_mapped=graph_bytes(sizes),
    )
