"""The plan projected: memory, halo traffic and epoch time of a full-batch run on many machines.

A graph too large to partition here (ogbn-papers100M) is *described* to the memory model
instead: ``P`` equal parts of ``n = N / P`` rows and ``e = 2 E / P`` stored in-edges each, a
halo of ``h = min(rho(P) n, N - n)`` rows received (and as many sent), ``rho(P) = rho_ref
(P / P_ref) ^ gamma`` (:class:`HaloModel`, an assumption stated by its numbers) and
``edges_per_row h`` halo edges. A partition on disk is read as it is
(:meth:`~fullgraph.memory.shapes.GraphShape.from_meta`). Either way, every rank gets:

- **memory**: the memory model's predicted peak (:func:`~fullgraph.memory.model.predict_rank`,
  the replay ``fullgraph plan`` prints), and per machine the sum of its ranks';
- **halo traffic**: every exchange of one training step as the same replay makes it (its
  width, rows sent and received, bytes a value or a compressed record): no second copy of the
  layers' exchange rules here (:func:`step_exchanges`);
- **epoch time**: ``f (edge_s e + row_s n) + halo_row_s (S + h)`` of compute (``f``: the
  measured slow-down of a rank sharing its machine, on machines of several ranks), with the costs of
  *this* model measured by :func:`~fullgraph.memory.cost_probe.probe_costs` (training steps of
  the real trainer on random graphs) or given, plus the bytes the rank sends (halo rows and
  the gradient all-reduce) at ``bandwidth``; the epoch is the slowest rank's. The exchange is
  taken not to overlap compute (an upper bound where it does).

:func:`project` turns a :class:`~fullgraph.memory.shapes.GraphShape` into one
:class:`RankProjection` per rank; ``fullgraph plan project`` prints them
(:mod:`fullgraph.commands.plan_project`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fullgraph.errors import ConfigError
from fullgraph.memory.ledger import F32
from fullgraph.memory.model import REPLAYS, Prediction, check_modelled, predict_rank
from fullgraph.memory.shapes import GraphShape, PartShape
from fullgraph.training.config import TrainConfig

__all__ = [
    "PRESETS",
    "Costs",
    "Exchange",
    "GraphSize",
    "HaloModel",
    "RankProjection",
    "described_shape",
    "preset",
    "project",
    "step_exchanges",
]


@dataclass(frozen=True)
class GraphSize:
    """The published sizes of a graph: what the projection needs of it.

    Attributes:
        name: the graph's name.
        num_nodes: ``N``.
        num_edges: ``E``, undirected; stored in both directions (``2 E`` in-edges).
        num_features: ``F``.
        num_classes: ``C``.
        num_train: training nodes.
    """

    name: str
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    num_train: int

    def check(self) -> None:
        """Refuse sizes no graph has (one line)."""
        if min(self.num_nodes, self.num_edges, self.num_features, self.num_classes) <= 0:
            raise ConfigError(f"{self.name}: nodes, edges, features and classes must be > 0")
        if not 0 < self.num_train <= self.num_nodes:
            raise ConfigError(f"{self.name}: training nodes must be in (0, {self.num_nodes}]")


#: The OGB graphs' published sizes (https://ogb.stanford.edu/docs/nodeprop/; edges as OGB
#: lists them, made undirected as the OGB and SAR examples do).
PRESETS: dict[str, GraphSize] = {
    "papers100M": GraphSize("ogbn-papers100M", 111_059_956, 1_615_685_872, 128, 172, 1_207_179),
    "products": GraphSize("ogbn-products", 2_449_029, 61_859_140, 100, 47, 196_615),
    "arxiv": GraphSize("ogbn-arxiv", 169_343, 1_166_243, 128, 40, 90_941),
}


def preset(name: str) -> GraphSize:
    """The sizes of a preset of :data:`PRESETS` (``ConfigError`` naming the known ones)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class HaloModel:
    """The halo of an equal part, an assumption stated by its numbers.

    Attributes:
        ratio: ``rho_ref``: halo rows per inner row at ``reference_parts``.
        growth: ``gamma``: ``rho`` grows as ``P ^ gamma``.
        reference_parts: ``P_ref``.
        edges_per_row: halo edges per halo row (METIS parts of our synthetic graphs: 1.6-1.8).
    """

    ratio: float = 1.0
    growth: float = 0.5
    reference_parts: int = 16
    edges_per_row: float = 1.7

    def rho(self, parts: int) -> float:
        """Halo rows per inner row at ``parts`` parts."""
        return self.ratio * (parts / self.reference_parts) ** self.growth

    def check(self) -> None:
        """Refuse a halo no partition has (one line)."""
        if self.ratio < 0 or self.growth < 0 or self.edges_per_row < 0:
            raise ConfigError("halo ratio, growth and edges per halo row must be >= 0")
        if self.reference_parts < 1:
            raise ConfigError("the halo model's reference part count must be >= 1")


