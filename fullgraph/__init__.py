"""fullgraph: full-batch distributed GNN training with exact full-graph gradients.

``fullgraph.evaluate(input_dict, metric)`` scores predictions with OGB's ``Evaluator``
convention (:func:`fullgraph.metrics.evaluate`); it is imported on first use, so that
``import fullgraph`` stays light.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "evaluate"]


def __getattr__(name: str) -> object:
    if name == "evaluate":
        from fullgraph.metrics import evaluate

        return evaluate
    raise AttributeError(f"module 'fullgraph' has no attribute {name!r}")
