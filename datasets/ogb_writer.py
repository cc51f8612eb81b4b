"""Write a :class:`Graph` in the OGB node-property layout, so the OGB reader loads it back.

Layout written under ``<root>/<name with - as _>/`` (one atomic directory rename)::

    raw/edge.csv.gz            "u,v" per line, each undirected edge once (u < v), no header
    raw/node-feat.csv.gz       one row of comma-separated floats per node
    raw/node-label.csv.gz      one integer per node ("nan" for unlabelled nodes)
    raw/num-node-list.csv.gz   the node count
    raw/num-edge-list.csv.gz   the count of lines in edge.csv.gz
    split/<scheme>/{train,valid,test}.csv.gz   node ids, one per line
    meta.json                  fullgraph's marker: name, classes, split scheme, whether the
                               edge file is symmetric-once, and the generator's parameters

and, once loaded, the reader's cache ``processed/<variant>/{key.json,*.npy}``. The chunked
synthetic writer's ``npy`` layout has ``arrays/*.npy`` (:data:`NPY_ARRAYS`) instead of ``raw/``
and ``split/``. ``force`` replaces only a directory of exactly these (:data:`DATASET`).

CSV text is written by pyarrow's multi-threaded CSV writer into a gzip stream at level 1
(fast; OGB's files are ordinary gzip so any level reads the same).
"""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fullgraph.atomic import (
    OutputKind,
    atomic_dir,
    atomic_write_json,
    holds,
    is_plain_dir,
    is_plain_file,
    read_marker,
)
from fullgraph.datasets.edges import csr_to_edges, is_symmetric
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.paths import dataset_dir
from fullgraph.renames import is_temporary_name

log = logging.getLogger(__name__)

#: Version of the meta.json marker written beside OGB-layout data.
MARKER_FORMAT = "fullgraph-ogb-v1"
_ROWS_PER_BATCH = 1_000_000
#: Values per CSV batch written (rows x columns), whatever the width.
_CELLS_PER_BATCH = 1 << 24
#: The files of ``raw/`` and of ``split/<scheme>/`` written here.
_RAW_FILES = {
    "edge.csv.gz",
    "node-feat.csv.gz",
    "node-label.csv.gz",
    "num-node-list.csv.gz",
    "num-edge-list.csv.gz",
    "edge_weight.csv.gz",
    "edge_feat.csv.gz",
}
_SPLIT_FILES = {"train.csv.gz", "valid.csv.gz", "test.csv.gz"}
#: The ``npy`` layout's array directory and arrays (:mod:`fullgraph.datasets.npy_layout`).
ARRAYS_DIR = "arrays"
NPY_ARRAYS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")


def _is_cache_file(name: str) -> bool:
    return name.endswith(".npy") or name == "key.json"


def _unexpected_under(entry: Path) -> list[Path]:
    """The paths under ``raw/``, ``split/`` or ``processed/`` that :func:`write_ogb` and the
    reader's cache would not have written (``entry`` itself for any other name)."""
    if entry.name == "raw" and is_plain_dir(entry):
        return [f for f in entry.iterdir() if not (f.name in _RAW_FILES and is_plain_file(f))]
    if entry.name == ARRAYS_DIR and is_plain_dir(entry):  # the npy layout's arrays
        names = {f"{a}.npy" for a in NPY_ARRAYS}
        return [f for f in entry.iterdir() if not (f.name in names and is_plain_file(f))]
    if entry.name not in ("split", "processed") or not is_plain_dir(entry):
        return [entry]
    kept = (lambda n: n in _SPLIT_FILES) if entry.name == "split" else _is_cache_file
    found: list[Path] = []
    for sub in entry.iterdir():  # split/<scheme>/, processed/<variant>/
        if entry.name == "processed" and is_temporary_name(sub.name):
            continue  # a cache being written (or a dead writer's, removed by the next one)
        if not is_plain_dir(sub):
            found.append(sub)
            continue
        found.extend(f for f in sub.iterdir() if not (kept(f.name) and is_plain_file(f)))
    return found


def _not_written_by_write_ogb(path: Path) -> str | None:
    """``None`` when ``path`` is a dataset directory :func:`write_ogb` wrote (or an empty
    directory), else what makes it someone else's: a ``meta.json`` marker of
    :data:`MARKER_FORMAT`, ``raw/`` and ``split/<scheme>/`` of the files written here,
    ``processed/`` of the reader's cache, nothing else."""
    if not path.is_dir():
        return "it is a file" if path.is_file() else "it is not a directory"
    marker = read_marker(path / "meta.json")
    ours = isinstance(marker, dict) and marker.get("format") == MARKER_FORMAT
    entries = sorted(path.iterdir())
    unexpected = []
    for entry in entries:
        if entry.name == "meta.json" and ours:
            continue
        unexpected.extend(_unexpected_under(entry))
    reason = holds(path, unexpected)
    if reason is None and not ours and entries:
        reason = "it has no meta.json marker of `fullgraph data synth`"
    return reason


#: A dataset directory in OGB layout: ``force`` replaces only one :func:`write_ogb` wrote.
DATASET = OutputKind("a dataset", _not_written_by_write_ogb)


