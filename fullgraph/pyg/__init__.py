"""Bring your own PyG model: train it on P ranks with the one-process result.

A single-process PyG script becomes a P-rank one by changing five lines
(``examples/gcn_cora.py`` against ``examples/gcn_cora_distributed.py``)::

    from fullgraph import pyg                                # added
    data = pyg.load_part(data)          # this rank's part (or pyg.load_part("parts/cora-4"))
    model = pyg.distribute(GCN(...), data)  # twins of the PyG layers, the same parameters
    loss = pyg.loss(out, data)          # global training count; backward() sums the gradients
    accs = [pyg.accuracy(pred, data, m) for m in masks]     # counts over all ranks

- :func:`load_part` (:mod:`~fullgraph.pyg.part_data`): the rank's part as a PyG ``Data``
  (from a partition directory, or a whole graph: a ``Data`` with ``edge_index`` or ``adj_t``);
  :func:`partition` (:mod:`~fullgraph.pyg.sources`) writes a user's own graph's partition
  directory once, as ``fullgraph partition --pyg FILE`` does.
- importing ``fullgraph.pyg`` before torch sets the environment defaults of the ``fullgraph``
  commands (``OMP_WAIT_POLICY=PASSIVE``; :mod:`~fullgraph.pyg.process`, which also ends the
  whole job when a rank fails).
- :func:`distribute` (:mod:`~fullgraph.pyg.convert`, :mod:`~fullgraph.pyg.twins`): replaces
  ``GCNConv``, ``SAGEConv(aggr="mean" or "sum")``, ``GATConv``, ``GINConv``, ``BatchNorm`` and
  ``Dropout`` by distributed twins, keeps row-wise modules, walks containers and PyG's
  ``GCN`` / ``GraphSAGE`` / ``GAT`` / ``GIN`` models, refuses the rest naming the layer and why
  (the rules: ``rules.RULES``, the table of ``docs/pyg.md``); the converted model sums its
  gradients over the ranks at the end of every backward pass (:mod:`~fullgraph.pyg.runtime`).
  ``distribute(model, data, precision="bf16-mixed")`` (or ``"32"``, ``"auto"``) runs its
  weight products and aggregations on bfloat16 inputs, exactly across ranks (docs/pyg.md,
  "Precision").
- While its forward pass runs, ``F.dropout``, ``torch.dropout`` and ``nn.Dropout`` draw hashed
  masks (P ranks drop what one process drops) and other random draws are refused
  (:mod:`~fullgraph.pyg.functional`).
- :func:`loss`, :func:`accuracy`, :func:`dropout` (:mod:`~fullgraph.pyg.helpers`): the calls of
  a script that must see every rank.
- Link prediction (PyG's ``examples/link_pred.py``, ``examples/gae_cora_distributed.py``):
  ``load_part((train_data, val_data, test_data))`` of ``T.RandomLinkSplit`` gives each split's
  pairs at their first node's owner (:mod:`~fullgraph.pyg.link_data`); ``z[eli[0]]`` fetches
  the pairs' rows (:mod:`~fullgraph.pyg.pair_index`); :func:`negative_sampling` draws hashed
  pairs, the same at any rank count; :func:`gather` gives every rank's rows in global order.
- A script's own loss and metrics are exact too: the converted model's output, ``data.y`` and
  the masks are node rows (:mod:`~fullgraph.pyg.node_rows`), so ``F.cross_entropy(out[m],
  y[m])``, ``F.nll_loss``, the other ``torch.nn.functional`` losses, ``.sum()`` / ``.mean()``
  over nodes and ``(pred[m] == y[m]).sum() / m.sum()`` are taken over every rank; reductions
  that cannot be made exact (``std``, ``topk``, ``argmax`` over nodes, ...) are refused in one
  line (:mod:`~fullgraph.pyg.node_reductions`, docs/pyg.md "Your own losses and metrics").
"""

from fullgraph.pyg.process import set_defaults

set_defaults()  # OMP_WAIT_POLICY=PASSIVE, ... while OpenMP has not started (before torch loads)

from fullgraph.pyg.convert import distribute  # noqa: E402
from fullgraph.pyg.helpers import accuracy, dropout, loss  # noqa: E402
from fullgraph.pyg.link_data import gather, negative_sampling  # noqa: E402
from fullgraph.pyg.load import load_part  # noqa: E402
from fullgraph.pyg.part_data import PartGraph  # noqa: E402
from fullgraph.pyg.sources import partition  # noqa: E402

__all__ = [
    "PartGraph",
    "accuracy",
    "distribute",
    "dropout",
    "gather",
    "load_part",
    "loss",
    "negative_sampling",
    "partition",
]
