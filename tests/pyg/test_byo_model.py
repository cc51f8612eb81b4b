"""Bring your own PyG model: the converted model on P ranks computes what PyG computes on one.

The models (``tests/pyg/pyg_worker.py``: the GCN and GAT of ``examples/gcn_cora.py``, written
as PyG's examples write them with ``F.dropout``, the GraphSAGE + BatchNorm of
``examples/sage_batchnorm.py``, GAT + per-node LayerNorm, a dropped weight; and PyG's model
classes ``GCN``, ``GraphSAGE``, ``GAT``, ``GIN`` with their common arguments) are converted by
``fullgraph.pyg.distribute`` and trained three SGD steps on P = 2 and 4 ranks. With dropout off
their gradients, losses, parameters, BatchNorm statistics and accuracy equal the ORIGINAL PyG
model's on one process; with dropout on (hashed masks, attention dropout included) they equal
the converted model's on one process. Unsupported layers and calls are refused in one line
naming them, before the first step; the support table of ``docs/pyg.md`` is the registry's; the
distributed example differs from the single-process one in at most five lines.

Enters through :mod:`fullgraph.pyg.convert`.
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
from fullgraph.pyg import rules  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def references(small_graph: Graph) -> dict:
    """The original PyG models and the converted ones, on one process."""
    return pyg_worker.references(small_graph, "examples")


@pytest.fixture(scope="module")
def basic_gnn_references(small_graph: Graph) -> dict:
    """PyG's model classes, original and converted, on one process."""
    return pyg_worker.references(small_graph, "basic_gnn")


def test_one_process_converted_equals_the_original(references: dict) -> None:
    pyg_worker.compare(references["converted"], references["original"], "exact")


def test_one_process_basic_gnn_models_equal_the_original(basic_gnn_references: dict) -> None:
    pyg_worker.compare(
        basic_gnn_references["converted"], basic_gnn_references["original"], "exact", "basic_gnn"
    )


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
    where = f"P={ranks}, {source}"
    pyg_worker.compare(got, references["original"], "exact", where=where)
    pyg_worker.compare(got, references["converted"], "dropout", where=where)


@pytest.mark.parametrize("ranks", [2, 4], ids=["P2", "P4"])
def test_basic_gnn_models_on_ranks_equal_one_process(
    ranks: int, small_partitions: dict, basic_gnn_references: dict, tmp_path: Path
) -> None:
    """PyG's ``GCN``, ``GraphSAGE``, ``GAT`` and ``GIN`` (jk, norm, act, dropout): gradients of
    every parameter after one step, losses over three, equal one process's."""
    got = run_task(
        pyg_worker.converted,
        ranks=ranks,
        out=tmp_path / "out.npz",
        timeout=300,
        source=str(small_partitions[ranks]),
        group="basic_gnn",
    )
    for key in (k for k in got if k.endswith("same_on_every_rank")):
        assert bool(got[key]), key
    where = f"P={ranks}"
    pyg_worker.compare(got, basic_gnn_references["original"], "exact", "basic_gnn", where)
    pyg_worker.compare(got, basic_gnn_references["converted"], "dropout", "basic_gnn", where)


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
        (lambda: pyg_nn.GATv2Conv(8, 8), "message-passing"),
        (lambda: pyg_nn.GATConv(8, 8, edge_dim=2, fill_value="max"), "fill_value='max'"),
        (lambda: pyg_nn.GraphConv(8, 8, aggr="min"), "aggr='min'"),
        (lambda: pyg_nn.SAGEConv(8, 8, aggr="min"), "aggr='min'"),
        (lambda: pyg_nn.LayerNorm(8), "mode='graph'"),
        (lambda: pyg_nn.GraphNorm(8), "all nodes of a graph"),
        (lambda: pyg_nn.PairNorm(), "all nodes of a graph"),
        (lambda: pyg_nn.aggr.MeanAggregation(), "pooling"),
        (lambda: pyg_nn.GINConv(nn.Linear(8, 8), aggr="mean"), "aggr='mean'"),
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


class _Calls(nn.Module):
    """``conv(call(x))``: a forward pass making ``call``."""

    def __init__(self, width: int, call) -> None:
        super().__init__()
        self.conv = pyg_nn.GCNConv(width, 4)
        self.call = call

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        return self.conv(self.call(self, x), edge_index)


