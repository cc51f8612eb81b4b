"""``fullgraph predict`` is exact: P ranks write what one process writes.

- for gcn (3 layers, both embeddings), sage with ``--norm batch``, gat (2 heads) and appnp
  (K = 3), a model
  trained in one process predicts at P = 1, 2, 4 (``--parts``) what one process predicts on the
  whole graph (``--dataset``): logits and embeddings to rtol 1e-5, the same classes, the
  probabilities the softmax of the logits; ``predict.json`` names the model file's sha256;
- new nodes: a model trained on a graph without its test nodes predicts on the grown graph
  (the test nodes and their edges added) at P = 2 what one process predicts there.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from harness import EXACT, assert_matches_one_process
from mp_utils import one_thread, run_mpi

from fullgraph.cli import main as cli_main
from fullgraph.datasets.graph import Graph

PREDICT = ["-m", "fullgraph.cli", "predict", "--threads", "1"]
#: kind -> (training options, embedding layers)
MODELS = {
    "gcn": (["--model", "gcn", "--layers", "3", "--hidden", "16"], "1,2"),
    "sage": (["--model", "sage", "--layers", "2", "--hidden", "16", "--norm", "batch"], "1"),
    "gat": (["--model", "gat", "--layers", "2", "--hidden", "8", "--heads", "2"], "1"),
    "appnp": (["--model", "appnp", "--layers", "2", "--hidden", "16", "--hops", "3"], "1"),
}
RTOL, ATOL = 1e-5, 1e-6


def _cli(argv: list[str]) -> None:
    with one_thread():
        assert cli_main([*argv, "--threads", "1"]) == 0


def _arrays(out: Path) -> dict[str, np.ndarray]:
    return {p.name: np.load(p, mmap_mode="r") for p in sorted(out.glob("*.npy"))}


def _close(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], what: str) -> None:
    """Every file of ``got`` equals one process's ``ref`` (the predictions exactly, the
    probabilities as the softmax of its logits)."""
    want = dict(ref)
    if "probabilities.npy" in got:
        z = np.asarray(ref["logits.npy"], dtype=np.float64)
        e = np.exp(z - z.max(axis=1, keepdims=True))
        want["probabilities.npy"] = e / e.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(got["probabilities.npy"].sum(axis=1), 1.0, rtol=1e-5)
    tolerances = {n: EXACT if n == "predictions.npy" else (RTOL, ATOL) for n in got}
    assert_matches_one_process(got, want, tolerances, where=what)


@pytest.fixture(scope="module")
def dataset_root(small_graph: Graph, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``small_graph`` on disk as dataset ``sbm-test`` (the graph ``small_partitions`` split)."""
    from fullgraph.datasets.synthetic import write_ogb

    root = tmp_path_factory.mktemp("predict-data")
    write_ogb(small_graph, root, small_graph.name)
    return root


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_ranks_predict_what_one_process_predicts(
    kind: str, small_graph: Graph, small_partitions, dataset_root: Path, tmp_path: Path
) -> None:
    train, layers = MODELS[kind]
    model = tmp_path / f"{kind}.pt"
    data = ["--dataset", small_graph.name, "--root", str(dataset_root)]
    _cli(["train", *data, *train, "--epochs", "5", "--quiet", "--save-model", str(model)])
    common = ["--model", str(model), "--embeddings", layers, "--quiet"]
    ref_dir = tmp_path / "one"
    _cli(["predict", *data, *common, "--logits", "--out", str(ref_dir)])
    ref = _arrays(ref_dir)
    n = small_graph.num_nodes
    assert ref["logits.npy"].shape == (n, 4) and ref["predictions.npy"].shape == (n,)
    assert set(ref) == {"logits.npy", "predictions.npy"} | {
        f"embeddings-{k}.npy" for k in layers.split(",")
    }
    np.testing.assert_array_equal(ref["predictions.npy"], ref["logits.npy"].argmax(axis=1))
    record = json.loads((ref_dir / "predict.json").read_text())
    assert record["model"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert record["files"]["logits.npy"] == {"shape": [n, 4], "dtype": "float32"}
    assert set(record["summary"]) == {"train_acc", "val_acc", "test_acc"}

    one = tmp_path / "p1"  # P = 1 from the partition directory, in this process
    _cli(["predict", "--parts", str(small_partitions[1]), *common, "--logits", "--out", str(one)])
    _close(_arrays(one), ref, f"{kind} P=1")
    for ranks in (2, 4):
        out = tmp_path / f"p{ranks}"
        logits = ["--logits"] if ranks == 2 else []  # P = 4 writes the probabilities
        parts = str(small_partitions[ranks])
        run_mpi(ranks, [*PREDICT, "--parts", parts, *common, *logits, "--out", str(out)], 200)
        got = _arrays(out)
        _close(got, ref, f"{kind} P={ranks}")
        summary = json.loads((out / "predict.json").read_text())
        assert summary["ranks"] == ranks and len(summary["peak_rss_mb"]) == ranks
        assert summary["summary"] == pytest.approx(record["summary"], abs=1e-12)
        assert summary["command"].startswith(f"mpirun -n {ranks} fullgraph predict --parts")


def _without(graph: Graph, drop: np.ndarray, name: str) -> Graph:
    """The subgraph induced by the nodes not in ``drop``, renumbered in their order."""
    keep = ~drop
    a = sp.csr_matrix(
        (np.ones(graph.indices.size, dtype=np.bool_), graph.indices, graph.indptr),
        shape=(graph.num_nodes, graph.num_nodes),
    )
    sub = a[keep][:, keep].tocsr()
    sub.sort_indices()
    assert graph.x is not None
    return Graph(
        name=name,
        num_nodes=int(keep.sum()),
        indptr=sub.indptr.astype(np.int64),
        indices=sub.indices.astype(np.int64),
        x=graph.x[keep],
        y=graph.y[keep],
        train_mask=graph.train_mask[keep],
        val_mask=graph.val_mask[keep],
        test_mask=graph.test_mask[keep],
        num_classes=graph.num_classes,
    ).validate()


@pytest.mark.timeout(400)
def test_a_model_predicts_new_nodes_at_any_rank_count(make_graph, tmp_path: Path) -> None:
    """Trained without half of the test nodes (a split may not be empty on disk); predicted
    on the grown graph at P = 2 and in one process: the new nodes' logits agree, and they are
    classified well above chance."""
    from fullgraph.datasets import load
    from fullgraph.datasets.synthetic import write_ogb
    from fullgraph.partition import partition_graph

    grown = make_graph(num_nodes=500, seed=7, name="grown")
    new = np.zeros(grown.num_nodes, dtype=np.bool_)
    new[np.flatnonzero(grown.test_mask)[::2]] = True
    seen = _without(grown, new, "seen")
    assert 0 < new.sum() and seen.num_nodes == grown.num_nodes - new.sum()
    root = tmp_path / "data"
    write_ogb(seen, root, "seen")
    write_ogb(grown, root, "grown")
    model = tmp_path / "m.pt"
    train = ["--model", "sage", "--hidden", "32", "--epochs", "30", "--quiet"]
    _cli(["train", "--dataset", "seen", "--root", str(root), *train, "--save-model", str(model)])
    parts = tmp_path / "grown-2"
    partition_graph(load("grown", root), 2, parts, method="metis", seed=0)
    common = ["--model", str(model), "--logits", "--quiet", "--embeddings", "1"]
    one = tmp_path / "one"
    _cli(["predict", "--dataset", "grown", "--root", str(root), *common, "--out", str(one)])
    two = tmp_path / "two"
    run_mpi(2, [*PREDICT, "--parts", str(parts), *common, "--out", str(two)], 200)
    ref, got = _arrays(one), _arrays(two)
    assert all(got[name].shape[0] == grown.num_nodes for name in ref), got
    tolerances = dict.fromkeys(ref, (RTOL, ATOL))
    assert_matches_one_process(
        {name: got[name][new] for name in ref},
        {name: ref[name][new] for name in ref},
        tolerances,
        where="P=2, the new nodes",
    )
    assert_matches_one_process(got, ref, tolerances, where="P=2, every node")
    test = grown.test_mask
    record = json.loads((two / "predict.json").read_text())
    tested = (ref["predictions.npy"][test] == grown.y[test]).mean()
    assert record["summary"]["test_acc"] == pytest.approx(tested, abs=1e-12)
    accuracy = (ref["predictions.npy"][new] == grown.y[new]).mean()
    assert accuracy > 0.5, accuracy  # 4 classes: chance is 0.25
