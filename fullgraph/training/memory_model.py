"""The memory model of a full-batch training rank: its predicted peak, term by term.

The model replays, buffer by buffer, what the code allocates on one rank (a *ledger*: every
buffer enters with its size and term when the code creates it and leaves when the code lets it
go) and reports the largest total and what made it up. It needs only a part's sizes, which
``meta.json`` holds: ``n`` inner rows, ``h`` halo rows, ``e`` stored edges, ``S`` rows sent,
``t`` training rows; the graph's ``F`` features and ``C`` classes; the model's widths
``d_0 = F, d_1 .. d_{L-1} = H, d_L = C``. Bytes: float32 4, int64 8, CSR column ids int32.

Terms (what ``fullgraph plan`` prints):

- **graph structure**: the split aggregation operator (:mod:`fullgraph.training.assembly`)
  and, with receptive-field pruning, the last layer's operator over the ``t`` training rows
  (about ``t/n`` of it, with its transpose and plan; lower layers taken as whole):
  inner and halo blocks and their transposes, ``16 e' + 8 (3n + h)`` with ``e' = e`` (SAGE) or
  ``e + n`` (GCN's self loops), the exchange plan's ``8 S``, the dropout ids ``8 n``; with a
  sliced exchange the slices' halo column blocks over the rows they reach and their
  transposes (about ``16 e_h + 16 min(K n, e_h) + 16 (S + h)`` per slice count ``K``;
  ``e_h``, the part's halo edges, is estimated as ``edge_cut * e / E``). While the rank sets
  up, the part's own arrays (``16 (n + h) + 8 e + 8 S``) and the building temporaries.
- **features**: ``x`` (``4 n F``), labels and masks (``11 n``), the precomputed first
  aggregation (``4 n F``) when input dropout is 0.
- **saved activations**: what the backward pass keeps (:mod:`fullgraph.models.graph_linear`):
  every hidden layer's input ``h_i`` (``4 n H`` each, the ReLU-dropout output, saved once for
  the weight gradients and the activation's derivative), the first layer's aggregation
  ``M = A X_drop`` (``4 n F``) when it aggregates first. The dropped input itself is rebuilt
  from its hash in the backward pass, never kept.
- **layer temporaries**: the current layer's ``Z = h W^T`` and output ``Y`` in the forward pass
  (``4 n d`` each), the output gradient ``dY`` and input gradient ``dh`` in the backward pass,
  row blocks (``A^T dY`` 8 MB at a time), the loss's rows (``8 t C``), the dropout mask while
  it is drawn.
- **halo buffers in flight**: per exchange of width ``w`` in ``K`` slices (``K = ceil(4 w
  max_rows / budget)``, ``--exchange-buffer-mb``), the send and receive buffers of one slice,
  ``4 w (S/K + h/K)``, twice when ``K > 1`` (the next slice is in flight while the current one
  is added); compressed exchanges go whole: the rows, their codes, the codes received and their
  decoded rows.
- **gradients + optimiser state**: parameters, gradients and Adam's two moments (``16 p``),
  the flat vector of the gradient all-reduce (``8 p``) while it runs.
- **compression residuals**: with ``--error-feedback``, ``4 w S`` per compressed forward
  exchange and ``4 w h`` per compressed backward exchange, kept from step to step.
- **process floor**: Python, torch, numba, MPI and the kernels' code, measured on this machine
  (:func:`measure_floor`: this process after a two-epoch run of the same model on a 64-node
  graph), not modelled.

The step is replayed as the code runs it: set-up (:func:`~fullgraph.training.assembly.
assemble_rank`), one training step (forward layer by layer, the loss, backward layer by layer,
the gradient all-reduce) and one evaluation; the peak is the largest total of the three.
Covered: ``--model gcn`` and ``sage`` without ``--norm`` or ``--residual``, dense input
features (:func:`check_modelled` says what is not).
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass, field
from typing import Any

from fullgraph.distributed.exchange_slices import slice_count
from fullgraph.errors import ConfigError
from fullgraph.training.config import TrainConfig

F32, I64, I32 = 4, 8, 4
#: Elements of one row block of ``A^T dY`` and of the received-row blocks in a layer's
#: backward pass (:data:`fullgraph.models.graph_linear.BLOCK_ELEMENTS`).
BLOCK_ELEMENTS = 1 << 21
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
        )

    @classmethod
    def from_part(cls, part: Any, dataset: str = "") -> GraphShape:
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
        )


@dataclass
class Prediction:
    """The predicted peak of one rank.

    Attributes:
        rank: the part.
        phase: where the peak falls (``forward layer 1``, ``backward layer 1``, ``setup``...).
        terms: bytes of every term of :data:`TERMS` at the peak.
    """

    rank: int
    phase: str
    terms: dict[str, int]

    @property
    def total(self) -> int:
        """The predicted peak resident memory, bytes (the sum of the terms)."""
        return sum(self.terms.values())


@dataclass
class Ledger:
    """Live buffers (name -> term, bytes); keeps the largest total and its terms."""

    floor: int
    live: dict[str, tuple[str, int]] = field(default_factory=dict)
    phase: str = "setup"
    peak: int = -1
    peak_terms: dict[str, int] = field(default_factory=dict)
    peak_phase: str = ""

    def add(self, name: str, term: str, nbytes: float) -> None:
        """A buffer is created (its name must not be live)."""
        assert term in TERMS and name not in self.live, name
        self.live[name] = (term, int(nbytes))
        self._check()

    def drop(self, *names: str) -> None:
        """Buffers are released (names not live are ignored)."""
        for name in names:
            self.live.pop(name, None)

    def rename(self, old: str, new: str, term: str | None = None) -> None:
        """A buffer changes role (an in-place operation): same bytes, maybe another term."""
        t, b = self.live.pop(old)
        self.live[new] = (term or t, b)

    def _check(self) -> None:
        total = self.floor + sum(b for _, b in self.live.values())
        if total > self.peak:
            terms = dict.fromkeys(TERMS, 0)
            terms["floor"] = self.floor
            for t, b in self.live.values():
                terms[t] += b
            self.peak, self.peak_terms, self.peak_phase = total, terms, self.phase


def check_modelled(cfg: TrainConfig) -> None:
    """Refuse the configurations the model does not cover (one line).

    Raises:
        ConfigError: a model other than gcn / sage, ``--norm``, ``--residual``.
    """
    if cfg.model not in ("gcn", "sage"):
        raise ConfigError(f"the memory model covers --model gcn and sage, not --model {cfg.model}")
    if cfg.norm != "none" or cfg.residual:
        raise ConfigError("the memory model covers layers without --norm and --residual")


def parameter_count(cfg: TrainConfig, num_features: int, num_classes: int) -> int:
    """Parameters of the model (weights, biases, SAGE's root weights)."""
    dims = widths(cfg, num_features, num_classes)
    per = 2 if cfg.model == "sage" else 1
    return sum(per * d * o + o for d, o in zip(dims[:-1], dims[1:], strict=True))


def widths(cfg: TrainConfig, num_features: int, num_classes: int) -> list[int]:
    """``[F, H, ..., H, C]``: the input and output width of every layer."""
    return [num_features] + [cfg.hidden] * (cfg.layers - 1) + [num_classes]


def precomputes(cfg: TrainConfig) -> bool:
    """Whether the first aggregation is computed once (gcn / sage, input dropout 0 or on)."""
    pre = cfg.precompute_first
    return pre == "on" or (pre == "auto" and cfg.resolved_input_dropout() == 0)


class _Rank:
    """Replays one rank's set-up, training step and evaluation into a :class:`Ledger`."""

    def __init__(self, part: PartShape, graph: GraphShape, cfg: TrainConfig, floor: int):
        self.p, self.g, self.cfg = part, graph, cfg
        self.led = Ledger(floor)
        self.dims = widths(cfg, graph.num_features, graph.num_classes)
        self.root = cfg.model == "sage"
        self.budget = int(cfg.exchange_buffer_mb * 2**20)
        self.pre = precomputes(cfg)
        self.p_in = cfg.resolved_input_dropout()
        self.codecs = (cfg.compress_fwd, cfg.compress_bwd) if cfg.compressed else None
        self.slice_counts: set[int] = set()

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
                 before_wait: list[tuple[str, str, float]]) -> None:  # fmt: skip
        """One exchange (either direction): ``sent`` rows go, ``received`` rows land;
        ``before_wait`` buffers are created while the first slice is in flight (the inner
        product). Leaves only ``before_wait`` live."""
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
        s = self._slice_rows(sent, k) * width * F32
        r = self._slice_rows(received, k) * width * F32
        led.add(f"{tag} send 0", "halo", s)
        led.add(f"{tag} recv 0", "halo", r)
        for name, term, nbytes in before_wait:
            led.add(name, term, nbytes)
        if k > 1:  # the next slice starts before the current one is waited for
            led.add(f"{tag} send 1", "halo", s)
            led.add(f"{tag} recv 1", "halo", r)
        led.drop(f"{tag} send 0", f"{tag} recv 0", f"{tag} send 1", f"{tag} recv 1")

    # -- phases --------------------------------------------------------------------------
    def setup(self) -> None:
        """:func:`~fullgraph.training.assembly.assemble_rank` on the loaded part."""
        led, p, g = self.led, self.p, self.g
        n, h, e, S = p.num_inner, p.num_halo, p.num_edges, p.num_send
        F = g.num_features
        led.phase = "setup"
        # the part as loaded (read into memory): ids, CSR, degrees, send list; features
        led.add("part ids", "structure", 2 * I64 * (n + h) + I64 * (n + 1) + I64 * S)
        led.add("part indices", "structure", I64 * e)
        led.add("x", "features", F32 * n * F)
        led.add("labels and masks", "features", (I64 + 3) * n)
        ep = e
        if self.cfg.model == "gcn":  # with_self_loops (int64 ids), then the GCN weights
            ep = e + n
            led.add("operator ids", "structure", I64 * ep)
            led.add("normalisation temporaries", "working", 3 * I64 * ep)
            led.add("operator values", "structure", F32 * ep)
            led.drop("normalisation temporaries")
            # rows no longer sorted by column: the stable sort and its sorted copy
            led.add("sort temporaries", "working", 3 * I64 * ep)
            led.add("sorted operator", "structure", (I64 + F32) * ep)
            led.drop("sort temporaries", "operator ids", "operator values")
            led.rename("sorted operator", "operator")
        else:  # mean weights: one row id per entry while the values are made
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
        led.add("nonzero count", "working", n * F)  # (x != 0), the sparse-input test
        led.drop("nonzero count")
        # the caller lets the part go: its ids, CSR and degrees leave (x, labels stay shared)
        led.drop("part ids", "part indices")
        params = parameter_count(self.cfg, F, g.num_classes)
        led.add("parameters, gradients, Adam moments", "optimizer", 4 * F32 * params)
        if self.cfg.error_feedback and self.codecs is not None:
            self._residuals()
        self._slice_structure(eh)

    def _pruned_last_layer(self, ep: int, eh: int) -> None:
        """Receptive-field pruning (:mod:`fullgraph.distributed.receptive_field`): the last
        layer's operator over the training rows, its transpose and plan. Its share of the edges
        is taken as the training rows' share of the rows; the layers below are taken as whole
        (on graphs of mean degree >> 1/train share they are: the training nodes' in-neighbours
        cover almost every node)."""
        cfg, p, led = self.cfg, self.p, self.led
        if cfg.prune != "auto" or cfg.model not in ("gcn", "sage") or cfg.norm == "batch":
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
        led, p, dims, g = self.led, self.p, self.dims, self.g
        n, h, S, t = p.num_inner, p.num_halo, p.num_send, p.num_train
        F, C, L = dims[0], dims[-1], len(dims) - 1
        dropped = self.p_in > 0 and not self.pre
        rebuild = dropped  # the dropped input is a constant the layer recomputes
        led.phase = "forward, input dropout"
        cur = "x"
        if dropped:
            led.add("dropout mask", "working", F32 * n * F)
            led.add("h0", "working", F32 * n * F)
            led.drop("dropout mask")
            cur = "h0"
        layer_saved: list[list[str]] = []
        for i in range(L):
            d, o = dims[i], dims[i + 1]
            led.phase = f"forward, layer {i}"
            pre = i == 0 and self.pre
            tf = not pre and o <= d
            saved: list[str] = []
            codec = self._codec(0, True)
            if tf:
                led.add(f"Z{i}", "working", F32 * n * o)
                self.exchange(f"fwd{i}", o, S, h, codec, [(f"Y{i}", "working", F32 * n * o)])
                led.drop(f"Z{i}")
                keep_h = not (i == 0 and rebuild)
            else:
                if not pre:
                    self.exchange(f"fwd{i}", d, S, h, codec, [(f"M{i}", "saved", F32 * n * d)])
                    saved.append(f"M{i}")
                led.add(f"Y{i}", "working", F32 * n * o)
                keep_h = self.root and not (i == 0 and rebuild)
            if cur != "x":
                if keep_h or i > 0:  # a hidden input is also the activation's saved output
                    led.rename(cur, cur, "saved")
                    saved.append(cur)
                else:
                    led.drop(cur)
            layer_saved.append(saved)
            if i < L - 1:  # ReLU-dropout in place: Y_i becomes h_{i+1}
                led.rename(f"Y{i}", f"h{i + 1}")
                cur = f"h{i + 1}"
        led.phase = "loss"
        led.rename(f"Y{L - 1}", "logits")
        led.add("loss rows", "working", (2 * F32 * C + I64) * t)
        led.drop("logits")  # fit() lets the logits go before the backward pass
        led.add("dY", "working", F32 * n * C)
        led.drop("loss rows")
        for i in reversed(range(L)):
            d, o = dims[i], dims[i + 1]
            led.phase = f"backward, layer {i}"
            pre = i == 0 and self.pre
            tf = not pre and o <= d
            codec = self._codec(1, True)
            if i > 0:
                led.add("dh", "working", F32 * n * d)
            rebuilt = i == 0 and rebuild and (tf or self.root)
            if rebuilt:  # hashed_dropout again: its mask, then the rows
                led.add("dropout mask", "working", F32 * n * F)
                led.add("h0 rebuilt", "working", F32 * n * F)
                led.drop("dropout mask")
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
            led.drop("h0 rebuilt", "dY", *layer_saved[i])
            if i > 0 and self.cfg.dropout > 0:
                led.rename("dh", "dY")  # ReLU-dropout's backward in place
            elif i > 0:  # ReLU's backward makes a new gradient
                led.add("dY", "working", F32 * n * d)
                led.drop("dh")
        led.phase = "gradient all-reduce"
        params = parameter_count(self.cfg, F, C)
        led.add("all-reduce vectors", "optimizer", 2 * F32 * (params + 1))
        led.drop("all-reduce vectors")

    def evaluate(self) -> None:
        """The evaluation forward pass (no dropout, float32 exchanges, nothing saved)."""
        led, p, dims = self.led, self.p, self.dims
        n, h, S = p.num_inner, p.num_halo, p.num_send
        L = len(dims) - 1
        cur = "x"
        for i in range(L):
            d, o = dims[i], dims[i + 1]
            led.phase = f"evaluation, layer {i}"
            pre = i == 0 and self.pre
            tf = not pre and o <= d
            if tf:
                led.add(f"Z{i}", "working", F32 * n * o)
                self.exchange(f"eval{i}", o, S, h, None, [(f"Y{i}", "working", F32 * n * o)])
                led.drop(f"Z{i}")
            else:
                if not pre:
                    self.exchange(f"eval{i}", d, S, h, None, [(f"M{i}", "working", F32 * n * d)])
                led.add(f"Y{i}", "working", F32 * n * o)
                led.drop(f"M{i}")
            if cur != "x":
                led.drop(cur)
            cur = f"Y{i}"
        led.add("predictions", "working", (I64 + 1) * n)
        led.drop(cur, "predictions")


