"""The replay behind the memory model (:mod:`fullgraph.memory.model`): a ledger of
live buffers and one rank's set-up, training step and evaluation (or ``fullgraph predict``'s
pass), buffer by buffer, for the GCN / SAGE / GIN layers (GAT: :mod:`fullgraph.memory.gat`), with
``--norm`` and ``--residual`` between the layers."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fullgraph.distributed.exchange_slices import slice_count
from fullgraph.models.graph_linear import BLOCK_ELEMENTS  # the row blocks the layer body uses
from fullgraph.models.layers import layer_class
from fullgraph.training.config import TrainConfig
from fullgraph.training.inference import WRITE_WINDOW_BYTES, window_rows

if TYPE_CHECKING:
    from fullgraph.partition import Partition

F32, I64, I32 = 4, 8, 4
BF16, F64 = 2, 8
#: Transient bytes per stored entry of building one transpose (:meth:`CSRMatrix.t`): the
#: entry permutation (int32), scipy's CSC copy (int32 ids and permuted values), the order as
#: int64, the transposed ids as int64 then int32, the permuted values.
TRANSPOSE_BYTES_PER_ENTRY = 4 + 8 + 8 + 8 + 4 + 4
#: Terms in the order they are printed, with their labels.
TERMS = {
    "structure": "graph structure",
    "features": "features",
    "saved": "saved activations",
    "working": "layer temporaries",
    "halo": "halo buffers in flight",
    "optimizer": "gradients + optimiser state",
    "compression": "compression residuals",
    "floor": "process floor",
}


@dataclass(frozen=True)
class PartShape:
    """The sizes of one part the model needs (all in ``meta.json``).

    Attributes:
        rank: the part.
        num_inner: ``n``, rows the rank owns.
        num_halo: ``h``, rows it receives per exchange.
        num_edges: ``e``, stored in-edges of its rows.
        num_send: ``S``, rows it sends per exchange.
        num_train: ``t``, its training rows.
        halo_edges: ``e_h``, its edges from halo rows (estimated: ``edge_cut * e / E``).
    """

    rank: int
    num_inner: int
    num_halo: int
    num_edges: int
    num_send: int
    num_train: int
    halo_edges: int


@dataclass(frozen=True)
class GraphShape:
    """The sizes of a partition the model needs, from its ``meta.json``."""

    dataset: str
    num_parts: int
    num_features: int
    num_classes: int
    parts: tuple[PartShape, ...]
    #: the parts store edge weights (``4 e``) and weighted in-degrees (``8 (n + h)``)
    edge_weight: bool = False
    #: width ``F_e`` of the stored edge feature rows (``4 e F_e``; 0: none)
    edge_dim: int = 0

    def edge_value_bytes(self, part: PartShape) -> int:
        """Bytes of ``part``'s stored edge values as loaded (``edge_weight``, ``in_weight``,
        ``edge_attr``)."""
        e, local = part.num_edges, part.num_inner + part.num_halo
        weights = (4 * e + 8 * local) if self.edge_weight else 0
        return weights + 4 * e * self.edge_dim

    @property
    def max_rows(self) -> int:
        """The most rows any rank sends or receives in one exchange (sets the slice count)."""
        return max((max(p.num_send, p.num_halo) for p in self.parts), default=0)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> GraphShape:
        """The shape of a checked ``meta.json`` (:func:`fullgraph.partition.read_meta`)."""
        total = max(int(meta["num_edges"]), 1)
        cut = int(meta["edge_cut"])
        parts = []
        for r, p in enumerate(meta["parts"]):
            sent = meta["files"].get(f"part-{r}/send_index.npy", {}).get("shape", [0])[0]
            e = int(p["num_edges"])
            parts.append(
                PartShape(
                    rank=r,
                    num_inner=int(p["num_inner"]),
                    num_halo=int(p["num_halo"]),
                    num_edges=e,
                    num_send=int(p.get("num_send", sent)),
                    num_train=int(p["num_train"]),
                    halo_edges=min(e, math.ceil(cut * e / total)),
                )
            )
        return cls(
            dataset=str(meta["dataset"]),
            num_parts=int(meta["num_parts"]),
            num_features=int(meta["num_features"]),
            num_classes=int(meta["num_classes"]),
            parts=tuple(parts),
            edge_weight=bool(meta.get("edge_weight", False)),
            edge_dim=int(meta.get("edge_dim", 0)),
        )

    @classmethod
    def from_part(cls, part: Partition, dataset: str = "") -> GraphShape:
        """The shape of a one-rank job's part (a whole graph: no halo, nothing sent)."""
        return cls(
            dataset=dataset,
            num_parts=1,
            num_features=int(part.num_features),
            num_classes=int(part.num_classes),
            parts=(
                PartShape(
                    rank=0,
                    num_inner=int(part.num_inner),
                    num_halo=0,
                    num_edges=int(part.num_edges),
                    num_send=0,
                    num_train=int(part.train_mask.sum()),
                    halo_edges=0,
                ),
            ),
            edge_weight=part.edge_weight is not None,
            edge_dim=int(part.edge_dim),
        )


