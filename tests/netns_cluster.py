"""A cluster of network namespaces for tests, benchmarks and fault drills.

The nodes are made by ``scripts/netns-cluster.sh``.

:class:`NetnsCluster` brings the nodes up and down (a context manager; ``down`` also runs when
the body fails) and builds the commands users run on a real cluster, with the namespace in
place of the machine:

- :meth:`NetnsCluster.mpirun` -- MPICH hydra with the cluster's host file and
  ``scripts/netns-exec.sh`` in place of ssh;
- :meth:`NetnsCluster.torchrun` -- one ``torchrun`` per node (static rendezvous on node 1);
- :meth:`NetnsCluster.torchrun_env` -- one process per rank with the variables torchrun sets
  (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT``), without its agent: quicker to start, and nothing between a rank's error and
  its exit status.

The benchmarks (``bench/multinode.py``) and ``scripts/netns_faults.py`` import it too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "scripts" / "netns-cluster.sh"
EXEC_SH = REPO / "scripts" / "netns-exec.sh"
BIN = Path(sys.executable).parent
STATE_ROOT = Path(os.environ.get("NETNS_CLUSTER_STATE", "/run/netns-cluster"))


def cannot_make_namespaces() -> str | None:
    """Why network namespaces cannot be made here (not root, no iproute2, the kernel or the
    container refuses), or ``None`` when they can (a throwaway namespace is made and removed)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (iproute2 is not installed)"
    probe = f"fgprobe{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def unique_prefix() -> str:
    """A node-name prefix no other run uses (``t`` + 6 hex digits)."""
    return "t" + uuid.uuid4().hex[:6]


