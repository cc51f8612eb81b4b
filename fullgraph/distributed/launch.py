"""Rank, size and threads of this process, read from the launcher's environment.

Launchers set different variables; we read, in order: MPICH / Intel MPI hydra (``PMI_RANK``,
``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``), Slurm ``srun`` (``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_STEP_TASKS_PER_NODE`` or ``SLURM_NTASKS_PER_NODE``;
only in a task srun started, which has the step's variables such as ``SLURM_STEP_ID``: the
batch script of ``sbatch`` has ``SLURM_PROCID=0`` and the job's ``SLURM_NTASKS`` but is one
process), Open MPI (``OMPI_COMM_WORLD_*``) and ``torchrun`` (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``). Without any of them the process is a single rank.

``srun --mpi=pmi2`` also sets ``PMI_RANK`` and ``PMI_SIZE`` (and ``PMI_FD``, the socket of
slurmstepd's PMI server) but not hydra's ``MPI_LOCAL*``: those ranks are Slurm's, MPI-capable.
Under ``srun --mpi=none`` (Slurm's default ``MpiDefault``) there is no PMI: MPI would start
every task as a rank 0 of its own, so the job runs over ``gloo`` and meets at
:func:`rendezvous_endpoint`: the first node of the step, a port derived from the job id.
"""

from __future__ import annotations

import os
import re
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
        pmi: under ``slurm``, the process-management interface srun offers MPI: ``pmi2``
            (``--mpi=pmi2``: ``PMI_FD`` is set), ``pmix`` (``PMIX_RANK``) or ``none``; ``""``
            for the other launchers.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str
    pmi: str = ""

    @property
    def under_mpi(self) -> bool:
        """True when an MPI process manager (hydra, ORTE/PRRTE, or srun with a PMI) started us."""
        if self.launcher == "slurm":
            return self.pmi != "none"
        return self.launcher in ("mpich", "openmpi")

    def relaunch(self, ranks: int) -> str:
        """How to start ``ranks`` ranks with this process's launcher (for messages)."""
        if self.launcher == "slurm":
            return f"srun -n {ranks}"
        if self.launcher == "torchrun":
            return f"torchrun --nproc-per-node {ranks} (over all nodes: {ranks} in all)"
        return f"mpirun -n {ranks}"

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


def _slurm_step(env: Mapping[str, str]) -> bool:
    """Whether this process is a task of a job step that srun started (not the batch script,
    which has ``SLURM_PROCID`` and ``SLURM_NTASKS`` too but none of the step's variables)."""
    return any(name in env for name in _SLURM_STEP_VARIABLES)


#: Variables srun sets in every task of a step and sbatch not in the batch script.
_SLURM_STEP_VARIABLES = (
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_NUM_TASKS",
)


def _slurm_pmi(env: Mapping[str, str]) -> str:
    """The PMI srun offers the task: ``pmix`` (``--mpi=pmix``), ``pmi2`` (``--mpi=pmi2``, whose
    server in slurmstepd also answers the PMI-1 wire protocol), or ``none``."""
    if "PMIX_RANK" in env or "PMIX_NAMESPACE" in env:
        return "pmix"
    if "PMI_FD" in env or "PMI_PORT" in env:
        return "pmi2"
    return "none"


