"""The graphs a PyG user brings to ``fullgraph.pyg``: ``adj_t``, partitioning once, wrong things.

- ``T.ToSparseTensor()``'s ``adj_t`` (torch sparse CSR / COO, a torch_sparse-like
  ``SparseTensor``) is the graph of ``edge_index``: the same CSR, its values the edge weights,
  the same parts; models called with ``data.adj_t`` train as PyG's own do on the ``adj_t``, on
  one process and on 2 ranks.
- ``pyg.partition`` and ``fullgraph partition --pyg`` write the parts that ``load_part(data)``
  builds in the process, and ``load_part(DIR)`` trains on them as on the in-process parts.
- ``load_part`` of a wrong thing says what it got and what it takes, in one line.

Enters through :mod:`fullgraph.pyg.sources`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric.nn")

import pyg_worker
import torch_geometric.transforms as T
from harness import run_task

from fullgraph import pyg
from fullgraph.cli import main as cli_main
from fullgraph.datasets import from_pyg, to_pyg
from fullgraph.distributed import Communicator
from fullgraph.errors import ConfigError, DataError, FullgraphError


class FakeSparseTensor:
    """What ``from_pyg`` asks of a torch_sparse ``SparseTensor`` (not installed here)."""

    def __init__(self, adj: torch.Tensor) -> None:
        self._coo = adj.to_sparse_coo().coalesce()

    def coo(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        row, col = self._coo.indices()
        return row, col, self._coo.values()

    def sparse_sizes(self) -> tuple[int, int]:
        return tuple(self._coo.shape)


def _adj_t(data, layout: str):
    if layout == "coo":
        return T.ToSparseTensor(layout=torch.sparse_coo)(data.clone())
    out = T.ToSparseTensor()(data.clone())
    if layout == "sparse_tensor":
        out.adj_t = FakeSparseTensor(out.adj_t)
    return out


@pytest.fixture(scope="module")
def weighted_data():
    return pyg_worker._weighted_only()


@pytest.mark.parametrize("layout", ["csr", "coo", "sparse_tensor"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_adj_t_is_the_edge_index_graph(layout, weighted, small_graph, weighted_data) -> None:
    data = weighted_data if weighted else to_pyg(small_graph)
    want = from_pyg(data, "pyg")
    got = from_pyg(_adj_t(data, layout), "pyg")
    assert np.array_equal(got.indptr, want.indptr)
    assert np.array_equal(got.indices, want.indices)
    if weighted:
        assert np.array_equal(got.edge_weight, want.edge_weight)
    else:  # ToSparseTensor's values of ones are no weights
        assert got.edge_weight is None and want.edge_weight is None


def test_adj_t_values_that_are_not_weights_are_refused(small_graph, weighted_data) -> None:
    data = to_pyg(small_graph)
    rows = torch.randn(data.edge_index.shape[1], 3)
    feats = T.ToSparseTensor(attr="edge_attr")(data.clone().update({"edge_attr": rows}))
    with pytest.raises(DataError, match=r"adj_t holds \(3,\) values per edge"):
        from_pyg(feats, "pyg")
    beside = T.ToSparseTensor()(weighted_data.clone().update({"edge_attr": rows}))
    with pytest.raises(DataError, match="data.edge_attr beside adj_t"):
        from_pyg(beside, "pyg")
    dense = T.ToSparseTensor()(data.clone())
    dense.adj_t = dense.adj_t.to_dense()
    with pytest.raises(DataError, match="adj_t must be a torch_sparse SparseTensor"):
        from_pyg(dense, "pyg")
    no_edges = data.clone()
    del no_edges.edge_index
    with pytest.raises(DataError, match="no edges"):
        from_pyg(no_edges, "pyg")


def _digest(root: Path) -> dict[str, str]:
    """sha256 of every part array of a partition directory, by relative path."""
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(root.glob("part-*/*.npy"))
    }


def test_partition_of_adj_t_equals_partition_of_edge_index(weighted_data, tmp_path) -> None:
    pyg.partition(weighted_data, parts=3, out=tmp_path / "edge_index")
    pyg.partition(_adj_t(weighted_data, "csr"), parts=3, out=tmp_path / "adj_t")
    want = _digest(tmp_path / "edge_index")
    assert want and _digest(tmp_path / "adj_t") == want


@pytest.fixture(scope="module")
def adj_references() -> dict:
    """The ``adj_t`` group on one process, unweighted and weighted: PyG's own models called
    with the whole graph's ``adj_t``, and the converted ones with ``data.adj_t``."""
    refs = {}
    with torch.random.fork_rng():
        for weighted in (False, True):
            whole = pyg_worker.adj_t_graph(weighted)
            original = pyg_worker.run_original(pyg_worker.with_adj_t(whole), "adj_t")
            part = pyg.load_part(whole.clone(), Communicator())
            converted = pyg_worker.run_converted(pyg_worker.with_adj_t(part), "adj_t")
            refs[weighted] = {"original": original, "converted": converted}
    return refs


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_adj_t_one_process_equals_pyg_on_adj_t(adj_references, weighted) -> None:
    refs = adj_references[weighted]
    pyg_worker.compare(refs["converted"], refs["original"], "exact", "adj_t")


