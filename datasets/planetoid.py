"""Reader of the Planetoid raw files (Cora, CiteSeer, PubMed) as published by Yang et al.

Files in ``<root>/<name>/raw/``: ``ind.<name>.{x,tx,allx}`` (scipy sparse features, Python-2
pickles), ``ind.<name>.{y,ty,ally}`` (one-hot labels), ``ind.<name>.graph`` (dict of adjacency
lists) and ``ind.<name>.test.index`` (one id per line). The public split: the first
``len(y)`` nodes train, the next 500 validation, the listed test ids test.

CiteSeer's test index skips 15 ids (isolated nodes without features or labels). As in PyG the
node count spans the full id range (3,327 nodes) and those nodes get all-zero features; here
they are unlabelled (``y = -1``) and in no mask.

PubMed's copy here lacks ``ind.pubmed.allx`` (features of all but 1,060 nodes). The graph,
labels and split load; ``x`` is ``None`` and ``meta["missing"] == ["features"]``, with a log
message. Code that needs features should call
:func:`fullgraph.datasets.registry.require_features`, which raises a clear DataError.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fullgraph.datasets.edges import edges_to_csr
from fullgraph.datasets.graph import Graph, nonfinite_rows
from fullgraph.datasets.paths import raw_dir
from fullgraph.errors import DataError

log = logging.getLogger(__name__)


class _PlanetoidUnpickler(pickle.Unpickler):
    """Loads only numpy arrays, scipy sparse matrices and plain containers.

    Maps the pickles' old ``scipy.sparse.csr``-style module paths to ``scipy.sparse`` and
    refuses any other class, so a tampered file cannot run code.
    """

    _ALLOWED = ("numpy", "scipy.sparse", "collections", "copy_reg", "copyreg")
    _BUILTINS = ("list", "dict", "set", "tuple", "int", "float", "object", "frozenset")

    def find_class(self, module: str, name: str) -> object:
        if module.startswith("scipy.sparse."):
            module = "scipy.sparse"
        builtin_ok = module in ("builtins", "__builtin__") and name in self._BUILTINS
        if not (builtin_ok or module.startswith(self._ALLOWED)):
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _unpickle(path: Path) -> object:
    if not path.is_file():
        raise DataError(f"missing file: expected {path}")
    try:
        with open(path, "rb") as f:
            return _PlanetoidUnpickler(f, encoding="latin1").load()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from exc
    except Exception as exc:  # a damaged pickle fails in many ways (EOF, bad opcode, types)
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(
            f"{path}: not a readable Planetoid pickle ({msg}); replace it with the dataset's "
            f"original file"
        ) from exc


def _dense(mat: object, path: Path) -> np.ndarray:
    if sp.issparse(mat):
        x = np.asarray(mat.toarray(), dtype=np.float32)
    elif isinstance(mat, np.ndarray) and (
        np.issubdtype(mat.dtype, np.number) or mat.dtype == np.bool_
    ):
        x = mat.astype(np.float32)
    else:
        kind = type(mat).__name__ if not isinstance(mat, np.ndarray) else f"{mat.dtype} array"
        raise DataError(f"{path}: expected a numeric matrix, found {kind}")
    if x.ndim != 2:
        raise DataError(f"{path}: expected a matrix, found shape {x.shape}")
    bad = nonfinite_rows(x)  # in float32: a float64 1e308 became an infinity
    if bad.size:
        raise DataError(
            f"{path}: row {int(bad[0])} holds NaN or infinite values (or one beyond float32's "
            f"+-3.4e38), {bad.size} such row(s) in all; features must be finite"
        )
    return x


def _onehot(obj: object, path: Path) -> np.ndarray:
    """A one-hot label matrix [rows, classes] of 0/1 numbers."""
    a = obj.toarray() if sp.issparse(obj) else obj
    if not isinstance(a, np.ndarray) or not (
        np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_
    ):
        raise DataError(f"{path}: expected a one-hot label matrix, found {type(obj).__name__}")
    if a.ndim != 2 or a.shape[1] < 1:
        raise DataError(f"{path}: expected a one-hot label matrix, found shape {a.shape}")
    if a.size and not np.isin(a, (0, 1)).all():
        raise DataError(f"{path}: label matrix holds values other than 0 and 1")
    return a


def _read_index(path: Path) -> np.ndarray:
    """The node ids of ``ind.<name>.test.index``, one per line."""
    if not path.is_file():
        raise DataError(f"missing file: expected {path}")
    try:
        tokens = path.read_text().split()
        ids = np.array([int(t) for t in tokens], dtype=np.int64)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from exc
    except (ValueError, OverflowError) as exc:
        raise DataError(f"{path}: expected one integer node id per line ({exc})") from exc
    if ids.size == 0:
        raise DataError(f"{path}: the file is empty; it should list the test node ids")
    if np.unique(ids).size != ids.size:
        raise DataError(f"{path}: lists a node id twice")
    return ids


def _labels(onehot: np.ndarray) -> np.ndarray:
    onehot = np.asarray(onehot)
    y = onehot.argmax(axis=1).astype(np.int64)
    y[onehot.sum(axis=1) == 0] = -1
    return y


def read_planetoid(
    root: Path,
    name: str,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    seed: int = 0,
) -> Graph:
    """Load ``cora``, ``citeseer`` or ``pubmed`` from Planetoid raw files.

    Args:
        root: dataset root; files in ``<root>/<name>/raw/``.
        name: ``cora``, ``citeseer`` or ``pubmed``.
        symmetric: add reverse edges (the raw adjacency is almost symmetric already).
        remove_self_loops: drop ``v -> v`` edges.
        seed: unused (the public split is fixed); accepted for a uniform reader signature.

    Returns:
        The graph with the public split.

    Raises:
        DataError: a missing file (path named) or inconsistent contents.
    """
    del seed
    raw = raw_dir(root, name)

    def path(part: str) -> Path:
        return raw / f"ind.{name}.{part}"

    y_train = _onehot(_unpickle(path("y")), path("y"))
    ty = _onehot(_unpickle(path("ty")), path("ty"))
    ally = _onehot(_unpickle(path("ally")), path("ally"))
    for part, a in (("y", y_train), ("ty", ty)):
        if a.shape[1] != ally.shape[1]:
            raise DataError(
                f"{path(part)}: {a.shape[1]} classes but {path('ally').name} has {ally.shape[1]}"
            )
    graph_dict = _unpickle(path("graph"))
    if not isinstance(graph_dict, dict):
        raise DataError(f"{path('graph')}: expected a dict of adjacency lists")
    test_index = _read_index(path("test.index"))
    if test_index.shape[0] != ty.shape[0]:
        raise DataError(
            f"{path('test.index')}: {test_index.shape[0]} test ids but {ty.shape[0]} rows in ty"
        )
    if y_train.shape[0] + 500 > ally.shape[0]:
        raise DataError(
            f"{path('y')}: {y_train.shape[0]} training rows + 500 validation nodes exceed the "
            f"{ally.shape[0]} rows of {path('ally').name}"
        )
    sorted_test = np.sort(test_index)
    lo, hi = int(sorted_test[0]), int(sorted_test[-1])
    if lo != ally.shape[0]:
        raise DataError(
            f"{path('test.index')}: test ids start at {lo}, expected {ally.shape[0]} (len ally)"
        )
    num_nodes = hi + 1
    # Row i of tx/ty belongs to node test_index[i] (file order, as PyG's
    # x[test_index] = x[sorted_test_index]); gaps (CiteSeer) stay empty.
    ty_ext = np.zeros((hi - lo + 1, ty.shape[1]), dtype=ty.dtype)
    ty_ext[test_index - lo] = ty
    y = _labels(np.vstack([ally, ty_ext]))

    missing: list[str] = []
    if path("allx").is_file():
        tx = _dense(_unpickle(path("tx")), path("tx"))
        allx = _dense(_unpickle(path("allx")), path("allx"))
        if tx.shape[1] != allx.shape[1]:
            raise DataError(
                f"{path('tx')}: {tx.shape[1]} feature columns but allx has {allx.shape[1]}"
            )
        if tx.shape[0] != ty.shape[0] or allx.shape[0] != ally.shape[0]:
            raise DataError(
                f"{raw}: feature rows (allx {allx.shape[0]}, tx {tx.shape[0]}) do not match "
                f"label rows (ally {ally.shape[0]}, ty {ty.shape[0]})"
            )
        tx_ext = np.zeros((hi - lo + 1, tx.shape[1]), dtype=np.float32)
        tx_ext[test_index - lo] = tx
        x = np.vstack([allx, tx_ext])
    else:
        x = None
        missing.append("features")
        log.warning(
            "%s: %s is missing, so node features are not available (x is None); "
            "graph, labels and split are complete",
            name,
            path("allx"),
        )

    try:
        keys = np.fromiter(graph_dict.keys(), dtype=np.int64, count=len(graph_dict))
        lens = np.fromiter((len(v) for v in graph_dict.values()), dtype=np.int64, count=len(keys))
        nbrs = np.fromiter(
            (u for v in graph_dict.values() for u in v), dtype=np.int64, count=int(lens.sum())
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise DataError(
            f"{path('graph')}: expected a dict of node id -> list of node ids ({exc})"
        ) from exc
    src = np.repeat(keys, lens)
    indptr, indices = edges_to_csr(
        src,
        nbrs,
        num_nodes,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=str(path("graph")),
    )
    n_train = y_train.shape[0]
    train = np.zeros(num_nodes, dtype=np.bool_)
    train[:n_train] = True
    val = np.zeros(num_nodes, dtype=np.bool_)
    val[n_train : n_train + 500] = True
    test = np.zeros(num_nodes, dtype=np.bool_)
    test[test_index] = True
    graph = Graph(
        name=name,
        num_nodes=num_nodes,
        indptr=indptr,
        indices=indices,
        x=x,
        y=y,
        train_mask=train,
        val_mask=val,
        test_mask=test,
        num_classes=int(ally.shape[1]),
        meta={"format": "planetoid", "path": str(raw), "missing": missing},
    )
    return graph.validate()
