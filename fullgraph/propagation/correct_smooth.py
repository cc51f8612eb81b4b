"""Correct & Smooth (Huang et al., ICLR 2021) over the whole graph on P ranks, exact.

The post-processing of PyG's ``torch_geometric.nn.models.CorrectAndSmooth`` (its
``LabelPropagation`` twice) on the predictions of any model, step for step:

1. ``Z = softmax(logits)``;
2. **correct**: the residual error ``E = Y - Z`` on the training nodes (``0`` elsewhere),
   propagated ``L1`` times, ``E <- a1 S E + (1 - a1) E0``, with ``S = D^-1/2 A D^-1/2`` (no
   self-loops, GLOBAL degrees); with ``autoscale`` every step is clamped to ``[-1, 1]`` and
   ``Z + s E`` takes each row's scale ``s = sigma / |E_row|_1`` (``sigma``: the mean of
   ``|E0|_1`` over the training nodes; ``1`` where that is infinite or above 1000); with a fixed
   ``scale`` the training rows are reset to ``E0`` after every step and ``Z + scale E``;
3. **smooth**: the training rows set to their one-hot labels, propagated ``L2`` times,
   ``H <- a2 S H + (1 - a2) H0``, clamped to ``[0, 1]`` after every step.

Exact at any rank count: every propagation step is one halo exchange with every row summed in
ascending global id of its sources (:func:`~fullgraph.distributed.halo.aggregate_rows`), and the
one sum over nodes (autoscale's ``sigma``) goes through the part's block tree
(:mod:`fullgraph.distributed.tree_sum`): P ranks give one process's bits. Without blocks (a
partition written before them, or ``--sums rank-order``) ``sigma`` is each rank's sum
all-reduced, equal to one process to float rounding only, as training's sums are then.

The output rows are class scores in ``[0, 1]`` that need not sum to 1; the predicted class is
their argmax. On a binary ROC-AUC task (Tolokers) both class columns are propagated as on any
other task and a node's score is its smoothed positive-class column (:func:`smoothed_metrics`).
A task without training nodes has no labels to propagate and is refused.

:class:`CorrectSmoothOptions` holds the options that ``fullgraph predict`` and ``fullgraph
train`` (its evaluation) share; the defaults are PyG's example for ogbn-products.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fullgraph.config import Config, check_alpha, check_number, option
from fullgraph.distributed.halo import HaloPlan, aggregate_rows
from fullgraph.distributed.split_operator import SplitOperator
from fullgraph.distributed.tree_sum import BlockLayout, row_sum, tree_root
from fullgraph.errors import ConfigError, mark_replicated
from fullgraph.models.local_graph import as_tensor
from fullgraph.precision import FLOAT32
from fullgraph.propagation.operators import propagation_operator
from fullgraph.run.metrics import split_metrics

if TYPE_CHECKING:
    from fullgraph.distributed.communicator import Communicator
    from fullgraph.partition import Partition

#: The most propagation steps of either stage: every step is a halo exchange of the class
#: columns, and label propagation has converged long before (published runs use 50).
MAX_CS_LAYERS = 1000
#: PyG's examples/correct_and_smooth.py for ogbn-products (the paper's products setting).
DEFAULT_CORRECTION_LAYERS = 50
DEFAULT_CORRECTION_ALPHA = 1.0
DEFAULT_SMOOTHING_LAYERS = 50
DEFAULT_SMOOTHING_ALPHA = 0.8
DEFAULT_SCALE = 20.0
#: autoscale's cap: a row whose scale is infinite or above it takes scale 1 (PyG's)
AUTOSCALE_CAP = 1000.0


def _check_cs_layers(name: str, value: int | None) -> None:
    """Propagation steps: unset, or an integer from 0 to :data:`MAX_CS_LAYERS`."""
    if value is None:
        return
    check_number(name, value, low=0, integer=True)
    if value > MAX_CS_LAYERS:
        raise ConfigError(
            f"{name} {value} is beyond the {MAX_CS_LAYERS} steps Correct & Smooth runs (every "
            f"step is a halo exchange; label propagation converges within tens of steps)"
        )


def parse_scale(text: str) -> str | float:
    """``--correction-scale``: ``auto`` or a number.

    Raises:
        ConfigError: neither.
    """
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise ConfigError(
            f"--correction-scale must be auto or a number > 0, got {text!r}"
        ) from None


def _check_scale(name: str, value: str | float | None) -> None:
    """``--correction-scale``: unset, ``auto`` or a finite number > 0."""
    if value is None or value == "auto":
        return
    if isinstance(value, str):
        raise ConfigError(f"{name} must be auto or a number > 0, got {value!r}")
    check_number(name, value, low=0.0, low_open=True)


@dataclass(frozen=True)
class CorrectSmoothParams:
    """Correct & Smooth's parameters, resolved (PyG ``CorrectAndSmooth``'s arguments).

    Attributes:
        correction_layers: ``L1``, steps of the error's propagation.
        correction_alpha: ``a1`` in (0, 1].
        smoothing_layers: ``L2``, steps of the labels' propagation.
        smoothing_alpha: ``a2`` in (0, 1].
        scale: the fixed scale of the propagated error, or ``None``: autoscale.
    """

    correction_layers: int = DEFAULT_CORRECTION_LAYERS
    correction_alpha: float = DEFAULT_CORRECTION_ALPHA
    smoothing_layers: int = DEFAULT_SMOOTHING_LAYERS
    smoothing_alpha: float = DEFAULT_SMOOTHING_ALPHA
    scale: float | None = DEFAULT_SCALE

    def __post_init__(self) -> None:
        _check_cs_layers("--correction-layers", self.correction_layers)
        _check_cs_layers("--smoothing-layers", self.smoothing_layers)
        check_alpha("--correction-alpha", self.correction_alpha)
        check_alpha("--smoothing-alpha", self.smoothing_alpha)
        _check_scale("--correction-scale", self.scale)

    @property
    def autoscale(self) -> bool:
        """Whether each row's scale is derived from the training error (``scale`` unset)."""
        return self.scale is None

    def to_dict(self) -> dict[str, Any]:
        """For logs and ``predict.json``: ``scale`` is ``"auto"`` under autoscale."""
        return {
            "correction_layers": self.correction_layers,
            "correction_alpha": self.correction_alpha,
            "smoothing_layers": self.smoothing_layers,
            "smoothing_alpha": self.smoothing_alpha,
            "scale": "auto" if self.scale is None else self.scale,
        }


