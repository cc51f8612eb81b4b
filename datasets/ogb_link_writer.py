"""Write a link dataset (message-passing graph + :class:`~fullgraph.datasets.link.LinkSplit`)
in OGB's linkprop layout, so that :func:`fullgraph.datasets.load` and
:func:`fullgraph.datasets.load_link_split` read it back.

Layout written under ``<root>/<name with - as _>/`` (one atomic directory rename)::

    raw/edge.csv.gz             the training edges, each undirected edge once (u < v)
    raw/edge_weight.csv.gz      one weight per line of edge.csv.gz (when the graph has weights)
    raw/edge_feat.csv.gz        one feature row per line (when the graph has edge features)
    raw/node-feat.csv.gz        node features (when the graph has them)
    raw/node-label.csv.gz       node labels (when the graph has classes: carried over)
    raw/num-node-list.csv.gz, raw/num-edge-list.csv.gz
    split/<scheme>/{train,valid,test}.pt   torch.save'd dicts with OGB's keys: ``edge`` [E, 2]
                                (+ ``weight``), ``edge_neg`` [N, 2]; or per-edge negatives
                                ``source_node``, ``target_node``, ``target_node_neg`` [E, K]
    meta.json                   fullgraph's marker: ``task: link``, metric, layout, counts,
                                the source and the split's parameters

Edge values are written once per undirected edge: those of the direction ``u -> v`` with
``u < v``. ``force`` replaces only a directory of exactly these (:data:`LINK_DATASET`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from fullgraph.atomic import (
    OutputKind,
    atomic_dir,
    atomic_write_json,
    holds,
    is_plain_dir,
    is_plain_file,
    read_marker,
)
from fullgraph.datasets.edges import csr_to_edges
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.link import EVAL_SPLITS, LINK_SPLITS, LinkSplit
from fullgraph.datasets.ogb_link import LINK_TASK
from fullgraph.datasets.ogb_writer import (
    MARKER_FORMAT,
    _write_columns,
    _write_lines,
    _write_matrix,
)
from fullgraph.datasets.paths import dataset_dir
from fullgraph.renames import is_temporary_name

log = logging.getLogger(__name__)

_RAW_FILES = {
    "edge.csv.gz",
    "edge_weight.csv.gz",
    "edge_feat.csv.gz",
    "node-feat.csv.gz",
    "node-label.csv.gz",
    "num-node-list.csv.gz",
    "num-edge-list.csv.gz",
}
_SPLIT_FILES = {f"{s}.pt" for s in LINK_SPLITS}


def _files_under(entry: Path, kept: set[str] | None) -> list[Path]:
    """Entries of ``entry/<sub>/`` that are not plain files named in ``kept`` (``None``: the
    reader's cache, ``.npy`` and ``key.json``); temporaries of a cache being written skipped."""
    found: list[Path] = []
    for sub in entry.iterdir():
        if kept is None and is_temporary_name(sub.name):
            continue
        if not is_plain_dir(sub):
            found.append(sub)
            continue
        for f in sub.iterdir():
            name_ok = f.name in kept if kept is not None else f.name.endswith(".npy")
            if not ((name_ok or (kept is None and f.name == "key.json")) and is_plain_file(f)):
                found.append(f)
    return found


def _not_written_here(path: Path) -> str | None:
    """``None`` when ``path`` is a link dataset :func:`write_ogb_link` wrote (or an empty
    directory), else what makes it someone else's."""
    if not path.is_dir():
        return "it is a file" if path.is_file() else "it is not a directory"
    marker = read_marker(path / "meta.json")
    ours = (
        isinstance(marker, dict)
        and marker.get("format") == MARKER_FORMAT
        and marker.get("task") == LINK_TASK
    )
    entries = sorted(path.iterdir())
    unexpected: list[Path] = []
    for entry in entries:
        if entry.name == "meta.json" and ours:
            continue
        if entry.name == "raw" and is_plain_dir(entry):
            unexpected += [
                f for f in entry.iterdir() if not (f.name in _RAW_FILES and is_plain_file(f))
            ]
        elif entry.name in ("split", "processed") and is_plain_dir(entry):
            unexpected += _files_under(entry, _SPLIT_FILES if entry.name == "split" else None)
        else:
            unexpected.append(entry)
    reason = holds(path, unexpected)
    if reason is None and not ours and entries:
        reason = "it has no meta.json marker of a fullgraph link dataset"
    return reason


#: A link dataset in OGB's linkprop layout: ``force`` replaces only one written here.
LINK_DATASET = OutputKind("a link dataset", _not_written_here)


def _save_split(where: Path, split: LinkSplit) -> None:
    """``{train,valid,test}.pt`` with OGB's keys (see the module doc)."""
    import torch

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))

    for s in LINK_SPLITS:
        pos = split.edges[s]
        if split.per_edge_negatives:
            obj = {"source_node": tensor(pos[:, 0]), "target_node": tensor(pos[:, 1])}
            if s in EVAL_SPLITS:
                obj["target_node_neg"] = tensor(split.negatives[s])
        else:
            obj = {"edge": tensor(pos)}
            if s in EVAL_SPLITS:
                obj["edge_neg"] = tensor(split.negatives[s])
            if s in split.edge_weight:
                obj["weight"] = torch.from_numpy(np.asarray(split.edge_weight[s], np.float32))
        torch.save(obj, where / f"{s}.pt")
        del obj


