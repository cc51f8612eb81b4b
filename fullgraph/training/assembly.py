"""Per-rank assembly: from a part on disk (or a whole graph) to what the model runs on.

The one rank assembler: :func:`rank_context` turns a part into the
:class:`~fullgraph.models.context.GraphContext` of a layer kind under its layer options (the
kind's own operator, :meth:`~fullgraph.models.layers.GraphLayer.operator`, split into inner and
halo columns on the device, halo plan, dropout ids, and the edge structure for the kinds that
weigh edges themselves); ``fullgraph train`` (:func:`assemble_rank`) and ``fullgraph.pyg``
(:class:`~fullgraph.pyg.part_data.PartGraph`) both build their contexts with it.

:func:`assemble_rank` builds, complete and once, everything one rank of a full-batch run needs:
feature, label and mask tensors on the device, the aggregation operator of the model's layer kind
split into inner and halo columns, the halo exchange plan (with its buffer limit and halo
compression), the precomputed first aggregation and the sparse form of the input when they
apply; for SGC and SIGN the hops of the features instead
(:func:`~fullgraph.propagation.features.hop_features`, read from the partition's cache when
kept there). The trainer only reads the result.

The part can be one of a job's parts (:class:`fullgraph.partition.Partition`) or a whole graph
(:func:`fullgraph.partition.whole_graph_part`): one process runs the very code the ranks run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.compression import HaloCompression
from fullgraph.distributed.faults import agree
from fullgraph.distributed.halo import HaloPlan, SplitOperator
from fullgraph.distributed.receptive_field import prune_layers
from fullgraph.distributed.tree_sum import BlockLayout
from fullgraph.errors import ConfigError
from fullgraph.kernels import CSRMatrix
from fullgraph.models.context import GraphContext
from fullgraph.models.gnn import precompute_first_aggregate, sparse_features
from fullgraph.models.layers import LayerOptions, layer_class
from fullgraph.models.local_graph import as_tensor, local_csr
from fullgraph.partition import Partition
from fullgraph.partition.load import whole_ids
from fullgraph.precision import Precision
from fullgraph.propagation.cache import HopCache
from fullgraph.propagation.features import HopSpec, hop_features
from fullgraph.propagation.operators import split_columns
from fullgraph.training.config import TrainConfig, TrainData
from fullgraph.training.cut_check import check_cut_training


def part_tensors(part: Partition) -> dict[str, torch.Tensor]:
    """Features, labels and masks of the inner nodes as torch tensors.

    They share the part's arrays when those are in memory (``load_partition(mmap=False)``, a
    whole graph), and copy them out of read-only memory maps.
    """
    return {
        "x": as_tensor(part.x, np.float32),
        "y": as_tensor(part.y, np.int64),
        "train": as_tensor(part.train_mask, np.bool_),
        "val": as_tensor(part.val_mask, np.bool_),
        "test": as_tensor(part.test_mask, np.bool_),
    }


def build_operator(
    part: Partition, model: str, options: LayerOptions | None = None
) -> SplitOperator:
    """The aggregation operator of layer kind ``model`` on this rank's rows, split inner / halo.

    Args:
        part: a partition (one of a job's parts, or a whole graph).
        model: a layer kind (``gcn``: ``D^-1/2 (A + I) D^-1/2`` with GLOBAL degrees;
            ``sage``: the mean over incoming neighbours; ...).
        options: the layer options (``aggr`` picks SAGE's and GraphConv's operator,
            ``edge_weight`` and ``improved`` weigh GCN's).

    Returns:
        The :class:`~fullgraph.distributed.halo.SplitOperator`, rows = inner nodes.

    Raises:
        ConfigError: the kind's (edge weights asked for but the part has none, ...).
    """
    options = options or LayerOptions()
    a = layer_class(model).variant(options).operator(part, options)
    return split_columns(a, int(part.num_inner))


def check_edge_weights(part: Partition, wanted_by: str, data: TrainData) -> None:
    """Refuse a run that weighs its edges (``wanted_by`` says why) on data without weights,
    in one line naming the data as the command line gave it and what to give instead.

    Args:
        part: this rank's part (the whole graph in one process).
        wanted_by: what asks for the weights (``--edge-weight``, or the model file).
        data: the command's data options (``--parts``, ``--dataset``, ``--synthetic``).

    Raises:
        ConfigError: ``part`` stores no edge weights.
    """
    if part.edge_weight is not None:
        return
    if data.parts:
        problem = (
            f"--parts {data.parts} stores no edge weights; partition a graph that has them "
            f"(raw/edge_weight.csv.gz in the OGB layout, or data.edge_weight)"
        )
    elif data.dataset:
        problem = (
            f"--dataset {data.dataset} --root {data.root} has no edge weights (an OGB-layout "
            f"raw/edge_weight.csv.gz, or an .npz with weighted adj_data); give a dataset that "
            f"has them"
        )
    else:
        problem = (
            f"--synthetic {data.synthetic} generates no edge weights; write a weighted graph "
            f"with `fullgraph data synth --edge-weight` and give it as --dataset"
        )
    raise ConfigError(f"{wanted_by}: {problem}")


@dataclass
class RankGraph:
    """What one rank trains on, built by :func:`assemble_rank`.

    Attributes:
        data: ``x``, ``y``, ``train``, ``val``, ``test`` of the inner nodes, on the device.
        ctx: operator, halo plan, dropout ids, precomputed first aggregation, sparse input.
        num_train_global: training nodes of the whole graph (the loss divisor).
    """

    data: dict[str, torch.Tensor]
    ctx: GraphContext
    num_train_global: int


def _normalize_rows(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """PyG ``NormalizeFeatures``: subtract the global minimum, divide rows by their sum."""
    local_min = x.min() if x.numel() else torch.tensor(float("inf"))
    neg = torch.tensor([-float(local_min)], dtype=torch.float64)
    global_min = -float(comm.allreduce_(neg, "max", tag="setup")[0])
    x = x - global_min
    return x / x.sum(dim=1, keepdim=True).clamp(min=1.0)


def needs_structure(kind: str, options: LayerOptions | None = None) -> bool:
    """Whether layer kind ``kind`` (with ``options``) reads the edges itself (attention, the
    maximum over neighbours): it then reads the part's edge structure and the global ids of its
    halo, not only the operator (:attr:`~fullgraph.models.layers.GraphLayer.reads_edges`)."""
    cls = layer_class(kind).variant(options)
    return not cls.precomputable if cls.reads_edges is None else cls.reads_edges


def rank_context(
    part: Partition,
    plan: HaloPlan,
    kind: str,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    *,
    options: LayerOptions | None = None,
) -> GraphContext:
    """The context a rank runs layers of kind ``kind`` with (no collective).

    Args:
        part: this rank's part.
        plan: the rank's halo exchange plan (shared by every kind of a model).
        kind: a registered layer kind.
        seed: the run's seed (dropout streams).
        device: where the operator lives.
        dtype: the operator's value type (default: as built, float32).
        options: the layer options (``aggr``: SAGE's and GraphConv's aggregation;
            ``edge_weight``, ``improved``: GCN's weights; see :func:`build_operator`).

    Returns:
        The operator split into inner and halo columns, the plan, the global ids of the inner
        nodes, and for the kinds that weigh edges themselves (:func:`needs_structure`) the local
        CSR of incoming edges and the global ids of every local node.
    """
    device = torch.device(device)
    op = build_operator(part, kind, options)

    def place(a: CSRMatrix | None) -> CSRMatrix | None:
        if a is None:
            return None
        a = a.to(device)
        if dtype is None or a.values is None:
            return a
        return a.with_values(a.values.to(dtype))

    ids = whole_ids(part)  # a receptive-field cut's ids in the whole graph: the same streams
    ctx = GraphContext(
        op=SplitOperator(place(op.inner), place(op.halo)),
        plan=plan,
        global_ids=np.array(part.global_ids[: part.num_inner], dtype=np.int64),
        seed=seed,
        blocks=BlockLayout.of_part(part),
        whole_ids=None if ids is part.global_ids else np.array(ids[: part.num_inner], np.int64),
    )
    if needs_structure(kind, options):
        ctx.structure = local_csr(part).to(device)
        ctx.local_global_ids = np.asarray(ids, dtype=np.int64)
    return ctx


def assemble_rank(
    part: Partition,
    comm: Communicator,
    config: TrainConfig,
    device: torch.device | str = "cpu",
    precision: Precision | None = None,
    *,
    hop_cache: HopCache | None = None,
) -> RankGraph:
    """Build everything rank ``comm.rank`` trains on (a collective: every rank calls it).

    Args:
        part: this rank's part.
        comm: the communicator.
        config: the run's configuration (layer kind, widths, dropout, compression).
        device: where tensors live.
        precision: the resolved policy (default: ``config.precision``'s, which must then be
            resolved: ``32`` or ``bf16-mixed``).
        hop_cache: where SGC's and SIGN's hops are kept
            (:class:`~fullgraph.propagation.cache.HopCache`; the commands give the
            partition's); ``None``: computed, nothing kept or printed.

    Returns:
        The :class:`RankGraph`.
    """
    device = torch.device(device)
    agree(comm, lambda: check_cut_training(part.meta, config, "the partition"))
    options = config.layer_options()
    kind = config.layer_kind()
    check = kind.part_check(options)
    if check is not None:  # refused alike on every rank (before any collective of the plan)
        agree(comm, lambda: check(part))
    data = part_tensors(part)
    if config.normalize_features:
        data["x"] = _normalize_rows(data["x"], comm)
    data = {k: v.to(device) for k, v in data.items()}
    compression = None
    if config.compressed:
        compression = HaloCompression(
            config.compress_fwd,
            config.compress_bwd,
            seed=config.seed,
            rank=comm.rank,
            error_feedback=config.error_feedback,
        )
    plan = HaloPlan.from_partition(
        part,
        comm,
        buffer_bytes=int(config.exchange_buffer_mb * 2**20),
        compression=compression,
        precision=precision or Precision(config.precision),
    )
    ctx = rank_context(
        part,
        plan,
        config.model,
        config.seed,
        device,
        options=options,
    )
    if config.prune == "auto" and kind.prunable and config.norm != "batch":
        ctx.train_graphs = prune_layers(ctx.op, plan, data["train"], config.layers)
    pre = config.precompute_first
    if kind.hop_input is not None:  # SGC, SIGN: the hops of the features, once (or cached)
        if pre == "off":
            raise ConfigError(
                f"--precompute-first off: --model {config.model} reads the hops of its "
                f"features, computed once; drop --precompute-first"
            )
        propagation, hops, alpha = kind.hop_options(options)
        spec = HopSpec(propagation, hops, alpha, kind.hop_input)
        feats = hop_features(
            part,
            data["x"],
            plan,
            spec,
            cache=hop_cache,
            normalize_features=config.normalize_features,
        )
        ctx.first_aggregate = plan.rows_in(feats)  # bf16-mixed: bfloat16, as the others
        del feats
    elif pre == "on" and not kind.precomputable:
        aggr = f" --aggr {config.aggr}" if config.aggr else ""
        raise ConfigError(f"--precompute-first on: --model {config.model}{aggr} cannot precompute")
    if kind.precomputable and (
        pre == "on" or (pre == "auto" and config.resolved_input_dropout() == 0)
    ):
        # bf16-mixed: kept in bfloat16, the dtype its product reads (half the bytes, no cast
        # per step)
        ctx.first_aggregate = plan.rows_in(precompute_first_aggregate(data["x"], ctx))
    x = data["x"]
    stats = torch.tensor([float((x != 0).sum()), float(x.numel())], dtype=torch.float64)
    nnz, total = comm.allreduce_(stats, "sum", tag="setup").tolist()
    first_out = config.hidden if config.layers > 1 else int(part.num_classes)
    sparse_ok = device.type == "cpu" and ctx.first_aggregate is None and not config.residual
    sparse_ok = sparse_ok and kind.precomputable  # the transform-first layers take CSR input
    if sparse_ok and first_out <= int(part.num_features) and nnz < 0.1 * total:
        ctx.sparse_x = sparse_features(x)
    return RankGraph(data=data, ctx=ctx, num_train_global=int(part.num_train_global))