def described_shape(size: GraphSize, parts: int, halo: HaloModel) -> GraphShape:
    """``size`` cut into ``parts`` equal parts with ``halo``'s halo (module docstring).

    Raises:
        ConfigError: ``parts`` below 1 or above the nodes, or sizes no graph has.
    """
    size.check()
    halo.check()
    if not 1 <= parts <= size.num_nodes:
        raise ConfigError(f"parts must be in [1, {size.num_nodes}], not {parts}")
    n = size.num_nodes // parts
    e = 2 * size.num_edges // parts
    h = 0 if parts == 1 else min(int(halo.rho(parts) * n), size.num_nodes - n)
    part = PartShape(
        rank=0,
        num_inner=n,
        num_halo=h,
        num_edges=e,
        num_send=h,
        num_train=size.num_train // parts,
        halo_edges=min(e, int(halo.edges_per_row * h)),
    )
    alike = tuple(PartShape(**{**part.__dict__, "rank": r}) for r in range(parts))
    return GraphShape(f"{size.name} (described)", parts, size.num_features, size.num_classes, alike)


@dataclass(frozen=True)
class Exchange:
    """One exchange of a training step, as the memory model's replay makes it.

    Attributes:
        tag: ``fwd<i>`` / ``bwd<i>`` (the layer and direction).
        width: values a row.
        rows_sent: rows this rank sends.
        rows_received: rows it receives.
        bytes_sent: bytes it sends (a value's bytes, or a compressed record's).
    """

    tag: str
    width: int
    rows_sent: int
    rows_received: int
    bytes_sent: int


def step_exchanges(
    part: PartShape, graph: GraphShape, cfg: TrainConfig, evaluation: bool = False
) -> list[Exchange]:
    """Every exchange of one training step of ``part``'s rank, from the replay itself.

    The replay family of the layer kind (:data:`~fullgraph.memory.model.REPLAYS`) runs its
    set-up and a training step with its ``exchange`` recorded; set-up's (the precomputed first
    aggregation, once per run) is not part of a step, and evaluation's (``eval<i>``) only with
    ``evaluation`` (an epoch that evaluates: what ``fullgraph train`` logs as ``halo_bytes``).
    """
    from fullgraph.distributed.compression import record_bytes

    check_modelled(cfg)
    rank = REPLAYS[cfg.layer_kind().replay](part, graph, cfg, 0)
    rank.setup()
    seen: list[Exchange] = []
    replayed = rank.exchange

    def recorded(
        tag: str,
        width: int,
        sent: int,
        received: int,
        codec: str | None,
        before_wait: list[tuple[str, str, float]],
        elem: int = F32,
    ) -> None:
        per_row = record_bytes(codec, width) if codec is not None else width * elem
        seen.append(Exchange(tag, width, sent, received, sent * per_row))
        replayed(tag, width, sent, received, codec, before_wait, elem)

    rank.exchange = recorded
    if graph.num_parts > 1:
        rank.train_step()
        if evaluation:
            rank.evaluate()
    return seen