def test_weighted_adj_t_is_refused_where_the_layer_cannot_weigh() -> None:
    part = pyg.load_part(pyg_worker.adj_t_graph(True), Communicator())
    model = pyg.distribute(pyg_worker.build("GraphSAGE", 12, 4, 0.0), part)
    with pytest.raises(ConfigError, match="data.adj_t carries the graph's edge weights"):
        model(part.x, part.adj_t)
    model(part.x, part.edge_index)  # the unweighted graph, as with edge_index in PyG


@pytest.mark.timeout(400)
@pytest.mark.parametrize("weighted", [0, 1], ids=["unweighted", "weighted"])
def test_adj_t_two_ranks_equal_one_process(adj_references, weighted, tmp_path) -> None:
    got = run_task(
        pyg_worker.adj_t,
        ranks=2,
        out=tmp_path / "out.npz",
        timeout=300,
        source="graph",
        weighted=weighted,
    )
    refs = adj_references[bool(weighted)]
    pyg_worker.compare(got, refs["original"], "exact", "adj_t", "P=2")
    pyg_worker.compare(got, refs["converted"], "dropout", "adj_t", "P=2")


@pytest.mark.timeout(400)
def test_partition_once_equals_the_in_process_partition(adj_references, tmp_path) -> None:
    """``pyg.partition`` writes the parts ``load_part(data)`` builds on 2 ranks; trained from
    the directory with ``adj_t``, the models equal the one-process references."""
    out = pyg.partition(pyg_worker.adj_t_graph(True), parts=2, out=tmp_path / "parts")
    in_process = run_task(
        pyg_worker.part_arrays,
        ranks=2,
        out=tmp_path / "a.npz",
        timeout=300,
        source="graph",
        adj=1,
    )
    from_dir = run_task(
        pyg_worker.part_arrays, ranks=2, out=tmp_path / "b.npz", timeout=300, source=str(out)
    )
    assert set(in_process) == set(from_dir)
    for key, value in in_process.items():
        assert np.array_equal(from_dir[key], value), key
    got = run_task(pyg_worker.adj_t, ranks=2, out=tmp_path / "t.npz", timeout=300, source=str(out))
    pyg_worker.compare(got, adj_references[True]["original"], "exact", "adj_t", "P=2")


