"""The graph convolution of Morris et al. (PyG ``GraphConv(aggr=...)``):
``Y = aggr_{j in N(i)} H_j W_rel + b_rel + H_i W_root`` with ``aggr`` the sum (the default),
the mean or the maximum over the incoming neighbours (``--aggr``; no edge weights).

It is the SAGE layer's formula with another default aggregation (``lin_rel`` holds the bias,
``lin_root`` none, as ``lin_l`` and ``lin_r``), so the classes here are
:mod:`~fullgraph.models.layers.sage`'s under another name: the same body, operators and
distribution; ``lin`` is PyG's ``lin_rel`` and ``root`` its ``lin_root``.
"""

from __future__ import annotations

from typing import ClassVar

from fullgraph.models.layers.base import PygExport, register_layer
from fullgraph.models.layers.sage import MaxAggregation, SAGELayer, SAGESumLayer


@register_layer
class GraphConvLayer(SAGESumLayer):
    """``sum(H_N(i)) W_rel + b_rel + H_i W_root`` (the sum; see :meth:`SAGELayer.variant`).

    Args:
        in_dim: input width.
        out_dim: output width.

    Shapes:
        - input: [num_inner, in_dim] -> [num_inner, out_dim]

    Attributes:
        lin: ``W_rel``, ``b_rel`` (PyG's ``lin_rel``).
        root: ``W_root``, no bias (PyG's ``lin_root``).
    """

    kind = "graphconv"
    pyg = PygExport(  # PyG has no BasicGNN of GraphConv layers
        conv="GraphConv",
        name="GraphConv",
        keys={
            "lin_rel.weight": "lin.weight",
            "lin_rel.bias": "lin.bias",
            "lin_root.weight": "root.weight",
        },
    )
    VARIANTS: ClassVar[dict[str, type[SAGELayer]]] = {}


class GraphConvMeanLayer(GraphConvLayer):
    """:class:`GraphConvLayer` with the mean over the incoming neighbours."""

    aggr = "mean"
    operator = staticmethod(SAGELayer.operator)


class GraphConvMaxLayer(MaxAggregation, GraphConvLayer):
    """:class:`GraphConvLayer` with the maximum over the incoming neighbours."""


GraphConvLayer.VARIANTS = {
    "sum": GraphConvLayer,
    "mean": GraphConvMeanLayer,
    "max": GraphConvMaxLayer,
}
