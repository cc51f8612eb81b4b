"""fullgraph: full-batch distributed GNN training with exact full-graph gradients."""

__version__ = "0.1.0"
