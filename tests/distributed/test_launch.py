"""Launcher environments and the local communicator."""

from __future__ import annotations

import pytest
import torch

from fullgraph.distributed import Communicator, create_communicator
from fullgraph.distributed.launch import LaunchInfo, default_threads, detect_launch
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
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "3",
           "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}  # fmt: skip
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
