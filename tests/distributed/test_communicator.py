"""Sums in a fixed order: ``allreduce_`` adds the ranks' pieces as ``((c0 + c1) + c2) + ...``.

In-process checks run P threads over a fake transport whose all-to-all moves the rows exactly
(like every real transport); the multi-rank checks start one ``mpirun`` launch of
``comm_worker.reduce`` per P over ``mpi`` and ``gloo``: the same vectors reduce to the same bits
on both transports and equal the fixed-order numpy sum, and 20 epochs of training end with the
same parameters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import comm_worker
import numpy as np
import pytest
import torch
from comm_worker import REDUCE_LENGTHS, reduce_input
from harness import run_task

from fullgraph.distributed.communicator import Communicator, chunk_sizes, ordered_sum


class _World:
    """The shared mailbox of the threads of one fake job."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=30)
        self.mail: dict[tuple[int, int, int], torch.Tensor] = {}


class _ThreadComm(Communicator):
    """Rank ``rank`` of a fake transport: exact all-to-all through a shared dict."""

    transport = "threads"

    def __init__(self, world: _World, rank: int) -> None:
        super().__init__(rank, world.size, timeout_s=30)
        self.world = world
        self.exchanges = 0
        self.native: list[str] = []

    def _alltoallv(
        self, send: torch.Tensor, recv: torch.Tensor, send_rows: list[int], recv_rows: list[int]
    ) -> Callable[[], None]:
        seq, self.exchanges = self.exchanges, self.exchanges + 1
        offsets = np.concatenate([[0], np.cumsum(send_rows)])
        for q in range(self.size):
            self.world.mail[(seq, self.rank, q)] = send[offsets[q] : offsets[q + 1]].clone()

        def wait() -> None:
            self.world.barrier.wait()
            got = [self.world.mail[(seq, q, self.rank)] for q in range(self.size)]
            assert [len(g) for g in got] == recv_rows
            recv.copy_(torch.cat(got).view_as(recv))

        return wait

    def _allreduce(self, tensor: torch.Tensor, op: str) -> None:
        self.native.append(op)
        if op == "sum":
            raise AssertionError("a sum must not use the transport's reduction")
        seq, self.exchanges = self.exchanges, self.exchanges + 1
        self.world.mail[(seq, self.rank, -1)] = tensor.clone()
        self.world.barrier.wait()
        for q in range(self.size):
            torch.maximum(tensor, self.world.mail[(seq, q, -1)], out=tensor)


def _run_ranks(size: int, fn: Callable[[_ThreadComm], object]) -> list[object]:
    """``fn(comm)`` on every rank of a fake job of ``size`` threads; results in rank order."""
    world = _World(size)
    comms = [_ThreadComm(world, r) for r in range(size)]
    out: list[object] = [None] * size
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            out[r] = fn(comms[r])
        except BaseException as exc:
            errors.append(exc)
            world.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


def _left_to_right(pieces: list[np.ndarray]) -> np.ndarray:
    acc = pieces[0].copy()
    for p in pieces[1:]:
        acc = acc + p
    return acc


def test_chunk_sizes_cover_the_vector() -> None:
    assert chunk_sizes(10, 4) == [3, 3, 2, 2]
    assert chunk_sizes(3, 4) == [1, 1, 1, 0]
    assert chunk_sizes(0, 2) == [0, 0]
    assert chunk_sizes(1000003, 4) == [250001, 250001, 250001, 250000]


