"""The propagation operators of a part, split into inner and halo columns.

Every operator here is one a layer kind already builds, or its normalisation without the
self-loop, over the part's rows (rows = inner nodes, columns = local ids: inner first, then
halo) with GLOBAL degrees, so that a rank's rows are one process's rows:

- ``gcn``: ``D^-1/2 (A + I) D^-1/2`` (:meth:`GCNLayer.operator
  <fullgraph.models.layers.gcn.GCNLayer.operator>`, PyG's ``gcn_norm``; SGC's and APPNP's);
- ``mean``: the mean over the incoming neighbours (SAGE's mean);
- ``sym``: ``D^-1/2 A D^-1/2`` without self-loops, ``D`` the in-degrees (PyG's
  ``gcn_norm(add_self_loops=False)``: the SIGN transform's, label propagation's and Correct &
  Smooth's); a node without in-edges has an empty row and weighs 0 as a source.

:func:`propagation_operator` gives one by name as a
:class:`~fullgraph.distributed.halo.SplitOperator` (every row in ascending column order, what
:class:`~fullgraph.distributed.halo.HaloAggregate` sums in ascending global id);
:func:`split_columns` is the split itself, shared with the layers' operators
(:func:`fullgraph.training.assembly.build_operator`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fullgraph.distributed.split_operator import SplitOperator
from fullgraph.errors import ConfigError
from fullgraph.kernels import CSRMatrix
from fullgraph.models.layers import LayerOptions, layer_class
from fullgraph.models.local_graph import in_degree, local_csr

if TYPE_CHECKING:
    from fullgraph.partition import Partition

#: The operators :func:`propagation_operator` builds.
OPERATORS = ("gcn", "mean", "sym")


def split_columns(a: CSRMatrix, num_inner: int) -> SplitOperator:
    """Split ``a`` (rows = inner, columns = inner + halo) into its inner and halo blocks.

    Both blocks keep every row's entries in ascending column order.
    """
    a = a.sorted_by_column()
    index_dtype = torch.int32 if a.num_cols < 2**31 else torch.int64
    inner = a.select_columns(torch.arange(num_inner)).with_indices(index_dtype)
    if a.num_cols == num_inner:
        return SplitOperator(inner, None)
    halo = a.select_columns(torch.arange(num_inner, a.num_cols)).with_indices(index_dtype)
    return SplitOperator(inner, halo)


def sym_matrix(part: Partition) -> CSRMatrix:
    """``D^-1/2 A D^-1/2`` over the part's rows, no self-loops, GLOBAL in-degrees (PyG's
    ``gcn_norm(add_self_loops=False)``: an entry touching a zero degree weighs 0)."""
    deg = in_degree(part)
    return local_csr(part).gcn_normalized(deg[: int(part.num_inner)], deg)


def propagation_matrix(part: Partition, name: str) -> CSRMatrix:
    """The operator ``name`` (:data:`OPERATORS`) over the part's rows, unsplit.

    Raises:
        ConfigError: an operator this module does not have (the known ones named).
    """
    if name == "gcn":
        return layer_class("gcn").operator(part, LayerOptions())
    if name == "mean":
        options = LayerOptions(aggr="mean")
        return layer_class("sage").variant(options).operator(part, options)
    if name == "sym":
        return sym_matrix(part)
    raise ConfigError(f"unknown propagation operator {name!r} (choose from {', '.join(OPERATORS)})")


def propagation_operator(part: Partition, name: str) -> SplitOperator:
    """The propagation operator ``name`` of this rank's rows, split into inner and halo columns.

    Args:
        part: this rank's part (one process: the whole graph's).
        name: ``gcn``, ``mean`` or ``sym`` (:data:`OPERATORS`).

    Returns:
        The :class:`~fullgraph.distributed.halo.SplitOperator` (on the CPU, float32 values).

    Raises:
        ConfigError: an operator this module does not have.
    """
    return split_columns(propagation_matrix(part, name), int(part.num_inner))
