"""Normalisation against PyG, BatchNorm's moments over several ranks, and its checkpoints.

- ``GraphBatchNorm`` equals PyG's ``BatchNorm`` (forward, input and parameter gradients, running
  statistics) in float64 on one process, and its all-reduced moments equal the moments of the
  concatenated rows when the rows are split over ranks (threads over a fake all-reduce);
- ``NodeLayerNorm`` equals PyG's ``LayerNorm(mode="node")``;
- a run with ``--norm batch`` resumed from its checkpoint reproduces the uninterrupted losses
  (the running statistics travel in the checkpoint);
- under a block tree (one process, rows out of block order), ``NodeLayerNorm``'s output and
  input gradient are torch's own bits and its weight and bias gradients go to the tree, and
  ``GraphBatchNorm``'s go to it as roots, close to the all-reduced ones (the bits at any rank
  count: ``tests/training/test_bitwise.py``).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import assert_matches_one_process
from mp_utils import one_thread

from fullgraph.cli import main as cli_main
from fullgraph.distributed import Communicator
from fullgraph.distributed.tree_sum import BlockGradients, BlockLayout, collecting
from fullgraph.models.norm import GraphBatchNorm, NodeLayerNorm, make_norm

pyg_nn = pytest.importorskip("torch_geometric.nn")


def test_batch_norm_equals_pyg() -> None:
    torch.manual_seed(0)
    x = torch.randn(50, 7, dtype=torch.float64) * 3 + 1
    ours = GraphBatchNorm(7).double()
    ref = pyg_nn.BatchNorm(7).double()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 2.0)
        ours.bias.uniform_(-1.0, 1.0)
        ref.module.weight.copy_(ours.weight)
        ref.module.bias.copy_(ours.bias)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = ours(xa, Communicator()), ref(xb)
    torch.testing.assert_close(ya, yb, rtol=1e-6, atol=1e-6)
    w = torch.randn_like(ya)
    (ya * w).sum().backward()
    (yb * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.weight.grad, ref.module.weight.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.bias.grad, ref.module.bias.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.running_mean, ref.module.running_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.running_var, ref.module.running_var, rtol=1e-6, atol=1e-6)
    ours.eval()
    ref.eval()
    torch.testing.assert_close(ours(x, Communicator()), ref(x), rtol=1e-6, atol=1e-6)


def test_layer_norm_equals_pyg_node_mode() -> None:
    torch.manual_seed(1)
    x = torch.randn(30, 9, dtype=torch.float64)
    ours = NodeLayerNorm(9).double()
    ref = pyg_nn.LayerNorm(9, mode="node").double()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 2.0)
        ref.weight.copy_(ours.weight)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = ours(xa), ref(xb)
    torch.testing.assert_close(ya, yb, rtol=1e-6, atol=1e-6)
    ya.sum().backward()
    yb.sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)


class _ThreadComm(Communicator):
    """A rank of an in-process job: sums every rank's tensor in rank order (a barrier)."""

    def __init__(self, rank: int, size: int, shared: dict) -> None:
        super().__init__(rank, size)
        self.shared = shared

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum", tag: str = "reduce"):
        box, barrier = self.shared["box"], self.shared["barrier"]
        box[self.rank] = tensor.clone()
        barrier.wait()
        total = box[0].clone()
        for r in range(1, self.size):
            total += box[r]
        barrier.wait()
        tensor.copy_(total)
        return tensor


@pytest.mark.parametrize("ranks", [2, 3])
def test_batch_norm_over_split_rows_equals_one_process(ranks: int) -> None:
    torch.manual_seed(2)
    x = torch.randn(40, 5, dtype=torch.float64)
    dy = torch.randn(40, 5, dtype=torch.float64)
    one = GraphBatchNorm(5).double()
    xa = x.clone().requires_grad_(True)
    (one(xa, Communicator()) * dy).sum().backward()
    bounds = [0, 7, 23, 40] if ranks == 3 else [0, 11, 40]
    shared = {"box": {}, "barrier": threading.Barrier(ranks)}
    grads: dict[int, torch.Tensor] = {}
    outs: dict[int, torch.Tensor] = {}
    norms = [GraphBatchNorm(5).double() for _ in range(ranks)]

    def rank(r: int) -> None:
        comm = _ThreadComm(r, ranks, shared)
        xr = x[bounds[r] : bounds[r + 1]].clone().requires_grad_(True)
        y = norms[r](xr, comm)
        (y * dy[bounds[r] : bounds[r + 1]]).sum().backward()
        outs[r], grads[r] = y.detach(), xr.grad

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    names = [f"rank {r}" for r in range(ranks)]
    got = {f"rank {r}/input gradient": grads[r] for r in range(ranks)}
    got |= {f"rank {r}/running_var": norms[r].running_var for r in range(ranks)}
    want = {f"rank {r}/input gradient": xa.grad[bounds[r] : bounds[r + 1]] for r in range(ranks)}
    want |= {f"rank {r}/running_var": one.running_var for r in range(ranks)}
    got["weight gradient"] = sum(n.weight.grad for n in norms)  # each rank's part, summed
    want["weight gradient"] = one.weight.grad
    float64 = (1e-7, 1e-7)  # torch.testing.assert_close's float64 tolerance
    tolerances = {"input gradient": float64, "running_var": float64}
    where = f"BatchNorm over {ranks} ranks' rows"
    assert_matches_one_process(got, want, tolerances, names=names, where=where)
    assert_matches_one_process(got, want, {"weight gradient": float64}, where=where)