@dataclass
class NetnsCluster:
    """``nodes`` namespaces joined by a bridge, each link shaped to ``rate``.

    Attributes:
        nodes: node count.
        rate: each link's rate in tc's syntax (``1gbit``, ``10gbit``).
        prefix: node names are ``prefix1..prefixN`` (also the namespaces); ``prefix0`` is the
            launcher's address on the bridge.
        subnet: the first three octets of the cluster's /24; ``None`` picks a free one.
        delay: one-way delay of each node's outgoing link (needs netem).
    """

    nodes: int
    rate: str = "10gbit"
    prefix: str = field(default_factory=unique_prefix)
    subnet: str | None = None
    delay: str = "0"

    # -- life ---------------------------------------------------------------------------------
    def up(self) -> NetnsCluster:
        """Create (or re-apply) the nodes; raises ``RuntimeError`` with the script's line."""
        tries = [self.subnet] if self.subnet else _free_subnets()
        err = ""
        for subnet in tries:
            r = self._script(
                "up",
                str(self.nodes),
                "--rate",
                self.rate,
                "--delay",
                self.delay,
                "--prefix",
                self.prefix,
                "--subnet",
                subnet,
            )
            if r.returncode == 0:
                self.subnet = subnet
                return self
            err = (r.stderr or r.stdout).strip()
            if "already in use" not in err:
                break
        raise RuntimeError(f"netns-cluster.sh up failed: {err}")

    def down(self) -> None:
        """End every process left in the nodes and remove everything ``up`` made."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._script("down", "--prefix", self.prefix)

    def __enter__(self) -> NetnsCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _script(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(CLUSTER_SH), *args], capture_output=True, text=True)

    # -- names --------------------------------------------------------------------------------
    def node(self, i: int) -> str:
        """Name (and namespace) of node ``i`` (0-based)."""
        return f"{self.prefix}{i + 1}"

    @property
    def head(self) -> str:
        """The launcher's name on the bridge (``-localhost`` of hydra)."""
        return f"{self.prefix}0"

    @property
    def hostfile(self) -> Path:
        """The mpirun host file (one node a line)."""
        return STATE_ROOT / self.prefix / "hostfile"

    def host_link(self, i: int) -> str:
        """The root-namespace end of node ``i``'s link."""
        return f"{self.prefix}{i + 1}h"

    # -- faults -------------------------------------------------------------------------------
    def set_link(self, i: int, up: bool) -> None:
        """Take node ``i``'s link down or bring it back."""
        state = "up" if up else "down"
        subprocess.run(["ip", "link", "set", self.host_link(i), state], check=True)

    def shape(self, i: int, rate: str | None = None, loss: str | None = None) -> None:
        """Change node ``i``'s link: its rate and/or the share of its packets lost."""
        args = ["shape", self.node(i)]
        if rate:
            args += ["--rate", rate]
        if loss:
            args += ["--loss", loss]
        r = self._script(*args)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip())

    def remove_node(self, i: int) -> None:
        """The node vanishes: its link first (no goodbye reaches the others), then every
        process in it, then its namespace. ``up()`` brings it back (empty)."""
        subprocess.run(["ip", "link", "del", self.host_link(i)], capture_output=True)
        for pid in self.pids([i]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "netns", "del", self.node(i)], capture_output=True)

    def pids(self, nodes: list[int] | None = None) -> list[int]:
        """Processes running in the given nodes (default all)."""
        out = []
        for i in range(self.nodes) if nodes is None else nodes:
            r = subprocess.run(
                ["ip", "netns", "pids", self.node(i)], capture_output=True, text=True
            )
            out += [int(p) for p in r.stdout.split()]
        return out

    # -- launch commands ----------------------------------------------------------------------
    def mpirun(self, ranks: int, per_node: int, argv: list[str]) -> list[str]:
        """``mpirun`` (MPICH hydra) of ``ranks`` ranks, ``per_node`` to a node, running ``argv``."""
        return [
            str(BIN / "mpirun"),
            "-launcher",
            "ssh",
            "-launcher-exec",
            str(EXEC_SH),
            "-f",
            str(self.hostfile),
            "-localhost",
            self.head,
            "-ppn",
            str(per_node),
            "-n",
            str(ranks),
            *argv,
        ]

    def torchrun(self, per_node: int, argv: list[str], port: int) -> list[list[str]]:
        """One ``torchrun`` per node (run them all at once); ``argv`` without ``python``."""
        return [
            [
                "ip",
                "netns",
                "exec",
                self.node(i),
                str(BIN / "torchrun"),
                "--nnodes",
                str(self.nodes),
                "--nproc-per-node",
                str(per_node),
                "--node-rank",
                str(i),
                "--master-addr",
                self.node(0),
                "--master-port",
                str(port),
                "--no-python",
                *argv,
            ]
            for i in range(self.nodes)
        ]

    def torchrun_env(self, per_node: int, argv: list[str], port: int) -> list[list[str]]:
        """One command per rank (rank order), each with torchrun's variables, in its node."""
        size = self.nodes * per_node
        return [
            [
                "ip",
                "netns",
                "exec",
                self.node(r // per_node),
                "env",
                f"RANK={r}",
                f"WORLD_SIZE={size}",
                f"LOCAL_RANK={r % per_node}",
                f"LOCAL_WORLD_SIZE={per_node}",
                f"MASTER_ADDR={self.node(0)}",
                f"MASTER_PORT={port}",
                *argv,
            ]
            for r in range(size)
        ]


def run_all(
    cmds: list[list[str]], timeout: float, env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess]:
    """Start ``cmds`` together, wait for all (killing every one after ``timeout`` seconds)."""
    procs = [
        subprocess.Popen(
            c,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        for c in cmds
    ]
    deadline = time.monotonic() + timeout
    out = []
    for p, c in zip(procs, cmds, strict=True):
        try:
            so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            so, se = p.communicate()
        out.append(subprocess.CompletedProcess(c, p.returncode, so, se))
    return out


def _free_subnets() -> list[str]:
    """A few /24 prefixes under 10.0.0.0/8 to try, random so that parallel runs differ."""
    rnd = uuid.uuid4().int
    return [f"10.{90 + (rnd >> (8 * k)) % 150}.{(rnd >> (8 * k + 4)) % 256}" for k in range(4)]
