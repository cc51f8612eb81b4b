"""Rank, size and threads of this process, read from the launcher's environment.

Launchers set different variables; we read, in order: MPICH / Intel MPI hydra (``PMI_RANK``,
``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``), Open MPI (``OMPI_COMM_WORLD_*``),
Slurm ``srun`` (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_STEP_TASKS_PER_NODE``
or ``SLURM_NTASKS_PER_NODE``) and ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``). Without any of them the process is a single rank.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from fullgraph.errors import ConfigError

#: The variables holding a rank's global rank and the job's size, per launcher.
RANK_VARIABLES = {
    "mpich": ("PMI_RANK", "PMI_SIZE"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS"),
    "torchrun": ("RANK", "WORLD_SIZE"),
}


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job.

    Attributes:
        rank: global rank in ``[0, size)``.
        size: number of ranks in the job.
        local_rank: rank among the processes on this node.
        local_size: number of ranks on this node.
        launcher: ``mpich``, ``openmpi``, ``slurm``, ``torchrun`` or ``none``.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str

    @property
    def under_mpi(self) -> bool:
        """True when an MPI process manager (hydra, ORTE/PRRTE or Slurm PMI) started us."""
        return self.launcher in ("mpich", "openmpi", "slurm")

    def to_dict(self) -> dict:
        """Plain-dict form, for logs and configs."""
        return asdict(self)

    def rank_processes(self, parent: int) -> dict[int, tuple[int, str]]:
        """The processes of this job's other ranks on this node, read from ``/proc``.

        They are the children of ``parent`` (the launcher's process on this node: hydra's
        proxy, the torchrun agent, slurmstepd) whose environment names a rank of a job of this
        size.

        Args:
            parent: the launcher's process id (this process's parent when it started).

        Returns:
            rank -> (pid, state), the state as ``/proc/PID/stat`` gives it (``R``, ``S``,
            ``D``, ``T`` stopped, ``t`` stopped by a debugger, ``Z`` exited); empty without a
            launcher or without ``/proc``.
        """
        if self.launcher not in RANK_VARIABLES:
            return {}
        rank_name, size_name = RANK_VARIABLES[self.launcher]
        found: dict[int, tuple[int, str]] = {}
        try:
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return {}
        for pid in pids:
            if pid == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
                if int(ppid) != parent:
                    continue
                env = _process_environ(pid)
            except (OSError, ValueError):
                continue
            rank, size = env.get(rank_name, ""), env.get(size_name, "")
            if rank.isdigit() and size == str(self.size):
                found[int(rank)] = (pid, state)
        return found


def _process_environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = f.read().split(b"\0")
    return dict(i.decode(errors="replace").partition("=")[::2] for i in items if b"=" in i)


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"launcher variable {name}={value!r} is not an integer") from None


def _slurm_local_size(env: Mapping[str, str]) -> int:
    """Tasks on this node: entry ``SLURM_NODEID`` of a ``2(x3),1`` style list (nodes 0-2 run
    2 tasks, node 3 runs 1), so that uneven steps get each node's own count."""
    node = int(env["SLURM_NODEID"]) if env.get("SLURM_NODEID", "").isdigit() else 0
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        if name not in env:
            continue
        counts: list[int] = []
        for item in env[name].split(","):
            count, _, repeat = item.partition("(x")
            if not count.isdigit() or not (repeat == "" or repeat.rstrip(")").isdigit()):
                counts = []
                break
            counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
        if counts:
            return counts[min(node, len(counts) - 1)]
    return 1


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read rank and size from the launcher's environment variables.

    Args:
        env: the environment to read (default ``os.environ``).

    Returns:
        The :class:`LaunchInfo`; a single rank when no launcher variables are set.

    Raises:
        ConfigError: a launcher variable is malformed or the rank is outside ``[0, size)``.
    """
    env = os.environ if env is None else env
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        rank, size = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
        local_rank = _int(env, "MPI_LOCALRANKID") if "MPI_LOCALRANKID" in env else rank
        local_size = _int(env, "MPI_LOCALNRANKS") if "MPI_LOCALNRANKS" in env else size
        info = LaunchInfo(rank, size, local_rank, local_size, "mpich")
    elif "OMPI_COMM_WORLD_RANK" in env:
        info = LaunchInfo(
            _int(env, "OMPI_COMM_WORLD_RANK"),
            _int(env, "OMPI_COMM_WORLD_SIZE"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
            "openmpi",
        )
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        info = LaunchInfo(
            _int(env, "SLURM_PROCID"),
            _int(env, "SLURM_NTASKS"),
            _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            _slurm_local_size(env),
            "slurm",
        )
    elif "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        info = LaunchInfo(
            _int(env, "RANK"),
            _int(env, "WORLD_SIZE"),
            _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1,
            "torchrun",
        )
    else:
        info = LaunchInfo(0, 1, 0, 1, "none")
    if not 0 <= info.rank < info.size or not 0 <= info.local_rank < max(info.local_size, 1):
        raise ConfigError(
            f"{info.launcher} launcher gave rank {info.rank} of {info.size} "
            f"(local {info.local_rank} of {info.local_size}): out of range"
        )
    return info


def default_threads(info: LaunchInfo, cores: int | None = None) -> int:
    """Threads per rank: the node's cores divided by the ranks on the node, at least one.

    Args:
        info: this process's launch information.
        cores: cores of the node (default ``os.cpu_count()``).

    Returns:
        The number of compute threads this rank should use.
    """
    if cores is None:
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, info.local_size))
