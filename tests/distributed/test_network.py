"""Interfaces, the rendezvous address, peer probes, and a set-up bounded by ``--timeout``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from fullgraph.distributed import Communicator
from fullgraph.distributed.network import (
    Interface,
    PeerProbe,
    interface_for,
    interfaces,
    reachable_address,
    rendezvous_address,
    use_interface_for,
    wait_for_listener,
)
from fullgraph.errors import PeerUnreachable

LO = Interface("lo", "127.0.0.1", 8, True)


def node(address: str, name: str = "eth0", prefix: int = 24) -> list[Interface]:
    return [LO, Interface(name, address, prefix, False)]


def test_interfaces_include_loopback_and_route_to_it() -> None:
    names = {i.name: i for i in interfaces()}
    assert any(i.loopback and i.address.startswith("127.") for i in names.values())
    assert interface_for("127.0.0.1").loopback
    assert interface_for("no-such-host.invalid") is None


def test_explicit_interface_wins_and_route_is_used_otherwise() -> None:
    env = {"GLOO_SOCKET_IFNAME": "ib0"}
    assert use_interface_for("127.0.0.1", env) == "ib0" and env["GLOO_SOCKET_IFNAME"] == "ib0"
    env = {}
    lo = use_interface_for("127.0.0.1", env)
    assert lo == env["GLOO_SOCKET_IFNAME"] and lo == interface_for("127.0.0.1").name
    env = {"GLOO_SOCKET_IFNAME": ""}  # empty counts as unset
    assert use_interface_for("127.0.0.1", env) == lo


def test_rendezvous_address_is_one_every_rank_reaches() -> None:
    # All ranks on rank 0's host: loopback.
    one_host = node("192.168.1.5")
    assert rendezvous_address([one_host, one_host]) == "127.0.0.1"
    # Rank 0 has a docker bridge first and the cluster network second: the cluster address,
    # though the docker address comes first and every host has the same docker address.
    docker = Interface("docker0", "172.17.0.1", 16, False)
    r0 = [LO, docker, Interface("eth0", "10.77.0.1", 24, False)]
    r1 = [LO, docker, Interface("eth0", "10.77.0.2", 24, False)]
    assert rendezvous_address([r0, r0, r1, r1]) == "10.77.0.1"
    # The host name's address first when it qualifies.
    r0b = [LO, Interface("ib0", "10.1.0.1", 16, False), Interface("eth0", "10.77.0.1", 24, False)]
    r1b = [LO, Interface("ib0", "10.1.0.2", 16, False), Interface("eth0", "10.77.0.2", 24, False)]
    assert rendezvous_address([r0b, r1b]) == "10.1.0.1"
    assert rendezvous_address([r0b, r1b], hostname_address="10.77.0.1") == "10.77.0.1"
    # A routed network (no shared subnet): rank 0's first address anyway.
    assert rendezvous_address([node("10.1.0.1"), node("10.2.0.1")]) == "10.1.0.1"


def test_reachable_address_of_a_peer() -> None:
    mine = node("10.77.0.1")
    assert reachable_address(mine, mine) == "127.0.0.1"
    assert reachable_address(node("10.77.0.2"), mine) == "10.77.0.2"
    assert reachable_address(node("10.9.0.2"), mine) == "10.9.0.2"
    docker = Interface("docker0", "172.17.0.1", 16, False)
    theirs = [LO, docker, Interface("eth0", "10.77.0.2", 24, False)]
    assert reachable_address(theirs, [*mine, docker]) == "10.77.0.2"


def test_probe_names_the_peer_that_is_gone() -> None:
    probes = [PeerProbe() for _ in range(3)]
    endpoints = [p.endpoint for p in probes]
    probes[0].set_peers(endpoints, 0)
    assert probes[0].unreachable() == {}
    probes[2].close()
    gone = probes[0].unreachable(timeout_s=2.0)
    assert list(gone) == [2] and "refused" in gone[2]
    for p in probes[:2]:
        p.close()


def test_wait_for_listener_is_bounded() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        t0 = time.monotonic()
        error = wait_for_listener("127.0.0.1", port, time.monotonic() + 0.5)
        assert error is not None and time.monotonic() - t0 < 3.0
        s.listen(1)
        assert wait_for_listener("127.0.0.1", port, time.monotonic() + 2.0) is None


class Stalled(Communicator):
    """Two ranks whose all-to-all never completes; the peer's probe socket is closed."""

    def __init__(self) -> None:
        super().__init__(rank=1, size=2, timeout_s=0.1)
        peer = PeerProbe()
        self.probe = PeerProbe()
        self.probe.set_peers([peer.endpoint, self.probe.endpoint], 1)
        peer.close()

    def _alltoallv(self, send, recv, send_rows, recv_rows):  # type: ignore[no-untyped-def]
        def wait() -> None:
            raise TimeoutError("MPI all-to-all did not complete within 0.1 s")

        return wait


def test_a_stalled_collective_names_the_unreachable_rank() -> None:
    comm = Stalled()
    pending = comm.alltoallv_start(torch.zeros(2, 1), [1, 1], [1, 1])
    expected = r"all-to-all did not complete within 0.1 s; unreachable: rank 0 \(127.0.0.1: conn"
    with pytest.raises(PeerUnreachable, match=expected) as err:
        pending.wait()
    assert err.value.unreachable.keys() == {0} and err.value.speaker  # rank 1 answers alone
    assert err.value.exit_code == 4
    comm.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_peer_that_never_comes_ends_the_rank_within_the_timeout(small_partitions, rank) -> None:
    """torchrun's variables, world size 2, only one rank started: one line, exit 4, bounded."""
    env = {
        **os.environ,
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "fullgraph.cli",
        "train",
        "--parts",
        str(small_partitions[2]),
        "--transport",
        "gloo",
        "--timeout",
        "3",
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 4, r.stderr
    assert len(lines) == 1, r.stderr
    if rank == 0:
        assert "rank 0: rank 1 never joined the rendezvous at 127.0.0.1" in lines[0]
    else:
        assert "rank 1: could not reach the rendezvous 127.0.0.1" in lines[0]
