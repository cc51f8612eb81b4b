"""What a PyG user passes as a whole graph: :func:`graph_of`, :func:`read_saved`.

``fullgraph.pyg.load_part`` and ``pyg.partition`` take a PyG ``Data`` (with ``edge_index``, or
``T.ToSparseTensor()``'s ``adj_t``: :func:`~fullgraph.datasets.pyg.from_pyg`) or a
:class:`~fullgraph.datasets.Graph`; ``fullgraph partition --pyg FILE`` reads one that
``torch.save`` or ``InMemoryDataset.save`` wrote. Anything else is refused in one line naming
what was given and what is taken.
"""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fullgraph.datasets.graph import Graph
from fullgraph.datasets.pyg import from_pyg
from fullgraph.errors import ConfigError, DataError

if TYPE_CHECKING:
    from torch_geometric.data import Data, InMemoryDataset

#: What :func:`graph_of` accepts, for its messages.
ACCEPTED = (
    "a partition directory (`fullgraph partition`, pyg.partition), a PyG Data with y and "
    "edge_index or adj_t, or a fullgraph Graph"
)


def describe(value: Any) -> str:
    """A short description of ``value`` for a message: its type, and a small value itself."""
    kind = type(value).__name__
    if isinstance(value, (int, float, bool)) or value is None:
        return f"{kind} {value!r}"
    if isinstance(value, (str, bytes, os.PathLike)):
        return f"{kind} {os.fspath(value)!r}"
    shape = getattr(value, "shape", None)
    return f"{kind} of shape {tuple(shape)}" if shape is not None else kind


def _describe_data(data: Data) -> str:
    """``Data(x [N, F], edge_index [2, E])``: the tensors of a PyG ``Data`` by name and shape."""
    items = []
    for key in sorted(data.keys()):
        value = data[key]
        shape = getattr(value, "shape", None)
        items.append(f"{key} {list(shape)}" if shape is not None else key)
    return f"{type(data).__name__}({', '.join(items)})"


def graph_of(source: Any, where: str) -> Graph:
    """``source`` as a whole :class:`~fullgraph.datasets.Graph`, or one line saying why not.

    Args:
        source: a :class:`~fullgraph.datasets.Graph`, or a PyG ``Data`` with ``y`` and its
            edges as ``edge_index`` or ``adj_t`` (:func:`~fullgraph.datasets.pyg.from_pyg`).
        where: the caller, for messages (``load_part``).

    Raises:
        ConfigError: ``source`` is none of these (a number, a tensor, a PyG dataset instead of
            its graph, a heterogeneous graph, ...), or a ``Data`` without labels.
        DataError: the ``Data``'s contents are inconsistent (from ``from_pyg``).
    """
    if isinstance(source, Graph):
        return source
    try:
        from torch_geometric.data import Data, Dataset, HeteroData
    except ImportError:  # pragma: no cover - torch_geometric is a dependency
        Data = Dataset = HeteroData = ()  # type: ignore[assignment,misc]
    if isinstance(source, HeteroData):
        raise ConfigError(
            f"{where}: got a heterogeneous graph (HeteroData); {where} takes one node and edge "
            f"type: convert it (data.to_homogeneous()) or give {ACCEPTED}"
        )
    if isinstance(source, Dataset):
        raise ConfigError(
            f"{where}: got the PyG dataset {type(source).__name__} ({len(source)} graphs), not "
            f"a graph: give its graph, {where}(dataset[0])"
        )
    if not isinstance(source, Data):
        raise ConfigError(f"{where}: got {describe(source)}; give {ACCEPTED}")
    if getattr(source, "y", None) is None:
        raise ConfigError(
            f"{where}: the PyG Data has no labels (y): {_describe_data(source)}; give y, one "
            f"class id per node (and train_mask for pyg.loss)"
        )
    return from_pyg(source, "pyg")


def read_saved(path: str | os.PathLike[str]) -> Graph:
    """The graph of a ``torch.save``'d PyG ``Data`` or of a saved PyG ``InMemoryDataset``.

    Args:
        path: a file written by ``torch.save(data, path)`` (a ``Data``, or a one-graph dataset
            object), a dataset's processed file (``InMemoryDataset.save``), or a dataset's
            directory holding one (``ROOT/processed/data.pt``, as ``Planetoid(ROOT, ...)``
            writes, or the ``processed`` directory itself).

    Raises:
        DataError: nothing there, not a torch file, or no graph of a node task in it.
        ConfigError: what is in it is not a graph :func:`graph_of` takes.
    """
    p = Path(path)
    if p.is_dir():
        found = sorted((p / "processed").glob("*.pt")) or sorted(p.glob("*.pt"))
        found = [f for f in found if f.name not in ("pre_filter.pt", "pre_transform.pt")]
        if len(found) != 1:
            names = ", ".join(f.name for f in found) or "none"
            raise DataError(
                f"{p}: expected one saved PyG dataset file (processed/*.pt) in the directory, "
                f"found {names}; give the file itself"
            )
        p = found[0]
    elif not p.is_file():
        raise DataError(f"{p} does not exist; give a torch.save'd PyG Data (.pt) or a dataset dir")
    loaded = _torch_load(p)
    if isinstance(loaded, tuple) and len(loaded) in (2, 3) and isinstance(loaded[1], dict | None):
        loaded = _saved_dataset(p)  # (data, slices[, class]) of InMemoryDataset.save
    try:
        from torch_geometric.data import Dataset
    except ImportError:  # pragma: no cover
        Dataset = ()  # type: ignore[assignment,misc]
    if isinstance(loaded, Dataset):
        if len(loaded) != 1:
            raise DataError(
                f"{p}: a PyG dataset of {len(loaded)} graphs; full-graph training takes one "
                f"graph: save the one to train on (torch.save(dataset[i], FILE))"
            )
        loaded = loaded[0]
    return graph_of(loaded, f"{p}")


def _torch_load(path: Path) -> Any:
    """``torch.load`` of the user's own file: tensors only first, then (a pickled ``Data``)
    in full, as ``torch_geometric.io.fs.torch_load`` does, without its warning."""
    import torch

    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return torch.load(path, map_location="cpu", weights_only=False)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: not a file torch.save wrote ({first})") from None


def _saved_dataset(path: Path) -> InMemoryDataset:
    """The ``InMemoryDataset`` of a file ``InMemoryDataset.save`` wrote (no class needed)."""
    from torch_geometric.data import InMemoryDataset

    class Saved(InMemoryDataset):
        def __init__(self) -> None:
            super().__init__(None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.load(str(path))

    return Saved()