#: The options' definitions, one place for both commands: field name -> :func:`option`'s
#: arguments (:func:`correct_smooth_option` makes each command's field of them).
_OPTIONS: dict[str, dict[str, Any]] = {
    "correct_smooth": dict(
        default=False,
        help="evaluate and predict with Correct & Smooth (Huang et al. 2021, PyG "
        "CorrectAndSmooth) on the model's softmax: the training error propagated, then the "
        "training labels; exact at any rank count",
    ),
    "correction_layers": dict(
        default=None,
        help=f"C&S: steps of the error's propagation, 0-{MAX_CS_LAYERS} (default "
        f"{DEFAULT_CORRECTION_LAYERS})",
        check=_check_cs_layers,
        metavar="L",
    ),
    "correction_alpha": dict(
        default=None,
        help=f"C&S: alpha of the error's propagation, in (0, 1] (default "
        f"{DEFAULT_CORRECTION_ALPHA:g})",
        check=check_alpha,
    ),
    "smoothing_layers": dict(
        default=None,
        help=f"C&S: steps of the labels' propagation, 0-{MAX_CS_LAYERS} (default "
        f"{DEFAULT_SMOOTHING_LAYERS})",
        check=_check_cs_layers,
        metavar="L",
    ),
    "smoothing_alpha": dict(
        default=None,
        help=f"C&S: alpha of the labels' propagation, in (0, 1] (default "
        f"{DEFAULT_SMOOTHING_ALPHA:g})",
        check=check_alpha,
    ),
    "correction_scale": dict(
        default=None,
        help=f"C&S: scale of the propagated error, a number > 0 or auto (each row's from the "
        f"training error, PyG's autoscale; default {DEFAULT_SCALE:g})",
        check=_check_scale,
        parse=parse_scale,
        metavar="{auto,S}",
    ),
}
#: The parameter fields (refused without ``--correct-smooth``).
PARAMETER_FIELDS = tuple(name for name in _OPTIONS if name != "correct_smooth")


def correct_smooth_option(name: str) -> Any:
    """The field ``name`` of the C&S options (:data:`_OPTIONS`) for a configuration class that
    derives from :class:`CorrectSmoothFields`."""
    return option(**_OPTIONS[name])


