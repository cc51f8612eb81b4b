"""The models wing: layer kinds (one file each), the layer stack, hashed dropout.

``GNN(kind, in_dim, hidden, out_dim, num_layers, dropout, input_dropout)`` stacks layers of a
registered kind (:func:`~fullgraph.models.layers.layer_kinds`); a rank runs it with its
:class:`~fullgraph.models.context.GraphContext`.
"""

from fullgraph.models.context import GraphContext
from fullgraph.models.gnn import GNN, load_parameter_vector, parameter_vector
from fullgraph.models.layers import GraphLayer, layer_class, layer_kinds, register_layer

__all__ = [
    "GNN",
    "GraphContext",
    "GraphLayer",
    "layer_class",
    "layer_kinds",
    "load_parameter_vector",
    "parameter_vector",
    "register_layer",
]
