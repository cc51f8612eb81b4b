"""Reader of OGB's link-property layout (``ogbl-*``, and what ``fullgraph data linksplit`` /
``data synth --preset collab|citation2`` write).

Layout under ``<root>/<name with - as _>/`` (OGB's ``LinkPropPredDataset``)::

    raw/edge.csv.gz              the message-passing graph: the *training* edges, "u,v" a line
    raw/num-node-list.csv.gz     the node count
    raw/num-edge-list.csv.gz     the count of lines in edge.csv.gz
    raw/node-feat.csv.gz         node features, when the dataset has them (ogbl-ddi has none)
    raw/edge_weight.csv.gz       one weight per line of edge.csv.gz (ogbl-collab)
    raw/node-label.csv.gz        node labels, only in datasets fullgraph wrote (carried over)
    split/<scheme>/{train,valid,test}.pt   torch.save'd dicts of tensors, OGB's keys:
        pairs:    edge [E, 2], valid/test edge_neg [N, 2], optional weight [E], year [E]
        per edge: source_node [E], target_node [E], valid/test target_node_neg [E, K]
                  (ogbl-citation2)
    meta.json                    fullgraph's marker (``task: link``), absent in OGB's copies

``raw/edge_year.csv.gz`` and ``raw/node_year.csv.gz`` (collab, citation2) and the splits'
``year`` are not used. :func:`read_ogb_link` returns the message-passing graph, symmetrised as
the node loaders do (ogbl-citation2 is directed in OGB; like OGB's GNN baselines, which call
``adj_t.to_symmetric()``, its citations are used both ways here, and its held-out pairs are kept
directed in the :class:`~fullgraph.datasets.link.LinkSplit`). Repeated edges of ``edge.csv.gz``
(ogbl-collab lists a pair once per year of collaboration) are merged into one with their weights
summed, both in the graph and in the training split; held-out pairs must be distinct. ``y`` is
all 0 with one class (the node labels where the dataset carries them), and the node masks are
all False: the supervision is :func:`load_link_split`'s.

Split files are opened with ``torch.load(weights_only=True)``: no pickled code runs. A file that
is no torch file, not a dict of tensors, holds other keys, ids out of range or shapes that do
not match is refused in one line naming it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from fullgraph.datasets.edges import check_edge_ids, edges_to_csr_with_values
from fullgraph.datasets.graph import GRAPH_ARRAYS, SPLITS, Graph
from fullgraph.datasets.link import EVAL_SPLITS, LINK_SPLITS, LinkSplit, pair_keys
from fullgraph.datasets.ogb import (
    _cache_key,
    _edge_values,
    _load_cache,
    _read_count,
    _require,
    _save_cache,
    read_csv_columns,
    read_marker,
    refuse_non_finite,
)
from fullgraph.datasets.paths import dataset_dir, raw_dir
from fullgraph.errors import DataError

log = logging.getLogger(__name__)

#: ``meta.json["task"]`` of a link dataset fullgraph wrote.
LINK_TASK = "link"
#: OGB's homogeneous linkprop datasets: (undirected, split scheme), as ``master.csv`` has them
#: (``add_inverse_edge``, ``split``); other ``ogbl-*`` names are read as undirected.
OGB_LINK = {
    "ogbl-collab": (True, "time"),
    "ogbl-ppa": (True, "throughput"),
    "ogbl-ddi": (True, "target"),
    "ogbl-citation2": (False, "time"),
}
#: The keys a split file may hold, by layout and split: (required, optional).
SPLIT_KEYS = {
    ("pairs", "train"): ({"edge"}, {"weight", "year"}),
    ("pairs", "eval"): ({"edge", "edge_neg"}, {"weight", "year"}),
    ("per_edge", "train"): ({"source_node", "target_node"}, set()),
    ("per_edge", "eval"): ({"source_node", "target_node", "target_node_neg"}, set()),
}


def is_link_dataset(root: str | Path, name: str) -> bool:
    """Whether ``name`` is read as a link dataset: an ``ogbl-*`` name, or a directory whose
    ``meta.json`` marker says ``task: link`` (written by fullgraph)."""
    if name.startswith("ogbl-"):
        return True
    d = dataset_dir(root, name)
    if not (d / "meta.json").is_file():
        return False
    try:
        marker = read_marker(d)
    except DataError:  # not a marker of ours: the node reader names what is wrong there
        return False
    return marker.get("task") == LINK_TASK


def _split_dir(d: Path, name: str, marker: dict) -> Path:
    """``split/<scheme>/``: the marker's scheme, OGB's for its names, or the only one."""
    root = d / "split"
    if not root.is_dir():
        raise DataError(f"missing directory: expected {root}/<scheme>/{{train,valid,test}}.pt")
    schemes = sorted(p.name for p in root.iterdir() if p.is_dir())
    for wanted in (marker.get("split_scheme"), OGB_LINK.get(name, (True, None))[1]):
        if wanted in schemes:
            return root / wanted
    if len(schemes) == 1:
        return root / schemes[0]
    if not schemes:
        raise DataError(f"no split scheme directory in {root}")
    raise DataError(f"{root}: several split schemes {schemes}; keep the one to read")


def _merge_repeats(
    src: np.ndarray, dst: np.ndarray, n: int, values: dict[str, np.ndarray], undirected: bool
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Edges listed more than once (either way when ``undirected``) as one, weights summed,
    other values (feature rows) of the first copy."""
    if src.size == 0:
        return src, dst, values
    keys = pair_keys(np.stack([src, dst], axis=1), n, undirected)
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    if uniq.size == keys.size:
        return src, dst, values
    log.info("merging %d repeated edges (weights summed)", keys.size - uniq.size)
    merged = {}
    for k, v in values.items():
        if k == "edge_weight":
            merged[k] = np.bincount(inverse, weights=v, minlength=uniq.size).astype(np.float32)
        else:
            merged[k] = v[first]
    return src[first], dst[first], merged