def _modes() -> int:
    return torch._C._len_torch_function_stack()


def test_dropout_calls_in_forward_draw_hashed_masks(data) -> None:
    """``F.dropout``, ``torch.dropout`` and ``torch.dropout_`` in a forward, as written: one
    process draws the hashed masks of the node rows (the mask of ``fullgraph.pyg.dropout``)."""
    calls = {
        "F.dropout": lambda m, x: F.dropout(x, p=0.5, training=m.training),
        "torch.dropout": lambda m, x: torch.dropout(x, 0.5, m.training),
        "torch.dropout keywords": lambda m, x: torch.dropout(input=x, p=0.5, train=m.training),
        "nn.functional.dropout keywords": lambda m, x: torch.nn.functional.dropout(
            input=x, training=m.training
        ),
        "torch.dropout_": lambda m, x: torch.dropout_(x.clone(), 0.5, m.training),
        "pyg.dropout": lambda m, x: pyg.dropout(x, 0.5, m.training),
    }
    outs = {}
    for name, call in calls.items():
        torch.manual_seed(0)
        model = pyg.distribute(_Calls(data.num_features, call), data)
        data.fullgraph.step = 0  # the same training step for every call
        outs[name] = model(data.x, data.edge_index)
        assert _modes() == 0
        model.eval()
        torch.testing.assert_close(
            model(data.x, data.edge_index), model.conv(data.x, data.edge_index)
        )
    for name, out in outs.items():
        torch.testing.assert_close(out, outs["pyg.dropout"], msg=name)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m, x: x * torch.rand_like(x), r"^torch.rand_like at .*test_byo_model.py:\d+ draws"),
        (
            lambda m, x: F.alpha_dropout(x, 0.5, m.training),
            r"^torch.nn.functional.alpha_dropout at",
        ),
        (lambda m, x: x.bernoulli_(0.5) * x, r"^Tensor.bernoulli_ at"),
        (
            lambda m, x: x + F.dropout(x.t(), 0.5, m.training).sum(),
            r"^torch.nn.functional.dropout at .*test_byo_model.py:\d+: dropout of a tensor of "
            r"shape \(12, \d+\) cannot be made exact",
        ),
        (
            lambda m, x: x + F.fractional_max_pool2d(x[None, None, :4, :4], 2, output_size=2).sum(),
            r"_Calls.forward drew from torch's random generator in a training pass",
        ),
    ],
    ids=["rand_like", "alpha_dropout", "bernoulli_", "edge-shaped", "unwatched draw"],
)
def test_random_draws_and_other_dropouts_are_refused_in_one_line(data, call, match) -> None:
    """Refused in the first training pass (before any step), one line naming the call and its
    site; evaluation passes draw nothing and run."""
    model = pyg.distribute(_Calls(data.num_features, call), data)
    with pytest.raises(ConfigError, match=match) as info:
        model(data.x.clone(), data.edge_index)
    assert "\n" not in str(info.value)
    assert _modes() == 0
    model.eval()
    model(data.x.clone(), data.edge_index)


def test_basic_gnn_refusals_name_the_module(data) -> None:
    """PyG model classes with a part that has no twin: refused by ``distribute``, naming it."""
    models = pytest.importorskip("torch_geometric.nn.models")
    f, c = data.num_features, data.num_classes
    cases = [
        (
            lambda: models.GAT(f, 8, 2, c, v2=True),
            "model.convs.0 (torch_geometric.nn.conv.gatv2_conv.GATv2Conv)",
        ),
        (
            lambda: models.GraphSAGE(f, 8, 2, c, aggr="min"),
            "model.convs.0 (torch_geometric.nn.conv.sage_conv.SAGEConv)",
        ),
        (
            lambda: models.GCN(f, 8, 2, c, norm="layer_norm"),
            "model.norms.0 (torch_geometric.nn.norm.layer_norm.LayerNorm)",
        ),
        (
            lambda: models.GCN(f, 8, 2, c, norm="graph_norm"),
            "model.norms.0 (torch_geometric.nn.norm.graph_norm.GraphNorm)",
        ),
        (
            lambda: models.EdgeCNN(f, 8, 2, c),
            "model.convs.0 (torch_geometric.nn.conv.edge_conv.EdgeConv)",
        ),
    ]
    for make, where in cases:
        with pytest.raises(ConfigError) as info:
            pyg.distribute(make(), data)
        msg = str(info.value)
        assert msg.startswith(where) and "cannot be distributed exactly" in msg and "\n" not in msg


