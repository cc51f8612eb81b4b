"""Partitioning a graph into per-rank parts on disk, loading and verifying them.

Typical use::

    from fullgraph.partition import partition_graph, load_partition, verify_partitions

    meta = partition_graph(graph, num_parts=4, out="parts/arxiv-4", method="metis")
    part = load_partition("parts/arxiv-4", rank)      # one rank's arrays, memory-mapped
    verify_partitions("parts/arxiv-4", graph)         # raises PartitionError on any problem

The on-disk format (``meta.json`` plus ``part-<r>/*.npy``) is documented in
:mod:`fullgraph.partition.format`.
"""

from fullgraph.partition.assign import METHODS, assign_parts, symmetric_adjacency
from fullgraph.partition.build import partition_graph, write_partitions
from fullgraph.partition.format import FORMAT_VERSION, PART_ARRAYS, PartitionDir, read_meta
from fullgraph.partition.load import Partition, load_partition
from fullgraph.partition.report import format_report
from fullgraph.partition.verify import verify_partitions
from fullgraph.partition.whole import whole_graph_part

__all__ = [
    "FORMAT_VERSION",
    "METHODS",
    "PART_ARRAYS",
    "Partition",
    "PartitionDir",
    "assign_parts",
    "format_report",
    "load_partition",
    "partition_graph",
    "read_meta",
    "symmetric_adjacency",
    "verify_partitions",
    "whole_graph_part",
    "write_partitions",
]