def test_partition_command_reads_saved_pyg_data(weighted_data, tmp_path, capsys) -> None:
    """``fullgraph partition --pyg``: a ``torch.save``'d ``Data`` (``edge_index`` or
    ``adj_t``) and a saved ``InMemoryDataset`` directory give ``pyg.partition``'s parts."""
    from torch_geometric.data import InMemoryDataset

    want_dir = pyg.partition(weighted_data, parts=2, out=tmp_path / "api")
    torch.save(weighted_data, tmp_path / "data.pt")
    torch.save(_adj_t(weighted_data, "csr"), tmp_path / "adj.pt")
    (tmp_path / "ds" / "processed").mkdir(parents=True)
    InMemoryDataset.save([weighted_data], str(tmp_path / "ds" / "processed" / "data.pt"))
    want = _digest(want_dir)
    for name in ("data.pt", "adj.pt", "ds"):
        out = tmp_path / f"cli-{name}"
        args = ["partition", "--pyg", str(tmp_path / name), "--parts", "2", "--out", str(out)]
        assert cli_main(args) == 0, name
        assert _digest(out) == want, name
    assert cli_main(["verify", str(tmp_path / "cli-ds")]) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give the graph: --dataset NAME --root DIR, or --pyg FILE"),
        (["--pyg", "{tmp}/missing.pt"], "missing.pt does not exist"),
        (["--pyg", "{tmp}/junk.pt"], "junk.pt: not a file torch.save wrote"),
        (["--pyg", "{tmp}/tensor.pt"], r"tensor.pt: got Tensor of shape \(3,\); give"),
        (["--pyg", "{tmp}/junk.pt", "--dataset", "cora"], "leave out --dataset"),
        (["--dataset", "cora"], "--root DIR is needed too"),
    ],
    ids=["nothing", "missing", "junk", "tensor", "both", "no-root"],
)
def test_partition_command_refuses_in_one_line(args, message, tmp_path, capsys) -> None:
    (tmp_path / "junk.pt").write_text("not a torch file\n")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    argv = ["partition", *[a.format(tmp=tmp_path) for a in args]]
    argv += ["--parts", "2", "--out", str(tmp_path / "out")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fullgraph partition: error: "), err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_partition_api_refuses_in_one_line(small_graph, tmp_path) -> None:
    data = to_pyg(small_graph)
    with pytest.raises(ConfigError, match="parts must be an integer, got float 2.0"):
        pyg.partition(data, parts=2.0, out=tmp_path / "a")
    with pytest.raises(ConfigError, match="method 'spectral' is not one of metis"):
        pyg.partition(data, parts=2, out=tmp_path / "a", method="spectral")
    with pytest.raises(ConfigError, match="partition: got int 42"):
        pyg.partition(42, parts=2, out=tmp_path / "a")
    pyg.partition(data, parts=2, out=tmp_path / "a")
    with pytest.raises(FileExistsError):
        pyg.partition(data, parts=2, out=tmp_path / "a")
    pyg.partition(data, parts=3, out=tmp_path / "a", force=True)


def _wrong_sources(tmp_path: Path, small_graph) -> dict[str, tuple[object, str]]:
    from torch_geometric.data import HeteroData, InMemoryDataset

    no_y = to_pyg(small_graph)
    del no_y.y
    (tmp_path / "data.pt").write_bytes(b"x")

    class OneGraph(InMemoryDataset):
        def __init__(self) -> None:
            super().__init__(None)
            self.data, self.slices = self.collate([to_pyg(small_graph)])

    return {
        "int": (42, r"load_part: got int 42; give a partition directory"),
        "tensor": (torch.zeros(2, 3), r"load_part: got Tensor of shape \(2, 3\); give"),
        "list": ([1, 2], "load_part: got list; give a partition directory"),
        "missing dir": (str(tmp_path / "nope"), r"load_part: '.*nope' does not exist; give a"),
        "a file": (str(tmp_path / "data.pt"), r"data.pt is a file, not a partition directory"),
        "no y": (
            no_y,
            r"has no labels \(y\): Data\(edge_index \[2, \d+\], .*x \[600, 12\]\); give",
        ),
        "dataset": (OneGraph(), r"got the PyG dataset OneGraph \(1 graphs\).*dataset\[0\]"),
        "hetero": (HeteroData(), "got a heterogeneous graph"),
    }


def test_load_part_names_what_it_got(small_graph, tmp_path) -> None:
    for name, (source, message) in _wrong_sources(tmp_path, small_graph).items():
        with pytest.raises(FullgraphError, match=message) as info:
            pyg.load_part(source, Communicator())
        assert "\n" not in str(info.value), name
