"""The training wing: configuration, per-rank assembly, the trainer and its epoch skeleton,
checkpoints, outputs and the job scaffold that ``fullgraph train`` and ``fullgraph minibatch``
share.
"""

from fullgraph.training.config import TrainConfig, TrainData
from fullgraph.training.job import RunOptions, RuntimeOptions
from fullgraph.training.trainer import Trainer

__all__ = ["RunOptions", "RuntimeOptions", "TrainConfig", "TrainData", "Trainer"]
