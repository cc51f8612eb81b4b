"""Aggregations with the same bits at every rank count (:mod:`fullgraph.distributed.ordered`,
issue 33): ``A H`` and the input gradient ``A^T dY`` of one aggregation at P = 2, 3, 4 equal one
process's bit for bit, float32 and bf16-mixed, with and without the overlap, whole and sliced
exchanges, and on a layer pruned to the loss's receptive field; the way boundary rows were
summed before (inner terms, then halo terms; owners adding returned halo partials in rank
order) does not, so the comparison can fail.

The ranks of a job run as threads of this process over :class:`ThreadCommunicator` (one at a
time: a rank computes only while the others wait in a collective), on partitions that
:func:`~fullgraph.partition.partition_graph` writes of a directed random graph with hubs and
isolated nodes (so the reverse exchange is not the forward one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fullgraph.datasets.graph import Graph
from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.halo import HaloAggregate, HaloPlan, exchange_halo_gradients
from fullgraph.distributed.receptive_field import prune_layers
from fullgraph.kernels import spmm
from fullgraph.partition import load_partition, partition_graph, whole_graph_part
from fullgraph.precision import Precision
from fullgraph.training.assembly import build_operator

WIDTH = 24
RANKS = (2, 3, 4)
WAIT_S = 60.0


class _World:
    """What the ranks of one threaded job share: posted payloads, a condition, the turn."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.cond = threading.Condition()
        self.posts: dict[tuple[int, int], Any] = {}
        self.turn = threading.Lock()  # held by the rank that computes


class ThreadCommunicator(Communicator):
    """A rank of a job whose ranks are threads: every collective posts this rank's payload
    and waits (the turn released) until every rank has posted the same collective."""

    transport = "threads"

    def __init__(self, world: _World, rank: int) -> None:
        super().__init__(rank, world.size, timeout_s=WAIT_S)
        self.world = world
        self._seq = 0

    def _post(self, payload: Any) -> int:
        seq, self._seq = self._seq, self._seq + 1
        with self.world.cond:
            self.world.posts[(seq, self.rank)] = payload
            self.world.cond.notify_all()
        return seq

    def _collect(self, seq: int) -> list[Any]:
        world = self.world
        world.turn.release()
        try:
            with world.cond:
                done = world.cond.wait_for(
                    lambda: all((seq, r) in world.posts for r in range(world.size)), WAIT_S
                )
        finally:
            world.turn.acquire()
        if not done:
            raise TimeoutError(f"rank {self.rank}: collective {seq} never completed")
        return [world.posts[(seq, r)] for r in range(world.size)]

    def _alltoallv(
        self, send: torch.Tensor, recv: torch.Tensor, send_rows: list[int], recv_rows: list[int]
    ) -> Callable[[], None]:
        seq = self._post((send.clone(), list(send_rows)))

        def wait() -> None:
            at = 0
            for src, (buf, rows) in enumerate(self._collect(seq)):
                start = sum(rows[: self.rank])
                recv[at : at + recv_rows[src]] = buf[start : start + rows[self.rank]]
                at += recv_rows[src]

        return wait

    def _allreduce(self, tensor: torch.Tensor, op: str) -> None:
        got = self._collect(self._post(tensor.clone()))
        out = got[0].clone()
        for piece in got[1:]:
            out = torch.maximum(out, piece) if op == "max" else out + piece
        tensor.copy_(out)

    def _broadcast(self, tensor: torch.Tensor, root: int) -> None:
        tensor.copy_(self._collect(self._post(tensor.clone()))[root])

    def _allgather_object(self, obj: Any) -> list[Any]:
        return self._collect(self._post(obj))


def run_ranks(size: int, task: Callable[[Communicator], Any]) -> list[Any]:
    """``task(comm)`` on ``size`` threaded ranks, one computing at a time; every result."""
    world = _World(size)
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        world.turn.acquire()
        try:
            results[rank] = task(ThreadCommunicator(world, rank))
        except BaseException as exc:  # re-raised below
            errors.append(exc)
        finally:
            world.turn.release()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(4 * WAIT_S)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a rank never finished"
    return results


def _graph() -> Graph:
    """Directed random graph: 400 nodes, ~6 in-edges each, three hubs, five isolated nodes."""
    rng = np.random.default_rng(3)
    n, linked, m = 400, 395, 2400
    src, dst = rng.integers(0, linked, m), rng.integers(0, linked, m)
    hubs = np.array([7, 100, 250])
    fans = rng.integers(0, linked, 600)
    src = np.concatenate([src, fans, np.repeat(hubs, 40)])
    dst = np.concatenate([dst, np.resize(hubs, fans.size), rng.integers(0, linked, 120)])
    a = sp.csr_matrix((np.ones(src.size, bool), (dst, src)), shape=(n, n))
    a.setdiag(False)
    a.eliminate_zeros()
    a.sort_indices()
    r = rng.random(n)
    return Graph(
        name="ordered-test",
        num_nodes=n,
        indptr=a.indptr.astype(np.int64),
        indices=a.indices.astype(np.int64),
        x=rng.normal(size=(n, 4)).astype(np.float32),
        y=rng.integers(0, 3, n),
        train_mask=r < 0.5,
        val_mask=(r >= 0.5) & (r < 0.7),
        test_mask=r >= 0.7,
        num_classes=3,
    ).validate()


