"""Which nodes ``fullgraph predict`` writes (``--nodes``), and where each rank's rows go.

``--nodes`` is one of:

- ``all`` (the default): every node, in global id order, as ``predict`` always wrote;
- ``labelled``: the nodes of the train, val and test masks; or a comma list of those splits
  (``train,val``): their nodes in ascending id;
- a file of node ids: a ``.npy`` of integers ``[m]``, or text with one id per line (``#``
  starts a comment): those nodes in the file's order.

Ids are the WHOLE graph's: on a receptive-field cut (:mod:`~fullgraph.partition.
receptive_cut`) a part's ``node_ids``, elsewhere the global ids. A selection other than
``all`` writes ``m`` rows per file and ``node_ids.npy`` (int64 ``[m]``: which node each row
is). :func:`parse_nodes` reads the request (a file whole: malformed, empty, a repeated id: one
line); :func:`check_request` refuses what the partition's ``meta.json`` already rules out (ids
out of range; on a cut, ``all`` and splits the cut did not keep); :func:`select_rows` (a
collective) gives every rank the output row of each of its inner rows (-1: not written), which
:class:`~fullgraph.training.inference.RowWriter` writes at.

On a cut only the nodes of the cut's splits (its seeds: the union of its masks) have exact
predictions; the other kept nodes lack part of their receptive field, so a request naming them
is refused, naming the fix (``--nodes labelled``, or a partition without ``--cut-hops``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.faults import agree
from fullgraph.errors import ConfigError, DataError
from fullgraph.partition import Partition
from fullgraph.partition.load import whole_ids
from fullgraph.run.prediction_dir import WRITE_WINDOW_BYTES
from fullgraph.training.cut_check import WHOLE

ALL = "all"
LABELLED = "labelled"
#: ``--nodes`` split name -> the part's mask
SPLIT_MASKS = {"train": "train_mask", "val": "val_mask", "test": "test_mask"}
#: What ``--nodes`` accepts, for messages.
NODES_HELP = (
    "all, labelled, splits (train,val,test, comma-separated) or a file of node ids (.npy of "
    "ints [m], or text with one id per line)"
)


@dataclass(frozen=True)
class NodeRequest:
    """``--nodes`` read: every node, the nodes of some splits, or the ids of a file.

    Attributes:
        text: ``--nodes`` as given.
        splits: the splits whose nodes are written (``labelled``: all three), or ``()``.
        path: the file of node ids, or ``None``.
        ids: the file's ids in its order (int64 [m]), or ``None``.
        lines: the file's line of every id (a text file), or ``None``: messages name entries.
    """

    text: str = ALL
    splits: tuple[str, ...] = ()
    path: str | None = None
    ids: np.ndarray | None = field(default=None, compare=False)
    lines: np.ndarray | None = field(default=None, compare=False)

    @property
    def everything(self) -> bool:
        """Every node (``--nodes all``): the files as ``predict`` always wrote them."""
        return not self.splits and self.path is None

    def entry(self, i: int) -> str:
        """Where the file's ``i``-th id is, for messages (``line 7``, ``entry 6``)."""
        return f"line {int(self.lines[i])}" if self.lines is not None else f"entry {i}"


def parse_nodes(text: str) -> NodeRequest:
    """``--nodes TEXT`` read; a file is read whole and checked (ids, not their range).

    Raises:
        ConfigError: an unknown split, no such file.
        DataError: a malformed or empty file, an id given twice.
    """
    spec = (text or "").strip()
    if spec in ("", ALL):
        return NodeRequest()
    if spec == LABELLED:
        return NodeRequest(spec, tuple(SPLIT_MASKS))
    names = [t.strip() for t in spec.split(",")]
    path = Path(spec)
    if all(n in SPLIT_MASKS for n in names):
        return NodeRequest(spec, tuple(s for s in SPLIT_MASKS if s in names))
    if path.is_file():
        ids, lines = read_node_ids(path)
        return NodeRequest(spec, (), str(path), ids, lines)
    if any(n in SPLIT_MASKS for n in names):
        bad = next(n for n in names if n not in SPLIT_MASKS)
        raise ConfigError(f"--nodes {spec}: unknown split {bad!r} (give {NODES_HELP})")
    raise ConfigError(f"--nodes {spec}: no such file (give {NODES_HELP})")