def test_ordered_sum_adds_left_to_right() -> None:
    a = np.float32(1.0)
    eps = np.float32(2.0**-24)  # half an ulp of 1: order decides whether it survives
    rows = np.array([[a, -a], [eps, a], [eps, eps], [-a, eps]], dtype=np.float32)
    got = ordered_sum(torch.from_numpy(rows)).numpy()
    want = ((rows[0] + rows[1]) + rows[2]) + rows[3]
    assert got.tobytes() == want.tobytes()
    in_place = torch.from_numpy(rows.copy())
    assert ordered_sum(in_place, out=in_place[0]).data_ptr() == in_place.data_ptr()
    assert in_place[0].numpy().tobytes() == want.tobytes()
    pairwise = (rows[0] + rows[1]) + (rows[2] + rows[3])
    reverse = rows[0] + (rows[1] + (rows[2] + rows[3]))
    assert want.tobytes() != pairwise.tobytes() and want.tobytes() != reverse.tobytes()


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_allreduce_sums_in_rank_order(size: int, dtype: type) -> None:
    """Every rank gets the left-to-right numpy sum bit for bit, uneven and empty chunks too."""
    lengths = sorted({1, size - 1, size + 1, 1003})
    inputs = {n: [reduce_input(r, n, dtype) for r in range(size)] for n in lengths}

    def job(comm: _ThreadComm) -> dict:
        res = {}
        for n in lengths:
            t = torch.from_numpy(inputs[n][comm.rank].copy())
            before = comm.bytes_sent["reduce"]
            assert comm.allreduce_(t, "sum") is t
            res[n] = (t.numpy().copy(), comm.bytes_sent["reduce"] - before)
        return res

    results = _run_ranks(size, job)
    for n in lengths:
        want = _left_to_right(inputs[n])
        for rank, res in enumerate(results):
            got, booked = res[n]
            assert got.dtype == dtype and got.tobytes() == want.tobytes(), (n, rank)
            mine = chunk_sizes(n, size)[rank]
            assert booked == (n - mine + (size - 1) * mine) * np.dtype(dtype).itemsize
    if size > 2:  # the inputs tell the orders apart (two terms commute)
        big = inputs[1003]
        assert _left_to_right(big).tobytes() != _left_to_right(big[::-1]).tobytes()


def test_allreduce_in_place_on_a_strided_view_and_max_native() -> None:
    """A non-contiguous tensor is reduced in place; ``max`` stays on the transport."""
    base = [torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1) for r in range(4)]

    def job(comm: _ThreadComm) -> tuple:
        t = base[comm.rank].clone().t()  # [4, 3], not contiguous
        comm.allreduce_(t, "sum", tag="metrics")
        m = torch.tensor([float(comm.rank), -float(comm.rank)], dtype=torch.float64)
        comm.allreduce_(m, "max", tag="setup")
        empty = comm.allreduce_(torch.zeros(0), "sum")
        return t.clone(), m, empty.numel(), comm.native, dict(comm.bytes_sent)

    for t, m, empty, native, sent in _run_ranks(4, job):
        assert torch.equal(t, sum(base).t()) and not t.is_contiguous()
        assert m.tolist() == [3.0, 0.0] and empty == 0 and native == ["max"]
        assert sent["metrics"] > 0 and sent["setup"] == 16 and sent.get("reduce", 0) == 0


def test_single_rank_sum_is_the_identity() -> None:
    comm = Communicator()
    t = torch.tensor([1.5, -2.0, 3.25])
    assert torch.equal(comm.allreduce_(t.clone(), "sum", tag="reduce"), t)
    assert comm.bytes_sent["reduce"] == 0
    comm.barrier()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_sums_and_training_bit_identical_over_mpi_and_gloo(
    ranks: int, small_partitions, tmp_path: Path
) -> None:
    """One launch per P: mpi and gloo sum to the numpy fixed-order bits; training agrees."""
    got = run_task(
        comm_worker.reduce,
        ranks=ranks,
        out=tmp_path / "reduce.npz",
        timeout=380,
        parts=small_partitions[ranks],
        transports=["mpi", "gloo"],
    )
    failures = [str(f) for f in got["failures"]]
    assert failures == [], "\n".join(failures)
    lengths = sorted({*REDUCE_LENGTHS, ranks - 1, ranks + 1})
    for n in lengths:
        want = _left_to_right([reduce_input(r, n, np.float32) for r in range(ranks)])
        for transport in ("mpi", "gloo"):
            assert got[f"{transport}/sum/{n}"].tobytes() == want.tobytes(), (transport, n)
        assert torch.equal(
            torch.from_numpy(got[f"mpi/sum/{n}"]), torch.from_numpy(got[f"gloo/sum/{n}"])
        )
    params = {t: torch.from_numpy(got[f"{t}/params"]) for t in ("mpi", "gloo")}
    assert torch.equal(params["mpi"], params["gloo"])
    assert np.array_equal(got["mpi/losses"], got["gloo/losses"])
    assert got["mpi/losses"][-1] < got["mpi/losses"][0]
