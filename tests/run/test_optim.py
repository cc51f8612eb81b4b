"""fullgraph.run.optim.Adam: the updates of torch.optim.Adam, without torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fullgraph.errors import ConfigError
from fullgraph.run.optim import Adam


def _setup() -> tuple[list[dict], torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 4), torch.nn.Linear(4, 3)
    groups = [
        {"params": list(a.parameters()), "weight_decay": 5e-4},
        {"params": list(b.parameters()), "weight_decay": 0.0},
    ]
    return groups, torch.nn.Sequential(a, torch.nn.ReLU(), b), torch.randn(7, 5)


def _steps(opt, model: torch.nn.Module, x: torch.Tensor, steps: int) -> list[torch.Tensor]:
    for _ in range(steps):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_updates_equal_torch_adam_bit_for_bit():
    groups, model, x = _setup()
    ours = _steps(Adam(groups, lr=0.01), model, x, 6)
    groups, model, x = _setup()
    ref = _steps(torch.optim.Adam(groups, lr=0.01), model, x, 6)
    for p, q in zip(ours, ref, strict=True):
        assert torch.equal(p, q)


def test_resume_from_state_dict_continues_identically():
    groups, model, x = _setup()
    straight = _steps(Adam(groups, lr=0.01), model, x, 6)
    groups, model, x = _setup()
    opt = Adam(groups, lr=0.01)
    _steps(opt, model, x, 3)
    state, weights = opt.state_dict(), [p.detach().clone() for p in model.parameters()]
    groups, model, x = _setup()
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights, strict=True):
            p.copy_(w)
    resumed = Adam(groups, lr=0.5)  # the learning rate comes back from the state
    resumed.load_state_dict(state)
    assert resumed.lr == 0.01
    for p, q in zip(_steps(resumed, model, x, 3), straight, strict=True):
        assert torch.equal(p, q)


def test_mismatched_state_is_refused():
    groups, model, x = _setup()
    opt = Adam(groups, lr=0.01)
    _steps(opt, model, x, 1)
    other = Adam([{"params": [torch.nn.Parameter(torch.zeros(2))]}], lr=0.01)
    with pytest.raises(ConfigError, match="does not match"):
        other.load_state_dict(opt.state_dict())
    with pytest.raises(ConfigError, match="learning rate"):
        Adam([{"params": []}], lr=0.0)


def test_training_step_imports_neither_dynamo_nor_triton():
    """torch.optim's optimisers import torch._dynamo (and Triton): ~150 MB per rank."""
    code = (
        "import sys, torch\n"
        "from fullgraph.datasets.synthetic import generate\n"
        "from fullgraph.distributed.communicator import Communicator\n"
        "from fullgraph.partition import whole_graph_part\n"
        "from fullgraph.training import RunOptions, TrainConfig, Trainer\n"
        "tr = Trainer(whole_graph_part(generate('tiny')), Communicator(), "
        "TrainConfig(epochs=1))\n"
        "tr.train_step(1); tr.evaluate()\n"
        "print(sorted(m for m in ('torch._dynamo', 'triton') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_scheduled_lr_warmup_then_constant() -> None:
    """A linear warm-up reaches the base rate after ``warmup`` steps, then stays there."""
    from fullgraph.run.optim import scheduled_lr

    rates = [scheduled_lr(0.03, s, 10, warmup=2) for s in range(1, 11)]
    assert rates[:3] == pytest.approx([0.01, 0.02, 0.03])
    assert rates[3:] == pytest.approx([0.03] * 7)
    assert [scheduled_lr(0.01, s, 5) for s in range(1, 6)] == [0.01] * 5


def test_scheduled_lr_cosine() -> None:
    """Cosine after the warm-up: the base rate first, base/100 at the last step, decreasing."""
    from fullgraph.run.optim import scheduled_lr

    rates = [scheduled_lr(0.02, s, 20, warmup=3, schedule="cosine") for s in range(1, 21)]
    assert rates[3] == pytest.approx(0.02)
    assert rates[-1] == pytest.approx(0.0002)
    after = rates[3:]
    assert all(a > b for a, b in zip(after, after[1:], strict=False))
    with pytest.raises(ConfigError, match="schedule"):
        scheduled_lr(0.01, 1, 10, schedule="linear")