def expand_hostlist(nodelist: str, limit: int = 2) -> list[str]:
    """The first ``limit`` hosts of a Slurm host list, in Slurm's order.

    ``fgn[1-2]`` -> ``fgn1, fgn2``; ``node[07,09-12],gpu3`` -> ``node07, node09, ...``;
    ``rack[2-3]-n[5-6]`` -> ``rack2-n5, rack2-n6, ...``; ``a,b`` -> ``a, b`` (what
    ``scontrol show hostnames`` prints).

    Args:
        nodelist: ``SLURM_STEP_NODELIST`` or ``SLURM_JOB_NODELIST``.
        limit: how many hosts at most (a list may name thousands).

    Raises:
        ConfigError: an empty or malformed list.
    """
    bad = ConfigError(f"malformed Slurm host list {nodelist!r}")
    items, depth, cur = [], 0, ""
    for ch in nodelist.strip():
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise bad
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth or not cur:
        raise bad
    hosts: list[str] = []
    for item in [*items, cur]:
        parts = re.split(r"\[([^\]]*)\]", item)  # text, ranges, text, ranges, ..., text
        names = [""]
        for i, part in enumerate(parts):
            if i % 2 == 0:
                names = [n + part for n in names]
                continue
            values: list[str] = []
            for r in part.split(","):
                lo, _, hi = r.partition("-")
                if not lo.isdigit() or not (hi == "" or hi.isdigit()):
                    raise bad
                for v in range(int(lo), int(hi or lo) + 1):
                    values.append(str(v).zfill(len(lo)))
                    if len(values) >= limit:
                        break
            names = [n + v for n in names for v in values][:limit]
        if not names or not names[0]:
            raise bad
        hosts += names
        if len(hosts) >= limit:
            break
    return hosts[:limit]


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list (:func:`expand_hostlist`)."""
    return expand_hostlist(nodelist, 1)[0]


#: Ports of the Slurm rendezvous: ``SLURM_PORT_BASE + (job id % 1500) * 10 + step id % 10``, in
#: 15000..29999 (below Linux's ephemeral ports, 32768 on).
SLURM_PORT_BASE = 15000


def slurm_port(job_id: int, step_id: int) -> int:
    """The rendezvous port of a job step: the same on every task, different for the steps of a
    job that run at once (up to 10) and for jobs whose ids are less than 1500 apart."""
    return SLURM_PORT_BASE + (job_id % 1500) * 10 + step_id % 10


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of a job meet for ``gloo`` / ``nccl`` without MPI.

    Attributes:
        host: the address or name of the node whose process opens the store.
        port: its TCP port.
        opens_store: whether this process opens the store (the others connect to it).
        source: where ``host`` and ``port`` came from, for messages.
        route_to: on the rendezvous node, another node of the step (see
            :attr:`interface_host`).
    """

    host: str
    port: int
    opens_store: bool
    source: str
    route_to: str = ""

    @property
    def interface_host(self) -> str:
        """The host whose route picks this rank's interface for gloo: ``route_to`` when set
        (ranks on the rendezvous node itself, whose own name may resolve to a loopback address
        there), else ``host``."""
        return self.route_to or self.host