@dataclass(frozen=True)
class Costs:
    """What an epoch costs on one rank, measured (:func:`~fullgraph.memory.cost_probe.
    probe_costs`) or given.

    Attributes:
        edge_s: seconds of a training step per stored in-edge of the rank.
        row_s: seconds of a training step per inner row.
        bandwidth: bytes a second one rank sends (the network, or shared memory on one box).
        threads: threads of a rank the costs hold for.
        source: how they were obtained, in words.
    """

    edge_s: float
    row_s: float
    bandwidth: float
    threads: int = 1
    source: str = "given"
    #: seconds of a training step per halo row sent or received (packing, the products of
    #: the rows returned in the backward pass); 0: not measured
    halo_row_s: float = 0.0
    #: compute of a rank sharing its machine with another rank / alone (measured with two
    #: ranks; applied to machines of several ranks)
    shared: float = 1.0

    def check(self) -> None:
        """Refuse costs no machine has (one line)."""
        if min(self.edge_s, self.row_s, self.halo_row_s) < 0 or self.edge_s + self.row_s <= 0:
            raise ConfigError("per-edge and per-row costs must be >= 0, not both 0")
        if self.bandwidth <= 0:
            raise ConfigError("the bandwidth must be > 0")
        if self.shared <= 0:
            raise ConfigError("the sharing factor must be > 0")


@dataclass(frozen=True)
class RankProjection:
    """One rank of a projected run.

    Attributes:
        part: its sizes.
        memory: its predicted peak (:class:`~fullgraph.memory.model.Prediction`).
        exchanges: the exchanges of one training step (:func:`step_exchanges`).
        compute_s: ``f (edge_s e + row_s n) + halo_row_s (S + h)``, ``f`` the sharing
            factor on a machine of several ranks (else 1).
        send_s: the bytes it sends a step (halo and the gradient all-reduce) at the bandwidth.
    """

    part: PartShape
    memory: Prediction
    exchanges: tuple[Exchange, ...]
    compute_s: float
    send_s: float

    @property
    def halo_rows(self) -> int:
        """Rows it sends a training step (every exchange, both directions)."""
        return sum(x.rows_sent for x in self.exchanges)

    @property
    def halo_bytes(self) -> int:
        """Bytes it sends a training step in halo exchanges."""
        return sum(x.bytes_sent for x in self.exchanges)

    @property
    def epoch_s(self) -> float:
        """Its training step: compute, then what it sends (no overlap assumed)."""
        return self.compute_s + self.send_s


def _alike(graph: GraphShape) -> bool:
    """Whether every part has rank 0's sizes (a described graph): one replay serves all."""
    first = graph.parts[0]
    return all(
        (p.num_inner, p.num_halo, p.num_edges, p.num_send, p.num_train, p.halo_edges)
        == (
            first.num_inner,
            first.num_halo,
            first.num_edges,
            first.num_send,
            first.num_train,
            first.halo_edges,
        )
        for p in graph.parts
    )


def project(
    graph: GraphShape, cfg: TrainConfig, floor: int, costs: Costs, ranks_per_machine: int = 1
) -> list[RankProjection]:
    """Every rank's memory, halo traffic and step time (module docstring).

    Args:
        graph: the partition's sizes (described, or of a ``meta.json``).
        cfg: the run's configuration (:func:`~fullgraph.memory.model.check_modelled`).
        floor: the process floor, bytes.
        costs: the per-edge, per-row and per-halo-row costs and the bandwidth.
        ranks_per_machine: ranks sharing a machine (above 1, the edges' and rows' costs are
            multiplied by ``costs.shared``).
    """
    from fullgraph.memory.replay import parameter_count

    costs.check()
    check_modelled(cfg)
    params = parameter_count(cfg, graph.num_features, graph.num_classes)
    p_count = graph.num_parts
    reduce_bytes = 2 * F32 * params * (p_count - 1) // p_count if p_count > 1 else 0
    parts = graph.parts[:1] if _alike(graph) else graph.parts
    out = []
    for part in parts:
        memory = predict_rank(part, graph, cfg, floor)
        exchanges = tuple(step_exchanges(part, graph, cfg))
        compute = costs.edge_s * part.num_edges + costs.row_s * part.num_inner
        compute *= costs.shared if ranks_per_machine > 1 else 1.0
        compute += costs.halo_row_s * (part.num_send + part.num_halo)
        sent = sum(x.bytes_sent for x in exchanges) + reduce_bytes
        out.append(RankProjection(part, memory, exchanges, compute, sent / costs.bandwidth))
    if len(parts) < len(graph.parts):  # alike: rank 0's projection for every rank
        out = [
            RankProjection(
                p,
                Prediction(p.rank, out[0].memory.phase, out[0].memory.terms),
                out[0].exchanges,
                out[0].compute_s,
                out[0].send_s,
            )
            for p in graph.parts
        ]
    return out
