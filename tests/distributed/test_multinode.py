"""Two nodes for real: ranks in separate network namespaces, over veth links shaped with tc.

One epoch of ``fullgraph train`` on a tiny graph, two ranks on two nodes, launched as on a
cluster: ``mpirun`` with a host file and ``scripts/netns-exec.sh`` in place of ssh (transport
mpi), and torchrun's variables with the rendezvous on node 1 (transport gloo: each rank finds
the interface that routes there by itself, although the host name resolves to a loopback
address). Both must give the one-process loss. Skips only where namespaces cannot be made (not
root, no iproute2, a container without CAP_NET_ADMIN); the namespaces have names unique to
the run and are removed whatever happens.

Enters through :mod:`fullgraph.distributed.launch` and :mod:`fullgraph.distributed.network`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from netns_cluster import (
    STATE_ROOT,
    NetnsCluster,
    cannot_make_namespaces,
    run_all,
    unique_prefix,
)

from fullgraph.distributed.launch import LaunchInfo, default_threads

REASON = cannot_make_namespaces()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"no namespace cluster: {REASON}")
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

ARGS = ["train", "--epochs", "1", "--hidden", "16", "--quiet", "--timeout", "30"]


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> NetnsCluster:
    c = NetnsCluster(nodes=2, rate="1gbit")
    request.addfinalizer(c.down)  # registered first: it runs even if up() fails half-way
    return c.up()


def fullgraph(*args: str) -> list[str]:
    return [sys.executable, "-m", "fullgraph.cli", *args]


def check_launch(log: Path, transport: str, launcher: str) -> None:
    """Two ranks, one per node: each is alone on its node and gets all of the node's cores."""
    final = [json.loads(line) for line in log.read_text().splitlines()][-1]
    assert final["ranks"] == 2 and final["transport"] == transport
    resolved = json.loads(log.with_name(log.stem + ".config.json").read_text())
    assert resolved["launch"]["launcher"] == launcher
    assert (resolved["launch"]["size"], resolved["launch"]["local_size"]) == (2, 1)
    assert resolved["threads_per_rank"] == default_threads(LaunchInfo(0, 2, 0, 1, launcher))


def epoch_loss(log: Path) -> float:
    return [json.loads(line) for line in log.read_text().splitlines()][0]["loss"]


@pytest.fixture(scope="module")
def one_process_loss(small_partitions: dict, tmp_path_factory: pytest.TempPathFactory) -> float:
    log = tmp_path_factory.mktemp("one") / "one.jsonl"
    cmd = fullgraph(*ARGS, "--parts", str(small_partitions[1]), "--log-json", str(log))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return epoch_loss(log)


@needs_namespaces
@pytest.mark.timeout(120)
def test_mpirun_across_two_nodes(cluster, small_partitions, one_process_loss, tmp_path) -> None:
    log = tmp_path / "mpi.jsonl"
    argv = fullgraph(
        *ARGS, "--parts", str(small_partitions[2]), "--transport", "mpi", "--log-json", str(log)
    )
    (r,) = run_all([cluster.mpirun(2, 1, argv)], timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert epoch_loss(log) == pytest.approx(one_process_loss, rel=1e-5, abs=1e-6)
    check_launch(log, "mpi", "mpich")


@needs_namespaces
@pytest.mark.timeout(120)
def test_torchrun_variables_across_two_nodes(
    cluster, small_partitions, one_process_loss, tmp_path
) -> None:
    log = tmp_path / "gloo.jsonl"
    argv = fullgraph(
        *ARGS, "--parts", str(small_partitions[2]), "--transport", "gloo", "--log-json", str(log)
    )
    results = run_all(
        cluster.torchrun_env(1, argv, port=29400), timeout=90, env={"GLOO_SOCKET_IFNAME": ""}
    )
    for rank, r in enumerate(results):
        assert r.returncode == 0, f"rank {rank}: {r.stdout}{r.stderr}"
    assert epoch_loss(log) == pytest.approx(one_process_loss, rel=1e-5, abs=1e-6)
    check_launch(log, "gloo", "torchrun")


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "0"], "node count '0'"),
        (["up", "two"], "node count 'two'"),
        (["up", "2", "--rate", "10g"], "--rate 10g"),
        (["up", "2", "--delay", "soon"], "--delay soon"),
        (["up", "2", "--loss", "120%"], "--loss 120%"),
        (["up", "2", "--bogus"], "unknown argument"),
    ],
)
def test_cluster_script_rejects_bad_input_before_building(args: list[str], needle: str) -> None:
    prefix = unique_prefix()
    r = script("netns-cluster.sh", *args, "--prefix", prefix)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout
    assert not (STATE_ROOT / prefix).exists()


def test_launch_script_rejects_unknown_hosts(tmp_path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{unique_prefix()}1\n")
    r = script("netns-launch.sh", "mpirun", "-f", str(hosts), "-n", "2", "--", "true")
    assert r.returncode == 2 and "unknown host" in r.stderr and len(r.stderr.splitlines()) == 1


@needs_namespaces
def test_cluster_is_idempotent_and_launch_checks_the_rank_count(cluster) -> None:
    again = script(
        "netns-cluster.sh",
        "up",
        "2",
        "--rate",
        "1gbit",
        "--prefix",
        cluster.prefix,
        "--subnet",
        str(cluster.subnet),
    )
    assert again.returncode == 0, again.stderr
    status = script("netns-cluster.sh", "status", "--prefix", cluster.prefix).stdout
    assert f"{cluster.node(0)} {cluster.subnet}.1/24 link up" in status
    r = script("netns-launch.sh", "mpirun", "-f", str(cluster.hostfile), "-n", "3", "--", "true")
    assert r.returncode == 2 and "do not divide" in r.stderr


@needs_namespaces
def test_down_removes_everything_up_made() -> None:
    c = NetnsCluster(nodes=1, rate="1gbit").up()
    c.down()
    assert (
        c.prefix
        not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
    assert c.prefix not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert c.prefix not in Path("/etc/hosts").read_text()
    assert not (STATE_ROOT / c.prefix).exists()