def read_node_ids(path: str | Path) -> tuple[np.ndarray, np.ndarray | None]:
    """The node ids of ``path``: a ``.npy`` of integers ``[m]``, or text with one id per line
    (``#`` starts a comment; blank lines are skipped).

    Returns:
        ``(ids int64 [m], the line of every id or None for .npy)``.

    Raises:
        DataError: unreadable, another shape or dtype, a line that is not one integer, no id,
            an id given twice (one line naming the first).
    """
    path = Path(path)
    lines: np.ndarray | None = None
    try:
        if path.suffix == ".npy":
            raw = np.load(path, allow_pickle=False)
        else:
            values, where = [], []
            for i, line in enumerate(path.read_text().splitlines()):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                try:
                    if len(words) != 1:
                        raise ValueError
                    values.append(int(words[0]))
                except ValueError:
                    raise DataError(
                        f"--nodes {path}: line {i + 1} ({line.strip()!r}) is not one node id"
                    ) from None
                where.append(i + 1)
            raw = np.asarray(values, dtype=np.int64)
            lines = np.asarray(where, dtype=np.int64)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"--nodes {path}: cannot read it ({exc})") from None
    if raw.ndim != 1 or not (np.issubdtype(raw.dtype, np.integer) or raw.size == 0):
        raise DataError(
            f"--nodes {path}: expected integer node ids [m], got {raw.dtype} {raw.shape}"
        )
    if raw.size == 0:
        raise DataError(f"--nodes {path}: holds no node id; nothing to predict")
    ids = raw.astype(np.int64)
    order = np.argsort(ids, kind="stable")
    same = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if same.size:
        first, second = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        req = NodeRequest(str(path), (), str(path), ids, lines)
        raise DataError(
            f"--nodes {path}: node {ids[first]} is given twice ({req.entry(first)} and "
            f"{req.entry(second)}); each node is written once ({_count(same.size, 'repeat')})"
        )
    return ids, lines


