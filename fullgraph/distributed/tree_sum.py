"""Sums over nodes that are the same bits at any rank count: fixed blocks, one fixed tree.

The node axis is cut into ``num_blocks`` blocks before the rank count is chosen (the partition
does it: :class:`BlockLayout`), and every part is a union of whole blocks. A sum over nodes (a
weight or bias gradient, the loss) is then taken in two steps whose order depends on the blocks
only:

1. each block's partial, with the same kernel and the same rows whatever the rank count
   (:meth:`BlockLayout.partials`);
2. the partials added in one binary tree over the block index: the full tree over
   ``[0, 2^ceil(log2 num_blocks))``, a node the sum ``left + right`` of its children, and a node
   whose right child covers no block of the graph (indices ``>= num_blocks``) its left child
   itself, no addition.

A rank pushes its blocks' partials in ascending block order on a :class:`DyadicStack`, which
adds siblings as soon as both are there: what is left are the rank's maximal aligned dyadic
intervals of blocks (``(level, index)``: blocks ``[index 2^level, (index + 1) 2^level)``), a few
per contiguous run of blocks. The cross-rank step
(:meth:`~fullgraph.distributed.communicator.Communicator.tree_sum_`) pushes every rank's
intervals, in ascending order, on one more stack: the root is the same tree whatever blocks each
rank held, P = 1 included.

During a training step the block functions of the models (``graph_linear``, ``mixed_linear``)
push their partials into the step's :class:`BlockGradients`, found with :func:`active_gradients`
while :func:`collecting` is in force.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

#: A node of the tree: (level, index), covering blocks ``[index << level, (index + 1) << level)``.
Label = tuple[int, int]


def tree_height(num_blocks: int) -> int:
    """The root's level: ``ceil(log2 num_blocks)`` (0 for one block)."""
    if num_blocks < 1:
        raise ValueError(f"a block tree needs at least one block, got {num_blocks}")
    return int(num_blocks - 1).bit_length()


class DyadicStack:
    """Nodes of the block tree pushed in ascending order, siblings added as soon as both are in.

    Args:
        num_blocks: blocks of the whole graph (the tree's leaves ``0 .. num_blocks - 1``).
        in_place: the values pushed are the stack's own (fresh partials): a left sibling
            takes the sum in place (the same bits as ``left + right``), no new tensor.

    Attributes:
        labels: the nodes held, ascending; ``values``: their sums.
    """

    def __init__(self, num_blocks: int, in_place: bool = False) -> None:
        self.num_blocks = int(num_blocks)
        self.in_place = in_place
        self.height = tree_height(self.num_blocks)
        self.labels: list[Label] = []
        self.values: list[torch.Tensor] = []
        self._end = 0  # the first block after the last one pushed

    def push(self, label: Label, value: torch.Tensor) -> None:
        """Push node ``label`` (a leaf ``(0, block)``, or an interval another stack left) whose
        sum is ``value``; it must start at or after the end of the last node pushed.

        Raises:
            ValueError: a node out of order, overlapping the last one, or outside the graph.
        """
        level, index = int(label[0]), int(label[1])
        start = index << level
        if level < 0 or index < 0 or level > self.height or start >= self.num_blocks:
            raise ValueError(f"tree node {label} is outside {self.num_blocks} blocks")
        if start < self._end:
            raise ValueError(f"tree node {label} pushed after block {self._end - 1}: out of order")
        self._end = (index + 1) << level
        self._merge(level, index, value)

    def _merge(self, level: int, index: int, value: torch.Tensor) -> None:
        """Add node ``(level, index)`` (checked by :meth:`push`) to its left siblings."""
        while True:
            if index % 2 == 1 and self.labels and self.labels[-1] == (level, index - 1):
                self.labels.pop()
                left = self.values.pop()
                value = left.add_(value) if self.in_place else left + value  # left + right
            elif not (index % 2 == 0 and level < self.height):
                break
            elif ((index + 1) << level) < self.num_blocks:
                break  # a left child whose right sibling holds blocks: wait for it
            level, index = level + 1, index // 2
        self.labels.append((level, index))
        self.values.append(value)

    def root(self) -> torch.Tensor:
        """The root's sum, once every block is in.

        Raises:
            ValueError: the nodes pushed do not cover every block of the graph.
        """
        if self.labels != [(self.height, 0)]:
            raise ValueError(
                f"the tree over {self.num_blocks} blocks is incomplete: it holds {self.labels}"
            )
        return self.values[0]