def write_ogb_link(
    graph: Graph,
    split: LinkSplit,
    root: str | Path,
    name: str,
    *,
    force: bool = False,
    split_scheme: str = "random",
    source: dict | None = None,
) -> Path:
    """Write ``graph`` (the message-passing graph: the training edges both ways) and ``split``
    at ``<root>/<name with - as _>`` in OGB's linkprop layout (atomic directory write).

    Args:
        graph: the message-passing graph (validated first).
        split: its supervision edges (checked first).
        root: dataset root directory.
        name: dataset name; ``load(name, root)`` and ``load_link_split(name, root)`` find it.
        force: replace an existing directory (only a link dataset written here).
        split_scheme: name of the ``split/<scheme>/`` directory.
        source: what the dataset was made from, kept in ``meta.json`` (default ``graph.meta``).

    Returns:
        The dataset directory.

    Raises:
        FileExistsError: the directory exists and ``force`` is false.
        ConfigError: the directory exists and is not a link dataset written here.
        ValueError: the graph's edges are not the split's training edges both ways.
    """
    graph.validate()
    split.check(where=name)
    src, dst = csr_to_edges(graph.indptr, graph.indices)
    once = src < dst
    lines = int(np.count_nonzero(once))
    if lines != len(split.edges["train"]) or 2 * lines != src.size:
        raise ValueError(
            f"{name}: the graph has {src.size} entries, the split {len(split.edges['train'])} "
            f"training edges; the message-passing graph must be those edges both ways"
        )
    target = dataset_dir(root, name)
    with atomic_dir(target, force=force, ours=LINK_DATASET) as tmp:
        raw = tmp / "raw"
        where = tmp / "split" / split_scheme
        raw.mkdir()
        where.mkdir(parents=True)
        log.info("%s: writing %d training edges", name, lines)
        _write_columns(raw / "edge.csv.gz", {"u": src[once], "v": dst[once]}, f"{name} edges")
        del src, dst
        if graph.edge_weight is not None:
            weights = {"w": np.asarray(graph.edge_weight)[once]}
            _write_columns(raw / "edge_weight.csv.gz", weights, f"{name} edge weights")
        if graph.edge_attr is not None:
            rows = np.asarray(graph.edge_attr)[once]
            _write_matrix(raw / "edge_feat.csv.gz", rows, f"{name} edge features")
        del once
        if graph.x is not None:
            log.info("%s: writing %d x %d features", name, *graph.x.shape)
            _write_matrix(raw / "node-feat.csv.gz", graph.x, f"{name} features")
        labels = graph.num_classes > 1
        if labels:
            y = graph.y
            if (y < 0).any():
                y = np.where(y < 0, np.nan, y.astype(np.float64))
            _write_columns(raw / "node-label.csv.gz", {"y": y}, f"{name} labels")
        _write_lines(raw / "num-node-list.csv.gz", [str(graph.num_nodes)])
        _write_lines(raw / "num-edge-list.csv.gz", [str(lines)])
        _save_split(where, split)
        counts = {s: len(split.edges[s]) for s in LINK_SPLITS}
        for s in EVAL_SPLITS:  # negative pairs, or targets in all (E x K)
            neg = split.negatives[s]
            counts[f"{s}_neg"] = int(neg.size if split.per_edge_negatives else len(neg))
        atomic_write_json(
            tmp / "meta.json",
            {
                "format": MARKER_FORMAT,
                "task": LINK_TASK,
                "name": name,
                "num_classes": int(graph.num_classes) if labels else 1,
                "split_scheme": split_scheme,
                "has_features": graph.x is not None,
                "has_labels": labels,
                "metric": split.metric,
                "per_edge_negatives": split.per_edge_negatives,
                "undirected": split.undirected,
                "counts": counts,
                "source": graph.meta if source is None else source,
            },
        )
    return target
