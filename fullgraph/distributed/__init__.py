"""The distributed wing: launch detection, communicators, halo exchange, compression, faults.

``create_communicator(transport, detect_launch())`` gives a rank its :class:`Communicator`;
:class:`~fullgraph.distributed.halo.HaloPlan` moves boundary rows between ranks every layer.
"""

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.connect import (
    TRANSPORTS,
    check_device,
    create_communicator,
    resolve_transport,
)
from fullgraph.distributed.launch import LaunchInfo, default_threads, detect_launch

__all__ = [
    "TRANSPORTS",
    "Communicator",
    "LaunchInfo",
    "check_device",
    "create_communicator",
    "default_threads",
    "detect_launch",
    "resolve_transport",
]