def _rows(n: int, salt: int) -> torch.Tensor:
    """Rows by global id, magnitudes over six decades (so the order of a sum shows)."""
    rng = np.random.default_rng(salt)
    scale = 10.0 ** rng.uniform(-3, 3, size=(n, 1))
    return torch.from_numpy((rng.normal(size=(n, WIDTH)) * scale).astype(np.float32))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The graph, its rows by global id, and its random partitions into 2, 3, 4 parts."""
    graph = _graph()
    root = tmp_path_factory.mktemp("ordered")
    paths = {}
    for p in RANKS:
        paths[p] = root / f"p{p}"
        partition_graph(graph, p, paths[p], method="random", seed=1)
    n = graph.num_nodes
    return {"graph": graph, "paths": paths, "h": _rows(n, 1), "dy": _rows(n, 2)}


def _one_rank(part, comm: Communicator, job: dict, kind: str, case: dict) -> dict:
    """One aggregation and its input gradient on this rank, keyed by global id; with
    ``old``, also the previous summation's results (inner then halo, halo partials)."""
    plan = HaloPlan.from_partition(
        part, comm, precision=Precision(case["precision"]), buffer_bytes=case["buffer_bytes"]
    )
    plan.overlap = case["overlap"]
    op = build_operator(part, kind)
    if case.get("pruned"):  # the first layer of two, restricted to the loss's receptive field
        train = torch.from_numpy(np.array(part.train_mask[: part.num_inner], dtype=bool))
        first = prune_layers(op, plan, train, 2, min_saving=0.0)[0]
        assert first.pruned
        op, plan = first.op, first.plan
    gids = torch.from_numpy(np.array(part.global_ids[: part.num_inner], dtype=np.int64))
    h = job["h"][gids].clone().requires_grad_(True)
    y = HaloAggregate.apply(h, op, plan)
    y.backward(job["dy"][gids])
    out = {"gids": gids, "y": y.detach(), "dh": h.grad}
    if case.get("old") and comm.size > 1:
        with torch.no_grad():
            x = h.detach()
            old = spmm(op.inner, x)
            op.add_halo_product(old, plan.start_forward(x).wait())
            dy = job["dy"][gids].contiguous()
            got: list[torch.Tensor] = []

            def inner() -> None:
                got.append(spmm(op.inner_t, dy))

            def receive(rows: torch.Tensor, index: torch.Tensor) -> None:
                got[0].index_add_(0, index, rows)

            exchange_halo_gradients(dy, op, plan, None, inner, receive)
        out.update(old_y=old, old_dh=got[0])
    return out


def _by_global_id(results: list[dict], key: str, n: int) -> torch.Tensor:
    """The ranks' rows of ``key`` put together in global-id order."""
    first = results[0][key]
    whole = first.new_full((n, first.shape[1]), float("nan"))
    for r in results:
        whole[r["gids"]] = r[key]
    return whole


CASES = [
    {"precision": "32", "overlap": True, "buffer_bytes": 32 << 20, "old": True},
    {"precision": "32", "overlap": False, "buffer_bytes": 2048},  # sliced exchanges
    {"precision": "bf16-mixed", "overlap": True, "buffer_bytes": 32 << 20},
    {"precision": "bf16-mixed", "overlap": False, "buffer_bytes": 2048},
    {"precision": "32", "overlap": True, "buffer_bytes": 2048, "pruned": True},
]


@pytest.mark.parametrize("kind", ["sage", "gcn"])
@pytest.mark.parametrize(
    "case",
    CASES,
    ids=lambda c: f"{c['precision']}-{c['buffer_bytes']}{'-pruned' * c.get('pruned', 0)}",
)
def test_aggregation_is_one_process_bitwise(job, kind: str, case: dict) -> None:
    """``A H`` and ``A^T dY`` at P = 2, 3, 4 are one process's bits; the old summation (where
    run) differs from one process at some P, so the comparison is not vacuous."""
    graph, n = job["graph"], job["graph"].num_nodes
    (one,) = run_ranks(1, lambda comm: _one_rank(whole_graph_part(graph), comm, job, kind, case))
    want_y, want_dh = _by_global_id([one], "y", n), _by_global_id([one], "dh", n)
    assert not torch.isnan(want_y).any() and want_y.dtype == torch.float32
    old_differs = []
    for p in RANKS:

        def task(comm: Communicator, p: int = p) -> dict:
            part = load_partition(job["paths"][p], comm.rank, mmap=False)
            return _one_rank(part, comm, job, kind, case)

        results = run_ranks(p, task)
        for key, want in (("y", want_y), ("dh", want_dh)):
            got = _by_global_id(results, key, n)
            differ = int((got != want).sum())
            assert differ == 0, f"P={p} {kind} {case}: {key} differs in {differ} entries"
        if case.get("old"):
            old_y, old_dh = (_by_global_id(results, k, n) for k in ("old_y", "old_dh"))
            old_differs.append(bool((old_y != want_y).any()) and bool((old_dh != want_dh).any()))
    if case.get("old"):
        assert any(old_differs), "inner-then-halo sums equal one process's: control is void"


def test_reverse_plan_of_a_symmetric_graph_is_the_forward_one(small_partitions) -> None:
    """On a symmetric graph the backward sends the rows the forward sends (the same maps)."""
    path = small_partitions[2]

    def task(comm: Communicator) -> tuple[bool, int, int]:
        part = load_partition(path, comm.rank, mmap=False)
        plan = HaloPlan.from_partition(part, comm)
        op = build_operator(part, "gcn")
        rev = op.reverse(comm, plan.send_index, plan.send_counts, plan.recv_counts, plan.global_ids)
        return rev.same_as_forward, sum(rev.send_counts), sum(plan.send_counts)

    for same, reverse_rows, forward_rows in run_ranks(2, task):
        assert same and reverse_rows == forward_rows
