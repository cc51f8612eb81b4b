"""Datasets: the :class:`Graph` type, readers for data on disk, synthetic generators.

``load(name, root)`` reads any known dataset from ``<root>/<name with - as _>/``;
``fullgraph.datasets.synthetic.generate`` makes degree-corrected SBM graphs and ``write_ogb``
writes them in OGB layout; ``load_link_split(name, root)`` gives a link dataset's supervision
edges; ``to_pyg`` / ``from_pyg`` convert to and from PyG.
"""

from fullgraph.datasets.graph import Graph
from fullgraph.datasets.ogb_link import load_link_split
from fullgraph.datasets.pyg import from_pyg, to_pyg
from fullgraph.datasets.registry import KNOWN_NAMES, load, require_features

__all__ = [
    "KNOWN_NAMES",
    "Graph",
    "from_pyg",
    "load",
    "load_link_split",
    "require_features",
    "to_pyg",
]