def stack_labels(num_blocks: int, block_ids: np.ndarray) -> list[Label]:
    """The intervals a rank holding blocks ``block_ids`` (ascending) is left with."""
    stack = DyadicStack(num_blocks)
    none = torch.empty(0)
    for b in block_ids:
        stack.push((0, int(b)), none)
    return stack.labels


def label_start(label: Label) -> int:
    """The first block node ``label`` covers."""
    return int(label[1]) << int(label[0])


def combine(num_blocks: int, pieces: list[tuple[list[Label], list[torch.Tensor]]]) -> torch.Tensor:
    """The root over every rank's intervals: ``pieces[r]`` is rank ``r``'s ``(labels, sums)``
    (what its stack was left with, or a slice of every sum); pushed in ascending block order
    on one stack, whichever rank holds what.

    Raises:
        ValueError: the intervals overlap or leave a block out.
    """
    nodes = [
        (label_start(lb), lb, v)
        for labels, values in pieces
        for lb, v in zip(labels, values, strict=True)
    ]
    nodes.sort(key=lambda item: item[0])
    stack = DyadicStack(num_blocks)
    for _, label, value in nodes:
        stack.push(label, value)
    return stack.root()


@dataclass(frozen=True)
class BlockLayout:
    """A part's blocks: which blocks of the graph it holds and which inner rows each has.

    Attributes:
        num_blocks: blocks of the whole graph (the same for every rank count).
        block_ids: int64 [b], the blocks this part holds, ascending.
        block_rows: int64 [num_inner], local inner rows ordered by (block, global id).
        block_ptr: int64 [b + 1], block ``block_ids[k]``'s rows are
            ``block_rows[block_ptr[k]:block_ptr[k + 1]]``.
        full_rows, positions: a receptive-field cut's blocks
            (:mod:`~fullgraph.partition.receptive_cut`), else ``None``: every block's size in
            the whole graph (int64 [b]) and every row's position there (int64 [num_inner], in
            block order); :meth:`partials` then gives ``partial`` each block's rows at those
            positions, zero rows where the cut dropped nodes: the whole graph's inputs where
            those rows carry zero gradient, so the whole graph's bits.
        empty_blocks: blocks may hold no row (:meth:`restricted`): their partials are taken
            over no row (zeros), so that the tree still covers every block of the graph.
    """

    num_blocks: int
    block_ids: np.ndarray
    block_rows: np.ndarray
    block_ptr: np.ndarray
    full_rows: np.ndarray | None = None
    positions: np.ndarray | None = None
    empty_blocks: bool = False
    contiguous: bool = field(init=False)
    labels: list[Label] = field(init=False)
    _leaves: list[int] = field(init=False, repr=False)
    _spans: list[slice] = field(init=False, repr=False)
    _pads: list[tuple[int, np.ndarray] | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ids = np.asarray(self.block_ids, dtype=np.int64)
        rows = np.asarray(self.block_rows, dtype=np.int64)
        ptr = np.asarray(self.block_ptr, dtype=np.int64)
        if len(ptr) != len(ids) + 1 or ptr[0] != 0 or ptr[-1] != len(rows):
            raise ValueError(
                f"block_ptr must hold {len(ids) + 1} offsets from 0 to {len(rows)}, got "
                f"{len(ptr)} from {ptr[:1]} to {ptr[-1:]}"
            )
        if np.any(np.diff(ptr) < (0 if self.empty_blocks else 1)):
            raise ValueError("every block of a part must hold at least one row")
        if len(ids) and (np.any(np.diff(ids) <= 0) or ids[0] < 0 or ids[-1] >= self.num_blocks):
            raise ValueError(f"block_ids must ascend within 0..{self.num_blocks - 1}")
        if len(rows) and not np.array_equal(np.sort(rows), np.arange(len(rows))):
            raise ValueError("block_rows must be a permutation of the part's inner rows")
        object.__setattr__(self, "block_ids", ids)
        object.__setattr__(self, "block_rows", rows)
        object.__setattr__(self, "block_ptr", ptr)
        object.__setattr__(self, "contiguous", bool(np.array_equal(rows, np.arange(len(rows)))))
        object.__setattr__(self, "labels", stack_labels(self.num_blocks, ids))
        object.__setattr__(self, "_leaves", ids.tolist())
        object.__setattr__(self, "_spans", self.spans())
        object.__setattr__(self, "_pads", self._cut_pads())

    def _cut_pads(self) -> list[tuple[int, np.ndarray] | None]:
        """Per block, ``(rows in the whole graph, positions of its rows)`` where the cut dropped
        some, else ``None``; checked."""
        if self.full_rows is None or self.positions is None:
            return [None] * len(self.block_ids)
        full = np.asarray(self.full_rows, dtype=np.int64)
        pos = np.asarray(self.positions, dtype=np.int64)
        if full.shape != self.block_ids.shape or pos.shape != self.block_rows.shape:
            raise ValueError("full_rows needs one size a block and positions one a row")
        pads: list[tuple[int, np.ndarray] | None] = []
        for k, span in enumerate(self._spans):
            p, n = np.array(pos[span], dtype=np.int64), int(full[k])  # own, writable
            if p.size and (p[0] < 0 or p[-1] >= n or np.any(np.diff(p) <= 0)):
                raise ValueError(
                    f"block {int(self.block_ids[k])}: positions must ascend in [0, {n})"
                )
            pads.append(None if p.size == n else (n, p))
        return pads

    @classmethod
    def of_part(cls, part: object) -> BlockLayout | None:
        """The layout of a loaded part, or ``None`` when it carries no blocks (a partition
        written before them)."""
        num_blocks = getattr(part, "num_blocks", None)
        if num_blocks is None or getattr(part, "block_ids", None) is None:
            return None
        full, pos = getattr(part, "block_full", None), getattr(part, "block_pos", None)
        return cls(int(num_blocks), part.block_ids, part.block_rows, part.block_ptr, full, pos)

    def restricted(self, keep: np.ndarray) -> BlockLayout:
        """The layout of the inner rows ``keep`` alone (ascending local rows, renumbered
        ``0 .. len(keep) - 1`` in that order): each block holds its rows among them in the same
        (block, global id) order, a block left without rows stays, empty (its partials are
        zeros: the tree covers every block of the graph still). Which rows of a block are kept
        depends on the nodes alone, not on the rank count, so the tree's sums over the
        restricted blocks are the same bits at any P. A cut's zero-row padding is not carried:
        the kept rows are the whole graph's rows of their blocks among ``keep``.

        Raises:
            ValueError: ``keep`` does not ascend within the part's inner rows.
        """
        keep = np.asarray(keep, dtype=np.int64)
        n = self.num_rows
        if keep.size and (keep[0] < 0 or keep[-1] >= n or np.any(np.diff(keep) <= 0)):
            raise ValueError(f"restricted: rows must ascend within 0..{n - 1}")
        new_id = np.full(n, -1, dtype=np.int64)
        new_id[keep] = np.arange(keep.size, dtype=np.int64)
        mapped = new_id[self.block_rows]
        kept = mapped >= 0
        ptr = np.concatenate([[0], np.cumsum(kept, dtype=np.int64)])[self.block_ptr]
        return BlockLayout(self.num_blocks, self.block_ids, mapped[kept], ptr, empty_blocks=True)

    @property
    def num_rows(self) -> int:
        """The part's inner rows."""
        return len(self.block_rows)

    def spans(self) -> list[slice]:
        """Each block's rows as a slice of the rows in block order (:meth:`in_block_order`)."""
        ptr = self.block_ptr.tolist()
        return [slice(ptr[k], ptr[k + 1]) for k in range(len(self.block_ids))]

    def in_block_order(self, t: torch.Tensor | sp.csr_matrix) -> torch.Tensor | sp.csr_matrix:
        """``t``'s rows ordered by (block, global id): ``t`` itself when the rows are
        block-contiguous, else one gathered copy."""
        if self.contiguous:
            return t
        if isinstance(t, sp.csr_matrix):
            return t[self.block_rows]
        return t.index_select(0, torch.from_numpy(self.block_rows).to(t.device))

    def partials(
        self,
        partial: Callable[..., torch.Tensor],
        *tensors: torch.Tensor | sp.csr_matrix,
        ordered: bool = False,
    ) -> DyadicStack:
        """``partial(*rows)`` of every block pushed on a new stack in ascending block order,
        ``rows`` the block's rows of each of ``tensors`` (views of :meth:`in_block_order`:
        the same bits as the block's rows alone, at any offset; ``ordered``: the tensors are
        in block order already). ``partial`` returns a new tensor (the stack adds into it)."""
        ordered_rows = list(tensors) if ordered else [self.in_block_order(t) for t in tensors]
        stack = DyadicStack(self.num_blocks, in_place=True)
        # the layout's blocks ascend inside the graph: pushed without push's checks
        merge, blocks = stack._merge, zip(self._leaves, self._spans, self._pads, strict=True)
        if len(ordered_rows) == 1:  # the common cases without a generator per block
            (a,) = ordered_rows
            for block, rows, pad in blocks:
                merge(0, block, partial(a[rows] if pad is None else padded(a[rows], *pad)))
        else:
            for block, rows, pad in blocks:
                got = (t[rows] for t in ordered_rows)
                merge(0, block, partial(*(got if pad is None else (padded(t, *pad) for t in got))))
        stack._end = int(self.block_ids[-1]) + 1 if len(self.block_ids) else 0
        return stack


def padded(
    t: torch.Tensor | sp.csr_matrix, rows: int, positions: np.ndarray
) -> torch.Tensor | sp.csr_matrix:
    """``t``'s rows at ``positions`` of ``rows`` rows, zero rows elsewhere (entries of a CSR
    matrix kept in their order)."""
    if isinstance(t, sp.csr_matrix):
        counts = np.zeros(rows, dtype=np.int64)
        counts[positions] = np.diff(t.indptr)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        return sp.csr_matrix((t.data, t.indices, indptr), shape=(rows, t.shape[1]))
    out = t.new_zeros((rows, *t.shape[1:]))
    out[torch.from_numpy(positions).to(t.device)] = t
    return out


def row_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t``'s rows (dim 0) in a fixed shape and order, summed by torch in one call
    on the rows where they lie: the reduction reads them unaligned, so the memory offset of a
    view plays no part (no copy; tests/distributed/test_tree_sum.py checks offsets)."""
    return t.sum(0)


class BlockGradients:
    """The tree stacks of one training step: per parameter (and per call of it), and the loss.

    Args:
        layout: the part's blocks.
    """

    LOSS = "loss"

    def __init__(self, layout: BlockLayout) -> None:
        self.layout = layout
        self._stacks: dict[int, list[DyadicStack]] = {}
        self._params: dict[int, torch.Tensor] = {}
        self._global: dict[int, torch.Tensor] = {}
        self._derived: list[tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]] = []
        self.loss: DyadicStack | None = None
        self.loss_divisor = 1.0

    def handles(self, param: torch.Tensor | None, rows: int) -> bool:
        """Whether ``param``'s gradient over ``rows`` rows goes through the tree: a leaf that
        wants a gradient, applied to every inner row of the part."""
        return (
            param is not None
            and param.requires_grad
            and param.is_leaf
            and rows == self.layout.num_rows
        )

    def add(
        self,
        param: torch.Tensor,
        partial: Callable[..., torch.Tensor],
        *tensors: torch.Tensor | sp.csr_matrix,
        ordered: bool = False,
    ) -> None:
        """Push ``partial(*rows)`` of every block (``rows``: the block's rows of each of
        ``tensors``, :meth:`BlockLayout.partials`; ``ordered``: already in block order) for one
        call of ``param``; a later call of the same parameter gets a stack of its own, added
        after the tree in call order."""
        stack = self.layout.partials(partial, *tensors, ordered=ordered)
        self._stacks.setdefault(id(param), []).append(stack)
        self._params[id(param)] = param

    def add_loss(self, row_losses: torch.Tensor, divisor: float = 1.0) -> None:
        """Push the per-block sums of ``row_losses`` (float [num_inner], 0 off the training
        rows), detached: the loss's gradient flows through the caller's own sum. The global
        loss is the tree's root divided by ``divisor`` (the global training count)."""
        if row_losses.shape != (self.layout.num_rows,):
            raise ValueError(
                f"row losses of shape {tuple(row_losses.shape)} for {self.layout.num_rows} rows"
            )
        values = row_losses.detach()
        self.loss_divisor = float(divisor)
        self.loss = self.layout.partials(lambda rows: row_sum(rows).reshape(1), values)

    def absorb(self, other: BlockGradients | None) -> None:
        """Take ``other``'s stacks and loss (partials over other rows, e.g. a link step's
        pairs, in blocks of the same part: the same tree nodes) into this step's tree.

        Raises:
            ValueError: ``other``'s blocks are not this tree's, or both hold a loss or the
                same parameter.
        """
        if other is None:
            return
        if other.layout.labels != self.layout.labels:
            raise ValueError("absorb: the two trees hold different blocks")
        if set(other._stacks) & set(self._stacks) or (other.loss and self.loss):
            raise ValueError("absorb: both trees hold the same parameter or a loss")
        self._stacks.update(other._stacks)
        self._params.update(other._params)
        if other.loss is not None:
            self.loss, self.loss_divisor = other.loss, other.loss_divisor

    def add_global(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        """Add ``grad`` to ``param``'s gradient as it is: a sum over every rank's rows taken
        already (a root of the block tree, e.g. inside a layer's backward that needed it
        there), the same bits on every rank, so it is not summed over ranks again."""
        held = self._global.get(id(param))
        self._global[id(param)] = grad.detach().clone() if held is None else held + grad
        self._params[id(param)] = param

    def derive(
        self, stand_in: torch.Tensor, source: torch.Tensor, params: list[torch.Tensor]
    ) -> None:
        """``stand_in`` (a detached leaf the step's block functions use, e.g. GAT's extended
        weight) stands for ``source``, a tensor computed from the parameters ``params`` alone
        (no node's rows in it: the same bits on every rank). Once the tree has summed
        ``stand_in``'s gradient, :meth:`finish_derived` takes it back through ``source`` to
        ``params``, which get their gradients from there only."""
        if not (stand_in.is_leaf and stand_in.requires_grad):
            raise ValueError("derive: the stand-in must be a leaf that requires grad")
        self._derived.append((stand_in, source, list(params)))

    def derived_params(self) -> list[torch.Tensor]:
        """The parameters whose gradients come through :meth:`derive`'s sources."""
        return [p for _, _, params in self._derived for p in params]

    def finish_derived(self, grad_of: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
        """Take each stand-in's summed gradient (``grad_of(stand_in)``; ``None``: it got
        none) back through its source into ``.grad`` of the derived parameters (in the order
        the stand-ins were registered: the same on every rank)."""
        for stand_in, source, _ in self._derived:
            grad = grad_of(stand_in)
            if grad is not None:
                torch.autograd.backward(source, grad.view_as(source))

    def stand_ins(self) -> list[torch.Tensor]:
        """The stand-ins :meth:`derive` registered, in order."""
        return [s for s, _, _ in self._derived]

    def global_grad(self, param: torch.Tensor) -> torch.Tensor | None:
        """The gradient :meth:`add_global` gave ``param``, or ``None``."""
        return self._global.get(id(param))

    def holds(self, param: torch.Tensor) -> bool:
        """Whether some call pushed ``param``'s partials (or its gradient, summed already)."""
        return id(param) in self._stacks or id(param) in self._global

    def calls(self, param: torch.Tensor) -> int:
        """How many calls pushed ``param``'s partials."""
        return len(self._stacks.get(id(param), []))

    def nodes(self, params: list[torch.Tensor]) -> torch.Tensor:
        """This rank's intervals as rows: [len(labels), n], each row the concatenation of
        every stack of ``params`` (each parameter's calls in call order), then the loss's when
        one was pushed.

        Raises:
        """
        stacks = [s for p in params for s in self._stacks.get(id(p), [])]
        if self.loss is not None:
            stacks.append(self.loss)
        labels = self.layout.labels
        if not stacks or not labels:
            width = sum(p.numel() * self.calls(p) for p in params) + (self.loss is not None)
            return torch.zeros(len(labels), width)
        return torch.stack(
            [torch.cat([s.values[j].reshape(-1) for s in stacks]) for j in range(len(labels))]
        )


def tree_root(
    comm: Any, layout: BlockLayout, stack: DyadicStack, key: str, tag: str = "norm"
) -> torch.Tensor:
    """The root over every rank of a stack :meth:`BlockLayout.partials` made, now (a
    collective: every rank calls it with the same ``key``; a layer's statistics or a sum its
    backward needs before the step ends), flat: ``[n]``, ``n`` the numel of one partial."""
    nodes = torch.stack([v.reshape(-1) for v in stack.values])
    return comm.tree_sum_(nodes, layout.labels, layout.num_blocks, key=key, tag=tag)


_ACTIVE = threading.local()


@contextlib.contextmanager
def collecting(grads: BlockGradients | None) -> Iterator[BlockGradients | None]:
    """Make ``grads`` the step's tree for the block functions run inside (``None``: none)."""
    previous = getattr(_ACTIVE, "grads", None)
    _ACTIVE.grads = grads
    try:
        yield grads
    finally:
        _ACTIVE.grads = previous


def active_gradients() -> BlockGradients | None:
    """The tree :func:`collecting` put in force on this thread, or ``None``."""
    return getattr(_ACTIVE, "grads", None)