def _labels(raw: Path, n: int) -> np.ndarray | None:
    """``raw/node-label.csv.gz`` (a dataset fullgraph wrote carries its labels), else None."""
    path = raw / "node-label.csv.gz"
    if not path.is_file():
        return None
    yf = read_csv_columns(path, "float64", n, "labels", columns=1)[:, 0]
    if yf.shape[0] != n:
        raise DataError(f"{path}: {yf.shape[0]} labels but {n} nodes; one of the files is wrong")
    labelled = ~np.isnan(yf)
    bad = labelled & ((yf < 0) | (yf != np.floor(np.where(labelled, yf, 0))) | (yf >= 2**31))
    if bad.any():
        v = int(np.argmax(bad))
        raise DataError(f"{path}: line {v + 1} holds label {yf[v]:g}; a label is a class id")
    return np.where(labelled, yf, -1).astype(np.int64)


def _parse(d: Path, name: str, marker: dict, symmetric: bool, remove_self_loops: bool) -> dict:
    raw = d / "raw"
    n_path = raw / "num-node-list.csv.gz"
    n = _read_count(_require(n_path), 1)
    m = _read_count(_require(raw / "num-edge-list.csv.gz"), 0)
    edge_path = raw / "edge.csv.gz"
    edges = read_csv_columns(
        _require(edge_path), "int64", m, f"{name} edges", columns=2, allow_empty=m == 0
    )
    if edges.shape[0] != m:
        raise DataError(f"{edge_path}: {edges.shape[0]} edges but num-edge-list says {m}")
    src, dst = edges[:, 0].copy(), edges[:, 1].copy()
    del edges
    try:
        check_edge_ids(src, dst, n, str(edge_path))
    except DataError as exc:
        raise DataError(f"{exc} ({n_path.name} says {n} nodes; one of the two is wrong)") from None
    values = _edge_values(raw, name, m)
    src, dst, values = _merge_repeats(src, dst, n, values, undirected=symmetric)
    indptr, indices, values = edges_to_csr_with_values(
        src,
        dst,
        n,
        values,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=str(edge_path),
    )
    del src, dst
    x = None
    feat = raw / "node-feat.csv.gz"
    if feat.is_file() or marker.get("has_features", False):
        x = read_csv_columns(_require(feat), "float32", n, f"{name} features")
        if x.shape[0] != n:
            raise DataError(f"{feat}: {x.shape[0]} feature rows but {n} nodes ({n_path.name})")
        refuse_non_finite(feat, x, "node")
    y = _labels(raw, n)
    no_nodes = np.zeros(n, dtype=np.bool_)
    return {
        "indptr": indptr,
        "indices": indices,
        "x": x,
        "y": np.zeros(n, dtype=np.int64) if y is None else y,
        **{mask: no_nodes.copy() for mask in SPLITS},
        "edge_weight": values.get("edge_weight"),
        "edge_attr": values.get("edge_attr"),
    }


