"""Launcher environments and the local communicator."""

from __future__ import annotations

import pytest
import torch

from fullgraph.distributed import Communicator, create_communicator
from fullgraph.distributed.connect import resolve_transport
from fullgraph.distributed.launch import (
    LaunchInfo,
    default_threads,
    detect_launch,
    expand_hostlist,
    first_host,
    mpi_start_environment,
    rendezvous_endpoint,
    slurm_port,
)
from fullgraph.errors import ConfigError


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (0, 1, 0, 1, "none")),
        (
            {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
            (3, 4, 1, 2, "mpich"),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "5",
                "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            (5, 8, 1, 4, "openmpi"),
        ),
        (
            {
                "SLURM_PROCID": "2",
                "SLURM_NTASKS": "6",
                "SLURM_LOCALID": "2",
                "SLURM_STEP_TASKS_PER_NODE": "3(x2)",
            },
            (2, 6, 2, 3, "slurm"),
        ),
        (
            {
                "RANK": "1",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
            },
            (1, 2, 1, 2, "torchrun"),
        ),
    ],
)
def test_detect_launch(env: dict, expected: tuple) -> None:
    info = detect_launch(env)
    assert (info.rank, info.size, info.local_rank, info.local_size, info.launcher) == expected


def test_slurm_uneven_nodes_get_their_own_task_count() -> None:
    env = {
        "SLURM_PROCID": "6",
        "SLURM_NTASKS": "7",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "3",
        "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
    }
    assert detect_launch(env).local_size == 1
    assert detect_launch({**env, "SLURM_PROCID": "2", "SLURM_NODEID": "1"}).local_size == 2


def test_detect_launch_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="PMI_RANK"):
        detect_launch({"PMI_RANK": "x", "PMI_SIZE": "2"})
    with pytest.raises(ConfigError, match="out of range"):
        detect_launch({"PMI_RANK": "4", "PMI_SIZE": "4"})


def test_default_threads_divides_cores_among_local_ranks() -> None:
    assert default_threads(LaunchInfo(0, 8, 0, 4, "mpich"), cores=16) == 4
    assert default_threads(LaunchInfo(0, 8, 0, 4, "mpich"), cores=2) == 1


def test_local_communicator_and_transport_errors() -> None:
    comm = create_communicator("local", LaunchInfo(0, 1, 0, 1, "none"))
    rows = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(comm.alltoallv_start(rows, [3], [3]).wait(), rows)
    assert torch.equal(comm.allreduce_(rows.clone()), rows)
    with pytest.raises(ConfigError, match="per-rank counts"):
        comm.alltoallv_start(rows, [1, 2], [3])
    with pytest.raises(ConfigError, match="transport local runs one rank"):
        create_communicator("local", LaunchInfo(0, 2, 0, 2, "mpich"))
    with pytest.raises(ConfigError, match="unknown transport"):
        create_communicator("ucx", LaunchInfo(0, 1, 0, 1, "none"))
    with pytest.raises(ConfigError, match="needs an MPI launcher"):
        create_communicator("mpi", LaunchInfo(0, 2, 0, 2, "torchrun"))
    assert isinstance(comm, Communicator) and comm.bytes_sent["halo"] == 0


# -- Slurm ----------------------------------------------------------------------------------
#: What srun sets in task 3 of `srun -N 2 --ntasks-per-node 2` (read off slurmd 22.05).
SRUN = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "fgn[1-2]",
    "SLURM_JOB_NODELIST": "fgn[1-2]",
    "SLURM_JOB_ID": "57",
}
#: srun --mpi=pmi2 adds slurmstepd's PMI socket and the rank (no MPI_LOCAL* as hydra's).
PMI2 = {"PMI_FD": "11", "PMI_JOBID": "57.0", "PMI_RANK": "3", "PMI_SIZE": "4"}


def test_srun_tasks_are_slurm_ranks_with_or_without_pmi() -> None:
    plain = detect_launch(SRUN)
    assert (plain.rank, plain.size, plain.local_rank, plain.local_size) == (3, 4, 1, 2)
    assert (plain.launcher, plain.pmi, plain.under_mpi) == ("slurm", "none", False)
    pmi2 = detect_launch({**SRUN, **PMI2})  # not hydra's "mpich" with local size 4
    assert (pmi2.launcher, pmi2.pmi, pmi2.under_mpi, pmi2.local_size) == ("slurm", "pmi2", True, 2)
    pmix = detect_launch({**SRUN, "PMIX_RANK": "3", "PMIX_NAMESPACE": "slurm.pmix.57.0"})
    assert (pmix.pmi, pmix.under_mpi) == ("pmix", True)
    assert resolve_transport("auto", plain) == "gloo"
    assert resolve_transport("auto", pmi2) == "mpi"


