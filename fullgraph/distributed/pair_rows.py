"""The rows of the node pairs a rank scores (link prediction), and their gradients summed in
one fixed order: the same bits at any rank count.

A rank scores the pairs ``(u, v)`` anchored at its inner nodes ``u`` (each supervision edge
lives at its source's owner). It needs the embedding row of every target ``v``; those of other
ranks are fetched once per pair set (:class:`PairRows`: the unique targets each peer owns are
requested, the owners send the rows). The backward pass does not add a node's gradient terms
where they were computed and then across ranks (that split would follow the rank count):
every pair's gradient row for its target goes to the target's owner as it is, and every node
sums the rows of every pair that touches it, as anchor or as target, in ascending order of a
global key (:func:`contribution_keys`: pair key, then side), in one pass
(:func:`~fullgraph.kernels.spmm.spmm_ordered_` over a 0/1 matrix). A node's gradient is
therefore the same sum of the same terms in the same order at every rank count.

The set-up of one pair set is a collective (three all-to-alls); its forward one more, its
backward one more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.kernels import CSRMatrix
from fullgraph.kernels.spmm import spmm_ordered_


def contribution_keys(pair_keys: np.ndarray, side: int) -> np.ndarray:
    """The order key of a pair's gradient term: ``2 * pair_key + side`` (0 anchor, 1 target)."""
    return np.asarray(pair_keys, dtype=np.int64) * 2 + int(side)


class NodeOwners:
    """Who owns every global node, and each inner node's local row on its owner.

    Built once per run from every rank's inner global ids (an all-gather).

    Attributes:
        owner: int32 [num_nodes], the rank owning each global node.
        local: int64 [num_nodes], the node's inner row on its owner.
    """

    def __init__(self, comm: Communicator, inner_global_ids: np.ndarray, num_nodes: int) -> None:
        mine = np.ascontiguousarray(inner_global_ids, dtype=np.int64)
        pieces = comm.allgather_object(mine) if comm.size > 1 else [mine]
        self.owner = np.full(int(num_nodes), -1, dtype=np.int32)
        self.local = np.full(int(num_nodes), -1, dtype=np.int64)
        for r, gids in enumerate(pieces):
            self.owner[gids] = r
            self.local[gids] = np.arange(len(gids), dtype=np.int64)
        if (self.owner < 0).any():
            missing = int(np.flatnonzero(self.owner < 0)[0])
            raise ValueError(f"node {missing} is owned by no rank")


def _alltoall_f64(
    comm: Communicator, rows: np.ndarray, send_counts: list[int], recv_counts: list[int]
) -> np.ndarray:
    """A set-up all-to-all of float64 rows (exact for integers below 2^53)."""
    tensor = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float64))
    return comm.alltoallv_start(tensor, send_counts, recv_counts, tag="setup").wait().numpy()


def _recv_counts(comm: Communicator, send_counts: list[int]) -> list[int]:
    """How many rows each peer will send this rank, from what each rank sends each peer."""
    counts = np.asarray(send_counts, dtype=np.float64).reshape(-1, 1)
    got = _alltoall_f64(comm, counts, [1] * comm.size, [1] * comm.size)
    return [int(c) for c in got.reshape(-1)]