class CorrectSmoothFields:
    """What a configuration holding the C&S fields can do with them (a mixin of
    :class:`CorrectSmoothOptions` and :class:`~fullgraph.training.config.TrainConfig`)."""

    correct_smooth: bool
    correction_layers: int | None
    correction_alpha: float | None
    smoothing_layers: int | None
    smoothing_alpha: float | None
    correction_scale: str | float | None

    def check_correct_smooth(self) -> None:
        """Refuse a C&S parameter given without ``--correct-smooth`` (one line).

        Raises:
            ConfigError: a parameter is set but C&S is off.
        """
        if self.correct_smooth:
            return
        for name in PARAMETER_FIELDS:
            if getattr(self, name) is not None:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} applies to Correct & Smooth: add --correct-smooth")

    def correct_smooth_params(self) -> CorrectSmoothParams | None:
        """The resolved parameters, or ``None`` without ``--correct-smooth``."""
        if not self.correct_smooth:
            return None

        def given(value: Any, default: Any) -> Any:
            return default if value is None else value

        scale = given(self.correction_scale, DEFAULT_SCALE)
        return CorrectSmoothParams(
            correction_layers=given(self.correction_layers, DEFAULT_CORRECTION_LAYERS),
            correction_alpha=given(self.correction_alpha, DEFAULT_CORRECTION_ALPHA),
            smoothing_layers=given(self.smoothing_layers, DEFAULT_SMOOTHING_LAYERS),
            smoothing_alpha=given(self.smoothing_alpha, DEFAULT_SMOOTHING_ALPHA),
            scale=None if scale == "auto" else float(scale),
        )


@dataclass
class CorrectSmoothOptions(CorrectSmoothFields, Config):
    """``fullgraph predict``'s Correct & Smooth options (``fullgraph train`` holds the same
    fields in its :class:`~fullgraph.training.config.TrainConfig`)."""

    correct_smooth: bool = correct_smooth_option("correct_smooth")
    correction_layers: int | None = correct_smooth_option("correction_layers")
    correction_alpha: float | None = correct_smooth_option("correction_alpha")
    smoothing_layers: int | None = correct_smooth_option("smoothing_layers")
    smoothing_alpha: float | None = correct_smooth_option("smoothing_alpha")
    correction_scale: str | float | None = correct_smooth_option("correction_scale")

    def check(self) -> None:
        """The parameters only with ``--correct-smooth``."""
        self.check_correct_smooth()


def symmetric_operator(part: Partition, device: torch.device | str = "cpu") -> SplitOperator:
    """``S = D^-1/2 A D^-1/2`` over the part's rows, no self-loops, GLOBAL in-degrees (PyG's
    ``gcn_norm(add_self_loops=False)``, LabelPropagation's operator; a node without edges
    has an empty row): :func:`~fullgraph.propagation.operators.propagation_operator`'s
    ``sym``, on ``device``."""
    op = propagation_operator(part, "sym")
    halo = op.halo.to(device) if op.halo is not None else None
    return SplitOperator(op.inner.to(device), halo)