def read_ogb_link(
    root: str | Path,
    name: str,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    cache: bool = True,
    mmap: bool = False,
) -> Graph:
    """The message-passing graph of a link dataset (its training edges; see the module doc).

    Args:
        root: dataset root; the data is in ``<root>/<name with - as _>/``.
        name: ``ogbl-<name>`` or a name ``fullgraph data linksplit`` / ``data synth`` wrote.
        symmetric: add reverse edges (every linkprop graph is used undirected by default).
        remove_self_loops: drop ``v -> v`` edges.
        cache: read and write the ``processed/link-<variant>/`` ``.npy`` cache.
        mmap: memory-map the cached arrays.

    Returns:
        The graph: ``y`` all 0 and ``num_classes`` 1 (or the labels a fullgraph-written
        dataset carries), every node mask False; ``meta["link"]`` True.

    Raises:
        DataError: missing files (path named), malformed or inconsistent contents.
    """
    d = raw_dir(root, name).parent
    marker = read_marker(d)
    variant = "link-" + ("sym" if symmetric else "dir") + ("" if remove_self_loops else "-loops")
    cache_dir = d / "processed" / variant
    key = _cache_key(d, variant)
    arrays = _load_cache(cache_dir, key, mmap) if cache else None
    parsed = arrays is None
    if parsed:
        arrays = _parse(d, name, marker, symmetric, remove_self_loops)
    y = arrays["y"]
    top = int(y.max()) if y.size else 0
    num_classes = int(marker.get("num_classes", top + 1)) or 1
    if top >= num_classes:
        raise DataError(
            f"{d / 'meta.json'}: num_classes is {num_classes} but node-label.csv.gz holds "
            f"label {top}; one of the two files is wrong"
        )
    meta = {"format": "ogb-link", "path": str(d), "symmetric": symmetric, "link": True}
    meta["missing"] = [] if arrays["x"] is not None else ["features"]
    if "source" in marker:
        meta["source"] = marker["source"]
    graph = Graph(
        name=name,
        num_nodes=int(arrays["indptr"].shape[0] - 1),
        num_classes=num_classes,
        meta=meta,
        **{a: arrays[a] for a in GRAPH_ARRAYS},
    )
    graph.validate()
    if parsed and cache:
        _save_cache(cache_dir, key, arrays)
    return graph


