"""``fullgraph export --to pyg``: the trained model as a plain PyG model, and PyG models trained
with ``fullgraph.pyg``, whose ``state_dict`` is already PyG's.

- Every configuration (gcn, sage, gat with 2 hidden heads and 1 output head, gin, mlp, appnp
  with K = 3 and alpha = 0.2 (its ``Linear`` layers, then PyG's ``APPNP``; and once with the
  defaults K = 10, alpha = 0.1), and two each of sage with ``--aggr max`` and graphconv with
  ``--aggr max`` / ``mean``; 1 to 3 layers;
  batch norm, layer norm, residual connections with width changes; a symmetric graph with
  isolated nodes and a hub, and a directed one) exported to ``OUT.py`` and ``OUT.pt``: the
  module imported from its path, ``load_model()``, the class rebuilt from ``OUT.pt``, and PyG's
  own ``GCN`` / ``GraphSAGE`` / ``GAT`` / ``GIN`` where the export names one, all give our
  logits (our ``GNN`` in evaluation on the one-process context) to 1e-5 in float32 (gin:
  relative to the largest logit).
- A link model (``--task link``, dot and MLP decoders): the export's ``decode(encode(...))``
  gives the logits ``fullgraph predict --pairs`` scores.
- ``fullgraph train --save-model`` then ``fullgraph export``, end to end on the command line.
- Bad input (not a model file, a damaged one, another target, another suffix, an existing
  output, a file fullgraph did not write, the model file itself as output): one line, exit 2,
  nothing written.
- A model converted by ``fullgraph.pyg.distribute`` and trained on 2 ranks: rank 0's
  ``model.state_dict()`` loads into a fresh plain PyG model (``strict=True``) that gives the
  distributed model's logits in one process.

This file is also the worker of the last test (``python tests/training/test_export_pyg.py --task
pyg_trained``, run by :func:`harness.run_task`).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from cli_run import assert_one_line, run_cli
from file_tree import tree
from harness import Tasks, run_task
from harness import main as worker_main
from mp_utils import one_thread
from torch import nn

pyg_nn = pytest.importorskip("torch_geometric.nn")

from fullgraph import pyg  # noqa: E402
from fullgraph.datasets import Graph, to_pyg  # noqa: E402
from fullgraph.distributed import Communicator  # noqa: E402
from fullgraph.partition import whole_graph_part  # noqa: E402
from fullgraph.run.torch_file import encode_torch_file  # noqa: E402
from fullgraph.training import TrainConfig  # noqa: E402
from fullgraph.training.assembly import assemble_rank  # noqa: E402
from fullgraph.training.export_pyg import MARKER, export_pyg  # noqa: E402
from fullgraph.training.model_file import (  # noqa: E402
    load_model_file,
    model_state,
    save_model_file,
)

#: The largest difference allowed between our logits and the exported model's (float32); for gin
#: relative to the largest logit when that exceeds 1.
TOLERANCE = 1e-5
#: configuration id -> TrainConfig fields (beside hidden 16, or 8 per head for gat)
CONFIGS: dict[str, dict[str, Any]] = {}
for _kind, _extra in (
    ("gcn", {}),
    ("sage", {}),
    ("gat", {"heads": 2, "output_heads": 1}),
    ("gin", {}),
    ("sage", {"aggr": "max"}),
    ("graphconv", {"aggr": "max"}),
    ("graphconv", {"aggr": "mean"}),
    ("mlp", {}),
    ("appnp", {"hops": 3, "alpha": 0.2}),
):
    for _name, _fields in (
        ("L1", {"layers": 1}),
        ("L3", {"layers": 3}),
        ("L3-batch", {"layers": 3, "norm": "batch"}),
        ("L3-layer", {"layers": 3, "norm": "layer"}),
        ("L3-batch-residual", {"layers": 3, "norm": "batch", "residual": True}),
        ("L2-layer-residual", {"layers": 2, "norm": "layer", "residual": True}),
        ("L1-residual", {"layers": 1, "residual": True}),
    ):
        _id = f"{_kind}-{_extra['aggr']}" if "aggr" in _extra else _kind
        if "aggr" in _extra and _name not in ("L3-layer", "L1-residual"):
            continue  # the other aggregations: two configurations each
        CONFIGS[f"{_id}-{_name}"] = {"model": _kind, **_extra, **_fields}
#: GAT with as many heads in the last layer as in the others: PyG's own GAT takes it too
CONFIGS["gat-L2-batch-heads2-out2"] = {
    "model": "gat",
    "heads": 2,
    "output_heads": 2,
    "layers": 2,
    "norm": "batch",
}
#: APPNP with the paper's K = 10 and alpha = 0.1 (the defaults)
CONFIGS["appnp-L2-default"] = {"model": "appnp", "layers": 2}
#: (configuration id, graph): every configuration on the symmetric graph, two per kind on the
#: directed one
CASES = [(c, "symmetric") for c in CONFIGS] + [
    (c, "directed") for c in CONFIGS if c.endswith(("-L3-layer", "-L3-batch-residual"))
]
#: configuration id -> the largest difference seen (printed at the end of the module)
MAX_ERRORS: dict[str, float] = {}

#: How export's one-line errors start.
EXPORT_ERROR = "fullgraph export: error: "


def _hub_graph(make_graph, *, directed: bool) -> Graph:
    """120 nodes, 5 isolated, and node 0 linked both ways to every second linked node."""
    g = make_graph(
        num_nodes=120, num_isolated=5, num_features=10, seed=4, directed=directed, name="hub"
    )
    n = g.num_nodes
    rows = np.repeat(np.arange(n), np.diff(g.indptr))
    src, dst = list(g.indices), list(rows)
    for v in range(1, n - 5, 2):
        src += [0, v]
        dst += [v, 0]
    a = sp.csr_matrix((np.ones(len(src), bool), (dst, src)), shape=(n, n))
    a.setdiag(False)
    a.eliminate_zeros()
    a.sort_indices()
    g.indptr, g.indices = a.indptr.astype(np.int64), a.indices.astype(np.int64)
    return g.validate()


@pytest.fixture(scope="module")
def graphs(make_graph) -> dict[str, Graph]:
    return {
        "symmetric": _hub_graph(make_graph, directed=False),
        "directed": _hub_graph(make_graph, directed=True),
    }


def _config(fields: dict[str, Any]) -> TrainConfig:
    hidden = 8 if fields["model"] == "gat" else 16
    return TrainConfig(hidden=hidden, dropout=0.5, input_dropout=0.2, **fields)


def _model_file(path: Path, cfg: TrainConfig, graph: Graph, seed: int = 0) -> Path:
    """A model file of ``cfg`` holding random weights and normalisation statistics."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cfg.build_model(graph.num_features, graph.num_classes)
        with torch.no_grad():
            for key, t in model.state_dict().items():
                if key.endswith("running_var"):
                    t.copy_(torch.rand_like(t) + 0.5)
                elif key.endswith("num_batches_tracked"):
                    t.fill_(7)
                else:
                    t.copy_(torch.randn_like(t) * 0.5)
    info = {"epoch": 7, "metric": "acc", "val": 0.5, "test": 0.25, "data": graph.name}
    return save_model_file(
        path, model_state(model, cfg, graph.num_features, graph.num_classes, info)
    )