#: The phases of the step that are not one layer's (a phase ``forward, layer 3`` is): their
#: totals grow linearly with the depth (the loss's phase holds every saved activation), which
#: :func:`fullgraph.memory.model.predict_quickly` extends to deeper models.
WHOLE_MODEL_PHASES = ("setup", "forward, input dropout", "loss", "gradient all-reduce")


@dataclass
class Ledger:
    """Live buffers (name -> term, bytes); keeps the largest total and its terms.

    The totals are kept as buffers come and go, so that a step costs the same at any depth (a
    replay of ``--layers 100000`` is linear in the layers, not quadratic)."""

    floor: int
    live: dict[str, tuple[str, int]] = field(default_factory=dict)
    phase: str = "setup"
    peak: int = -1
    peak_terms: dict[str, int] = field(default_factory=dict)
    peak_phase: str = ""
    #: bytes of the live buffers of every term (the floor included)
    terms: dict[str, int] = field(default_factory=dict)
    #: the largest total (and its terms) in each phase of :data:`WHOLE_MODEL_PHASES`
    phase_peaks: dict[str, tuple[int, dict[str, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.terms = dict.fromkeys(TERMS, 0)
        self.terms["floor"] = self.floor

    def add(self, name: str, term: str, nbytes: float) -> None:
        """A buffer is created (its name must not be live)."""
        assert term in TERMS and name not in self.live, name
        self.live[name] = (term, int(nbytes))
        self.terms[term] += int(nbytes)
        self._check()

    def drop(self, *names: str) -> None:
        """Buffers are released (names not live are ignored)."""
        for name in names:
            if name in self.live:
                t, b = self.live.pop(name)
                self.terms[t] -= b

    def rename(self, old: str, new: str, term: str | None = None) -> None:
        """A buffer changes role (an in-place operation): same bytes, maybe another term."""
        t, b = self.live.pop(old)
        self.live[new] = (term or t, b)
        self.terms[t] -= b
        self.terms[term or t] += b

    def _check(self) -> None:
        total = sum(self.terms.values())
        if self.phase in WHOLE_MODEL_PHASES and total > self.phase_peaks.get(self.phase, (-1,))[0]:
            self.phase_peaks[self.phase] = (total, dict(self.terms))
        if total > self.peak:
            self.peak, self.peak_terms, self.peak_phase = total, dict(self.terms), self.phase


def _meta_model(cfg: TrainConfig, num_features: int, num_classes: int) -> Any:
    """The run's :class:`~fullgraph.models.gnn.GNN` on torch's meta device (shapes only)."""
    import torch

    with torch.device("meta"):
        return cfg.build_model(num_features, num_classes)


def parameter_count(cfg: TrainConfig, num_features: int, num_classes: int) -> int:
    """Parameters of the model (weights, biases, attention vectors, norms, projections)."""
    model = _meta_model(cfg, num_features, num_classes)
    return sum(p.numel() for p in model.parameters())


def widths(cfg: TrainConfig, num_features: int, num_classes: int) -> list[int]:
    """``[F, H, ..., H, C]``: the input and output width of every layer (``H`` = heads x
    width for GAT's concatenated heads)."""
    return list(_meta_model(cfg, num_features, num_classes).dims)


def precomputes(cfg: TrainConfig) -> bool:
    """Whether the first aggregation is computed once (gcn / sage, input dropout 0 or on)."""
    pre = cfg.precompute_first
    return pre == "on" or (pre == "auto" and cfg.resolved_input_dropout() == 0)


class RankReplay:
    """Replays one rank's set-up, training step and evaluation into a :class:`Ledger`; with
    ``predict`` its set-up for ``fullgraph predict`` and :meth:`predict` instead (``cfg`` then
    is :func:`~fullgraph.training.inference.inference_config` of the model's)."""

    def __init__(
        self, part: PartShape, graph: GraphShape, cfg: TrainConfig, floor: int,
        predict: bool = False,
    ) -> None:  # fmt: skip
        self.p, self.g, self.cfg = part, graph, cfg
        self.predicting = predict
        #: ``N``, the rows of every output file
        self.num_nodes = sum(q.num_inner for q in graph.parts)
        self.led = Ledger(floor)
        #: the run's model on the meta device: its widths, parameters and layers' shapes
        self.model = _meta_model(cfg, graph.num_features, graph.num_classes)
        self.dims: list[int] = list(self.model.dims)
        self.params = sum(q.numel() for q in self.model.parameters())
        self.budget = int(cfg.exchange_buffer_mb * 2**20)
        self.pre = precomputes(cfg)
        self.p_in = cfg.resolved_input_dropout()
        self.codecs = (cfg.compress_fwd, cfg.compress_bwd) if cfg.compressed else None
        self.slice_counts: set[int] = set()
        kind = layer_class(cfg.model).variant(cfg.layer_options())
        #: the body adds ``h R^T`` (SAGE, GIN): it keeps its input in either order
        self.root = kind.root_term
        #: ReLU in place and ``Linear(out, out)`` after the body (GIN's MLP)
        self.mlp = kind.row_mlp
        self.prunable = kind.prunable
        #: the layer returns its input's gradient as a new tensor (ReLU-dropout may work in place)
        self.fresh = kind.fresh_input_grad
        #: ReLU-dropout in place in both passes (no norm, no residual, a fresh-gradient layer)
        self.alone = self.fresh and cfg.norm == "none" and not cfg.residual
        #: --precision bf16-mixed: the body's products read bf16 copies, ``Z`` / ``M`` and the
        #: forward halo rows are bf16 (2 bytes), the sums float64 until rounded to float32
        self.bf16 = cfg.precision == "bf16-mixed"

    # -- exchanges -----------------------------------------------------------------------
    def _slices(self, width: int, codec: str | None) -> int:
        if codec is not None and codec != "none":
            return 1
        k = slice_count(self.g.max_rows, width, self.budget) if self.g.num_parts > 1 else 1
        if k > 1:
            self.slice_counts.add(k)
        return k

    def _slice_rows(self, rows: int, k: int) -> int:
        return rows if k == 1 else -(-rows // k) + self.g.num_parts

    def _codec(self, direction: int, training: bool) -> str | None:
        if not training or self.codecs is None or self.codecs[direction] == "none":
            return None
        return self.codecs[direction]

    def exchange(self, tag: str, width: int, sent: int, received: int, codec: str | None,
                 before_wait: list[tuple[str, str, float]], elem: int = F32) -> None:  # fmt: skip
        """One exchange (either direction): ``sent`` rows go, ``received`` rows land, ``elem``
        bytes a value (2: bf16-mixed forward rows) when uncompressed; ``before_wait`` buffers
        are created while the first slice is in flight (the inner product). Leaves only
        ``before_wait`` live."""
        from fullgraph.distributed.compression import record_bytes

        led = self.led
        if self.g.num_parts == 1:
            for name, term, nbytes in before_wait:
                led.add(name, term, nbytes)
            return
        if codec is not None:  # whole; the rows, their codes, the codes received, decoded
            rec = record_bytes(codec, width)
            led.add(f"{tag} rows", "halo", sent * width * F32)
            led.add(f"{tag} codes", "halo", sent * rec)
            led.drop(f"{tag} rows")
            led.add(f"{tag} codes received", "halo", received * rec)
            for name, term, nbytes in before_wait:
                led.add(name, term, nbytes)
            led.drop(f"{tag} codes")
            led.add(f"{tag} decoded", "halo", received * width * F32)
            led.drop(f"{tag} codes received", f"{tag} decoded")
            return
        k = self._slices(width, None)
        s = self._slice_rows(sent, k) * width * elem
        r = self._slice_rows(received, k) * width * elem
        led.add(f"{tag} send 0", "halo", s)
        led.add(f"{tag} recv 0", "halo", r)
        for name, term, nbytes in before_wait:
            led.add(name, term, nbytes)
        if k > 1:  # the next slice starts before the current one is waited for
            led.add(f"{tag} send 1", "halo", s)
            led.add(f"{tag} recv 1", "halo", r)
        led.drop(f"{tag} send 0", f"{tag} recv 0", f"{tag} send 1", f"{tag} recv 1")

    # -- phases --------------------------------------------------------------------------
    def _loaded_part(self, indices: str) -> None:
        """The part as loaded (read into memory): ids, CSR row pointers, degrees and send list
        (``part ids``), its column ids (named ``indices``: kept by GAT), features, labels and
        masks."""
        led, p = self.led, self.p
        n, h, S = p.num_inner, p.num_halo, p.num_send
        led.add("part ids", "structure", 2 * I64 * (n + h) + I64 * (n + 1) + I64 * S)
        led.add(indices, "structure", I64 * p.num_edges)
        led.add("x", "features", F32 * n * self.g.num_features)
        led.add("labels and masks", "features", (I64 + 3) * n)
        if self.g.edge_value_bytes(p):  # stored with the part, aligned with its edges
            led.add("part edge values", "structure", self.g.edge_value_bytes(p))

    def setup(self) -> None:
        """:func:`~fullgraph.training.assembly.assemble_rank` on the loaded part."""
        led, p, g = self.led, self.p, self.g
        n, h, e, S = p.num_inner, p.num_halo, p.num_edges, p.num_send
        F = g.num_features
        led.phase = "setup"
        self._loaded_part("part indices")
        ep = e
        if self.cfg.model == "gcn":  # with_self_loops (int64 ids), then the GCN weights
            ep = e + n
            led.add("operator ids", "structure", I64 * ep)
            if self.cfg.edge_weight or self.cfg.improved:  # float64 weights, degrees, mask
                led.add("weighting temporaries", "working", (2 * 8 + 1) * ep + 16 * (n + h))
                led.drop("weighting temporaries")
            led.add("normalisation temporaries", "working", 3 * I64 * ep)
            led.add("operator values", "structure", F32 * ep)
            led.drop("normalisation temporaries")
            # rows no longer sorted by column: the stable sort and its sorted copy
            led.add("sort temporaries", "working", 3 * I64 * ep)
            led.add("sorted operator", "structure", (I64 + F32) * ep)
            led.drop("sort temporaries", "operator ids", "operator values")
            led.rename("sorted operator", "operator")
        else:  # mean weights: one row id per entry while the values are made (GIN's ones: less)
            led.add("row ids", "working", I64 * ep)
            led.add("operator", "structure", F32 * ep)
            led.drop("row ids")
            led.add("sort check", "working", 2 * I64 * ep + ep)  # already sorted: kept
            led.drop("sort check")
        eh = min(p.halo_edges, ep)
        ei = ep - eh
        for block, entries in (("inner", ei), ("halo", eh)):  # select_columns, then int32
            if block == "halo" and h == 0:
                continue
            led.add("select temporaries", "working", I64 * (n + h) + (2 * I64 + 1) * ep)
            led.add(f"{block} block64", "structure", (I64 + F32) * entries + I64 * (n + 1))
            led.drop("select temporaries")
            led.add(f"{block} ids32", "structure", I32 * entries)  # with_indices(int32)
            led.drop(f"{block} block64", f"{block} ids32")
            led.add(f"{block} block", "structure", (I32 + F32) * entries + I64 * (n + 1))
        led.drop("operator")
        for block, entries, cols in (("inner", ei, n), ("halo", eh, h)):  # the transposes
            if block == "halo" and h == 0:
                continue
            led.add("transpose temporaries", "working", TRANSPOSE_BYTES_PER_ENTRY * entries)
            led.add(f"{block} transpose", "structure", (I32 + F32) * entries + I64 * (cols + 1))
            led.drop("transpose temporaries")
        led.add("plan send list", "structure", I64 * S)
        self._pruned_last_layer(ep, eh)
        led.add("dropout ids", "structure", I64 * n)
        if self.pre:  # the first aggregation of the features, once, float32 exchange
            self.exchange(
                "precompute", F, S, h, None, [("first aggregate", "features", F32 * n * F)]
            )
            if self.bf16:  # kept in bf16 (the dtype its product reads)
                led.add("first aggregate bf16", "features", BF16 * n * F)
                led.drop("first aggregate")
        led.add("nonzero count", "working", n * F)  # (x != 0), the sparse-input test
        led.drop("nonzero count")
        # the caller lets the part go: its ids, CSR and degrees leave (x, labels stay shared)
        led.drop("part ids", "part indices")
        if self.g.edge_value_bytes(p):
            led.drop("part edge values")
        self._parameters()
        if self.cfg.error_feedback and self.codecs is not None:
            self._residuals()
        self._slice_structure(eh)

    def _parameters(self) -> None:
        """Training: parameters, gradients and Adam's two moments. Predicting: the parameters
        and the model file's copy of them (the ``optimizer`` term then holds no more)."""
        if self.predicting:
            self.led.add("parameters and the model file's", "optimizer", 2 * F32 * self.params)
        else:
            self.led.add("parameters, gradients, Adam moments", "optimizer", 4 * F32 * self.params)

    def _pruned_last_layer(self, ep: int, eh: int) -> None:
        """Receptive-field pruning (:mod:`fullgraph.distributed.receptive_field`): the last
        layer's operator over the training rows, its transpose and plan. Its share of the edges
        is taken as the training rows' share of the rows; the layers below are taken as whole
        (on graphs of mean degree >> 1/train share they are: the training nodes' in-neighbours
        cover almost every node)."""
        cfg, p, led = self.cfg, self.p, self.led
        if cfg.prune != "auto" or not self.prunable or cfg.norm == "batch":
            return
        n = max(p.num_inner, 1)
        share = min(1.0, p.num_train / n)
        if share > 0.9:
            return
        kept, kept_h = share * ep, share * eh
        led.add("pruning masks", "working", ep + I64 * kept)  # entry mask, kept columns
        blocks = 2 * ((I32 + F32) * kept + I64 * (n + 1)) + 2 * I64 * (n + 1)
        led.add("pruned last layer", "structure", blocks + I64 * share * p.num_send)
        led.drop("pruning masks")
        if kept_h:
            led.add("pruned last layer halo", "structure", I64 * (p.num_halo + 1))

    def _residuals(self) -> None:
        p, dims = self.p, self.dims
        fwd, bwd = self.codecs or ("none", "none")
        total = 0
        for i, (d, o) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            tf = (i > 0 or not self.pre) and o <= d
            if i == 0 and self.pre:
                continue
            width = o if tf else d
            if fwd != "none":
                total += F32 * p.num_send * width
            if bwd != "none" and (tf or i > 0):
                total += F32 * p.num_halo * width
        self.led.add("error-feedback residuals", "compression", total)

    def _slice_structure(self, halo_edges: int) -> None:
        """The slices' halo column blocks (built on first use, kept per slice count)."""
        p = self.p
        for i, (d, o) in enumerate(zip(self.dims[:-1], self.dims[1:], strict=True)):
            if not (i == 0 and self.pre):
                self._slices(o if (o <= d and not (i == 0 and self.pre)) else d, None)
        for k in sorted(self.slice_counts):
            # per slice: its halo columns' block over the rows they reach (row ids, pointers,
            # entries) and its transpose; the slices' send and halo row lists
            reached = min(k * p.num_inner, halo_edges)
            nbytes = (I32 + F32) * 2 * halo_edges + 2 * I64 * reached
            nbytes += I64 * (p.num_halo + k) + I64 * (p.num_send + p.num_halo)
            self.led.add(f"slices of {k}", "structure", nbytes)

    def train_step(self) -> None:
        """One training step (:meth:`fullgraph.training.trainer.Trainer.train_step`)."""
        led, p, dims = self.led, self.p, self.dims
        n, t = p.num_inner, p.num_train
        F, C, L = dims[0], dims[-1], len(dims) - 1
        dropped = self.p_in > 0 and not self.pre
        rebuild = dropped and self.fresh  # the dropped input is a constant the layer recomputes
        led.phase = "forward, input dropout"
        cur = "x"
        if dropped:
            led.add("dropout mask", "working", F32 * n * F)
            led.add("h0", "working", F32 * n * F)
            led.drop("dropout mask")
            cur = "h0"
        layer_saved: list[list[str]] = []
        norm_saved: list[list[str]] = []
        for i in range(L):
            led.phase = f"forward, layer {i}"
            saved, keep_h = self.layer_forward(i, True, rebuild)
            if self.cfg.residual:
                keep_h = keep_h or dims[i] != dims[i + 1]  # the projection saves its input
                self._residual_forward(i)
            if cur != "x":
                if keep_h or i > 0:  # a hidden input is also the activation's saved output
                    led.rename(cur, cur, "saved")
                    saved.append(cur)
                else:
                    led.drop(cur)
            layer_saved.append(saved)
            if i < L - 1:
                norm_saved.append(self._between_forward(i, True))
                cur = f"h{i + 1}"
        led.phase = "loss"
        led.rename(f"Y{L - 1}", "logits")
        led.add("loss rows", "working", (2 * F32 * C + I64) * t)
        led.drop("logits")  # fit() lets the logits go before the backward pass
        led.add("dY", "working", F32 * n * C)
        led.drop("loss rows")
        for i in reversed(range(L)):
            led.phase = f"backward, layer {i}"
            self.layer_backward(i, rebuild)
            if self.cfg.residual and i > 0:  # the residual path's gradient joins dh
                led.add("residual grad", "working", F32 * n * dims[i])
                led.drop("residual grad")
            led.drop("h0 rebuilt", "dY", *layer_saved[i])
            if i > 0:
                self._between_backward(i - 1)
                led.drop(*norm_saved[i - 1])
        led.phase = "gradient all-reduce"
        led.add("all-reduce vectors", "optimizer", 2 * F32 * (self.params + 1))
        led.drop("all-reduce vectors")

    def layer_forward(self, i: int, training: bool, rebuild: bool) -> tuple[list[str], bool]:
        """Layer ``i`` of a GCN / SAGE / GIN stack (:mod:`fullgraph.models.graph_linear`): leaves
        its output ``Y{i}`` live; returns the buffers it saves for the backward pass and
        whether it also saves its input."""
        led, p = self.led, self.p
        n, h, S = p.num_inner, p.num_halo, p.num_send
        d, o = self.dims[i], self.dims[i + 1]
        pre = i == 0 and self.pre
        tf = not pre and o <= d
        codec = self._codec(0, training)
        term = "saved" if training else "working"
        saved: list[str] = []
        tag = f"fwd{i}" if training else f"eval{i}"
        if self.bf16:
            return self._layer_forward_bf16(i, training, rebuild, codec)
        if tf:
            led.add(f"Z{i}", "working", F32 * n * o)
            self.exchange(tag, o, S, h, codec, [(f"Y{i}", "working", F32 * n * o)])
            led.drop(f"Z{i}")
            keep_h = not (i == 0 and rebuild)
        else:
            if not pre:
                self.exchange(tag, d, S, h, codec, [(f"M{i}", term, F32 * n * d)])
                saved.append(f"M{i}")
            led.add(f"Y{i}", "working", F32 * n * o)
            keep_h = self.root and not (i == 0 and rebuild)
        if self.mlp:  # ReLU in place (its output saved, also Lin2's input), then Lin2
            led.rename(f"Y{i}", f"R{i}", term)
            saved.append(f"R{i}")
            led.add(f"Y{i}", "working", F32 * n * o)
        if not training:
            led.drop(*saved)
        return saved, keep_h

    def _layer_forward_bf16(
        self, i: int, training: bool, rebuild: bool, codec: str | None
    ) -> tuple[list[str], bool]:
        """:meth:`layer_forward` under ``--precision bf16-mixed``: the input's bf16 copy, ``Z``
        (transforming first) or the kept ``M`` (aggregating first) in bf16, the forward rows
        sent and received in bf16, the aggregation's float64 sums of the rows with halo terms
        (at most ``e_h`` of them) while those arrive, the output float32."""
        led, p = self.led, self.p
        n, h, S = p.num_inner, p.num_halo, p.num_send
        pending = min(n, p.halo_edges) if self.g.num_parts > 1 else 0
        d, o = self.dims[i], self.dims[i + 1]
        pre = i == 0 and self.pre
        tf = not pre and o <= d
        term = "saved" if training else "working"
        saved: list[str] = []
        tag = f"fwd{i}" if training else f"eval{i}"
        led.add(f"h{i} bf16", "working", BF16 * n * d)
        if tf:
            led.add(f"Z{i}", "working", BF16 * n * o)
            sums = [(f"Y{i}", "working", F32 * n * o), (f"Y{i} sums", "working", F64 * pending * o)]
            self.exchange(tag, o, S, h, codec, sums, BF16)
            led.drop(f"Z{i}", f"Y{i} sums")
            keep_h = not (i == 0 and rebuild)
        else:
            if not pre:
                sums = [(f"M{i} f32", "working", F32 * n * d), (f"M{i} sums", "working",
                        F64 * pending * d)]  # fmt: skip
                self.exchange(tag, d, S, h, codec, sums, BF16)
                led.drop(f"M{i} sums")
                led.add(f"M{i}", term, BF16 * n * d)
                led.drop(f"M{i} f32")
                saved.append(f"M{i}")
            led.add(f"Y{i} bf16", "working", BF16 * n * o)
            led.add(f"Y{i}", "working", F32 * n * o)
            led.drop(f"Y{i} bf16")
            keep_h = self.root and not (i == 0 and rebuild)
        if self.root:  # h R^T in bf16, added
            led.add(f"root{i}", "working", BF16 * n * o)
            led.drop(f"root{i}")
        led.drop(f"h{i} bf16")
        if self.mlp:  # ReLU in place (its output saved), Lin2 on its bf16 copy (kept)
            led.rename(f"Y{i}", f"R{i}", term)
            saved.append(f"R{i}")
            led.add(f"R{i} bf16", term, BF16 * n * o)
            saved.append(f"R{i} bf16")
            led.add(f"Y{i}", "working", F32 * n * o)
        if not training:
            led.drop(*saved)
        return saved, keep_h

    def layer_backward(self, i: int, rebuild: bool) -> None:
        """Layer ``i``'s backward pass: from ``dY`` live to ``dh`` (the input's gradient,
        for ``i > 0``) live."""
        led, p, g = self.led, self.p, self.g
        n, h, S = p.num_inner, p.num_halo, p.num_send
        d, o = self.dims[i], self.dims[i + 1]
        tf = not (i == 0 and self.pre) and o <= d
        codec = self._codec(1, True)
        if self.mlp:  # Lin2's input gradient, then ReLU's: the body's output gradient
            if self.bf16:  # Lin2's dW against its kept bf16 input, widened
                led.add("R f32", "working", F32 * n * o)
                led.drop("R f32")
            led.add("dR", "working", F32 * n * o)
            led.drop("dY")
            led.add("dY body", "working", F32 * n * o)
            led.drop("dR")
            led.rename("dY body", "dY")
        if i > 0:
            led.add("dh", "working", F32 * n * d)
        if i == 0 and rebuild and (tf or self.root):  # hashed_dropout again: mask, then rows
            led.add("dropout mask", "working", F32 * n * self.dims[0])
            led.add("h0 rebuilt", "working", F32 * n * self.dims[0])
            led.drop("dropout mask")
        if self.bf16 and not tf:  # dW = dY^T M with the bf16 M widened
            led.add("M f32", "working", F32 * n * d)
            led.drop("M f32")
        if tf:  # rows of A^T dY a block at a time, received rows in blocks too
            rows = BLOCK_ELEMENTS // max(o, 1)
            inner = [("dY^T A block", "working", F32 * o * min(n, rows))]
            self.exchange(f"bwd{i}", o, h, S, codec, inner)
            if g.num_parts > 1:  # the gathered input rows and their product, per block
                rows = BLOCK_ELEMENTS // max(o, d, 1)
                led.add("received-row blocks", "working", 2 * F32 * max(o, d) * min(S, rows))
            led.drop("dY^T A block", "received-row blocks")
        elif i > 0:  # dM = dY W, then A^T dM with the reverse exchange
            led.add("dM", "working", F32 * n * d)
            self.exchange(f"bwd{i}", d, h, S, codec, [("A^T dM", "working", F32 * n * d)])
            led.drop("dM", "dh")
            led.rename("A^T dM", "dh")

    def _residual_forward(self, i: int) -> None:
        """``Y = layer(h) + res(h)``: the projection's rows (widths differ), then the sum."""
        led, n, o = self.led, self.p.num_inner, self.dims[i + 1]
        if self.dims[i] != o:
            led.add(f"res{i}", "working", F32 * n * o)
        led.add(f"sum{i}", "working", F32 * n * o)
        led.drop(f"Y{i}", f"res{i}")
        led.rename(f"sum{i}", f"Y{i}")

    def _between_forward(self, i: int, training: bool) -> list[str]:
        """Norm, ReLU and the next dropout after layer ``i``: ``Y{i}`` becomes ``h{i+1}``;
        returns what the backward pass keeps of it beside ``h{i+1}``."""
        led, n, o = self.led, self.p.num_inner, self.dims[i + 1]
        norm = self.cfg.norm
        nxt = f"h{i + 1}"
        if norm == "none" and self.alone:  # ReLU-dropout in place
            led.rename(f"Y{i}", nxt)
            return []
        if norm == "none":  # ReLU(-dropout) into a new buffer (the layer's input gradient is
            led.add(nxt, "working", F32 * n * o)  # not fresh, or a residual reads Y too)
            led.drop(f"Y{i}")
            return []
        if norm == "batch":  # fused: into a buffer it keeps for the next steps; keeps its input
            if f"kept norm out{i}" not in led.live:
                led.add(f"kept norm out{i}", "saved", F32 * n * o)
            led.add(nxt, "working", 0)  # the kept buffer
            if training:
                led.rename(f"Y{i}", f"norm in{i}", "saved")
                led.add(f"norm stats{i}", "saved", 4 * F32 * o)
                return [f"norm in{i}", f"norm stats{i}"]
            led.drop(f"Y{i}")
            return []
        # composed: the norm's output, then ReLU(-dropout) into a new buffer
        led.add(f"norm out{i}", "working", F32 * n * o)
        led.add(nxt, "working", F32 * n * o)
        led.drop(f"norm out{i}")
        if training:  # LayerNorm keeps its input and per-row statistics
            led.rename(f"Y{i}", f"norm in{i}", "saved")
            led.add(f"norm stats{i}", "saved", 2 * F32 * n)
            return [f"norm in{i}", f"norm stats{i}"]
        led.drop(f"Y{i}")
        return []

    def _between_backward(self, i: int) -> None:
        """From ``dh`` (the gradient of ``h{i+1}``) to ``dY`` (of layer ``i``'s output)."""
        led, n, o = self.led, self.p.num_inner, self.dims[i + 1]
        norm = self.cfg.norm
        if norm == "none" and self.alone and self.cfg.dropout > 0:
            led.rename("dh", "dY")  # ReLU-dropout's backward in place
            return
        if norm == "batch" and self.fresh and not self.cfg.residual:
            led.rename("dh", "dY")  # the fused BatchNorm's backward in place
            return
        if norm == "layer":  # ReLU-dropout's gradient, then LayerNorm's
            led.add("d norm out", "working", F32 * n * o)
            led.drop("dh")
            led.add("dY", "working", F32 * n * o)
            led.drop("d norm out")
            return
        led.add("dY", "working", F32 * n * o)
        led.drop("dh")

    def evaluate(self) -> None:
        """The evaluation forward pass (no dropout, float32 exchanges, nothing saved)."""
        led, p, dims = self.led, self.p, self.dims
        L = len(dims) - 1
        self._forward_without_grad("evaluation")
        led.add("predictions", "working", (I64 + 1) * p.num_inner)
        led.drop(f"Y{L - 1}", "predictions")

    def _forward_without_grad(
        self, phase: str, after_hidden: Callable[[int], None] | None = None
    ) -> None:
        """The layers in evaluation mode (no dropout, nothing saved for a backward pass); each
        hidden layer's output ``h{i+1}`` lives until the next layer is done. ``after_hidden(i)``
        runs once hidden output ``i + 1`` exists (predict writes it)."""
        led, L = self.led, len(self.dims) - 1
        cur = "x"
        for i in range(L):
            led.phase = f"{phase}, layer {i}"
            self.layer_forward(i, False, False)
            if self.cfg.residual:
                self._residual_forward(i)
            if cur != "x":
                led.drop(cur)
            if i < L - 1:
                self._between_forward(i, False)
                cur = f"h{i + 1}"
                if after_hidden is not None:
                    after_hidden(i)

    # -- fullgraph predict -------------------------------------------------------------------
    def _write_rows(self, source_row: int, file_row: int, transform: bool) -> None:
        """:meth:`~fullgraph.training.inference.RowWriter.write` of this rank's ``n`` rows of
        ``source_row`` bytes into a file of ``file_row`` bytes a row: per window, the rows
        gathered, their transform (softmax, argmax) and the window of the file mapped, all
        three let go before the next window."""
        led, n = self.led, self.p.num_inner
        per = window_rows(WRITE_WINDOW_BYTES, file_row, source_row)
        ours = min(n, per)  # at most all of this rank's rows fall in one window
        led.add("write rows", "working", ours * source_row)
        if transform:
            led.add("write transformed", "working", ours * file_row)
        led.add("write window", "working", min(per, self.num_nodes) * file_row)
        led.drop("write rows", "write transformed", "write window")

    def predict(self) -> None:
        """``fullgraph predict``'s pass (:class:`fullgraph.training.inference.Predictor`):
        the row order of the writer, the evaluation forward with every hidden layer's
        embeddings written as it ends (an upper bound: any ``--embeddings`` needs at most
        this), then the predictions and the probabilities written, the summary's counts."""
        led, p, dims = self.led, self.p, self.dims
        n, L = p.num_inner, len(dims) - 1
        led.phase = "predict, set-up"
        led.add("row order", "structure", 2 * I64 * n)  # sorted global ids and the order
        led.add("argsort", "working", I64 * n)
        led.drop("argsort")
        self._forward_without_grad(
            "predict",
            lambda i: self._write_rows(F32 * dims[i + 1], F32 * dims[i + 1], False),
        )
        led.phase = "predict, writing the outputs"
        last = f"Y{L - 1}"
        C = dims[-1]
        self._write_rows(F32 * C, I64, True)  # predictions.npy: the argmax
        self._write_rows(F32 * C, F32 * C, True)  # probabilities.npy: the softmax
        led.phase = "predict, summary"
        led.add("summary", "working", (2 * I64 + 1) * n)  # argmax, correct
        led.drop("summary", last)