def _count(n: int, noun: str) -> str:
    """``3 ids``, ``1 id``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def whole_num_nodes(meta: dict[str, Any]) -> int:
    """The whole graph's node count of a partition's ``meta.json`` (a cut's ``whole``)."""
    cut = meta.get("cut")
    return int(cut["whole_num_nodes"]) if cut else int(meta["num_nodes"])


def cut_scope(meta: dict[str, Any], where: str) -> str:
    """What a cut's predictions cover, for messages (``--parts P is cut to ... only``)."""
    cut = meta["cut"]
    return (
        f"{where} is cut to the {int(cut['hops'])}-hop receptive field of "
        f"{'/'.join(cut['splits'])} (meta.json cut): predictions are exact for its "
        f"{int(cut['seeds']):,} labelled nodes only"
    )


def check_range(request: NodeRequest, num_nodes: int, where: str) -> None:
    """Refuse file ids outside ``[0, num_nodes)`` (one line: the first and how many).

    Raises:
        DataError: an id out of range.
    """
    if request.ids is None:
        return
    bad = np.flatnonzero((request.ids < 0) | (request.ids >= num_nodes))
    if bad.size:
        i = int(bad[0])
        raise DataError(
            f"--nodes {request.path}: node {request.ids[i]} ({request.entry(i)}) is outside "
            f"[0, {num_nodes}), the nodes of {where}; {_count(bad.size, 'such id')}"
        )


def check_request(
    request: NodeRequest, meta: dict[str, Any] | None, where: str, link: bool = False
) -> None:
    """Refuse, before any work, what the request and the partition's ``meta.json`` rule out:
    ``--nodes`` for a link model, ids out of range; on a cut, every node and a split the cut
    did not keep.

    Args:
        request: ``--nodes`` read.
        meta: the partition's metadata, or ``None`` (one process: checked once loaded).
        where: how the command line names the data (``--parts DIR``).
        link: the model is a link model.

    Raises:
        ConfigError, DataError: one line naming the fix.
    """
    if link:
        if not request.everything:
            raise ConfigError(
                f"--nodes {request.text} applies to node models; a link model scores --pairs"
            )
        return
    if meta is None:
        return
    check_range(request, whole_num_nodes(meta), where)
    if "cut" not in meta:
        return
    fix = f"predict on a {WHOLE}"
    if request.everything:
        raise ConfigError(
            f"{cut_scope(meta, where)}; add --nodes labelled (or a file of them), or {fix}"
        )
    kept = list(meta["cut"]["splits"])
    dropped = [s for s in request.splits if s not in kept]
    if dropped and request.text != LABELLED:
        raise ConfigError(
            f"--nodes {request.text}: {cut_scope(meta, where)}, not {dropped[0]}'s; give "
            f"--nodes {','.join(kept)} (or labelled), or {fix}"
        )


@dataclass
class NodeRows:
    """This rank's share of a selection (:func:`select_rows`).

    Attributes:
        rows: int64 [num_inner], the output row of every inner row, or -1: not written.
        count: ``m``, the rows of every output file.
        node_ids: rank 0: the whole-graph id of every output row (int64 [m], what
            ``node_ids.npy`` holds); other ranks ``None``.
    """

    rows: np.ndarray
    count: int
    node_ids: np.ndarray | None


def _labelled(part: Partition, splits: tuple[str, ...]) -> np.ndarray:
    """bool [num_inner]: the inner rows in any of ``splits``' masks."""
    mask = np.zeros(int(part.num_inner), dtype=bool)
    for name in splits:
        mask |= np.asarray(getattr(part, SPLIT_MASKS[name]), dtype=bool)[: mask.size]
    return mask


def select_rows(
    request: NodeRequest, part: Partition, comm: Communicator, where: str
) -> NodeRows | None:
    """Every rank's output rows of ``request`` (a collective; ``None`` for every node).

    Splits: their nodes in ascending whole-graph id (every rank gathers the ids selected,
    ``8 m`` bytes). A file: its ids in its order, each found at the rank that owns it; on a cut
    only at a labelled row (the others' predictions are not exact).

    Args:
        request: ``--nodes`` read (and :func:`check_request` passed).
        part: this rank's part (one process: the whole graph's).
        comm: the communicator.
        where: how the command line names the data.

    Raises:
        ConfigError, DataError: on every rank alike: no node selected, a file's id out of range
            (one process) or, on a cut, not a labelled node.
    """
    if request.everything:
        return None
    meta = getattr(part, "meta", None) or {}
    num_inner = int(part.num_inner)
    ids = np.asarray(whole_ids(part)[:num_inner], dtype=np.int64)
    rows = np.full(num_inner, -1, dtype=np.int64)
    if request.ids is None:
        mask = _labelled(part, request.splits)
        mine = ids[mask]
        chosen = np.sort(np.concatenate([np.asarray(a) for a in comm.allgather_object(mine)]))

        def nonempty() -> None:
            if not chosen.size:
                raise DataError(
                    f"--nodes {request.text}: {where} has no node in "
                    f"{'/'.join(request.splits)}; nothing to predict"
                )

        agree(comm, nonempty)
        rows[mask] = np.searchsorted(chosen, mine)
        return NodeRows(rows, int(chosen.size), chosen if comm.rank == 0 else None)
    wanted = request.ids
    if comm.size == 1:  # one process: the range is known now
        agree(comm, lambda: check_range(request, num_inner, where))
    cut = "cut" in meta
    eligible = _labelled(part, tuple(SPLIT_MASKS)) if cut else np.ones(num_inner, dtype=bool)
    order = np.argsort(wanted, kind="stable")
    ascending = wanted[order]
    at = np.minimum(np.searchsorted(ascending, ids), wanted.size - 1)
    hit = (ascending[at] == ids) & eligible
    rows[hit] = order[at[hit]]
    found = np.zeros(wanted.size, dtype=bool)
    for entries in comm.allgather_object(rows[hit]):
        found[np.asarray(entries, dtype=np.int64)] = True
    del order, ascending, at, hit

    def covered() -> None:
        missing = np.flatnonzero(~found)
        if not missing.size:
            return
        i = int(missing[0])
        what = "labelled node of the cut" if cut else "node of this graph"
        fix = (
            f"; {cut_scope(meta, where)}: give their ids (--nodes labelled writes them all), "
            f"or predict on a {WHOLE}"
            if cut
            else ""
        )
        raise ConfigError(
            f"--nodes {request.path}: {missing.size:,} of its {_count(wanted.size, 'id')} "
            f"{'names' if missing.size == 1 else 'name'} no {what} "
            f"(the first: node {wanted[i]}, {request.entry(i)}){fix}"
        )

    agree(comm, covered)
    return NodeRows(rows, int(wanted.size), wanted if comm.rank == 0 else None)


def write_node_ids(
    path: Path, node_ids: np.ndarray, window_bytes: int = WRITE_WINDOW_BYTES
) -> None:
    """Fill ``node_ids.npy`` (created at its size with the outputs) with the selection's ids,
    a window of the file mapped at a time (as :class:`~fullgraph.training.inference.
    RowWriter` writes)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0
        shape, _, dtype = (read if version == (1, 0) else np.lib.format.read_array_header_2_0)(f)
        header = f.tell()
    assert tuple(shape) == node_ids.shape, (shape, node_ids.shape)
    per = max(1, window_bytes // np.dtype(dtype).itemsize)
    for start in range(0, node_ids.size, per):
        part = node_ids[start : start + per]
        mm = np.memmap(
            path, dtype=dtype, mode="r+", offset=header + start * dtype.itemsize, shape=part.shape
        )
        mm[:] = part
        mm.flush()
        del mm


def selection_record(
    request: NodeRequest, rows: NodeRows | None, num_nodes: int, meta: dict[str, Any] | None
) -> dict[str, Any]:
    """``predict.json``'s ``nodes``: what ``--nodes`` selected and how many rows the files
    hold (``node_ids``: the file naming each row's node; ``whole_graph``: its ids are a cut's
    whole-graph ids)."""
    kind = "all" if request.everything else ("file" if request.path else "splits")
    return {
        "select": kind,
        "spec": request.text,
        "splits": list(request.splits),
        "file": str(Path(request.path).resolve()) if request.path else None,
        "rows": num_nodes if rows is None else rows.count,
        "node_ids": None if rows is None else "node_ids.npy",
        "whole_graph": bool(meta and "cut" in meta),
    }