class CorrectSmooth:
    """Correct & Smooth of one rank's rows (every rank of the job builds one; its calls are
    collectives).

    Args:
        op: the propagation operator ``S`` (:func:`symmetric_operator`).
        plan: the rank's halo plan (its maps; the exchanges go as float32, uncompressed).
        y: labels of the inner rows, int64 [num_inner].
        train: the training mask of the inner rows (whose labels are propagated).
        num_train: training nodes of the whole graph (autoscale's mean).
        blocks: the part's block layout (``sigma`` through the tree: the same bits at any P),
            or ``None``: each rank's sum all-reduced.
        params: the parameters.

    Raises:
        ConfigError: the graph has no training nodes (nothing to propagate).
    """

    def __init__(
        self,
        op: SplitOperator,
        plan: HaloPlan,
        y: torch.Tensor,
        train: torch.Tensor,
        num_train: int,
        blocks: BlockLayout | None,
        params: CorrectSmoothParams,
    ) -> None:
        if num_train <= 0:
            raise mark_replicated(
                ConfigError(
                    "--correct-smooth propagates the labels of the training nodes, but this "
                    "graph has none in its train split: nothing to correct or smooth with"
                )
            )
        self.op, self.plan = op, plan.with_precision(FLOAT32)
        self.y, self.train = y, train.to(torch.bool)
        self.num_train, self.blocks, self.params = int(num_train), blocks, params
        #: seconds of the last call's two stages
        self.seconds = {"correct_s": 0.0, "smooth_s": 0.0}

    @classmethod
    def of_part(
        cls,
        part: Partition,
        plan: HaloPlan,
        params: CorrectSmoothParams,
        device: torch.device | str = "cpu",
        blocks: BlockLayout | None = None,
    ) -> CorrectSmooth:
        """The C&S of ``part``'s rows: its operator, labels and training mask on ``device``.

        Args:
            part: this rank's part (one process: the whole graph's).
            plan: the rank's halo plan.
            params: the parameters.
            device: where the rows live.
            blocks: the layout the sum over nodes takes (default: the part's own, if any).
        """
        device = torch.device(device)
        y = as_tensor(part.y, np.int64).to(device)
        train = as_tensor(part.train_mask, np.bool_).to(device)
        layout = blocks if blocks is not None else BlockLayout.of_part(part)
        op = symmetric_operator(part, device)
        return cls(op, plan, y, train, int(part.num_train_global), layout, params)

    def _propagate(
        self,
        rows: torch.Tensor,
        layers: int,
        alpha: float,
        post: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """``layers`` steps of ``out <- alpha S out + (1 - alpha) rows``, ``post(out)`` after
        each (PyG LabelPropagation's loop)."""
        out = rows
        res = (1 - alpha) * out
        for _ in range(layers):
            out = aggregate_rows(out, self.op, self.plan, None)
            out.mul_(alpha).add_(res)
            out = post(out)
        return out

    def _one_hot(self, like: torch.Tensor) -> torch.Tensor:
        """The training rows' one-hot labels, ``like``'s dtype, [train rows, C]."""
        labels = self.y[self.train]
        out = torch.zeros((labels.numel(), like.shape[1]), dtype=like.dtype, device=like.device)
        return out.scatter_(1, labels.view(-1, 1), 1.0)

    def sigma(self, error: torch.Tensor) -> torch.Tensor:
        """The mean over the graph's training nodes of ``|error_row|_1`` (``error`` is 0 off
        the training rows): per block, then the block tree (the same bits at any P); without
        blocks each rank's sum all-reduced. A collective."""
        comm = self.plan.comm
        magnitude = error.abs()
        if self.blocks is None:
            total = magnitude.sum().reshape(1)
            return comm.allreduce_(total, "sum", tag="metrics")[0] / self.num_train
        stack = self.blocks.partials(row_sum, magnitude)
        return tree_root(comm, self.blocks, stack, key="correct-smooth", tag="metrics").sum() / (
            self.num_train
        )

    @torch.no_grad()
    def correct(self, y_soft: torch.Tensor) -> torch.Tensor:
        """``Z + scale * E``: the training error propagated (PyG ``CorrectAndSmooth.correct``).

        Shapes:
            - ``y_soft``: [num_inner, C] -> [num_inner, C]
        """
        p, train = self.params, self.train
        error = torch.zeros_like(y_soft)
        error[train] = self._one_hot(y_soft) - y_soft[train]
        if p.autoscale:
            smoothed = self._propagate(
                error, p.correction_layers, p.correction_alpha, lambda x: x.clamp_(-1.0, 1.0)
            )
            sigma = self.sigma(error)
            scale = sigma / smoothed.abs().sum(dim=1, keepdim=True)
            scale[scale.isinf() | (scale > AUTOSCALE_CAP)] = 1.0
            return y_soft + scale * smoothed
        fixed = error[train]

        def fix_input(x: torch.Tensor) -> torch.Tensor:
            x[train] = fixed
            return x

        smoothed = self._propagate(error, p.correction_layers, p.correction_alpha, fix_input)
        return y_soft + p.scale * smoothed

    @torch.no_grad()
    def smooth(self, y_soft: torch.Tensor) -> torch.Tensor:
        """The training rows set to their labels, propagated (PyG ``CorrectAndSmooth.smooth``).

        Shapes:
            - ``y_soft``: [num_inner, C] -> [num_inner, C]
        """
        p = self.params
        rows = y_soft.clone()
        rows[self.train] = self._one_hot(y_soft)
        return self._propagate(
            rows, p.smoothing_layers, p.smoothing_alpha, lambda x: x.clamp_(0.0, 1.0)
        )

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The smoothed class scores of this rank's rows: ``smooth(correct(softmax(logits)))``.

        Shapes:
            - ``logits``: [num_inner, C] -> [num_inner, C], float32
        """
        t0 = time.perf_counter()
        corrected = self.correct(torch.softmax(logits.float(), dim=1))
        t1 = time.perf_counter()
        out = self.smooth(corrected)
        self.seconds = {"correct_s": t1 - t0, "smooth_s": time.perf_counter() - t1}
        return out


def smoothed_metrics(
    scores: torch.Tensor,
    y: torch.Tensor,
    masks: dict[str, torch.Tensor],
    comm: Communicator,
    metric: str,
) -> dict[str, float]:
    """``{split}_{metric}`` of C&S's class scores over all ranks (a collective): ``acc`` by
    their argmax; ``rocauc`` (two classes) by the smoothed positive-class column itself, as
    the scores of the two classes need not sum to 1.

    Shapes:
        - ``scores``: [rows, classes]; ``y`` and every mask: [rows]
    """
    if metric == "rocauc" and scores.dim() == 2 and scores.shape[1] == 2:
        # split_metrics scores a node by column 1 - column 0: 0 there leaves column 1 exact
        scores = torch.stack([torch.zeros_like(scores[:, 1]), scores[:, 1]], dim=1)
    return split_metrics(scores, y, masks, comm, metric)