def rendezvous_endpoint(
    info: LaunchInfo, env: Mapping[str, str] | None = None
) -> Rendezvous | None:
    """The rendezvous a launcher's variables name, or ``None`` (an MPI launcher: rank 0 picks an
    address and publishes it over MPI; one rank: a local store).

    - ``torchrun``: ``MASTER_ADDR`` and ``MASTER_PORT`` (default 29500); rank 0 opens the store
      unless the torchrun agent already runs one.
    - ``srun`` without a PMI (``--mpi=none``): ``MASTER_ADDR`` / ``MASTER_PORT`` when both are
      set; else the first node of ``SLURM_STEP_NODELIST`` (``SLURM_JOB_NODELIST`` outside a
      step) and :func:`slurm_port` of ``SLURM_JOB_ID`` and ``SLURM_STEP_ID``. The task with
      ``SLURM_NODEID`` 0 and ``SLURM_LOCALID`` 0 (on that node) opens the store; the ranks on
      that node pick their gloo interface by the route to the second node.

    Args:
        info: this process's launch information.
        env: the environment to read (default ``os.environ``).

    Raises:
        ConfigError: srun's variables lack the node list or the job id, or are malformed.
    """
    env = os.environ if env is None else env
    if info.launcher == "torchrun":
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500
        opens = info.rank == 0 and not agent
        return Rendezvous(env["MASTER_ADDR"], port, opens, "MASTER_ADDR:MASTER_PORT")
    if info.launcher != "slurm" or info.under_mpi or info.size == 1:
        return None
    node0 = env.get("SLURM_NODEID", "0") == "0" and info.local_rank == 0
    opens = node0 if "SLURM_NODEID" in env else info.rank == 0
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        port = _int(env, "MASTER_PORT")
        return Rendezvous(env["MASTER_ADDR"], port, opens, "MASTER_ADDR:MASTER_PORT")
    lists = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    name = next((n for n in lists if env.get(n)), None)
    if name is None or "SLURM_JOB_ID" not in env:
        raise ConfigError(
            "srun started the ranks without a PMI (--mpi=none) and without SLURM_STEP_NODELIST "
            "or SLURM_JOB_ID to meet at: set MASTER_ADDR and MASTER_PORT"
        )
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "0"))
    port = slurm_port(_int(env, "SLURM_JOB_ID"), int(step) if step.isdigit() else 0)
    source = f"first node of {name}, port from SLURM_JOB_ID"
    hosts = expand_hostlist(env[name], 2)
    # On the first node its own name may resolve to 127.0.1.1 (Debian's /etc/hosts): the
    # interface that reaches the second node is the one the others reach this node by.
    on_first = env.get("SLURM_NODEID", "") == "0" or env.get("SLURMD_NODENAME") == hosts[0]
    route_to = hosts[1] if on_first and len(hosts) > 1 else ""
    return Rendezvous(hosts[0], port, opens, source, route_to)


def mpi_start_environment(
    info: LaunchInfo, library_version: str, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Variables to set before ``MPI_Init`` for this launcher and MPI library (often none).

    Under ``srun --mpi=pmi2`` MPICH speaks the PMI-1 wire protocol to slurmstepd, whose PMI-1
    server takes each request from a single ``read`` of 1024 bytes (Slurm 22.05 ``pmi1.c``,
    ``handle_pmi1_cmd``) although it announces values of up to 1024 characters: a longer
    request arrives in two reads and is refused or misread (``mpi/pmi2: value not properly
    terminated in client request``). MPICH's UCX network module publishes its worker address
    (about 3 KB) in segments of up to 1024 characters, run-length encoded, so whether a line
    passes depends on the address's bytes: 5 of 10 starts of ``fullgraph train`` on 2 nodes
    hit it, 2 of them failed. The OFI module's address is one short request (78 bytes): MPICH
    with an OFI device gets ``MPIR_CVAR_CH4_NETMOD=ofi`` unless the user chose a module.

    Args:
        info: this process's launch information.
        library_version: ``MPI.Get_library_version()`` (callable before ``MPI_Init``).
        env: the environment to read (default ``os.environ``).

    Returns:
        Name -> value of the variables to set (none already set by the user).
    """
    env = os.environ if env is None else env
    if info.launcher != "slurm" or info.pmi != "pmi2" or "MPIR_CVAR_CH4_NETMOD" in env:
        return {}
    if not library_version.startswith("MPICH Version:"):
        return {}
    device = next((ln for ln in library_version.splitlines() if ln.startswith("MPICH Device:")), "")
    return {"MPIR_CVAR_CH4_NETMOD": "ofi"} if "ofi" in device else {}


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
    slurm_task = "SLURM_PROCID" in env and "SLURM_NTASKS" in env and _slurm_step(env)
    hydra = "MPI_LOCALNRANKS" in env or "MPI_LOCALRANKID" in env
    if slurm_task and not hydra and env.get("PMI_RANK", env["SLURM_PROCID"]) == env["SLURM_PROCID"]:
        info = LaunchInfo(
            _int(env, "SLURM_PROCID"),
            _int(env, "SLURM_NTASKS"),
            _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            _slurm_local_size(env),
            "slurm",
            _slurm_pmi(env),
        )
    elif "PMI_RANK" in env and "PMI_SIZE" in env:
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