def predict_rank(part: PartShape, graph: GraphShape, cfg: TrainConfig, floor: int) -> Prediction:
    """The predicted peak of one rank: set-up, a training step and an evaluation replayed.

    Args:
        part: the rank's sizes.
        graph: the partition's sizes.
        cfg: the run's configuration (:func:`check_modelled` must accept it).
        floor: the process floor, bytes (:func:`measure_floor`).

    Returns:
        The :class:`Prediction` (its terms add up to its total).
    """
    check_modelled(cfg)
    rank = _Rank(part, graph, cfg, floor)
    rank.setup()
    rank.train_step()
    rank.evaluate()
    led = rank.led
    return Prediction(rank=part.rank, phase=led.peak_phase, terms=dict(led.peak_terms))


def predict(graph: GraphShape, cfg: TrainConfig, floor: int) -> list[Prediction]:
    """:func:`predict_rank` for every rank of the partition."""
    return [predict_rank(p, graph, cfg, floor) for p in graph.parts]


def _tiny_part(num_features: int, num_classes: int) -> Any:
    """A 64-node graph (a ring with chords) with the real widths, as a one-rank part."""
    import numpy as np
    import scipy.sparse as sp

    from fullgraph.datasets.graph import Graph
    from fullgraph.partition.whole import whole_graph_part

    n = 64
    rng = np.random.default_rng(0)
    src = np.concatenate([np.arange(n), rng.integers(0, n, 3 * n)])
    dst = np.concatenate([(np.arange(n) + 1) % n, rng.integers(0, n, 3 * n)])
    a = sp.csr_matrix((np.ones(src.size, bool), (dst, src)), shape=(n, n))
    a = (a + a.T).tocsr()
    a.setdiag(False)
    a.eliminate_zeros()
    a.sort_indices()
    y = np.arange(n) % max(num_classes, 1)
    train = np.arange(n) % 2 == 0
    graph = Graph(
        name="floor-probe",
        num_nodes=n,
        indptr=a.indptr.astype(np.int64),
        indices=a.indices.astype(np.int64),
        x=rng.normal(size=(n, num_features)).astype(np.float32),
        y=y.astype(np.int64),
        train_mask=train,
        val_mask=~train,
        test_mask=np.zeros(n, bool),
        num_classes=max(num_classes, 1),
    )
    return whole_graph_part(graph)


