"""Launcher environments, the local communicator, and the counter-based dropout masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fullgraph.comm import Communicator, create_communicator
from fullgraph.dropout import (
    dropout_keep_mask,
    hashed_dropout,
    keep_scale_torch,
    splitmix64_int,
    stream_key,
)
from fullgraph.errors import ConfigError
from fullgraph.launch import LaunchInfo, default_threads, detect_launch


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


def test_splitmix64_known_values() -> None:
    # Reference outputs of splitmix64 seeded with 0 (Vigna's generator: state += golden).
    state, outs = 0, []
    for _ in range(3):
        outs.append(splitmix64_int(state))
        state += 0x9E3779B97F4A7C15
    assert outs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_dropout_masks_depend_only_on_global_ids() -> None:
    gids = np.array([7, 2, 11, 5], dtype=np.int64)
    full = dropout_keep_mask(np.arange(12), 9, 0.5, 1, 3, 0)
    assert np.array_equal(dropout_keep_mask(gids, 9, 0.5, 1, 3, 0), full[gids])
    assert not np.array_equal(dropout_keep_mask(gids, 9, 0.5, 1, 4, 0), full[gids])
    big = dropout_keep_mask(np.arange(4000), 50, 0.25, 0, 1, 1)
    assert abs(big.mean() - 0.75) < 0.01
    h = torch.ones(4, 9, requires_grad=True)
    out = hashed_dropout(h, gids, 0.5, 1, 3, 0)
    assert torch.equal(out.detach(), torch.from_numpy(full[gids]).float() * 2.0)
    assert stream_key(1, 3, 0) != stream_key(1, 3, 1)


def test_torch_masks_equal_numba_masks() -> None:
    """The device (torch int64) path draws bit-identical masks to the CPU kernel."""
    gids = np.array([0, 3, 2**40 + 7, 123456789], dtype=np.int64)
    for width, p in ((9, 0.5), (256, 0.25), (3, 0.9)):
        ref = dropout_keep_mask(gids, width, p, 5, 6, 2)
        got = keep_scale_torch(torch.from_numpy(gids), width, p, stream_key(5, 6, 2), 1.0)
        assert np.array_equal(got.numpy() > 0, ref)


def test_fused_relu_dropout_equals_relu_then_dropout() -> None:
    from fullgraph.dropout import ReluDropout

    gids = np.array([4, 9, 1, 30, 2], dtype=np.int64)
    x = torch.randn(5, 11, dtype=torch.float32)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ref = hashed_dropout(torch.relu(a), gids, 0.5, 2, 7, 1)
    got = ReluDropout.apply(b, gids, 0.5, 2, 7, 1)
    assert torch.equal(got, ref)
    w = torch.randn(5, 11)
    (ref * w).sum().backward()
    (got * w).sum().backward()
    assert torch.equal(a.grad, b.grad)
