"""The memory of a ``fullgraph minibatch`` rank, estimated from the sizes (no tensor built).

The mini-batch baseline (:mod:`fullgraph.minibatch`) has no replay of its own; what grows with
its options is counted here, in the terms of :data:`~fullgraph.memory.model.TERMS`,
so that ``fullgraph minibatch`` refuses a run that cannot fit by the rule ``fullgraph train``
uses (:func:`fullgraph.memory.plan.check_minibatch`):

- **gradients + optimiser state**: the parameters of the ``sage`` model (its meta-device copy,
  :meth:`fullgraph.models.gnn.GNN`), their gradients, Adam's two moments and the flat vectors
  of the first broadcast and the gradient all-reduce: ``(4 + 4 + 8 + 8) p`` bytes;
- **layer temporaries**: the exact layer-wise evaluation
  (:func:`~fullgraph.minibatch.inference.layerwise_inference`), the largest layer: this rank's
  ``N/P`` rows of the layer's input, its neighbour sums (or transformed rows), its output and
  one broadcast chunk (:data:`~fullgraph.minibatch.inference.CHUNK_VALUES`);
- **graph structure**: the sampler's node map (``8 N``) and this rank's rows of the operator;
- **features**: the labels and masks every rank copies (``11 N``), and, once per node (the
  ranks of a machine share the memory-mapped arrays), the graph's features and CSR;
- **process floor**: given (the process as it is when the check runs: a lower bound).

Not counted: the sampled blocks of a training step (they depend on the sampling; with the
default fanouts and batch size they are far smaller than the evaluation's rows), so the total
is a lower bound of the peak.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fullgraph.memory.model import TERMS, Prediction

if TYPE_CHECKING:
    from fullgraph.minibatch.config import MinibatchConfig

F32, I64 = 4, 8


def predict_minibatch(
    num_nodes: int,
    num_edges: int,
    num_features: int,
    num_classes: int,
    cfg: MinibatchConfig,
    ranks: int,
    ranks_per_node: int,
    floor: int,
) -> list[Prediction]:
    """The estimated peak of every rank of a mini-batch run (see the module docstring).

    Args:
        num_nodes: ``N``.
        num_edges: stored edges of the graph's CSR.
        num_features: ``F``.
        num_classes: ``C``.
        cfg: the run's :class:`~fullgraph.minibatch.config.MinibatchConfig`.
        ranks: ``P``.
        ranks_per_node: ranks sharing a node (the graph's arrays are counted on the first).
        floor: the process floor, bytes.

    Returns:
        One :class:`~fullgraph.memory.model.Prediction` per rank (phase
        ``evaluation``).
    """
    import torch

    from fullgraph.minibatch.inference import CHUNK_VALUES
    from fullgraph.models.gnn import GNN

    with torch.device("meta"):
        model = GNN(
            "sage",
            num_features,
            cfg.hidden,
            num_classes,
            len(cfg.fanouts),
            cfg.dropout,
            cfg.resolved_input_dropout(),
        )
    params = sum(q.numel() for q in model.parameters())
    dims = list(model.dims)
    rows = math.ceil(num_nodes / ranks)
    evaluation = 0
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        width = min(d_in, d_out)
        source = 0 if i == 0 else rows * d_in  # the first layer reads the shared features
        sums = rows * width
        out = 0 if d_out == d_in else rows * d_out
        chunk = min(CHUNK_VALUES, num_nodes * width)
        evaluation = max(evaluation, F32 * (source + sums + out + chunk))
    shared = F32 * num_nodes * num_features + I64 * (num_nodes + 1 + num_edges)
    preds = []
    for rank in range(ranks):
        terms = dict.fromkeys(TERMS, 0)
        terms["optimizer"] = (4 + 4 + 8 + 8) * params
        terms["working"] = evaluation
        terms["structure"] = I64 * num_nodes + (I64 + F32) * rows
        terms["features"] = 11 * num_nodes + (shared if rank % ranks_per_node == 0 else 0)
        terms["floor"] = floor
        preds.append(Prediction(rank=rank, phase="evaluation", terms=terms))
    return preds
