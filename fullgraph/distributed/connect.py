"""Building the communicator of a transport from the launcher's rank and size."""

from __future__ import annotations

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.launch import LaunchInfo
from fullgraph.errors import ConfigError

TRANSPORTS = ("local", "mpi", "gloo", "nccl")


def resolve_transport(transport: str, info: LaunchInfo) -> str:
    """The transport ``auto`` stands for: ``mpi`` for several ranks under an MPI launcher,
    ``gloo`` for several ranks under ``torchrun``, else ``local``; other names as given."""
    if transport != "auto":
        return transport
    if info.size == 1:
        return "local"
    return "mpi" if info.under_mpi else "gloo"


def check_device(device: str, transport: str) -> None:
    """Refuse a device that does not exist, or that the transport cannot move tensors of.

    Args:
        device: where tensors live (``cpu``, ``cuda``, ``cuda:N``).
        transport: the resolved transport.

    Raises:
        ConfigError: CUDA asked where torch sees none, or ``mpi`` with a GPU device.
    """
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}, but torch {torch.__version__} sees no CUDA device")
    if transport == "mpi" and device != "cpu":
        raise ConfigError("transport mpi exchanges host buffers: use --device cpu (or nccl)")


def create_communicator(
    transport: str, info: LaunchInfo, timeout_s: float = 300.0, label: str = "fullgraph"
) -> Communicator:
    """Build the communicator for ``transport`` from the launcher's rank and size.

    Set-up is bounded by ``timeout_s`` like every collective; with several ranks every rank
    also opens its probe socket (:meth:`Communicator.start_probe`), so that a later timeout
    names the peers that stopped answering.

    Args:
        transport: ``local``, ``mpi``, ``gloo`` or ``nccl``.
        info: rank and size read by :func:`fullgraph.distributed.launch.detect_launch`.
        timeout_s: seconds the set-up and any collective may wait.
        label: prefix of a message a set-up watchdog prints (``fullgraph train``).

    Returns:
        The communicator; ``local`` is only valid for a single rank.

    Raises:
        ConfigError: unknown transport, ``local`` with several ranks, or ``mpi`` outside an
            MPI launcher with several ranks.
        PeerUnreachable: a rank could not be reached during set-up.
    """
    if transport not in TRANSPORTS:
        raise ConfigError(f"unknown transport {transport!r} (choose from {', '.join(TRANSPORTS)})")
    if transport == "local":
        if info.size != 1:
            raise ConfigError(
                f"transport local runs one rank, but the launcher started {info.size}"
            )
        return Communicator(0, 1, timeout_s)
    if transport == "mpi":
        from fullgraph.distributed.mpi import MPICommunicator

        if info.size > 1 and info.launcher == "slurm" and not info.under_mpi:
            raise ConfigError(
                "transport mpi needs a PMI, but srun started the ranks without one "
                "(--mpi=none): run srun --mpi=pmi2, or use --transport gloo"
            )
        if info.size > 1 and not info.under_mpi:
            raise ConfigError(
                f"transport mpi needs an MPI launcher, but {info.launcher} started us"
            )
        comm = MPICommunicator(timeout_s)
        if (comm.rank, comm.size) != (info.rank, info.size):
            raise ConfigError(
                f"MPI sees rank {comm.rank} of {comm.size} but the launcher says "
                f"{info.rank} of {info.size}"
            )
        comm.start_probe()
        return comm
    from fullgraph.distributed.torch_distributed import TorchCommunicator

    return TorchCommunicator(transport, info, timeout_s, label)
