"""Node pairs of a link-prediction script: ``data.edge_label_index`` and what indexes by it.

A PyG link-prediction script scores pairs ``(u, v)`` of node embeddings: ``z[eli[0]] *
z[eli[1]]`` for an ``edge_label_index`` ``eli`` [2, m] of global node ids. On P ranks each rank
holds only its own nodes' rows of ``z``, so :func:`fullgraph.pyg.load_part` (a link split) and
:func:`fullgraph.pyg.negative_sampling` give ``eli`` as :class:`PairIndex`: this rank's pairs
(those whose first node, the *anchor*, it owns) of one :class:`PairSet`, every pair with a
global order key. Then

- ``eli[0]`` / ``eli[1]`` are :class:`PairSide` tensors, and ``z[eli[0]]`` / ``z[eli[1]]`` of
  the converted model's node rows are every pair's anchor / target rows: the targets other
  ranks own come through one all-to-all, and the backward pass sums every node's pair terms
  in ascending key, anchor and target terms alike
  (:class:`~fullgraph.distributed.pair_rows.PairRows`): the same bits at any rank count;
- the rows are :class:`~fullgraph.pyg.node_rows.NodeRows` (the tag of rows split over the
  ranks) carrying the pairs' keys, so a loss over them (``BCEWithLogitsLoss``) is the global
  value and :func:`fullgraph.pyg.gather` lays them out in key order;
- ``torch.cat([pos, neg], dim=-1)`` of pair indices is the pair set of both, its keys those
  of the first set, then those of the second shifted past the first's.

Any other call on a :class:`PairIndex` acts on this rank's pairs as a plain tensor
(``.size(1)``: this rank's count).
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.pair_rows import NodeOwners, PairRows
from fullgraph.errors import ConfigError
from fullgraph.partition import Partition
from fullgraph.pyg.node_rows import NodeRows, plain, tag


class PairPart(Protocol):
    """What the pairs read of the rank's :class:`~fullgraph.pyg.part_data.PartGraph`."""

    part: Partition
    comm: Communicator
    seed: int
    step: int
    num_inner: int
    global_ids: np.ndarray
    num_nodes_global: int | None

    @property
    def num_edges(self) -> int:
        """Incoming edges of the rank's inner nodes."""


def owners_of(part: PairPart) -> NodeOwners:
    """Who owns every global node of ``part``'s graph (built once per part: an all-gather).

    Raises:
        ConfigError: the part was not loaded from a link split (no global node count).
    """
    owners = getattr(part, "_pair_owners", None)
    if owners is None:
        total = getattr(part, "num_nodes_global", None)
        if total is None:
            raise ConfigError(
                "node pairs need the part of a link split: load_part((train_data, val_data, "
                "test_data)) of T.RandomLinkSplit"
            )
        owners = NodeOwners(part.comm, part.global_ids, int(total))
        part._pair_owners = owners
    return owners