def test_unknown_norm_is_refused() -> None:
    from fullgraph.errors import ConfigError

    with pytest.raises(ConfigError, match="--norm must be one of none, batch, layer"):
        make_norm("group", 4)


def test_resume_with_batch_norm_is_exact(tmp_path: Path, monkeypatch) -> None:
    args = ["train", "--synthetic", "tiny", "--threads", "1", "--quiet", "--layers", "3"]
    args += ["--hidden", "32", "--norm", "batch", "--residual", "--epochs", "6"]
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    ckpt = tmp_path / "ckpt"
    with one_thread():
        assert cli_main([*args, "--log-json", str(full)]) == 0
        monkeypatch.setenv("FULLGRAPH_FAIL_AT", "0:5")
        with pytest.raises(RuntimeError, match="injected failure"):
            cli_main(
                [
                    *args,
                    "--log-json",
                    str(part),
                    "--checkpoint",
                    str(ckpt),
                    "--checkpoint-every",
                    "2",
                ]
            )
        monkeypatch.delenv("FULLGRAPH_FAIL_AT")
        assert (
            cli_main([*args, "--log-json", str(part), "--checkpoint", str(ckpt), "--resume"]) == 0
        )

    def losses(path: Path) -> dict[int, float]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return {r["epoch"]: r["loss"] for r in rows if not r.get("final")}

    assert losses(part) == losses(full)


def _layout(n: int, blocks: int, seed: int) -> BlockLayout:
    """``blocks`` blocks over ``n`` rows held out of row order."""
    rows = np.random.default_rng(seed).permutation(n)
    return BlockLayout(blocks, np.arange(blocks), rows, np.linspace(0, n, blocks + 1).astype(int))


def test_layer_norm_under_the_tree_is_torchs_with_tree_gradients() -> None:
    torch.manual_seed(3)
    x, dy = torch.randn(300, 9) * 2 + 1, torch.randn(300, 9)
    ref, ours = NodeLayerNorm(9), NodeLayerNorm(9)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 2.0)
        ref.bias.uniform_(-1.0, 1.0)
    ours.load_state_dict(ref.state_dict())
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya = ref(xa)
    (ya * dy).sum().backward()
    tree = BlockGradients(_layout(300, 11, 0))
    with collecting(tree):
        yb = ours(xb)
        (yb * dy).sum().backward()
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
    assert ours.weight.grad is None and ours.bias.grad is None
    assert tree.calls(ours.weight) == 1 and tree.calls(ours.bias) == 1
    root = Communicator().tree_sum_(tree.nodes([ours.weight, ours.bias]), tree.layout.labels, 11)
    torch.testing.assert_close(root, torch.cat([ref.weight.grad, ref.bias.grad]))


def test_batch_norm_under_the_tree_gives_root_gradients() -> None:
    torch.manual_seed(4)
    x, dy = torch.randn(300, 6) * 3 + 2, torch.randn(300, 6)
    ref, ours = GraphBatchNorm(6), GraphBatchNorm(6)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (ref(xa, Communicator()) * dy).sum().backward()
    tree = BlockGradients(_layout(300, 13, 1))
    with collecting(tree):
        (ours(xb, Communicator()) * dy).sum().backward()
    assert ours.weight.grad is None and ours.bias.grad is None
    for param, want in ((ours.weight, ref.weight.grad), (ours.bias, ref.bias.grad)):
        assert tree.holds(param) and tree.calls(param) == 0  # a root, not partials
        torch.testing.assert_close(tree.global_grad(param), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.running_var, ref.running_var)
    assert int(ours.num_batches_tracked) == 1
