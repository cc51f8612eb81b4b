"""Bring your own PyG model: the converted model on P ranks computes what PyG computes on one.

The models (``tests/pyg/pyg_worker.py``: the GCN of ``examples/gcn_cora.py``, the GraphSAGE +
BatchNorm of ``examples/sage_batchnorm.py``, GAT + per-node LayerNorm) are converted by
``fullgraph.pyg.distribute`` and trained three SGD steps on P = 2 and 4 ranks. With dropout off
their gradients, losses, parameters, BatchNorm statistics and accuracy equal the ORIGINAL PyG
model's on one process; with dropout on (hashed masks, attention dropout included) they equal
the converted model's on one process. Unsupported layers are refused naming the layer, and the
distributed example differs from the single-process one in at most five lines.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from harness import run_task
from mp_utils import run_mpi
from torch import nn

pyg_nn = pytest.importorskip("torch_geometric.nn")

import pyg_worker  # noqa: E402

from fullgraph import pyg  # noqa: E402
from fullgraph.datasets import Graph, to_pyg  # noqa: E402
from fullgraph.distributed import Communicator  # noqa: E402
from fullgraph.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal to rtol 1e-5 (entries near zero: to 1e-5 of the largest entry)."""
    scale = float(np.abs(want).max()) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


def _compare(got: dict, want: dict, mode: str) -> None:
    for name in pyg_worker.models():
        for field in ("grads", "losses", "params", "buffers", "val_acc"):
            key = f"{name}/{mode}/{field}"
            _close(np.asarray(got[key]), np.asarray(want[key]), key)


@pytest.fixture(scope="module")
def references(small_graph: Graph) -> dict:
    """The original PyG models and the converted ones, on one process."""
    with torch.random.fork_rng():
        original = pyg_worker.run_original(to_pyg(small_graph))
        converted = pyg_worker.run_converted(pyg.load_part(small_graph, Communicator()))
    return {"original": original, "converted": converted}


def test_one_process_converted_equals_the_original(references: dict) -> None:
    _compare(references["converted"], references["original"], "exact")


@pytest.mark.parametrize(
    ("ranks", "source"), [(2, "parts"), (4, "parts"), (2, "graph")], ids=["P2", "P4", "P2-graph"]
)
def test_ranks_equal_one_process(
    ranks: int, source: str, small_partitions: dict, references: dict, tmp_path: Path
) -> None:
    """P ranks: dropout off = the original PyG model; dropout on = the converted model, on one
    process. ``graph``: every rank holds the graph and ``load_part`` partitions it."""
    src = str(small_partitions[ranks]) if source == "parts" else "sbm"
    got = run_task(
        pyg_worker.converted, ranks=ranks, out=tmp_path / "out.npz", timeout=300, source=src
    )
    for key in (k for k in got if k.endswith("same_on_every_rank")):
        assert bool(got[key]), key
    _compare(got, references["original"], "exact")
    _compare(got, references["converted"], "dropout")


@pytest.fixture(scope="module")
def data(small_graph: Graph):
    return pyg.load_part(small_graph, Communicator())


def test_parameters_are_shared_and_state_dict_keys_kept(data) -> None:
    model = pyg_worker.build("sage_bn", data.num_features, data.num_classes, 0.5)
    before = dict(model.named_parameters())
    keys = list(model.state_dict())
    converted = pyg.distribute(model, data)
    assert converted is model
    assert type(model.conv1).__name__ == "SAGEConvTwin"
    assert type(model.bn1.module).__name__ == "BatchNormTwin"
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[k] is before[k] for k in before)
    assert list(model.state_dict()) == keys


class _Wrap(nn.Module):
    """A model holding ``layer`` after a GCNConv (``model.block.1``)."""

    def __init__(self, layer: nn.Module, width: int) -> None:
        super().__init__()
        self.conv = pyg_nn.GCNConv(width, 8)
        self.block = nn.Sequential(nn.ReLU(), layer)

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        return self.block(self.conv(x, edge_index))


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: pyg_nn.GINConv(nn.Linear(8, 8)), "message-passing"),
        (lambda: pyg_nn.GraphConv(8, 8), "message-passing"),
        (lambda: pyg_nn.SAGEConv(8, 8, aggr="max"), "aggr='max'"),
        (lambda: pyg_nn.LayerNorm(8), "mode='graph'"),
        (lambda: pyg_nn.GraphNorm(8), "all nodes of a graph"),
        (lambda: pyg_nn.PairNorm(), "all nodes of a graph"),
        (lambda: pyg_nn.aggr.MeanAggregation(), "pooling"),
        (lambda: pyg_nn.MLP([8, 8, 8], dropout=0.5), "dropout=0"),
        (lambda: nn.BatchNorm1d(8, momentum=None), "momentum=None"),
        (lambda: nn.AlphaDropout(0.5), "nn.Dropout"),
        (lambda: nn.Softmax(dim=0), "dim=0"),
        (lambda: nn.MultiheadAttention(8, 2), "not known to act"),
    ],
)
def test_unsupported_layers_are_refused_by_name(data, make, why: str) -> None:
    layer = make()
    model = _Wrap(layer, data.num_features)
    with pytest.raises(ConfigError) as info:
        pyg.distribute(model, data)
    msg = str(info.value)
    assert "\n" not in msg
    assert f"model.block.1 ({type(layer).__module__}.{type(layer).__qualname__})" in msg
    assert "cannot be distributed exactly" in msg and why in msg


