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

CSV text is written by pyarrow's multi-threaded CSV writer into a gzip stream at level 1
(fast; OGB's files are ordinary gzip so any level reads the same).
"""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fullgraph.atomic import atomic_dir, atomic_write_json
from fullgraph.datasets.edges import csr_to_edges, is_symmetric, undirected_edges
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.paths import dataset_dir

log = logging.getLogger(__name__)

#: Version of the meta.json marker written beside OGB-layout data.
MARKER_FORMAT = "fullgraph-ogb-v1"
_ROWS_PER_BATCH = 1_000_000


def _write_columns(path: Path, columns: dict[str, np.ndarray], desc: str) -> None:
    """Write equal-length columns as headerless CSV into ``path`` (gzip level 1), in batches."""
    import pyarrow as pa  # imported here: ranks load this module but never write CSV
    import pyarrow.csv as pacsv

    n = next(iter(columns.values())).shape[0]
    opts = pacsv.WriteOptions(include_header=False, batch_size=65536, quoting_style="none")
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
        for s in range(0, max(n, 1), _ROWS_PER_BATCH):
            e = min(n, s + _ROWS_PER_BATCH)
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
        force: replace an existing dataset directory.
        split_scheme: name of the ``split/<scheme>/`` directory.

    Returns:
        The dataset directory.

    Raises:
        FileExistsError: the directory exists and ``force`` is false.
    """
    graph.validate()
    target = dataset_dir(root, name)
    symmetric = is_symmetric(graph.indptr, graph.indices)
    with atomic_dir(target, force=force) as tmp:
        raw = tmp / "raw"
        split = tmp / "split" / split_scheme
        raw.mkdir()
        split.mkdir(parents=True)
        if symmetric:
            src, dst = undirected_edges(graph.indptr, graph.indices)
        else:
            src, dst = csr_to_edges(graph.indptr, graph.indices)
        num_lines = int(src.shape[0])
        log.info("%s: writing %d edges", name, num_lines)
        _write_columns(raw / "edge.csv.gz", {"u": src, "v": dst}, f"{name} edges")
        del src, dst
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
