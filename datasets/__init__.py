"""Datasets: the :class:`Graph` type, readers for data on disk, synthetic generators."""

from fullgraph.datasets.graph import Graph

__all__ = ["Graph"]