def test_basic_gnn_refuses_sampled_subgraph_arguments(data) -> None:
    models = pytest.importorskip("torch_geometric.nn.models")
    model = pyg.distribute(models.GCN(data.num_features, 8, 2, data.num_classes), data)
    assert type(model._trim).__name__ == "TrimToLayerTwin"
    with pytest.raises(ConfigError, match="num_sampled_nodes_per_hop"):
        model(
            data.x,
            data.edge_index,
            num_sampled_nodes_per_hop=[1, 1],
            num_sampled_edges_per_hop=[1, 1],
        )


def test_docs_list_what_the_registry_supports() -> None:
    """``docs/pyg.md`` holds the support tables generated from ``rules.RULES`` and the watched
    calls, verbatim (regenerate: ``python -c "from fullgraph.pyg.rules import
    support_table; print(support_table())"``)."""
    from fullgraph.pyg.rules import support_table

    doc = (ROOT / "docs" / "pyg.md").read_text()
    begin, end = "<!-- support table: begin -->\n", "\n<!-- support table: end -->"
    assert begin in doc and end in doc
    assert doc.split(begin, 1)[1].split(end, 1)[0] == support_table()


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


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_example_on_two_ranks_prints_the_one_process_losses(model: str, shared_dataset) -> None:
    """Three epochs without dropout: the losses of ``mpirun -n 2`` equal one process's (the
    PyG script's ``F.dropout`` calls included, at p = 0)."""
    root = str(shared_dataset("cora"))
    args = ["--root", root, "--model", model, "--epochs", "3", "--dropout", "0"]
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


#: A script whose model is refused by ``distribute`` (``convert``) or in its forward (``call``).
REFUSED_SCRIPT = """
import sys
import torch
from conftest import build_sbm_graph
from torch_geometric.nn.models import GAT, GCN
from fullgraph import pyg
data = pyg.load_part(build_sbm_graph(), threads=1)
if sys.argv[1] == "convert":
    model = pyg.distribute(GAT(data.num_features, 8, 2, data.num_classes, v2=True), data)
else:
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gcn = GCN(data.num_features, 8, 2, data.num_classes)
        def forward(self, x, edge_index):
            return self.gcn(x + torch.randn_like(x), edge_index)
    model = pyg.distribute(Noisy(), data)
    model(data.x, data.edge_index)
print("not reached")
"""


@pytest.mark.parametrize("where", ["convert", "call"])
def test_a_refused_script_ends_with_one_line_per_rank_at_most(where: str, tmp_path) -> None:
    """Under ``mpirun -n 2`` a refusal ends the script before its first step with one line, no
    traceback: once for ``distribute``'s (agreed by the ranks), once per rank naming it for a
    call refused in the forward pass."""
    script = tmp_path / "pyg_refused.py"
    script.write_text(REFUSED_SCRIPT)
    env = {"PYTHONPATH": str(ROOT / "tests")}
    proc = run_mpi(2, [str(script), where], timeout=200, expect_ok=False, env=env)
    assert proc.returncode != 0 and "not reached" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fullgraph.pyg: error")]
    assert "Traceback" not in proc.stderr, proc.stderr
    if where == "convert":
        assert lines == [
            "fullgraph.pyg: error: model.convs.0 (torch_geometric.nn.conv.gatv2_conv.GATv2Conv) "
            "cannot be distributed exactly: " + rules._MESSAGE_PASSING
        ], proc.stderr
    else:
        # the first rank to fail aborts the job: the other's line may not come
        assert 1 <= len(lines) <= 2 and len({line[:30] for line in lines}) == len(lines)
        assert all(
            line[:30] in ("fullgraph.pyg: error: rank 0: ", "fullgraph.pyg: error: rank 1: ")
            for line in lines
        ), proc.stderr
        line_no = next(i for i, t in enumerate(REFUSED_SCRIPT.splitlines(), 1) if "randn" in t)
        assert all(f"torch.randn_like at {script}:{line_no} draws" in t for t in lines), lines


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
