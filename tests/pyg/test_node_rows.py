"""A script's own reductions over node rows (``fullgraph.pyg.node_rows``): exact, or refused.

A script converted with ``pyg.distribute`` that keeps its own ``F.cross_entropy(out[mask],
y[mask])``, ``nll_loss`` on ``log_softmax``, ``.mean()`` over node rows, a class-weighted loss
with ``bincount``, ``mse_loss`` on ``one_hot`` and the hand-written accuracy trains on 2 and 3
ranks as the same script on one process (the unconverted model: losses, gradients, parameters,
accuracies); the reductions are global on a rank with no row; the reductions that cannot be
made exact are refused in one line before the first step, on every rank. On one process every
``torch.nn.functional`` loss on node rows equals plain torch (value and gradient).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from harness import assert_matches_one_process, run_task
from mp_utils import run_mpi

pytest.importorskip("torch_geometric.nn")

import reductions_worker
from pyg_worker import CLOSE

from fullgraph import pyg
from fullgraph.datasets import Graph, to_pyg
from fullgraph.distributed import Communicator
from fullgraph.errors import ConfigError
from fullgraph.pyg.node_rows import NodeRows, plain, tag


@pytest.fixture(scope="module")
def one_process(small_graph: Graph) -> dict:
    """The scripts on one process: unconverted on the whole graph, and converted."""
    with torch.random.fork_rng():
        original = reductions_worker.run_scripts(to_pyg(small_graph))
        converted = reductions_worker.run_scripts(pyg.load_part(small_graph, Communicator()))
    return {"original": original, "converted": converted}


def _compare(got: dict, want: dict, where: str) -> None:
    """Every script result of ``want`` (float64) in ``got`` (:data:`pyg_worker.CLOSE`)."""
    got = {key: np.asarray(got[key], dtype=np.float64) for key in want if key in got}
    want = {key: np.asarray(value, dtype=np.float64) for key, value in want.items()}
    assert_matches_one_process(got, want, dict.fromkeys(want, CLOSE), where=where)


def test_one_process_converted_scripts_equal_the_original(one_process: dict) -> None:
    _compare(one_process["converted"], one_process["original"], "converted, one process")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks", [2, 3], ids=["P2", "P3"])
def test_own_reductions_on_ranks_equal_one_process(
    ranks: int, one_process: dict, tmp_path: Path
) -> None:
    """Own cross_entropy (the issue's script), nll_loss, .mean(), sum / mask.sum(), weights,
    mse on one_hot, hand-written accuracies: P ranks compute what one process computes."""
    got = run_task(
        reductions_worker.scripts, ranks=ranks, out=tmp_path / "out.npz", timeout=360, source="sbm"
    )
    for key in (k for k in got if k.endswith("same_on_every_rank")):
        assert bool(got[key]), key
    _compare(got, one_process["original"], f"P={ranks}")
    # the local mean of the issue would differ: the losses are not those of any one rank alone
    assert float(got["cross_entropy/losses"][0]) == pytest.approx(
        float(one_process["original"]["cross_entropy/losses"][0]), rel=1e-6
    )


@pytest.mark.timeout(300)
def test_reductions_are_global_on_a_rank_without_rows(tmp_path: Path) -> None:
    got = run_task(
        reductions_worker.zero_rows, ranks=2, out=tmp_path / "out.npz", timeout=240, source="sbm"
    )
    assert got["rows"][0] > 0 and got["rows"][1] == 0
    for name in reductions_worker.ZERO_ROWS:
        for rank in range(2):
            what = {name: CLOSE}
            where = f"rank {rank} of 2, no rows on rank 1"
            assert_matches_one_process(
                got[f"{name}/got"][rank], got[f"{name}/want"], what, where=where
            )


@pytest.mark.timeout(300)
def test_refusals_on_two_ranks_before_the_first_step(tmp_path: Path) -> None:
    got = run_task(
        reductions_worker.refusals, ranks=2, out=tmp_path / "out.npz", timeout=240, source="sbm"
    )
    assert bool(got["params_kept"]) and bool(got["refused_on_every_rank"])
    for name in reductions_worker.REFUSED:
        message = str(got[name])
        assert message, f"{name} was not refused"
        assert "\n" not in message and "pyg.loss(out, data)" in message, message


@pytest.mark.timeout(300)
def test_an_uncaught_refusal_ends_every_rank_with_one_line(tmp_path: Path) -> None:
    script = Path(reductions_worker.__file__)
    args = [str(script), "--task", "refusals", "--out", str(tmp_path / "o.npz")]
    done = run_mpi(
        2,
        [*args, "--source", "sbm", "--uncaught", "std"],
        240,
        expect_ok=False,
        env={"PYTHONPATH": str(script.parents[1])},
    )
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("fullgraph.pyg: error:")]
    assert len(lines) == 1, done.stderr  # raised alike on every rank, printed once
    assert lines[0].startswith("fullgraph.pyg: error: Tensor.std on the node rows"), lines
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def part(small_graph: Graph) -> object:
    return pyg.load_part(small_graph, Communicator()).fullgraph


def _loss_cases(n: int, c: int) -> list[tuple[str, object, tuple, dict]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    y_ignored = y.clone()
    y_ignored[::5] = -100
    w = torch.rand(c, generator=g) + 0.5
    probs = torch.rand(n, c, generator=g).softmax(-1)
    pos = torch.rand(n, c, generator=g)
    return [
        ("ce", F.cross_entropy, (x, y), {}),
        ("ce-weight-ignore", F.cross_entropy, (x, y_ignored), {"weight": w}),
        ("ce-smoothing-ignore", F.cross_entropy, (x, y_ignored), {"label_smoothing": 0.2}),
        ("ce-probs-weight", F.cross_entropy, (x, probs), {"weight": w}),
        ("ce-sum", F.cross_entropy, (x, y), {"reduction": "sum"}),
        ("nll-weight", F.nll_loss, (x.log_softmax(-1), y_ignored), {"weight": w}),
        ("mse", F.mse_loss, (x, pos), {}),
        ("l1-sum", F.l1_loss, (x, pos), {"reduction": "sum"}),
        ("smooth-l1", F.smooth_l1_loss, (x, pos), {"beta": 0.5}),
        ("bce-logits", F.binary_cross_entropy_with_logits, (x, pos), {"pos_weight": w}),
        ("bce-logits-weight", F.binary_cross_entropy_with_logits, (x, pos), {"weight": w}),
        ("bce", F.binary_cross_entropy, (x.sigmoid(), pos), {"weight": pos}),
        ("kl-batchmean", F.kl_div, (x.log_softmax(-1), probs), {"reduction": "batchmean"}),
        ("kl-mean", F.kl_div, (x.log_softmax(-1), probs), {}),
        ("multilabel-soft-margin", F.multilabel_soft_margin_loss, (x, (pos > 0.5).float()), {}),
        ("multi-margin", F.multi_margin_loss, (x, y), {}),
        ("huber", F.huber_loss, (x, pos), {"delta": 0.3}),
    ]


@pytest.mark.parametrize("case", range(17))
def test_every_loss_on_node_rows_equals_torch_on_one_process(part: object, case: int) -> None:
    name, fn, args, kwargs = _loss_cases(part.num_inner, 4)[case]
    x = args[0].clone().requires_grad_(True)
    want = fn(x, *args[1:], **kwargs)
    (want_grad,) = torch.autograd.grad(want, x)
    xt = x.detach().clone().requires_grad_(True)
    got = fn(tag(xt, part), *(tag(a, part) for a in args[1:]), **kwargs)
    assert type(got) is torch.Tensor, name
    (got_grad,) = torch.autograd.grad(got, xt)
    assert_matches_one_process(
        {"value": got.detach().numpy(), "gradient": got_grad.numpy()},
        {"value": want.detach().numpy(), "gradient": want_grad.numpy()},
        {"value": CLOSE, "gradient": CLOSE},
        where=f"{name} on node rows, against plain torch",
    )


def test_bce_with_logits_of_an_element_is_the_same_wherever_it_lies(part: object) -> None:
    """The loss of node (or pair) rows with ``F.binary_cross_entropy_with_logits``: an element's
    gradient does not depend on how many rows come before it (torch's SIMD bulk and scalar
    tail may differ in the last bit; a rank's row count would then change the bits)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20_000, generator=g) * 6
    y = (torch.rand(20_000, generator=g) > 0.5).float()
    grads = []
    for shift in range(17):  # every alignment of the last 1000 elements
        xs = x[shift:].clone().requires_grad_(True)
        loss = F.binary_cross_entropy_with_logits(
            tag(xs, part), tag(y[shift:], part), reduction="sum"
        )
        (grad,) = torch.autograd.grad(loss, xs)
        grads.append(grad[-1000:])
    assert all(torch.equal(grad, grads[0]) for grad in grads)


def test_row_preserving_calls_keep_the_tag_and_others_drop_it(part: object) -> None:
    x = tag(torch.randn(part.num_inner, 3), part)
    mask = tag(torch.arange(part.num_inner) % 2 == 0, part)
    for kept in (
        x[mask],
        x * 2 + 1,
        x.log_softmax(dim=-1),
        x.argmax(dim=-1),
        x.sum(dim=1),
        x[:, 0],
        x.squeeze(),
        x @ torch.ones(3, 2),
        x.detach().clone(),
    ):
        assert isinstance(kept, NodeRows) and kept.fullgraph_rows
    assert not isinstance(x[0], NodeRows) and not isinstance(x.sum(), NodeRows)
    assert not x.t().fullgraph_rows
    assert float(x.t().sum()) == pytest.approx(float(plain(x).sum()), rel=1e-6)
    with pytest.raises(ConfigError, match="after the node axis was moved"):
        x.t().sum(dim=1)
    with pytest.raises(ConfigError, match="torch.trace"):
        torch.trace(x)


def test_saved_node_rows_load_as_plain_tensors(part: object, tmp_path: Path) -> None:
    x = tag(torch.randn(part.num_inner, 3), part)
    torch.save({"out": x}, tmp_path / "out.pt")
    loaded = torch.load(tmp_path / "out.pt")["out"]
    assert type(loaded) is torch.Tensor and torch.equal(loaded, plain(x))


def test_an_unconverted_script_is_untouched(small_graph: Graph) -> None:
    data = to_pyg(small_graph)
    model = reductions_worker.pyg_worker.build("gcn", data.num_features, data.num_classes, 0.0)
    out = model(data.x, data.edge_index)
    assert type(out) is torch.Tensor and type(data.y) is torch.Tensor
    assert float(out[data.train_mask].std()) > 0  # no refusal outside a converted model