def _ours(model_path: Path, graph: Graph) -> torch.Tensor:
    """Our model's logits: the ``GNN`` in evaluation on the one-process context, its rows (in
    block order) put back in global order."""
    mf = load_model_file(model_path)
    part = whole_graph_part(graph)
    rank = assemble_rank(part, Communicator(), mf.config)
    with torch.no_grad():
        logits = mf.build()(rank.data["x"], rank.ctx, training=False)
    out = torch.empty_like(logits)
    out[torch.from_numpy(np.asarray(part.global_ids))] = logits
    return out


def _import(path: Path) -> ModuleType:
    """The module at ``path``, imported under a fresh name."""
    name = f"exported_{path.stem}_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _logits(model: nn.Module, graph: Graph) -> torch.Tensor:
    data = to_pyg(graph)
    model.eval()
    with torch.no_grad():
        return model(data.x, data.edge_index)


@pytest.fixture(scope="module", autouse=True)
def _report_errors():
    """Print the largest difference per configuration (``pytest -s`` shows it)."""
    yield
    if MAX_ERRORS:
        print("\nexport parity, max |ours - PyG| (float32; gin: relative to logits above 1):")
        for key, err in MAX_ERRORS.items():
            print(f"  {key:36s} {err:.3g}")


@pytest.mark.parametrize(("config", "graph_name"), CASES, ids=[f"{c}-{g}" for c, g in CASES])
def test_exported_model_gives_our_logits(
    config: str, graph_name: str, graphs: dict, tmp_path: Path
) -> None:
    graph = graphs[graph_name]
    cfg = _config(CONFIGS[config])
    model_path = _model_file(tmp_path / "model.pt", cfg, graph)
    with one_thread():
        ours = _ours(model_path, graph)
        assert export_pyg(model_path, tmp_path / "net.py") == [
            tmp_path / "net.pt",
            tmp_path / "net.py",
        ]
        assert export_pyg(model_path, tmp_path / "alone.pt") == [tmp_path / "alone.pt"]
        module = _import(tmp_path / "net.py")
        loaded = module.load_model()
        assert not loaded.training
        errors = {"load_model": float((_logits(loaded, graph) - ours).abs().max())}
        saved = torch.load(tmp_path / "alone.pt", weights_only=True)  # plain torch.load
        assert saved["format"] == "fullgraph-pyg" and saved["class"] == "FullgraphGNN"
        rebuilt = module.FullgraphGNN(**saved["init_args"])
        assert list(saved["state_dict"]) == list(rebuilt.state_dict())  # PyG's keys, its order
        rebuilt.load_state_dict(saved["state_dict"], strict=True)
        errors["class + .pt"] = float((_logits(rebuilt, graph) - ours).abs().max())
        spec = saved["pyg_model"]
        same_heads = cfg.layers == 1 or cfg.heads == cfg.output_heads
        expect_basic = not cfg.residual and (cfg.model != "gat" or same_heads)
        expect_basic = expect_basic and not (cfg.model == "gin" and cfg.norm != "none")
        # PyG has no GraphConv model, nor an MLP or APPNP whose layers are ``convs``
        expect_basic = expect_basic and cfg.model not in ("graphconv", "mlp", "appnp")
        assert (spec is not None) == expect_basic, spec
        if spec is not None:  # PyG's own model, no code of ours
            import torch_geometric.nn.models as pyg_models

            basic = getattr(pyg_models, spec["class"].rpartition(".")[2])(**spec["kwargs"])
            basic.load_state_dict(saved["state_dict"], strict=True)
            errors[spec["class"]] = float((_logits(basic, graph) - ours).abs().max())
    # gin: relative to the logits' scale (its sums over a hub of 60 in-neighbours reach 1e3)
    sums = cfg.model == "gin" or (cfg.model == "graphconv" and cfg.aggr != "mean")
    scale = max(1.0, float(ours.abs().max())) if sums else 1.0
    errors = {k: v / scale for k, v in errors.items()}
    MAX_ERRORS[f"{config} ({graph_name})"] = max(errors.values())
    assert max(errors.values()) <= TOLERANCE, errors


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_a_link_model_exports_its_decoder(decoder: str, small_graph: Graph, tmp_path: Path) -> None:
    """``model.decode(model.encode(x, edge_index), pairs)`` of the export are the logits
    ``fullgraph predict --pairs`` scores (SAGE encoder, dot / OGB's MLP decoder)."""
    from link_worker import trained_model_file

    from fullgraph.training.link_predict import LinkScorer

    model = trained_model_file(small_graph, tmp_path / "link.pt", decoder=decoder)
    pairs = np.random.default_rng(4).integers(0, small_graph.num_nodes, size=(300, 2))
    with one_thread():
        part = whole_graph_part(small_graph)
        want = LinkScorer(part, Communicator(), load_model_file(model)).scores(pairs)
        export_pyg(model, tmp_path / "gae.py")
        loaded = _import(tmp_path / "gae.py").load_model()
        data = to_pyg(small_graph)
        with torch.no_grad():
            z = loaded.encode(data.x, data.edge_index)
            got = loaded.decode(z, torch.from_numpy(pairs).t()).numpy()
    saved = torch.load(tmp_path / "gae.pt", weights_only=True)
    assert saved["init_args"]["decoder"] == decoder and saved["pyg_model"] is None
    assert ("decoder.lins.0.weight" in saved["state_dict"]) == (decoder == "mlp")
    assert "decoder" in (tmp_path / "gae.py").read_text().split('"""')[1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_the_module_imports_torch_and_pyg_only(graphs: dict, tmp_path: Path) -> None:
    graph = graphs["symmetric"]
    cfg = _config({"model": "sage", "layers": 2, "normalize_features": True})
    export_pyg(_model_file(tmp_path / "m.pt", cfg, graph), tmp_path / "sage_net.py")
    text = (tmp_path / "sage_net.py").read_text()
    assert text.startswith(MARKER)
    roots = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add(node.module.split(".")[0])
    assert roots == {"__future__", "pathlib", "torch", "torch_geometric"}
    assert "NormalizeFeatures" in text and "from sage_net import load_model" in text
    saved = torch.load(tmp_path / "sage_net.pt", weights_only=True)
    assert saved["normalize_features"] is True
    assert saved["source"]["epoch"] == 7 and saved["source"]["model_file"].endswith("m.pt")


def test_train_then_export_on_the_command_line(tmp_path: Path, capsys) -> None:
    """A model trained a few epochs (gat, batch norm, residual) exported by the command."""
    from fullgraph.datasets.synthetic import generate

    model, out = tmp_path / "run.model.pt", tmp_path / "export" / "gat_tiny.py"
    train = ["train", "--threads", "1", "--quiet", "--synthetic", "tiny", "--model", "gat"]
    train += ["--layers", "2", "--hidden", "8", "--heads", "2", "--norm", "batch"]
    train += ["--residual", "--epochs", "3", "--save-model", str(model)]
    code, _, err = run_cli(train, capsys)
    assert code == 0, err
    code, printed, err = run_cli(["export", "--model", str(model), "--to", "pyg", str(out)], capsys)
    assert code == 0 and err == "", err
    assert printed.strip() == f"fullgraph export: wrote {out.with_suffix('.pt')} and {out}"
    graph = generate("tiny", seed=0)
    with one_thread():
        ours = _ours(model, graph)
        theirs = _logits(_import(out).load_model(), graph)
    err = float((theirs - ours).abs().max())
    MAX_ERRORS["gat-L2-batch-residual (tiny, trained 3 epochs)"] = err
    assert err <= TOLERANCE


@pytest.fixture(scope="module")
def model_file(graphs: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    cfg = _config({"model": "gcn", "layers": 2, "norm": "batch"})
    return _model_file(root / "gcn.model.pt", cfg, graphs["symmetric"])


def _damaged(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 1
    out = path.with_name("damaged.pt")
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("text file", "is not a fullgraph model file"),
        ("checkpoint", "is a checkpoint, not a model file"),
        ("damaged", "fails its sha256 checksum"),
        ("missing", "cannot read model file"),
        ("weights do not fit", "parameter 'layers.0.lin.bias' is missing"),
        ("target", "--to onnx: unsupported target; fullgraph exports to: pyg"),
        ("suffix", "give a path ending in .py"),
        ("out is the model", "is the model file this command reads"),
        ("weights are the model", "(its weights"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    case: str, needle: str, model_file: Path, tmp_path: Path, capsys
) -> None:
    model, to, out = model_file, "pyg", tmp_path / "out.py"
    if case == "text file":
        model = tmp_path / "notes.pt"
        model.write_text("not a model\n")
    elif case == "checkpoint":
        model = tmp_path / "ck.pt"
        model.write_bytes(encode_torch_file({"model": {}, "optimizer": {}, "epoch": 1}))
    elif case == "damaged":
        model = tmp_path / "copy.pt"
        model.write_bytes(model_file.read_bytes())
        model = _damaged(model)
    elif case == "missing":
        model = tmp_path / "nothing.pt"
    elif case == "weights do not fit":
        state = torch.load(model_file, weights_only=True)
        del state["state_dict"]["layers.0.lin.bias"]
        model = tmp_path / "short.pt"
        model.write_bytes(encode_torch_file(state))
    elif case == "target":
        to = "onnx"
    elif case == "suffix":
        out = tmp_path / "out.onnx"
    elif case == "out is the model":
        model = tmp_path / "gcn.pt"
        model.write_bytes(model_file.read_bytes())
        out = model
    elif case == "weights are the model":
        model = tmp_path / "gcn.pt"
        model.write_bytes(model_file.read_bytes())
        out = tmp_path / "gcn.py"
    before = tree(tmp_path)
    code, _, err = run_cli(["export", "--model", str(model), "--to", to, str(out)], capsys)
    assert_one_line(code, err, needle, prefix=EXPORT_ERROR)
    assert tree(tmp_path) == before


def test_outputs_are_replaced_only_with_force_and_only_when_ours(
    model_file: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "net.py"
    argv = ["export", "--model", str(model_file), "--to", "pyg", str(out)]
    assert run_cli(argv, capsys)[0] == 0
    before = tree(tmp_path)
    code, _, err = run_cli(argv, capsys)
    assert_one_line(
        code, err, "already exists (use --force to replace it)", prefix="fullgraph export: error: "
    )
    assert tree(tmp_path) == before
    assert run_cli([*argv, "--force"], capsys)[0] == 0  # our own export: replaced
    out.write_text("# my notes\n")  # a user's file where the module was
    before = tree(tmp_path)
    code, _, err = run_cli([*argv, "--force"], capsys)
    assert_one_line(
        code,
        err,
        f"OUT {out} is not a PyG export written by fullgraph",
        prefix="fullgraph export: error: ",
    )
    assert tree(tmp_path) == before
    out.unlink()
    weights = tmp_path / "net.pt"  # the weights beside it: a model file of `fullgraph train`
    weights.write_bytes(model_file.read_bytes())
    before = tree(tmp_path)
    code, _, err = run_cli([*argv, "--force"], capsys)
    assert_one_line(
        code, err, "it is a model file of `fullgraph train`", prefix="fullgraph export: error: "
    )
    assert tree(tmp_path) == before
    alone = tmp_path / "alone.pt"
    alone.write_bytes(b"PK a user's archive")
    code, _, err = run_cli([*argv[:-1], str(alone), "--force"], capsys)
    assert_one_line(
        code, err, "it carries no fullgraph checksum", prefix="fullgraph export: error: "
    )


# -- fullgraph.pyg: a distributed PyG model's state_dict is a PyG state_dict -----------------


class Mixed(nn.Module):
    """Every layer ``fullgraph.pyg.distribute`` converts or keeps: GCNConv, PyG BatchNorm,
    Dropout, SAGEConv, LayerNorm per node, GATConv with 2 heads, torch BatchNorm1d, Linear."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = pyg_nn.GCNConv(in_channels, 16)
        self.bn1 = pyg_nn.BatchNorm(16)
        self.drop = nn.Dropout(0.3)
        self.conv2 = pyg_nn.SAGEConv(16, 16)
        self.norm2 = pyg_nn.LayerNorm(16, mode="node")
        self.conv3 = pyg_nn.GATConv(16, 8, heads=2, dropout=0.2)
        self.bn3 = nn.BatchNorm1d(16)
        self.lin = nn.Linear(16, out_channels)

    def forward(self, x: torch.Tensor, edge_index: Any) -> torch.Tensor:
        x = self.drop(F.relu(self.bn1(self.conv1(x, edge_index))))
        x = F.relu(self.norm2(self.conv2(x, edge_index)))
        x = F.elu(self.bn3(self.conv3(x, edge_index)))
        return self.lin(x)


TASKS = Tasks()


@TASKS.task
def pyg_trained(*, state: Path) -> dict[str, np.ndarray]:
    """:class:`Mixed` converted and trained 3 Adam steps on this rank's part of the tests'
    default graph; rank 0 saves ``model.state_dict()`` to ``state``; returns the evaluation
    logits of every node (global order) and the state_dict's keys."""
    from conftest import build_sbm_graph

    data = pyg.load_part(build_sbm_graph(), threads=1)
    torch.manual_seed(0)
    model = pyg.distribute(Mixed(data.num_features, data.num_classes), data)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        model.train()
        opt.zero_grad()
        pyg.loss(model(data.x, data.edge_index), data).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        out = model(data.x, data.edge_index)
    part = data.fullgraph
    pieces = part.comm.allgather_object((part.global_ids, out.numpy()))
    logits = np.empty((sum(len(g) for g, _ in pieces), out.shape[1]), dtype=np.float32)
    for gids, rows in pieces:
        logits[gids] = rows
    if part.comm.rank == 0:
        torch.save(model.state_dict(), state)  # as a user saves it: nothing of fullgraph's
    return {"logits": logits, "keys": np.array(list(model.state_dict()))}


@pytest.mark.timeout(300)
def test_a_distributed_pyg_model_saves_a_plain_pyg_state_dict(
    small_graph: Graph, tmp_path: Path
) -> None:
    state = tmp_path / "state.pt"
    got = run_task(pyg_trained, ranks=2, out=tmp_path / "out.npz", timeout=240, state=state)
    torch.manual_seed(123)  # other initial weights: everything must come from the file
    plain = Mixed(small_graph.num_features, small_graph.num_classes)
    saved = torch.load(state, weights_only=True)
    assert list(got["keys"]) == list(plain.state_dict()) == list(saved)  # same names, order
    plain.load_state_dict(saved, strict=True)
    assert int(plain.bn1.module.num_batches_tracked) == 3  # statistics of 3 training steps
    want = torch.from_numpy(got["logits"])
    err = float((_logits(plain, small_graph) - want).abs().max())
    MAX_ERRORS["fullgraph.pyg Mixed, P=2 -> plain PyG"] = err
    assert err <= TOLERANCE * max(1.0, float(want.abs().max()))


if __name__ == "__main__":
    sys.exit(worker_main(TASKS))