@dataclass
class PairRows:
    """One pair set's exchange plan and the fixed order of its gradient sums.

    Attributes:
        anchor_rows: int64 [m], each pair's anchor (a local inner row).
        target_index: int64 [m], each pair's target in ``[own inner rows; fetched rows]``.
        serve_rows: int64, the inner rows this rank sends, grouped by requesting peer.
        serve_counts, fetch_counts: rows sent to / fetched from each peer (forward).
        grad_send: int64, the pairs whose target gradient row goes to another rank, grouped by
            the target's owner; ``grad_send_counts`` / ``grad_recv_counts`` per peer.
        order: the 0/1 matrix ``[num_inner, m + m_local + m_received]`` that sums every
            node's terms (anchor rows ``dHu``, then local-target rows, then received rows) in
            ascending contribution key.
        local_targets: int64, the pairs whose target is an inner row of this rank.
    """

    comm: Communicator
    num_inner: int
    anchor_rows: torch.Tensor
    target_index: torch.Tensor
    serve_rows: torch.Tensor
    serve_counts: list[int]
    fetch_counts: list[int]
    grad_send: torch.Tensor
    grad_send_counts: list[int]
    grad_recv_counts: list[int]
    local_targets: torch.Tensor
    order: CSRMatrix | None

    @classmethod
    def build(
        cls,
        comm: Communicator,
        owners: NodeOwners,
        anchors: np.ndarray,
        targets: np.ndarray,
        pair_keys: np.ndarray,
        num_inner: int,
        with_grad: bool = True,
    ) -> PairRows:
        """The plan of the pairs ``(anchors[i], targets[i])`` (global ids; the anchors this
        rank's inner nodes) with order keys ``pair_keys`` (unique over every rank's pairs).

        A collective: every rank calls it, with its own pairs (possibly none).
        """
        size, me = comm.size, comm.rank
        anchors = np.asarray(anchors, dtype=np.int64)
        targets = np.asarray(targets, dtype=np.int64)
        keys = np.asarray(pair_keys, dtype=np.int64)
        if len(anchors) and (owners.owner[anchors] != me).any():
            raise ValueError("a pair's anchor is not an inner node of this rank")
        anchor_rows = owners.local[anchors]
        t_owner = owners.owner[targets].astype(np.int64)
        t_local = owners.local[targets]
        remote = t_owner != me
        # forward: the unique remote targets, grouped by owner, ascending global id
        wanted = np.unique(targets[remote])
        w_owner = owners.owner[wanted].astype(np.int64)
        by_owner = np.argsort(w_owner, kind="stable")
        wanted, w_owner = wanted[by_owner], w_owner[by_owner]
        fetch_counts = np.bincount(w_owner, minlength=size).tolist()
        target_index = t_local.copy()
        if remote.any():  # wanted ascends in (owner, id): one composite key finds a slot
            wanted_key = w_owner * (1 << 40) + wanted
            slot = np.searchsorted(wanted_key, t_owner[remote] * (1 << 40) + targets[remote])
            target_index[remote] = num_inner + slot
        if size > 1:
            serve_counts = _recv_counts(comm, fetch_counts)
            asked = _alltoall_f64(comm, wanted.reshape(-1, 1), fetch_counts, serve_counts)
            serve_rows = owners.local[asked.reshape(-1).astype(np.int64)]
        else:
            serve_counts, serve_rows = [0], np.zeros(0, dtype=np.int64)
        # backward: every remote pair's target row to the target's owner, with its key
        send_pairs = np.flatnonzero(remote)
        send_pairs = send_pairs[np.argsort(t_owner[send_pairs], kind="stable")]
        grad_send_counts = np.bincount(t_owner[send_pairs], minlength=size).tolist()
        local_targets = np.flatnonzero(~remote)
        order = None
        grad_recv_counts = [0] * size
        if with_grad:
            if size > 1:
                grad_recv_counts = _recv_counts(comm, grad_send_counts)
                meta = np.stack([targets[send_pairs], keys[send_pairs]], axis=1)
                got = _alltoall_f64(comm, meta.reshape(-1, 2), grad_send_counts, grad_recv_counts)
                recv_rows = owners.local[got[:, 0].astype(np.int64)]
                recv_keys = got[:, 1].astype(np.int64)
            else:
                recv_rows = recv_keys = np.zeros(0, dtype=np.int64)
            rows = np.concatenate([anchor_rows, t_local[local_targets], recv_rows])
            ckeys = np.concatenate(
                [
                    contribution_keys(keys, 0),
                    contribution_keys(keys[local_targets], 1),
                    contribution_keys(recv_keys, 1),
                ]
            )
            entry = np.lexsort((ckeys, rows))  # by node, then ascending key
            indptr = np.zeros(num_inner + 1, dtype=np.int64)
            np.cumsum(np.bincount(rows, minlength=num_inner), out=indptr[1:])
            order = CSRMatrix(
                torch.from_numpy(indptr),
                torch.from_numpy(entry.astype(np.int64)),
                None,
                num_cols=len(rows),
            )
        t = torch.from_numpy
        return cls(
            comm=comm,
            num_inner=int(num_inner),
            anchor_rows=t(anchor_rows),
            target_index=t(target_index),
            serve_rows=t(np.ascontiguousarray(serve_rows, dtype=np.int64)),
            serve_counts=[int(c) for c in serve_counts],
            fetch_counts=[int(c) for c in fetch_counts],
            grad_send=t(send_pairs.astype(np.int64)),
            grad_send_counts=[int(c) for c in grad_send_counts],
            grad_recv_counts=[int(c) for c in grad_recv_counts],
            local_targets=t(local_targets.astype(np.int64)),
            order=order,
        )

    @property
    def num_pairs(self) -> int:
        """Pairs of this rank."""
        return int(self.anchor_rows.shape[0])

    def fetch(self, h: torch.Tensor) -> torch.Tensor:
        """``[h; rows of the remote targets]`` (a collective; no autograd)."""
        h = h.detach()
        if self.comm.size == 1:
            return h
        send = h.index_select(0, self.serve_rows.to(h.device))
        got = self.comm.alltoallv_start(send, self.serve_counts, self.fetch_counts, tag="halo")
        return torch.cat([h, got.wait()])

    def rows(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each pair's anchor and target rows of ``h`` [num_inner, d], differentiable with
        respect to ``h`` through :class:`PairRowsFunction` (gradients in the fixed order)."""
        if not h.requires_grad or self.order is None:
            full = self.fetch(h)
            return (
                h.index_select(0, self.anchor_rows.to(h.device)),
                full.index_select(0, self.target_index.to(h.device)),
            )
        return PairRowsFunction.apply(h, self)

    def gradient(self, d_anchor: torch.Tensor, d_target: torch.Tensor) -> torch.Tensor:
        """``dH`` [num_inner, d] from the pairs' row gradients: the target rows of remote
        targets sent to their owners, every node's terms summed in ascending key (a
        collective)."""
        assert self.order is not None
        dev = d_anchor.device
        d_target = d_target.contiguous()
        received = d_target.new_zeros((0, d_target.shape[1]))
        if self.comm.size > 1:
            send = d_target.index_select(0, self.grad_send.to(dev))
            pending = self.comm.alltoallv_start(
                send, self.grad_send_counts, self.grad_recv_counts, tag="halo"
            )
            received = pending.wait()
        terms = torch.cat(
            [d_anchor.contiguous(), d_target.index_select(0, self.local_targets.to(dev)), received]
        )
        out = torch.zeros((self.num_inner, terms.shape[1]), dtype=terms.dtype, device=dev)
        rows = torch.arange(self.num_inner, dtype=torch.int64, device=dev)
        return spmm_ordered_(out, self.order.to(dev), rows, terms)


class PairRowsFunction(torch.autograd.Function):
    """``(h[anchors], [h; fetched][targets])`` whose backward is :meth:`PairRows.gradient`."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, plan: PairRows) -> tuple[torch.Tensor, torch.Tensor]:
        """The anchor rows and the target rows of every pair."""
        ctx.plan = plan
        full = plan.fetch(h)
        dev = h.device
        return (
            h.index_select(0, plan.anchor_rows.to(dev)),
            full.index_select(0, plan.target_index.to(dev)),
        )

    @staticmethod
    def backward(ctx: Any, d_anchor: torch.Tensor, d_target: torch.Tensor) -> tuple:
        """``dH``: every node's pair terms in ascending contribution key."""
        return ctx.plan.gradient(d_anchor, d_target), None