def current_rss_bytes() -> int:
    """This process's resident memory now, bytes (``/proc/self/statm``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:  # no procfs: the peak so far
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_floor(cfg: TrainConfig, num_features: int, num_classes: int) -> int:
    """The process floor: this process's resident memory once every kernel of the run has run.

    Trains the configured model for two epochs on a 64-node graph in this process (the
    kernels' code, torch's and numba's pools and workspaces load as they would in epoch 1),
    then returns the resident memory after the graph and model are gone. Call it in a process
    that has imported the training stack and started MPI, as a rank has.

    Args:
        cfg: the run's configuration (model, widths, dropout, compression).
        num_features: the real input width.
        num_classes: the real number of classes.

    Returns:
        Bytes.
    """
    import gc

    from fullgraph.distributed.communicator import Communicator
    from fullgraph.training.job import RunOptions
    from fullgraph.training.trainer import Trainer

    # the run's model and exchange options; a gentle learning rate (the probe's steps only
    # load code: a run's own lr could make the tiny model diverge, which is not the point)
    probe = TrainConfig(**{**cfg.to_dict(), "epochs": 2, "eval_every": 1, "lr": 1e-3, "extra": {}})
    trainer = Trainer(_tiny_part(num_features, num_classes), Communicator(), probe,
                      RunOptions(quiet=True))  # fmt: skip
    for epoch in (1, 2):  # the steps and evaluations of fit(), without its hooks and log
        trainer.train_step(epoch)
        trainer.evaluate()
    del trainer
    gc.collect()
    return current_rss_bytes()