def test_batch_script_and_hydra_inside_an_allocation_are_not_srun_tasks() -> None:
    # The batch script: SLURM_PROCID=0 and the job's task count, but one process, no step.
    batch = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    assert detect_launch({**batch, "SLURM_PROCID": "0"}).launcher == "none"
    # mpirun inside the allocation: hydra's proxies were started by srun (one per node).
    hydra = {
        **SRUN,
        "SLURM_PROCID": "1",
        "PMI_RANK": "3",
        "PMI_SIZE": "4",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "2",
    }
    assert detect_launch(hydra).launcher == "mpich" and detect_launch(hydra).rank == 3


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("fgn[1-2]", "fgn1"),
        ("node[07,09-12],gpu3", "node07"),
        ("rack[2-3]-n[5-6]", "rack2-n5"),
        ("a,b", "a"),
        ("login", "login"),
    ],
)
def test_first_host_of_a_slurm_host_list(nodelist: str, first: str) -> None:
    assert first_host(nodelist) == first


def test_expand_hostlist_in_slurms_order() -> None:
    assert expand_hostlist("fgn[1-2]") == ["fgn1", "fgn2"]
    assert expand_hostlist("node[07,09-12],gpu3", 4) == ["node07", "node09", "node10", "node11"]
    assert expand_hostlist("rack[2-3]-n[5-6]", 3) == ["rack2-n5", "rack2-n6", "rack3-n5"]
    assert expand_hostlist("a,b[1-2]", 5) == ["a", "b1", "b2"]
    assert expand_hostlist("big[1-100000]") == ["big1", "big2"]  # never expanded whole


@pytest.mark.parametrize("nodelist", ["", "n[1-2", "n]1", "n[x-y]", "n[[1]]", "a,"])
def test_first_host_rejects_malformed_lists(nodelist: str) -> None:
    with pytest.raises(ConfigError, match="malformed Slurm host list"):
        first_host(nodelist)


def test_srun_without_pmi_meets_on_the_first_node_at_a_port_from_the_job_id() -> None:
    info = detect_launch(SRUN)
    r = rendezvous_endpoint(info, SRUN)
    assert r is not None and (r.host, r.port) == ("fgn1", slurm_port(57, 0)) == ("fgn1", 15570)
    assert not r.opens_store and "SLURM_STEP_NODELIST" in r.source
    assert r.interface_host == "fgn1"  # on node 2: the route to the first node
    first = {**SRUN, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    r0 = rendezvous_endpoint(detect_launch(first), first)
    # on the first node its own name may resolve to loopback: the route to node 2 picks it
    assert r0 is not None and r0.opens_store and r0.interface_host == "fgn2"
    # concurrent steps of one job differ; ports stay below the ephemeral range
    assert slurm_port(57, 1) != slurm_port(57, 0)
    assert all(15000 <= slurm_port(j, s) < 30000 for j in (0, 1499, 10**9) for s in (0, 9))
    # the user's MASTER_ADDR / MASTER_PORT win; under a PMI rank 0 publishes (None here)
    own = {**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "29999"}
    assert rendezvous_endpoint(detect_launch(own), own).port == 29999  # type: ignore[union-attr]
    assert rendezvous_endpoint(detect_launch({**SRUN, **PMI2}), {**SRUN, **PMI2}) is None
    with pytest.raises(ConfigError, match="MASTER_ADDR and MASTER_PORT"):
        bare = {k: v for k, v in SRUN.items() if "NODELIST" not in k}
        rendezvous_endpoint(detect_launch(bare), bare)


def test_torchrun_rendezvous_is_master_addr() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "29400"}
    r = rendezvous_endpoint(detect_launch(env), env)
    assert r is not None and (r.host, r.port, r.opens_store) == ("n1", 29400, True)
    agent = {**env, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert not rendezvous_endpoint(detect_launch(agent), agent).opens_store  # type: ignore[union-attr]


MPICH_WHEEL = "MPICH Version:      5.0.2\nMPICH Device:       ch4:ucx ofi\n"


def test_mpich_under_srun_pmi2_takes_the_ofi_module() -> None:
    pmi2 = detect_launch({**SRUN, **PMI2})
    assert mpi_start_environment(pmi2, MPICH_WHEEL, {}) == {"MPIR_CVAR_CH4_NETMOD": "ofi"}
    # the user's choice, another launcher, another MPI, an MPICH without OFI: nothing
    assert mpi_start_environment(pmi2, MPICH_WHEEL, {"MPIR_CVAR_CH4_NETMOD": "ucx"}) == {}
    hydra = LaunchInfo(0, 4, 0, 2, "mpich")
    assert mpi_start_environment(hydra, MPICH_WHEEL, {}) == {}
    assert mpi_start_environment(pmi2, "Open MPI v5.0.3, package: ...", {}) == {}
    assert mpi_start_environment(pmi2, "MPICH Version: 4.1\nMPICH Device: ch4:ucx\n", {}) == {}


def test_transport_mpi_under_srun_without_pmi_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"srun --mpi=pmi2, or use --transport gloo"):
        create_communicator("mpi", detect_launch(SRUN))
