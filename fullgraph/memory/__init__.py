"""The memory wing: every rank's peak memory predicted from the sizes, before anything runs.

:mod:`~fullgraph.memory.model` (the prediction, term by term, and the process floor probe),
:mod:`~fullgraph.memory.shapes` (the sizes it reads), :mod:`~fullgraph.memory.ledger` (the live
buffers), :mod:`~fullgraph.memory.replay` (the training step replayed allocation by allocation
on shapes) with one replay per family of layer kinds (:mod:`~fullgraph.memory.linear`,
:mod:`~fullgraph.memory.gat`: attention's terms, :mod:`~fullgraph.memory.max_aggr`),
:mod:`~fullgraph.memory.minibatch` (the baseline's estimate) and :mod:`~fullgraph.memory.plan`
(the rule a run start applies: refuse, warn or off). It models the full-batch trainer, so it
sits above :mod:`fullgraph.training`.
"""