class PairSet:
    """This rank's pairs of one pair set, their global keys and the row plan.

    Args:
        part: the rank's part.
        pairs: int64 [2, m], global ids; every anchor (row 0) an inner node of this rank.
        keys: int64 [m], each pair's global order key (unique over every rank's pairs).
        total: the key range of the set over every rank (keys lie in ``[0, total)``).
    """

    def __init__(self, part: PairPart, pairs: np.ndarray, keys: np.ndarray, total: int) -> None:
        self.part = part
        self.pairs = np.ascontiguousarray(pairs, dtype=np.int64).reshape(2, -1)
        self.keys = np.ascontiguousarray(keys, dtype=np.int64)
        self.total = int(total)
        self._plans: dict[bool, PairRows] = {}
        self._last: tuple[Any, tuple[NodeRows, NodeRows], int] | None = None

    @property
    def num_pairs(self) -> int:
        """Pairs of this rank."""
        return int(self.pairs.shape[1])

    def index(self) -> PairIndex:
        """The set as ``edge_label_index`` [2, m] (int64 global ids)."""
        out = torch.from_numpy(self.pairs.copy()).as_subclass(PairIndex)
        out.fullgraph_pairs = self
        return out

    def plan(self, with_grad: bool) -> PairRows:
        """The row plan (a collective on first use: every rank indexes alike)."""
        if with_grad not in self._plans:
            self._plans[with_grad] = PairRows.build(
                self.part.comm,
                owners_of(self.part),
                self.pairs[0],
                self.pairs[1],
                self.keys,
                self.part.num_inner,
                with_grad=with_grad,
            )
        return self._plans[with_grad]

    def rows(self, z: torch.Tensor, side: int) -> NodeRows:
        """Every pair's anchor (``side`` 0) or target (1) row of the node rows ``z`` (both
        fetched at once, kept for the other side of the same ``z``)."""
        h = plain(z)
        if not isinstance(h, torch.Tensor) or h.dim() < 1 or h.shape[0] != self.part.num_inner:
            shape = tuple(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
            raise ConfigError(
                f"z[edge_label_index[{side}]]: z must hold one row per node of the rank "
                f"({self.part.num_inner}; the converted model's output), got {shape}"
            )
        last = self._last
        if last is not None and last[0]() is z and getattr(z, "_version", 0) == last[2]:
            return last[1][side]
        flat = h.reshape(h.shape[0], -1)
        grad = flat.requires_grad and torch.is_grad_enabled()
        anchor, target = self.plan(grad).rows(flat) if grad else self._rows_no_grad(flat)
        shape = (-1, *h.shape[1:])
        out = tuple(tag(t.reshape(shape), self.part, keys=self.keys) for t in (anchor, target))
        self._last = (weakref.ref(z), out, getattr(z, "_version", 0))
        return out[side]

    def _rows_no_grad(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self.plan(False)
        full = plan.fetch(flat)
        dev = flat.device
        return (
            flat.index_select(0, plan.anchor_rows.to(dev)),
            full.index_select(0, plan.target_index.to(dev)),
        )

    @staticmethod
    def concat(sets: Sequence[PairSet]) -> PairSet:
        """The pairs of ``sets`` in turn; keys shifted past the key range of the sets before."""
        part = sets[0].part
        if any(s.part is not part for s in sets):
            raise ConfigError("torch.cat of edge_label_index: the pairs of different parts")
        shift = np.cumsum([0] + [s.total for s in sets[:-1]])
        keys = np.concatenate([s.keys + int(o) for s, o in zip(sets, shift, strict=True)])
        pairs = np.concatenate([s.pairs for s in sets], axis=1)
        return PairSet(part, pairs, keys, int(sum(s.total for s in sets)))


def _cat_sets(args: tuple, kwargs: dict) -> PairSet | None:
    """The pair set of ``torch.cat([PairIndex, ...], dim=-1 or 1)``; ``None`` for another
    cat (of other tensors, or along dim 0)."""
    tensors = args[0] if args else kwargs.get("tensors")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(tensors, (list, tuple)) or not tensors:
        return None
    if not all(isinstance(t, PairIndex) for t in tensors):
        if any(isinstance(t, PairIndex) for t in tensors) and dim in (1, -1):
            raise ConfigError(
                "torch.cat of edge_label_index with a plain tensor: each rank holds only its "
                "own pairs; draw negatives with pyg.negative_sampling and cat the pair indices"
            )
        return None
    if dim not in (1, -1):
        return None
    return PairSet.concat([t.fullgraph_pairs for t in tensors])


class PairIndex(torch.Tensor):
    """This rank's pairs [2, m] (global node ids) of a :class:`PairSet` (see the module).

    Attributes:
        fullgraph_pairs: the pair set.
    """

    fullgraph_pairs: PairSet

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Collection[type],
        args: tuple = (),
        kwargs: dict | None = None,
    ) -> Any:
        """``eli[0]`` / ``eli[1]``: a :class:`PairSide`; ``torch.cat`` of pair indices along
        the pairs: a new set; anything else on this rank's pairs as plain tensors."""
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__getitem__ and isinstance(args[0], PairIndex):
                side = args[1]
                if isinstance(side, torch.Tensor) and side.dim() == 0:
                    side = int(side)
                if isinstance(side, int) and side in (0, 1, -1, -2):
                    return PairSide.of(args[0].fullgraph_pairs, side % 2)
            if func in (torch.cat, torch.concat, torch.concatenate):
                found = _cat_sets(args, kwargs)
                if found is not None:
                    return found.index()
            return func(*_plain_pairs(args), **_plain_pairs(kwargs))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle (``torch.save``) as a plain tensor of this rank's pairs."""
        return _plain_pairs(self).__reduce_ex__(protocol)


class PairSide(torch.Tensor):
    """``edge_label_index[side]``: the anchors (0) or targets (1) of this rank's pairs; a node
    row tensor indexed by it gives every pair's row (:meth:`PairSet.rows`).

    Attributes:
        fullgraph_pairs: the pair set.
        fullgraph_side: 0 (anchors) or 1 (targets).
    """

    fullgraph_pairs: PairSet
    fullgraph_side: int

    @staticmethod
    def of(pairs: PairSet, side: int) -> PairSide:
        """Side ``side`` of ``pairs``."""
        out = torch.from_numpy(pairs.pairs[side].copy()).as_subclass(PairSide)
        out.fullgraph_pairs, out.fullgraph_side = pairs, side
        return out

    def take_rows(self, z: torch.Tensor) -> NodeRows:
        """``z[self]``: every pair's row on this side."""
        return self.fullgraph_pairs.rows(z, self.fullgraph_side)

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Collection[type],
        args: tuple = (),
        kwargs: dict | None = None,
    ) -> Any:
        """``z[side]``: the pairs' rows; anything else as a plain tensor of global ids."""
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__getitem__ and isinstance(args[1], PairSide):
                return args[1].take_rows(args[0])
            return func(*_plain_pairs(args), **_plain_pairs(kwargs))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle as a plain tensor."""
        return _plain_pairs(self).__reduce_ex__(protocol)


def _plain_pairs(t: Any) -> Any:
    """``t`` with pair indices and sides as plain tensors (tuples, lists, dicts walked)."""
    if isinstance(t, (PairIndex, PairSide)):
        with torch._C.DisableTorchFunctionSubclass():
            return t.as_subclass(torch.Tensor)
    if isinstance(t, (tuple, list)) and not hasattr(t, "_fields"):
        return type(t)(_plain_pairs(v) for v in t)
    if isinstance(t, dict):
        return {k: _plain_pairs(v) for k, v in t.items()}
    return t
