"""The graphs a PyG user brings, and partitioning them once: :func:`partition`.

:func:`fullgraph.pyg.load_part` takes a partition directory or a whole graph held by every
rank. A whole graph is partitioned again by every rank of every run (each rank holds the whole
graph and the parts it builds: issue 31 measured 4.0 GB a rank against 3.1 GB for the plain
process); :func:`partition` (or ``fullgraph partition --pyg FILE``) writes the partition
directory once, with the builder of ``fullgraph partition``, and ``load_part(DIR)`` then reads
only the rank's part. The same owners come out of both (the method's seed 0), so the parts are
the same.

- what ``load_part`` and :func:`partition` accept as a whole graph, and the files
  ``fullgraph partition --pyg`` reads: :mod:`fullgraph.datasets.pyg_input`;
- :func:`part_of_graph`: the rank's part of a whole graph, partitioned in the process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fullgraph.datasets import Graph
from fullgraph.datasets.pyg_input import describe, graph_of
from fullgraph.errors import ConfigError

if TYPE_CHECKING:
    from torch_geometric.data import Data

    from fullgraph.distributed import Communicator
    from fullgraph.partition import Partition
    from fullgraph.partition.blocks import NodeBlocks

#: The line rank 0 prints when ``load_part`` partitions a whole graph on every rank.
IN_PROCESS_NOTE = (
    "fullgraph.pyg: note: load_part partitions the whole graph on each of the {ranks} ranks "
    "(every rank holds it); partition it once instead: pyg.partition(data, parts={ranks}, "
    "out=DIR) or `fullgraph partition --pyg DATA.pt --parts {ranks} --out DIR`, then "
    "load_part(DIR)"
)


def partition(
    data: Data | Graph,
    parts: int,
    out: str | os.PathLike[str],
    *,
    method: str = "metis",
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Partition a whole graph once into the directory that ``load_part(out)`` and
    ``fullgraph train --parts out`` read (the builder of ``fullgraph partition``).

    Call it in one process (not under a launcher's several ranks), e.g.
    ``pyg.partition(data, parts=4, out="parts/mygraph-4")``; then ``mpirun -n 4 python
    script.py`` with ``data = pyg.load_part("parts/mygraph-4")``. With ``method`` and ``seed``
    at their defaults the parts are those ``load_part(data)`` builds on 4 ranks.

    Args:
        data: a PyG ``Data`` (``edge_index`` or ``adj_t``) or a
            :class:`~fullgraph.datasets.Graph`, as :func:`graph_of` takes.
        parts: number of parts P (ranks of the later runs).
        out: the partition directory to create.
        method: ``metis`` (default), ``random`` or ``contiguous``.
        seed: seed of the method.
        force: replace an existing ``out`` if it is a partition fullgraph wrote.

    Returns:
        ``out``, once written (atomically: a temporary directory renamed at the end).

    Raises:
        ConfigError: ``data`` is not a graph, ``out`` holds something else, or the process is
            one of a launcher's several ranks.
        FileExistsError: ``out`` exists and ``force`` is false.
    """
    from fullgraph.atomic import check_output
    from fullgraph.partition.assign import METHODS, check_num_parts
    from fullgraph.partition.build import partition_graph
    from fullgraph.partition.output_kind import PARTITION

    if method not in METHODS:
        raise ConfigError(f"partition: method {method!r} is not one of {', '.join(METHODS)}")
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)):
        raise ConfigError(f"partition: parts must be an integer, got {describe(parts)}")
    from fullgraph.distributed import detect_launch

    info = detect_launch()
    if info.size > 1:
        raise ConfigError(
            f"partition: run it in one process (this is rank {info.rank} of {info.size}: the "
            f"ranks would all write {os.fspath(out)}); then load_part({os.fspath(out)!r}) here"
        )
    graph = graph_of(data, "partition")
    check_num_parts(int(parts), graph.num_nodes)
    check_output(Path(out), "out", kind="dir", exist_ok=force, ours=PARTITION)
    partition_graph(graph, int(parts), out, method=method, seed=seed, force=force)
    return Path(out)


def _graph_digest(graph: Graph) -> str:
    """A hash of the graph's arrays, to check that every rank was given the same graph."""
    h = hashlib.sha256()
    arrays = (graph.indptr, graph.indices, graph.x, graph.y, graph.train_mask)
    for a in (*arrays, graph.edge_weight, graph.edge_attr):
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def part_of_graph(graph: Graph, comm: Communicator, method: str) -> Partition:
    """This rank's part of ``graph``: the whole graph on one rank, else partitioned here.

    Rank 0 assigns the owners (``method``, seed 0), says once that every rank partitions
    (:data:`IN_PROCESS_NOTE`) and sends the owners to every rank; each rank builds the parts
    in a private temporary directory, loads its own and removes the rest.
    """
    from fullgraph.partition import load_partition, whole_graph_part, write_partitions

    if comm.size == 1:  # the rows of the Data in the graph's own order
        return whole_graph_part(graph, order="global")
    from fullgraph.pyg.process import alike

    digests = comm.allgather_object(_graph_digest(graph))
    if len(set(digests)) != 1:
        error = ConfigError(
            "load_part: the ranks were given different graphs; give every rank the same"
        )
        error.alike = True  # type: ignore[attr-defined]
        raise error
    if comm.rank == 0:
        print(IN_PROCESS_NOTE.format(ranks=comm.size), file=sys.stderr, flush=True)
    assigned = alike(comm, lambda: _owners(graph, comm, method))
    owner, blocks = comm.allgather_object(assigned)[0]

    def build() -> Partition:
        tmp = tempfile.mkdtemp(prefix=f"fullgraph-part-{os.getpid()}-")
        try:
            out = os.path.join(tmp, "parts")
            write_partitions(
                graph, owner, out, method=method, seed=0, num_parts=comm.size, blocks=blocks
            )
            return load_partition(out, comm.rank, mmap=False, verify_checksums=False)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return alike(comm, build)


def _owners(
    graph: Graph, comm: Communicator, method: str
) -> tuple[np.ndarray, NodeBlocks | None] | None:
    """``(owner of every node, its node blocks)`` on rank 0 (``None`` elsewhere), as
    ``fullgraph partition`` and :func:`partition` assign them (``method``, seed 0: ``metis``
    cuts fixed node blocks, whose order the parts' rows then follow)."""
    from fullgraph.partition.build import assign_owners

    if comm.rank != 0:
        return None
    return assign_owners(graph, comm.size, method=method, seed=0)
