"""The mini-batch wing: the neighbour-sampling GraphSAGE baseline full-batch is compared with.

It shares the layers (:mod:`fullgraph.models`), the job scaffold and the epoch skeleton
(:mod:`fullgraph.training`) with full-batch training, so that the comparison is like for like.
"""

from fullgraph.minibatch.config import MinibatchConfig, MinibatchData
from fullgraph.minibatch.trainer import MinibatchTrainer

__all__ = ["MinibatchConfig", "MinibatchData", "MinibatchTrainer"]