def _load_pt(path: Path) -> dict[str, np.ndarray]:
    """A split file as ``{key: array}``: a dict of tensors, opened with ``weights_only``."""
    import torch  # only when a split is read

    _require(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from exc
    except Exception as exc:  # torch raises many kinds for a damaged file
        msg = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise DataError(
            f"{path}: not a readable torch file ({msg}); it is truncated or not a split file, "
            f"replace it with an intact copy"
        ) from None
    if not isinstance(obj, dict):
        raise DataError(
            f"{path}: holds a {type(obj).__name__}, expected a dict of tensors (OGB's split "
            f"layout: edge, edge_neg, ... or source_node, target_node, ...)"
        )
    out = {}
    for k, v in obj.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise DataError(
                f"{path}: key {k!r} holds a {type(v).__name__}, expected a tensor (a split file "
                f"is a dict of tensors)"
            )
        out[k] = v.numpy()
    return out


def _layout(path: Path, arrays: dict) -> str:
    if ("edge" in arrays) == ("source_node" in arrays):
        raise DataError(
            f"{path}: keys {sorted(arrays)}; expected OGB's 'edge' (pairs) or 'source_node' / "
            f"'target_node' (per-edge negatives), one of the two"
        )
    return "pairs" if "edge" in arrays else "per_edge"


def _ids(path: Path, arrays: dict, key: str, shape: tuple) -> np.ndarray:
    """``arrays[key]``: integer node ids of the given shape (``-1``: any length)."""
    a = arrays[key]
    fits = a.ndim == len(shape) and all(w in (-1, s) for w, s in zip(shape, a.shape, strict=True))
    if not fits:
        want = "[" + ", ".join("E" if w == -1 else str(w) for w in shape) + "]"
        raise DataError(f"{path}: {key} has shape {list(a.shape)}, expected {want}")
    if not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        raise DataError(f"{path}: {key} holds {a.dtype} values; node ids are integers")
    return a.astype(np.int64, copy=False)


def _read_split(path: Path, layout: str | None, split: str) -> tuple[str, dict]:
    """One split file: its layout and ``{"pos": [E,2], "neg": ..., "weight": [E] | None}``."""
    arrays = _load_pt(path)
    own = _layout(path, arrays)
    if layout is not None and own != layout:
        raise DataError(
            f"{path}: {own} layout ({sorted(arrays)}) but train.pt has the {layout} layout; "
            f"all three split files must have the same keys"
        )
    required, optional = SPLIT_KEYS[own, "train" if split == "train" else "eval"]
    missing, extra = required - set(arrays), set(arrays) - required - optional
    if missing or extra:
        what = f"lacks {sorted(missing)}" if missing else f"holds unknown keys {sorted(extra)}"
        raise DataError(f"{path}: {what}; a {split} file has {sorted(required | optional)}")
    if own == "pairs":
        pos = _ids(path, arrays, "edge", (-1, 2))
        neg = _ids(path, arrays, "edge_neg", (-1, 2)) if split != "train" else None
    else:
        s = _ids(path, arrays, "source_node", (-1,))
        t = _ids(path, arrays, "target_node", (s.shape[0],))
        pos = np.stack([s, t], axis=1)
        neg = None
        if split != "train":
            neg = _ids(path, arrays, "target_node_neg", (s.shape[0], -1))
    weight = arrays.get("weight")
    if weight is not None:
        weight = np.asarray(weight, dtype=np.float32).reshape(-1)
        if weight.shape[0] != pos.shape[0]:
            raise DataError(f"{path}: {weight.shape[0]} weights for {pos.shape[0]} edges")
        refuse_non_finite(path, weight, "edge")
    return own, {"pos": pos, "neg": neg, "weight": weight}


def load_link_split(name: str, root: str | Path) -> LinkSplit | None:
    """The supervision edges of link dataset ``name`` in ``root``, checked
    (:meth:`LinkSplit.check`), or ``None`` for a dataset without a link split.

    Training pairs listed more than once (ogbl-collab's repeated collaborations) are merged,
    weights summed; held-out pairs must be distinct. The metric is the marker's (fullgraph's
    datasets), else OGB's (:data:`fullgraph.datasets.link.LINK_METRICS`).

    Raises:
        DataError: missing or malformed files, one line naming the file.
    """
    if not is_link_dataset(root, name):
        return None
    d = raw_dir(root, name).parent
    marker = read_marker(d)
    n = _read_count(_require(d / "raw" / "num-node-list.csv.gz"), 1)
    where = _split_dir(d, name, marker)
    layout = None
    parts = {}
    for s in LINK_SPLITS:
        layout, parts[s] = _read_split(where / f"{s}.pt", layout, s)
    undirected = bool(marker.get("undirected", OGB_LINK.get(name, (True, ""))[0]))
    train = parts["train"]
    values = {"edge_weight": train["weight"]} if train["weight"] is not None else {}
    _check_range(where / "train.pt", train["pos"], n)
    src, dst, values = _merge_repeats(train["pos"][:, 0], train["pos"][:, 1], n, values, undirected)
    train["pos"] = np.stack([src, dst], axis=1)
    train["weight"] = values.get("edge_weight")
    split = LinkSplit(
        name=name,
        num_nodes=n,
        edges={s: parts[s]["pos"] for s in LINK_SPLITS},
        negatives={s: parts[s]["neg"] for s in EVAL_SPLITS},
        per_edge_negatives=layout == "per_edge",
        undirected=undirected,
        metric=str(marker.get("metric", "")),
        edge_weight={s: p["weight"] for s, p in parts.items() if p["weight"] is not None},
    )
    return split.check(where=os.fspath(where))


def _check_range(path: Path, pairs: np.ndarray, n: int) -> None:
    """Ids of ``pairs`` in ``[0, n)`` before they become keys (``u * n + v``)."""
    bad = (pairs < 0) | (pairs >= n)
    if bad.any():
        e = int(np.argmax(bad.any(axis=1)))
        raise DataError(
            f"{path}: edge {e} ({pairs[e, 0]}, {pairs[e, 1]}) is out of range for {n} nodes "
            f"(num-node-list.csv.gz); {int(bad.any(axis=1).sum())} in all"
        )
