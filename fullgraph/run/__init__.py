"""The run wing: what every command that runs on ranks shares.

:mod:`~fullgraph.run.options` (runtime and run-output options), :mod:`~fullgraph.run.command`
(the :class:`~fullgraph.run.command.Command` scaffold and its :class:`~fullgraph.run.command.Job`),
:mod:`~fullgraph.run.epochs` (the epoch skeleton: gradient reduction, metrics, records),
:mod:`~fullgraph.run.optim` (Adam without ``torch._dynamo``), :mod:`~fullgraph.run.checkpoint`,
:mod:`~fullgraph.run.outputs` and :mod:`~fullgraph.run.log`. Full-batch training
(:mod:`fullgraph.training`), the mini-batch baseline (:mod:`fullgraph.minibatch`) and
``fullgraph.pyg`` build on it.
"""

from fullgraph.run.options import RunOptions, RuntimeOptions

__all__ = ["RunOptions", "RuntimeOptions"]
