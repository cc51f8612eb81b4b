"""Building per-rank parts from an owner array and writing them atomically.

The on-disk layout is described in :mod:`fullgraph.partition.format`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fullgraph.atomic import atomic_dir, atomic_write_json
from fullgraph.datasets.graph import SPLITS, Graph, first_overlap, split_name
from fullgraph.errors import DataError, PartitionError
from fullgraph.partition.assign import assign_parts, check_num_parts
from fullgraph.partition.format import (
    FORMAT_VERSION,
    META_NAME,
    PART_ARRAYS,
    file_key,
    part_dir_name,
    sha256_file,
)
from fullgraph.partition.report import build_report
from fullgraph.resources import StageTimer


def save_array(root: Path, rank: int, name: str, array: np.ndarray, files: dict) -> None:
    """Save ``array`` as ``part-<rank>/<name>.npy`` under ``root`` and record it in ``files``."""
    expected = PART_ARRAYS[name]
    if array.dtype != expected:
        raise PartitionError(f"internal: {name} has dtype {array.dtype}, expected {expected}")
    key = file_key(rank, name)
    path = root / key
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)
    files[key] = {
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
        "shape": list(array.shape),
        "dtype": str(array.dtype),
    }


def _inner_part(
    graph: Graph,
    owner: np.ndarray,
    num_parts: int,
    rank: int,
    inner: np.ndarray,
    local_inner: np.ndarray,
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """Arrays of one part except the send lists.

    Returns:
        ``(arrays, halo owners, number of cut incoming edges)``.
    """
    n = graph.num_nodes
    ni = int(inner.size)
    counts = graph.indptr[inner + 1] - graph.indptr[inner]
    indptr = np.zeros(ni + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    nnz = int(indptr[-1])
    gather = np.repeat(graph.indptr[inner] - indptr[:-1], counts) + np.arange(nnz, dtype=np.int64)
    src = graph.indices[gather].astype(np.int64, copy=False)
    del gather
    src_owner = owner[src]
    foreign = src_owner != rank
    key = src_owner[foreign] * n + src[foreign]
    halo_keys = np.unique(key)
    halo_owner = halo_keys // n
    cols = np.empty(nnz, dtype=np.int64)
    cols[~foreign] = local_inner[src[~foreign]]
    cols[foreign] = ni + np.searchsorted(halo_keys, key)
    recv_offsets = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(halo_owner, minlength=num_parts), out=recv_offsets[1:])
    global_ids = np.concatenate([inner, halo_keys % n]).astype(np.int64)
    x = (
        np.zeros((ni, 0), dtype=np.float32)
        if graph.x is None
        else np.asarray(graph.x[inner], dtype=np.float32)
    )
    arrays = {
        "global_ids": global_ids,
        "indptr": indptr,
        "indices": cols,
        "in_degree": (graph.indptr[global_ids + 1] - graph.indptr[global_ids]).astype(np.int64),
        "x": x,
        "y": np.asarray(graph.y[inner], dtype=np.int64),
        "train_mask": np.asarray(graph.train_mask[inner], dtype=np.bool_),
        "val_mask": np.asarray(graph.val_mask[inner], dtype=np.bool_),
        "test_mask": np.asarray(graph.test_mask[inner], dtype=np.bool_),
        "recv_offsets": recv_offsets,
    }
    return arrays, halo_owner, int(foreign.sum())


def write_partitions(
    graph: Graph,
    owner: np.ndarray,
    out: str | os.PathLike[str],
    *,
    method: str,
    seed: int,
    force: bool = False,
    num_parts: int | None = None,
    timer: StageTimer | None = None,
    notes: list[str] | None = None,
) -> dict:
    """Write the parts that ``owner`` defines to ``out`` (temporary directory, then rename).

    Args:
        graph: the partitioned graph.
        owner: int64 [num_nodes], owner rank of every node, in ``[0, num_parts)``.
        out: the partition directory to create.
        method: partitioning method, recorded in ``meta.json``.
        seed: seed, recorded in ``meta.json``.
        force: replace an existing ``out``.
        num_parts: number of parts P (default ``owner.max() + 1``; give it when a part may be
            empty).
        timer: stages already timed (e.g. the assignment), extended with the build stages.
        notes: remarks made while assigning, copied into the report.

    Returns:
        The metadata written to ``out/meta.json`` (with its ``report``).

    Raises:
        FileExistsError: ``out`` exists and ``force`` is false, also when it appears while the
            parts are written (another run); nothing is replaced then.
        DataError: the graph's split masks overlap.
        PartitionError: ``owner`` has the wrong shape or values.
    """
    n = graph.num_nodes
    overlap = first_overlap({k: getattr(graph, k) for k in SPLITS})
    if overlap is not None:
        a, b, v = overlap
        raise DataError(
            f"{graph.name}: node {v} is in both the {split_name(a)} and the {split_name(b)} "
            f"split; a node may be in one split only"
        )
    owner = np.asarray(owner)
    if owner.shape != (n,) or not np.issubdtype(owner.dtype, np.integer):
        raise PartitionError(f"owner must be an integer array of shape ({n},), got {owner.shape}")
    owner = owner.astype(np.int64, copy=False)
    if owner.min() < 0:
        raise PartitionError(f"owner holds a negative rank ({int(owner.min())})")
    num_parts = int(owner.max()) + 1 if num_parts is None else num_parts
    check_num_parts(num_parts, n)
    if owner.max() >= num_parts:
        raise PartitionError(f"owner holds rank {int(owner.max())} >= num_parts {num_parts}")
    timer = timer if timer is not None else StageTimer()
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists (use --force to replace it)")

    order = np.argsort(owner, kind="stable")  # inner nodes of each rank, ascending global id
    offsets = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=num_parts), out=offsets[1:])
    local_inner = np.empty(n, dtype=np.int64)
    local_inner[order] = np.arange(n, dtype=np.int64) - offsets[owner[order]]

    files: dict[str, dict] = {}
    parts: list[dict] = []
    halos: list[tuple[np.ndarray, np.ndarray]] = []
    edge_cut = 0
    with atomic_dir(out, force=force) as tmp:
        with timer.stage("build_parts"):
            for r in tqdm(range(num_parts), desc="build parts", unit="part", disable=None):
                (tmp / part_dir_name(r)).mkdir()
                inner = order[offsets[r] : offsets[r + 1]]
                arrays, halo_owner, cut = _inner_part(
                    graph, owner, num_parts, r, inner, local_inner
                )
                edge_cut += cut
                for name, array in arrays.items():
                    save_array(tmp, r, name, array, files)
                ni = int(inner.size)
                halos.append((arrays["global_ids"][ni:], arrays["recv_offsets"]))
                parts.append(
                    {
                        "rank": r,
                        "num_inner": ni,
                        "num_halo": int(halo_owner.size),
                        "num_edges": int(arrays["indptr"][-1]),
                        "num_train": int(arrays["train_mask"].sum()),
                    }
                )
                del arrays
        with timer.stage("send_lists"):
            for r in range(num_parts):
                pieces = [local_inner[halo_gid[recv[r] : recv[r + 1]]] for halo_gid, recv in halos]
                send_offsets = np.zeros(num_parts + 1, dtype=np.int64)
                np.cumsum([p.size for p in pieces], out=send_offsets[1:])
                send_index = np.concatenate(pieces).astype(np.int64)
                save_array(tmp, r, "send_index", send_index, files)
                save_array(tmp, r, "send_offsets", send_offsets, files)
                parts[r]["num_send"] = int(send_index.size)
        meta = {
            "format_version": FORMAT_VERSION,
            "dataset": graph.name,
            "num_nodes": n,
            "num_edges": graph.num_edges,
            "num_features": graph.num_features,
            "num_classes": int(graph.num_classes),
            "num_parts": num_parts,
            "method": method,
            "seed": int(seed),
            "num_train_global": int(graph.train_mask.sum()),
            "edge_cut": int(edge_cut),
            "parts": parts,
            "report": build_report(parts, graph.num_edges, edge_cut, timer, notes or []),
            "files": dict(sorted(files.items())),
        }
        atomic_write_json(tmp / META_NAME, meta)
    return meta


def partition_graph(
    graph: Graph,
    num_parts: int,
    out: str | os.PathLike[str],
    method: str = "metis",
    seed: int = 0,
    force: bool = False,
) -> dict:
    """Assign owners with :func:`assign_parts` and write the parts with :func:`write_partitions`.

    Args:
        graph: the graph to split.
        num_parts: number of parts P.
        out: the partition directory to create.
        method: ``metis``, ``random`` or ``contiguous``.
        seed: seed of the method.
        force: replace an existing ``out``.

    Returns:
        The metadata written to ``out/meta.json``; ``meta["report"]`` is the partition report.
    """
    check_num_parts(num_parts, graph.num_nodes)
    if Path(out).exists() and not force:
        raise FileExistsError(f"{out} already exists (use --force to replace it)")
    timer = StageTimer()
    notes: list[str] = []
    with timer.stage("assign"):
        owner = assign_parts(graph, num_parts, method=method, seed=seed, notes=notes)
    return write_partitions(
        graph,
        owner,
        out,
        method=method,
        seed=seed,
        force=force,
        num_parts=num_parts,
        timer=timer,
        notes=notes,
    )