def _write_columns(path: Path, columns: dict[str, np.ndarray], desc: str) -> None:
    """Write equal-length columns as headerless CSV into ``path`` (gzip level 1), in batches."""
    import pyarrow as pa  # imported here: ranks load this module but never write CSV
    import pyarrow.csv as pacsv

    n = next(iter(columns.values())).shape[0]
    # rows per batch shrink with the width: a batch's text stays far below arrow's 2 GiB
    # buffers (a 40,000-wide edge_feat row is ~400 KB of text)
    rows = max(1, min(_ROWS_PER_BATCH, _CELLS_PER_BATCH // max(1, len(columns))))
    opts = pacsv.WriteOptions(
        include_header=False, batch_size=min(65536, rows), quoting_style="none"
    )
    with (
        gzip.open(path, "wb", compresslevel=1) as sink,
        tqdm(
            total=n,
            desc=desc,
            unit="row",
            unit_scale=True,
            leave=False,
            disable=n < 5 * _ROWS_PER_BATCH,
        ) as bar,
    ):
        for s in range(0, max(n, 1), rows):
            e = min(n, s + rows)
            table = pa.table({k: pa.array(v[s:e]) for k, v in columns.items()})
            pacsv.write_csv(table, sink, opts)
            bar.update(e - s)


def _write_matrix(path: Path, x: np.ndarray, desc: str) -> None:
    cols = {f"f{j}": x[:, j] for j in range(x.shape[1])}
    _write_columns(path, cols, desc)


def _write_lines(path: Path, values: list[str]) -> None:
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(("\n".join(values) + "\n").encode())


def write_ogb(
    graph: Graph, root: str | Path, name: str, *, force: bool = False, split_scheme: str = "random"
) -> Path:
    """Write ``graph`` in OGB layout at ``<root>/<name with - as _>`` (atomic directory write).

    A symmetric graph is written with each undirected edge once (``u < v``), like OGB's
    undirected datasets; a directed graph with every edge ``u -> v``. The reader symmetrises
    again on load unless asked otherwise.

    Args:
        graph: the graph to write (validated first).
        root: dataset root directory.
        name: dataset name; ``load(name, root)`` finds it afterwards.
        force: replace an existing dataset directory (only one this function wrote).
        split_scheme: name of the ``split/<scheme>/`` directory.

    Returns:
        The dataset directory.

    Raises:
        FileExistsError: the directory exists and ``force`` is false.
        ConfigError: the directory exists and is not a dataset this function wrote (a user's
            folder, a downloaded dataset); nothing is replaced.
    """
    graph.validate()
    target = dataset_dir(root, name)
    symmetric = is_symmetric(graph.indptr, graph.indices) and _symmetric_values(graph)
    with atomic_dir(target, force=force, ours=DATASET) as tmp:
        raw = tmp / "raw"
        split = tmp / "split" / split_scheme
        raw.mkdir()
        split.mkdir(parents=True)
        src, dst = csr_to_edges(graph.indptr, graph.indices)
        once = src < dst if symmetric else np.ones(src.shape[0], dtype=np.bool_)
        src, dst = src[once], dst[once]
        num_lines = int(src.shape[0])
        log.info("%s: writing %d edges", name, num_lines)
        _write_columns(raw / "edge.csv.gz", {"u": src, "v": dst}, f"{name} edges")
        del src, dst
        if graph.edge_weight is not None:  # one line per line of edge.csv.gz
            weights = {"w": np.asarray(graph.edge_weight)[once]}
            _write_columns(raw / "edge_weight.csv.gz", weights, f"{name} edge weights")
        if graph.edge_attr is not None:
            rows = np.asarray(graph.edge_attr)[once]
            _write_matrix(raw / "edge_feat.csv.gz", rows, f"{name} edge features")
        if graph.x is not None:
            log.info("%s: writing %d x %d features", name, *graph.x.shape)
            _write_matrix(raw / "node-feat.csv.gz", graph.x, f"{name} features")
        labels = graph.y
        if (labels < 0).any():  # OGB writes "nan" for unlabelled nodes (papers100M)
            labels = np.where(labels < 0, np.nan, labels.astype(np.float64))
        _write_columns(raw / "node-label.csv.gz", {"y": labels}, f"{name} labels")
        _write_lines(raw / "num-node-list.csv.gz", [str(graph.num_nodes)])
        _write_lines(raw / "num-edge-list.csv.gz", [str(num_lines)])
        for fname, mask in (
            ("train", graph.train_mask),
            ("valid", graph.val_mask),
            ("test", graph.test_mask),
        ):
            _write_columns(split / f"{fname}.csv.gz", {"id": np.flatnonzero(mask)}, fname)
        atomic_write_json(
            tmp / "meta.json",
            {
                "format": MARKER_FORMAT,
                "name": name,
                "num_classes": int(graph.num_classes),
                "split_scheme": split_scheme,
                "edges_symmetric_once": bool(symmetric),
                "has_features": graph.x is not None,
                "source": graph.meta,
            },
        )
    return target


def _symmetric_values(graph: Graph) -> bool:
    """Whether every edge ``u -> v`` carries the values of ``v -> u`` (trivially without edge
    values): only then is each undirected edge written once. Needs a symmetric CSR."""
    values = [v for v in (graph.edge_weight, graph.edge_attr) if v is not None]
    if not values:
        return True
    n = graph.num_nodes
    src, dst = csr_to_edges(graph.indptr, graph.indices)
    keys = dst * n + src
    order = np.argsort(keys, kind="stable")
    reverse = order[np.searchsorted(keys[order], src * n + dst)]
    m = src.shape[0]
    return all(
        np.array_equal(np.asarray(v).reshape(m, -1), np.asarray(v)[reverse].reshape(m, -1))
        for v in values
    )
