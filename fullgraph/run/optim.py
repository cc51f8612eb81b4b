"""Adam over parameter groups, on torch's own functional Adam kernel.

``torch.optim.Adam`` computes exactly this, but every method of ``torch.optim.Optimizer`` is
wrapped by ``torch._disable_dynamo``, whose first call imports ``torch._dynamo`` (and Triton,
when installed): 150 MB of resident memory in every rank, measured with torch 2.13
(docs/train.md). A rank that trains one model needs none of it, so this class keeps the
parameter groups and moment buffers itself and calls :func:`torch.optim.adam.adam`, the
functional update ``torch.optim.Adam.step`` runs, with the same arguments: the updates are
bit-for-bit those of ``torch.optim.Adam`` (tests/test_optim.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypedDict

import torch
from torch.optim.adam import adam as adam_update

from fullgraph.errors import ConfigError


class ParamGroup(TypedDict, total=False):
    """One parameter group of :class:`Adam`: its parameters and L2 weight decay (default 0)."""

    params: Iterable[torch.Tensor]
    weight_decay: float


#: Learning-rate schedules of :func:`scheduled_lr`.
SCHEDULES = ("constant", "cosine")


def scheduled_lr(
    base: float, step: int, steps: int, warmup: int = 0, schedule: str = "constant"
) -> float:
    """The learning rate of optimiser step ``step`` (1-based) of ``steps``.

    A linear warm-up from ``base / (warmup + 1)`` to ``base`` over the first ``warmup`` steps,
    then ``constant`` (``base``) or ``cosine`` (half a cosine from ``base`` down to
    ``base / 100`` at step ``steps``, as ``CosineAnnealingLR(eta_min=base/100)`` after a
    warm-up). A function of the step alone, so a resumed run continues the same schedule.

    Args:
        base: the peak learning rate.
        step: the step about to be taken, 1-based.
        steps: the run's steps.
        warmup: warm-up steps (0: none).
        schedule: ``constant`` or ``cosine``.
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown learning-rate schedule {schedule!r} (choose from {SCHEDULES})")
    if step <= warmup:
        return base * step / (warmup + 1)
    if schedule == "constant" or steps <= warmup + 1:
        return base
    done = (step - warmup - 1) / (steps - warmup - 1)
    low = base / 100.0
    return low + 0.5 * (base - low) * (1.0 + math.cos(math.pi * min(1.0, done)))


class Adam:
    """Adam (Kingma & Ba; L2 weight decay added to the gradient, as ``torch.optim.Adam``).

    Args:
        groups: parameter groups, each ``{"params": [...], "weight_decay": float}``.
        lr: learning rate.
        betas: ``(beta1, beta2)``.
        eps: term added to the denominator.
    """

    def __init__(
        self,
        groups: Iterable[ParamGroup],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if lr <= 0:
            raise ConfigError(f"learning rate must be positive, got {lr}")
        self.lr, self.betas, self.eps = float(lr), betas, float(eps)
        self.groups = [
            {"params": list(g["params"]), "weight_decay": float(g.get("weight_decay", 0.0))}
            for g in groups
        ]
        params = [p for g in self.groups for p in g["params"]]
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = [torch.zeros((), dtype=torch.float32) for _ in params]

    def zero_grad(self) -> None:
        """Zero every parameter's gradient (allocating it on first use)."""
        for g in self.groups:
            for p in g["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                else:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update of every parameter that has a gradient."""
        index = 0
        for g in self.groups:
            chosen: dict[str, list[torch.Tensor]] = {
                k: [] for k in ("params", "grads", "avg", "avg_sq", "steps")
            }
            for p in g["params"]:
                if p.grad is not None:
                    chosen["params"].append(p)
                    chosen["grads"].append(p.grad)
                    chosen["avg"].append(self.exp_avg[index])
                    chosen["avg_sq"].append(self.exp_avg_sq[index])
                    chosen["steps"].append(self.steps[index])
                index += 1
            if not chosen["params"]:
                continue
            adam_update(
                chosen["params"],
                chosen["grads"],
                chosen["avg"],
                chosen["avg_sq"],
                [],
                chosen["steps"],
                amsgrad=False,
                beta1=self.betas[0],
                beta2=self.betas[1],
                lr=self.lr,
                weight_decay=g["weight_decay"],
                eps=self.eps,
                maximize=False,
            )

    def state_dict(self) -> dict[str, Any]:
        """Moments and step counts (copies), for checkpoints."""
        return {
            "exp_avg": [t.clone() for t in self.exp_avg],
            "exp_avg_sq": [t.clone() for t in self.exp_avg_sq],
            "steps": [t.clone() for t in self.steps],
            "lr": self.lr,
            "betas": list(self.betas),
            "eps": self.eps,
            "weight_decay": [g["weight_decay"] for g in self.groups],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (shapes must match this optimiser's)."""
        for name in ("exp_avg", "exp_avg_sq", "steps"):
            mine, theirs = getattr(self, name), state[name]
            if len(theirs) != len(mine) or any(
                a.shape != b.shape for a, b in zip(mine, theirs, strict=True)
            ):
                raise ConfigError(f"optimiser state {name!r} does not match the model's shapes")
            for a, b in zip(mine, theirs, strict=True):
                a.copy_(b)
        self.lr, self.betas, self.eps = float(state["lr"]), tuple(state["betas"]), state["eps"]
        for g, wd in zip(self.groups, state["weight_decay"], strict=True):
            g["weight_decay"] = float(wd)
