"""SGC and SIGN against PyG on one process (1e-6): ``--model sgc --layers 1`` is
``SGConv(F, C, K)`` with the same weights (logits and weight gradients); ``--model sign`` is
PyG's ``transforms.SIGN(K)`` followed by ``examples/sign.py``'s model (a linear layer per hop,
ReLU, concatenated, a linear layer) with the same weights; ``--layers 1`` a linear model of the
concatenated hops. Training reaches the test graph's blocks; the options SGC and SIGN take
(and those they refuse) in one line; the export refused, naming why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import ConfigError
from fullgraph.partition import whole_graph_part
from fullgraph.training.assembly import assemble_rank
from fullgraph.training.config import TrainConfig

pyg_nn = pytest.importorskip("torch_geometric.nn")


def _model_and_rank(graph, **fields):
    """Our model (seeded) and one process's assembled rank, rows in global order (PyG's)."""
    cfg = TrainConfig(**fields)
    cfg.check()
    part = whole_graph_part(graph, order="global")
    rank = assemble_rank(part, Communicator(), cfg)
    torch.manual_seed(0)
    model = cfg.build_model(int(part.num_features), int(part.num_classes))
    return model.eval(), rank


def _data(graph):
    from fullgraph.datasets import to_pyg

    return to_pyg(graph)


def test_sgc_is_pyg_sgconv(small_graph) -> None:
    model, rank = _model_and_rank(small_graph, model="sgc", layers=1, hops=2)
    data = _data(small_graph)
    conv = pyg_nn.SGConv(12, 4, K=2)
    with torch.no_grad():
        conv.lin.weight.copy_(model.layers[0].lin.weight)
        conv.lin.bias.copy_(model.layers[0].lin.bias)
    ours = model(rank.data["x"], rank.ctx)
    theirs = conv(data.x, data.edge_index)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    ours.square().sum().backward()
    theirs.square().sum().backward()
    for a, b in (
        (model.layers[0].lin.weight, conv.lin.weight),
        (model.layers[0].lin.bias, conv.lin.bias),
    ):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)


def test_sign_is_pyg_sign_and_its_example_model(small_graph) -> None:
    transforms = pytest.importorskip("torch_geometric.transforms")
    k = 3
    model, rank = _model_and_rank(small_graph, model="sign", layers=2, hidden=8, hops=k)
    inception, last = model.layers[0], model.layers[1]
    assert inception.out_dim == (k + 1) * 8 and len(inception.lins) == k + 1
    data = transforms.SIGN(k)(_data(small_graph))
    xs = [data.x] + [data[f"x{i}"] for i in range(1, k + 1)]
    with torch.no_grad():  # examples/sign.py's Net in evaluation: no dropout
        outs = [torch.relu(lin(x)) for x, lin in zip(xs, inception.lins, strict=True)]
        theirs = last.lin(torch.cat(outs, dim=-1))
        ours = model(rank.data["x"], rank.ctx)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def test_sign_with_one_layer_is_a_linear_model_of_the_hops(small_graph) -> None:
    transforms = pytest.importorskip("torch_geometric.transforms")
    model, rank = _model_and_rank(small_graph, model="sign", layers=1, hops=2)
    data = transforms.SIGN(2)(_data(small_graph))
    lin = model.layers[0].lins[0]
    assert lin.in_features == 36 and lin.out_features == 4
    with torch.no_grad():
        theirs = lin(torch.cat([data.x, data.x1, data.x2], dim=-1))
        ours = model(rank.data["x"], rank.ctx)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "fields",
    [
        {"model": "sgc", "layers": 1, "lr": 0.2, "weight_decay": 0.0},
        {"model": "sign", "layers": 2, "hidden": 16, "input_dropout": 0.1},
        {"model": "sign", "propagation": "ppr", "alpha": 0.2, "hops": 2},
        {"model": "sgc", "propagation": "mean", "layers": 2, "hidden": 16},
    ],
    ids=["sgc", "sign-input-dropout", "sign-ppr", "sgc-mean-mlp"],
)
def test_training_learns_the_blocks(small_graph, fields: dict) -> None:
    from fullgraph.run.options import RunOptions
    from fullgraph.training.trainer import Trainer

    cfg = TrainConfig(epochs=40, **fields)
    cfg.check()
    trainer = Trainer(whole_graph_part(small_graph), Communicator(), cfg, RunOptions(quiet=True))
    first = trainer.train_step(1).loss
    for epoch in range(2, 41):
        last = trainer.train_step(epoch).loss
    acc = trainer.evaluate()
    assert last < first and acc["val_acc"] > 0.6, (first, last, acc)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"model": "gcn", "propagation": "sym"},
            "--propagation applies to --model sgc and sign only, not --model gcn",
        ),
        (
            {"model": "sgc", "alpha": 0.2},
            "--alpha applies to --propagation ppr only, not --model sgc --propagation gcn",
        ),
        (
            {"model": "sign", "propagation": "heat"},
            "--propagation must be one of gcn, mean, ppr, sym, not 'heat'",
        ),
        ({"model": "sign", "hops": 0}, "--hops"),
        ({"model": "sign", "hops": 101}, "beyond the 100 propagation steps"),
        ({"model": "sign", "alpha": 0.0, "propagation": "ppr"}, "--alpha must be in (0, 1], not 0"),
        (
            {"model": "sign", "precompute_first": "off"},
            "--precompute-first off: --model sign reads the hops",
        ),
    ],
)
def test_bad_options_are_refused_in_one_line(small_graph, fields: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _model_and_rank(small_graph, **fields)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_sgc_exports_to_sgconv_and_the_others_are_refused_naming_why(
    small_graph, tmp_path: Path
) -> None:
    """``--layers 1 --propagation gcn``: the exported module's ``SGConv`` gives our logits;
    SIGN, a deeper SGC and another propagation are refused in one line."""
    import importlib.util

    import numpy as np

    from fullgraph.datasets import to_pyg
    from fullgraph.training.export_pyg import export_pyg
    from fullgraph.training.model_file import model_state, save_model_file

    def saved(name: str, **fields) -> Path:
        cfg = TrainConfig(**fields)
        model, _ = _model_and_rank(small_graph, **fields)
        state = model_state(model, cfg, 12, 4, {"epoch": 1, "data": "sbm"})
        return save_model_file(tmp_path / f"{name}.pt", state)

    path = saved("sgc", model="sgc", layers=1, hops=3)
    written = export_pyg(path, tmp_path / "exported.py")
    spec = importlib.util.spec_from_file_location("exported_sgc", written[-1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = to_pyg(small_graph)
    with torch.no_grad():
        theirs = module.load_model()(data.x, data.edge_index)
        model, rank = _model_and_rank(small_graph, model="sgc", layers=1, hops=3)
        ours = model(rank.data["x"], rank.ctx)
    assert type(module.load_model().convs[0]).__name__ == "SGConv"
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert np.isfinite(theirs.numpy()).all()
    refused = {
        "sign": ("PyG has no SIGN model", {"model": "sign"}),
        "deep": ("an sgc of 2 layers on --propagation gcn", {"model": "sgc", "layers": 2}),
        "mean": ("on --propagation mean", {"model": "sgc", "layers": 1, "propagation": "mean"}),
    }
    for name, (why, fields) in refused.items():
        with pytest.raises(ConfigError) as err:
            export_pyg(saved(name, **fields), tmp_path / f"{name}-out.py")
        assert why in str(err.value) and "\n" not in str(err.value), str(err.value)
        assert not (tmp_path / f"{name}-out.py").exists()