def test_torch_random_draws_in_forward_are_refused(data) -> None:
    class FDropout(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = pyg_nn.GCNConv(data.num_features, 4)

        def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
            return self.conv(F.dropout(x, 0.5, self.training), edge_index)

    model = pyg.distribute(FDropout(), data)
    with pytest.raises(ConfigError, match="fullgraph.pyg.dropout"):
        model(data.x, data.edge_index)
    model.eval()
    model(data.x, data.edge_index)  # no draw in evaluation


def test_converted_layers_refuse_another_edge_index(data, small_graph: Graph) -> None:
    model = pyg.distribute(pyg_nn.GCNConv(data.num_features, 4), data)
    with pytest.raises(ConfigError, match="edge_index must be data.edge_index"):
        model(data.x, to_pyg(small_graph).edge_index)
    with pytest.raises(ConfigError, match="rows"):
        model(data.x[:5], data.edge_index)


def test_a_second_backward_through_one_forward_is_refused(data) -> None:
    model = pyg.distribute(pyg_nn.GCNConv(data.num_features, data.num_classes), data)
    loss = pyg.loss(model(data.x, data.edge_index), data)
    loss.backward(retain_graph=True)
    with pytest.raises(ConfigError, match="second backward"):
        loss.backward()


def test_loss_and_accuracy_are_global_values(data, small_graph: Graph) -> None:
    out = torch.randn(data.num_nodes, data.num_classes, requires_grad=True)
    m = data.train_mask
    want = F.cross_entropy(out[m], data.y[m])
    got = pyg.loss(out, data)
    torch.testing.assert_close(got, want)
    got.backward()
    want_grad = torch.autograd.grad(want, out)[0]
    torch.testing.assert_close(out.grad, want_grad)
    v = data.val_mask
    acc = float((out.argmax(-1)[v] == data.y[v]).sum()) / float(v.sum())
    assert pyg.accuracy(out, data, v) == pytest.approx(acc)


def _code(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_examples_differ_in_at_most_five_lines() -> None:
    """The distributed example is the single-process one with at most five lines changed or
    added, and its docstring (shared by both) lists them."""
    single, dist = EXAMPLES / "gcn_cora.py", EXAMPLES / "gcn_cora_distributed.py"
    diff = list(difflib.unified_diff(_code(single), _code(dist), lineterm="", n=0))
    added = [d[1:] for d in diff if d.startswith("+") and not d.startswith("+++")]
    removed = [d[1:] for d in diff if d.startswith("-") and not d.startswith("---")]
    assert 0 < len(added) <= 5 and len(removed) <= 5, "\n".join(diff)
    doc = dist.read_text().split('"""')[1]
    for line in added:
        assert f"    {line.strip()}" in doc, f"the docstring does not show {line.strip()!r}"


def test_example_on_two_ranks_prints_the_one_process_losses(shared_dataset) -> None:
    """Three epochs without dropout: the losses of ``mpirun -n 2`` equal one process's."""
    root = str(shared_dataset("cora"))
    args = ["--root", root, "--epochs", "3", "--dropout", "0"]
    sys.path.insert(0, str(EXAMPLES))
    try:
        import gcn_cora
    finally:
        sys.path.remove(str(EXAMPLES))
    with torch.random.fork_rng():
        want = gcn_cora.main(args)
    proc = run_mpi(2, [str(EXAMPLES / "gcn_cora_distributed.py"), *args], timeout=300)
    got = [float(v) for v in re.findall(r"loss (\S+)", proc.stdout)]
    assert len(got) == 3, proc.stdout  # printed once: rank 1's output is quiet
    np.testing.assert_allclose(got, want, rtol=1e-5)


#: A script whose rank 1 fails before it calls ``load_part``.
FAILS_BEFORE_LOAD_PART = """
import os, sys
from fullgraph import pyg
if os.environ["PMI_RANK"] == "1":
    raise ValueError("the script failed on rank 1")
pyg.load_part(sys.argv[1], timeout=float(sys.argv[2]))
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_rank_failing_before_load_part_ends_the_others(small_partitions, tmp_path) -> None:
    """Rank 1's own code raises before ``load_part``: its traceback is printed, and rank 0,
    waiting for it in MPI initialisation, ends once the timeout has passed, naming rank 1."""
    script = tmp_path / "pyg_fails_early.py"
    script.write_text(FAILS_BEFORE_LOAD_PART)
    proc = run_mpi(2, [str(script), str(small_partitions[2]), "5"], timeout=120, expect_ok=False)
    assert proc.returncode != 0
    assert "ValueError: the script failed on rank 1" in proc.stderr, proc.stderr
    assert re.search(
        r"^fullgraph.pyg: error: rank 0: MPI initialisation did not finish within 5 s; "
        r"rank 1 (is not running|\(pid \d+\) has exited)",
        proc.stderr,
        re.MULTILINE,
    ), proc.stderr
