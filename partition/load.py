"""Loading one rank's part of a partition directory."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fullgraph.datasets.graph import SPLITS, first_overlap, split_name
from fullgraph.errors import PartitionError
from fullgraph.partition.format import (
    BLOCK_ARRAYS,
    CUT_ARRAYS,
    EDGE_ARRAYS,
    LINK_ARRAYS,
    META_NAME,
    PART_ARRAYS,
    REWRITE,
    PartitionDir,
    block_arrays,
    check_file,
    cut_arrays,
    edge_arrays,
    file_key,
)
from fullgraph.partition.link_parts import check_link_meta, check_part_link, link_arrays, link_view


def whole_ids(part: object) -> np.ndarray:
    """Every local node's id in the whole graph: a receptive-field cut's ``node_ids``, else its
    ``global_ids`` (the keys of dropout streams; in the same order as ``global_ids``)."""
    node_ids = getattr(part, "node_ids", None)
    return part.global_ids if node_ids is None else node_ids  # type: ignore[attr-defined]


@dataclass
class Partition:
    """The part of the graph one rank owns, with its halo and exchange maps.

    Local ids: ``0 .. num_inner-1`` are the inner (owned) nodes, ``num_inner ..
    num_inner+num_halo-1`` the halo nodes, grouped by owner rank ascending.

    Shapes:
        - ``global_ids``, ``in_degree``: int64 [num_inner + num_halo]
        - ``indptr``: int64 [num_inner + 1]; ``indices``: int64 [nnz] (local source ids of the
          incoming edges of every inner node)
        - ``x``: float32 [num_inner, num_features]; ``y``: int64 [num_inner]
        - ``train_mask``, ``val_mask``, ``test_mask``: bool [num_inner]
        - ``send_index``: int64 [total rows sent]; ``send_offsets``, ``recv_offsets``: int64 [P+1]
        - ``edge_weight``: float32 [nnz] or ``None``; ``in_weight``: float64
          [num_inner + num_halo] (GLOBAL weighted in-degrees) or ``None``; ``edge_attr``:
          float32 [nnz, edge_dim] or ``None``: per-edge values aligned with ``indices``
        - ``block_ids``: int64 [b], the blocks this part holds, ascending; ``block_ptr``: int64
          [b + 1]; ``block_rows``: int64 [num_inner], the inner rows ordered by (block, global
          id): block ``block_ids[k]``'s rows are ``block_rows[block_ptr[k]:block_ptr[k+1]]``,
          ascending global id. All three and ``num_blocks`` (blocks of the whole graph) are
          ``None`` for a partition without blocks (written before them, or not by
          ``--assign blocks``). A loaded part's inner rows are block-contiguous:
          ``block_rows`` is ``arange(num_inner)``.
        - ``node_ids``: int64 [num_inner + num_halo], a receptive-field cut's ids of the local
          nodes in the whole graph; ``block_pos`` [num_inner] and ``block_full`` [b]: the cut's
          rows' positions in their blocks of the whole graph and those blocks' sizes
          (:mod:`~fullgraph.partition.receptive_cut`); ``None`` without a cut.
        - ``link``: a link-prediction partition's supervision edges anchored at this part's
          inner nodes (:mod:`~fullgraph.partition.link_parts`): ``train``, ``train_id``,
          ``valid``, ``valid_id``, ``valid_neg`` (``valid_neg_id`` for negative pairs),
          ``test``, ...; ``None`` for a node partition.
    """

    rank: int
    num_parts: int
    num_inner: int
    num_halo: int
    global_ids: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    in_degree: np.ndarray
    x: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    send_index: np.ndarray
    send_offsets: np.ndarray
    recv_offsets: np.ndarray
    num_classes: int
    num_features: int
    num_train_global: int
    partition_hash: str
    meta: dict = field(repr=False)
    edge_weight: np.ndarray | None = None
    in_weight: np.ndarray | None = None
    edge_attr: np.ndarray | None = None
    num_blocks: int | None = None
    block_ids: np.ndarray | None = None
    block_rows: np.ndarray | None = None
    block_ptr: np.ndarray | None = None
    link: dict[str, np.ndarray] | None = None
    node_ids: np.ndarray | None = None
    block_pos: np.ndarray | None = None
    block_full: np.ndarray | None = None

    @property
    def has_blocks(self) -> bool:
        """Whether the part carries the fixed node blocks bit-identical training needs."""
        return self.num_blocks is not None

    @property
    def edge_dim(self) -> int:
        """Width of the stored edge feature rows (0 when there are none)."""
        return 0 if self.edge_attr is None else int(self.edge_attr.shape[1])

    def __repr__(self) -> str:
        return (
            f"Partition(rank={self.rank}, num_parts={self.num_parts}, num_inner={self.num_inner}, "
            f"num_halo={self.num_halo}, num_edges={self.num_edges}, "
            f"num_features={self.num_features}, num_classes={self.num_classes})"
        )

    @property
    def num_local(self) -> int:
        """Inner plus halo nodes."""
        return self.num_inner + self.num_halo

    @property
    def num_edges(self) -> int:
        """Incoming edges of the inner nodes stored in this part."""
        return int(self.indices.shape[0])

    def send_to(self, peer: int) -> np.ndarray:
        """Local inner ids this rank sends to ``peer``, in the order ``peer`` stores them."""
        return self.send_index[self.send_offsets[peer] : self.send_offsets[peer + 1]]

    def halo_from(self, peer: int) -> slice:
        """Local ids of the halo rows owned by ``peer``, as a slice."""
        start = self.num_inner + int(self.recv_offsets[peer])
        return slice(start, self.num_inner + int(self.recv_offsets[peer + 1]))


def check_part_counts(root: Path, meta: dict, rank: int, arrays: dict[str, np.ndarray]) -> None:
    """Check the arrays of part ``rank`` against every count ``meta.json`` gives for them.

    Cheap checks (one pass over each array at most): the shapes against ``num_inner``,
    ``num_halo``, ``num_features`` and ``num_parts``; the row pointer and column ids; global ids
    against ``num_nodes``; labels against ``num_classes``; the stored edges against
    ``num_edges``, the training nodes against ``num_train`` and the sends against ``num_send``;
    the split masks disjoint and holding labelled nodes only.

    Args:
        root: the partition directory.
        meta: its checked ``meta.json`` (see :func:`~fullgraph.partition.format.read_meta`).
        rank: the part.
        arrays: the part's arrays by name (:data:`~fullgraph.partition.format.PART_ARRAYS`).

    Raises:
        PartitionError: naming ``meta.json`` and the field, or the array file, that disagree.
    """
    meta_path = root / META_NAME
    part = meta["parts"][rank]
    ni, nh = part["num_inner"], part["num_halo"]

    def file(name: str) -> str:
        return file_key(rank, name)

    def field(name: str, value: int, problem: str) -> PartitionError:
        return PartitionError(f"{meta_path}: {name} is {value} but {problem}; {REWRITE}")

    where = f"parts[{rank}]"
    # the dimensions first: a count below is never read off a scalar (no "-1 entries")
    for name in ("indptr", "indices", "global_ids", "in_degree", "y", "send_index", *SPLITS):
        if arrays[name].ndim != 1:
            raise PartitionError(f"{root / file(name)} has shape {arrays[name].shape}, not 1-D")
    rows = {k: int(arrays[k].shape[0]) if arrays[k].ndim else 0 for k in arrays}
    if rows["indptr"] != ni + 1:
        raise field(
            f"{where}.num_inner",
            ni,
            f"{file('indptr')} has {rows['indptr']} entries (not num_inner + 1 = {ni + 1})",
        )
    if rows["global_ids"] != ni + nh:
        raise field(
            f"{where}.num_halo",
            nh,
            f"{file('global_ids')} has {rows['global_ids']} rows (not num_inner + num_halo = "
            f"{ni} + {nh})",
        )
    for name, want, what in (
        ("in_degree", ni + nh, "num_inner + num_halo"),
        ("x", ni, "num_inner"),
        ("y", ni, "num_inner"),
        ("train_mask", ni, "num_inner"),
        ("val_mask", ni, "num_inner"),
        ("test_mask", ni, "num_inner"),
    ):
        if rows[name] != want:
            raise field(
                f"{where}.num_inner", ni, f"{file(name)} has {rows[name]} rows (not {what})"
            )
    x = arrays["x"]
    if x.ndim != 2 or x.shape[1] != meta["num_features"]:
        raise field("num_features", meta["num_features"], f"{file('x')} has shape {x.shape}")
    P = meta["num_parts"]
    for name in ("send_offsets", "recv_offsets"):
        if arrays[name].shape != (P + 1,):
            raise field(
                "num_parts", P, f"{file(name)} has {rows[name]} entries (not num_parts + 1)"
            )
    indptr, indices = arrays["indptr"], arrays["indices"]
    if indptr[0] != 0 or (ni and np.diff(indptr).min() < 0):
        raise PartitionError(f"{root / file('indptr')} is not a CSR row pointer ({REWRITE})")
    if indptr[-1] != indices.shape[0]:
        raise PartitionError(
            f"{root / file('indptr')} ends at {int(indptr[-1])} but {file('indices')} has "
            f"{indices.shape[0]} entries; {REWRITE}"
        )
    if indices.shape[0] != part["num_edges"]:
        raise field(
            f"{where}.num_edges",
            part["num_edges"],
            f"{file('indices')} stores {indices.shape[0]} edges",
        )
    if indices.size and (indices.min() < 0 or indices.max() >= ni + nh):
        raise PartitionError(
            f"{root / file('indices')} holds a column id outside [0, num_inner + num_halo = "
            f"{ni + nh}); {REWRITE}"
        )
    gids = arrays["global_ids"]
    n = meta["num_nodes"]
    if gids.size and (gids.min() < 0 or gids.max() >= n):
        bad = int(gids.min()) if gids.min() < 0 else int(gids.max())
        raise field("num_nodes", n, f"{file('global_ids')} holds node {bad}")
    y = arrays["y"]
    C = meta["num_classes"]
    if y.size and (y.min() < -1 or y.max() >= C):
        bad = int(y.min()) if y.min() < -1 else int(y.max())
        raise field("num_classes", C, f"{file('y')} holds label {bad}")
    masks = {k: arrays[k] for k in SPLITS}
    overlap = first_overlap(masks)
    if overlap is not None:
        a, b, v = overlap
        raise PartitionError(
            f"{root / file(a)}: node {int(gids[v])} is in both the {split_name(a)} and the "
            f"{split_name(b)} split ({file(b)}); a node may be in one split only"
        )
    for name, m in masks.items():
        if ni and np.any(y[m] < 0):
            v = int(gids[np.flatnonzero(m & (y < 0))[0]])
            raise PartitionError(
                f"{root / file(name)}: node {v} is in the {split_name(name)} split but has no "
                f"label (y = -1 in {file('y')})"
            )
    train = int(np.count_nonzero(masks["train_mask"]))
    if train != part["num_train"]:
        raise field(f"{where}.num_train", part["num_train"], f"{file('train_mask')} marks {train}")
    send, recv = arrays["send_offsets"], arrays["recv_offsets"]
    if recv[0] != 0 or recv[-1] != nh or np.diff(recv).min() < 0:
        raise field(
            f"{where}.num_halo",
            nh,
            f"{file('recv_offsets')} runs from {int(recv[0])} to {int(recv[-1])}",
        )
    num_send = int(arrays["send_index"].shape[0])
    if send[0] != 0 or send[-1] != num_send or np.diff(send).min() < 0:
        raise PartitionError(
            f"{root / file('send_offsets')} does not run from 0 to the {num_send} entries of "
            f"{file('send_index')}; {REWRITE}"
        )
    if "num_send" in part and part["num_send"] != num_send:
        raise field(f"{where}.num_send", part["num_send"], f"{file('send_index')} has {num_send}")
    check_halo_maps(root, rank, ni, arrays)
    if "block_ids" in arrays:
        check_part_blocks(root, meta, rank, arrays["block_ids"], arrays["block_ptr"])
    nnz = int(indices.shape[0])
    for name, want in (
        ("edge_weight", (nnz,)),
        ("in_weight", (ni + nh,)),
        ("edge_attr", (nnz, meta.get("edge_dim", 0))),
    ):
        if name in arrays and arrays[name].shape != want:
            raise PartitionError(
                f"{root / file(name)} has shape {list(arrays[name].shape)}, expected "
                f"{list(want)} (aligned with {file('indices')}); {REWRITE}"
            )


def check_part_blocks(
    root: Path, meta: dict, rank: int, block_ids: np.ndarray, block_ptr: np.ndarray
) -> None:
    """The cheap invariants of part ``rank``'s blocks (one pass over ``b`` entries): the
    ``parts[rank].num_blocks`` blocks ascending in ``[0, num_blocks)``, ``block_ptr`` running
    from 0 to ``num_inner`` with no block empty.

    Raises:
        PartitionError: one line naming the file and what is wrong.
    """
    part = meta["parts"][rank]
    b, ni, nb = part["num_blocks"], part["num_inner"], meta["num_blocks"]
    ids, ptr = root / file_key(rank, "block_ids"), root / file_key(rank, "block_ptr")
    if block_ids.shape != (b,):
        raise PartitionError(
            f"{root / META_NAME}: parts[{rank}].num_blocks is {b} but "
            f"{file_key(rank, 'block_ids')} has shape {list(block_ids.shape)}; {REWRITE}"
        )
    if b and (block_ids[0] < 0 or block_ids[-1] >= nb or np.any(np.diff(block_ids) <= 0)):
        raise PartitionError(
            f"{ids} is not a list of distinct blocks ascending in [0, num_blocks = {nb}); {REWRITE}"
        )
    if block_ptr.shape != (b + 1,) or block_ptr[0] != 0 or block_ptr[-1] != ni:
        raise PartitionError(
            f"{ptr} does not run from 0 to the part's {ni} inner rows in {b + 1} offsets; {REWRITE}"
        )
    if b and np.any(np.diff(block_ptr) <= 0):
        k = int(np.flatnonzero(np.diff(block_ptr) <= 0)[0])
        raise PartitionError(
            f"{ptr}: block {int(block_ids[k])} holds {int(block_ptr[k + 1] - block_ptr[k])} "
            f"rows (a block holds at least one); {REWRITE}"
        )


def check_halo_maps(root: Path, rank: int, num_inner: int, arrays: dict[str, np.ndarray]) -> None:
    """The cheap invariants of part ``rank``'s halo maps (checked on every load, also without
    checksums): it exchanges no rows with itself and sends inner nodes only.

    One pass over ``send_index``: a damaged file is refused here rather than as an
    ``IndexError`` deep in the first exchange.

    Raises:
        PartitionError: naming the file and the first id out of range.
    """
    send, recv = arrays["send_offsets"], arrays["recv_offsets"]
    for name, off in (("send_offsets", send), ("recv_offsets", recv)):
        if off[rank + 1] != off[rank]:
            raise PartitionError(
                f"{root / file_key(rank, name)}: part {rank} exchanges "
                f"{int(off[rank + 1] - off[rank])} rows with itself (a part sends and receives "
                f"only other parts' rows); {REWRITE}"
            )
    index = arrays["send_index"]
    if index.size and (index.min() < 0 or index.max() >= num_inner):
        bad = int(index.min()) if index.min() < 0 else int(index.max())
        pos = int(np.argmax(index == bad))
        raise PartitionError(
            f"{root / file_key(rank, 'send_index')}: entry {pos} sends node {bad}, outside the "
            f"part's {num_inner} inner nodes [0, {num_inner}); {REWRITE}"
        )


def check_peer_counts(counts: list[tuple[list[int], list[int]]]) -> None:
    """Every part sends each other part the number of rows that part's receive map expects
    from it: ``counts[r]`` is part ``r``'s ``(rows sent to each part, rows received from each
    part)``, from its ``send_offsets`` and ``recv_offsets``. A rank sees its own part only, so
    the ranks gather their counts at set-up (:meth:`~fullgraph.distributed.halo.HaloPlan.
    from_partition`); a mismatch would silently misplace rows in every exchange.

    Raises:
        PartitionError: the first part pair (in rank order) whose counts disagree.
    """
    for r, (sends, _) in enumerate(counts):
        for q, (_, receives) in enumerate(counts):
            if sends[q] != receives[r]:
                raise PartitionError(
                    f"part {r} sends {sends[q]} rows to part {q} ({file_key(r, 'send_offsets')}) "
                    f"but part {q} expects {receives[r]} from it "
                    f"({file_key(q, 'recv_offsets')}): the parts' halo maps disagree; {REWRITE}"
                )


def load_partition(
    path: str | os.PathLike[str] | PartitionDir,
    rank: int,
    *,
    mmap: bool = True,
    verify_checksums: bool = True,
) -> Partition:
    """Load part ``rank`` of the partition directory ``path``.

    Args:
        path: a directory written by :func:`fullgraph.partition.write_partitions` (or its
            ``meta.json``), or a :class:`~fullgraph.partition.format.PartitionDir` already
            opened (its ``meta.json`` is not read again).
        rank: which part, ``0 <= rank < num_parts``.
        mmap: memory-map the arrays (read-only) instead of reading them into memory.
        verify_checksums: hash every file of the part against ``meta.json`` first (sizes are
            always checked).

    Returns:
        The :class:`Partition`.

    Raises:
        PartitionError: missing directory or file, corrupted or truncated file, rank out of
            range, a ``meta.json`` field of the wrong type or inconsistent, or arrays that
            disagree with a count in ``meta.json`` (see :func:`check_part_counts`).
    """
    opened = path if isinstance(path, PartitionDir) else PartitionDir.open(path)
    root, meta, meta_hash = opened.root, opened.meta, opened.meta_hash
    num_parts = int(meta["num_parts"])
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise PartitionError(f"rank must be an integer, got {rank!r}")
    if not 0 <= rank < num_parts:
        raise PartitionError(f"rank {rank} out of range: {root} has {num_parts} parts")
    check_link_meta(meta, root / META_NAME)
    arrays: dict[str, np.ndarray] = {}
    wanted = {
        **PART_ARRAYS,
        **{k: EDGE_ARRAYS[k] for k in edge_arrays(meta)},
        **{k: BLOCK_ARRAYS[k] for k in block_arrays(meta)},
        **{k: LINK_ARRAYS[k] for k in link_arrays(meta)},
        **{k: CUT_ARRAYS[k] for k in cut_arrays(meta)},
    }
    for name, dtype in wanted.items():
        key = file_key(rank, name)
        entry = meta["files"].get(key)
        if entry is None:
            raise PartitionError(f"{root / META_NAME} lists no file {key}")
        file = check_file(root, key, entry, verify_checksums)
        try:
            array = np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise PartitionError(f"{file} is not a readable .npy file ({exc})") from exc
        if array.dtype != dtype or list(array.shape) != entry["shape"]:
            raise PartitionError(
                f"{file} holds {array.dtype} {list(array.shape)}, meta.json records "
                f"{entry['dtype']} {entry['shape']}"
            )
        arrays[name] = array
    link = link_view(arrays) if "link" in meta else None
    arrays = {k: v for k, v in arrays.items() if k not in LINK_ARRAYS}
    check_part_counts(root, meta, rank, arrays)
    if link is not None:
        check_part_link(root, meta, rank, link)
    part = meta["parts"][rank]
    num_inner, num_halo = int(part["num_inner"]), int(part["num_halo"])
    for name, rows in (("node_ids", num_inner + num_halo), ("block_pos", num_inner)):
        if name in arrays and arrays[name].shape != (rows,):
            raise PartitionError(
                f"{root / file_key(rank, name)} has shape {arrays[name].shape}, not ({rows},); "
                f"{REWRITE}"
            )
    if "block_full" in arrays and arrays["block_full"].shape != arrays["block_ids"].shape:
        raise PartitionError(
            f"{root / file_key(rank, 'block_full')} has {arrays['block_full'].shape[0]} entries "
            f"for {arrays['block_ids'].shape[0]} blocks; {REWRITE}"
        )
    if "block_ids" in arrays:
        arrays["block_rows"] = np.arange(num_inner, dtype=np.int64)
    return Partition(
        rank=int(rank),
        num_parts=num_parts,
        num_inner=num_inner,
        num_halo=num_halo,
        num_classes=int(meta["num_classes"]),
        num_features=int(meta["num_features"]),
        num_train_global=int(meta["num_train_global"]),
        partition_hash=meta_hash,
        meta=meta,
        num_blocks=int(meta["num_blocks"]) if "num_blocks" in meta else None,
        link=link,
        **arrays,
    )
