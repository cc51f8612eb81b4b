"""The training wing: full-batch training only: the experiment's configuration, the rank
assembler (a part -> what a rank trains on) and the trainer.

``Trainer(part, comm, TrainConfig(...), RunOptions(...))`` is the Python API; ``RunOptions``
(from :mod:`fullgraph.run`) is re-exported here because the trainer takes it.
"""

from fullgraph.run.options import RunOptions, RuntimeOptions
from fullgraph.training.config import TrainConfig, TrainData
from fullgraph.training.trainer import Trainer

__all__ = ["RunOptions", "RuntimeOptions", "TrainConfig", "TrainData", "Trainer"]
