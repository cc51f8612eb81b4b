"""The memory model's replay of the stacks on precomputed hops (a layer kind's
:attr:`~fullgraph.models.layers.GraphLayer.replay` ``hops``: ``--model sgc`` and ``sign``,
:mod:`fullgraph.models.layers.sign`).

With ``W`` the hops' width (``(K + 1) F`` for SIGN, ``F`` for SGC):

- **set-up**: the part, the empty operator of the per-row layers, then the precompute
  (:func:`~fullgraph.propagation.features.hop_features`) as when nothing is cached (a cached
  entry needs less: the hops alone): the propagation operator (with GCN's self-loops for
  ``gcn`` and ``ppr``) split into its blocks and their ordered row splits, the hops' buffer
  ``4 n W`` (kept: the ``features`` term), per hop the previous and the new hop ``4 n F``
  each and one float32 exchange of ``F`` columns, ``alpha X`` for ``ppr``; under bf16-mixed the
  hops' bfloat16 copy (``2 n W``) replaces the buffer. The operator then goes.
- **layers**: the first reads the hops; in training with input dropout their dropped copy
  (``4 n W``) is kept for the weight gradients, with the mask while it is drawn; SIGN's
  inception layer holds its per-hop outputs and their concatenation (``4 n (K + 1) H`` each)
  at once. The other layers are :class:`~fullgraph.memory.rows.RowRank`'s per-row layers.
"""

from __future__ import annotations

from fullgraph.memory.ledger import BF16, F32, I32, I64
from fullgraph.memory.rows import RowRank
from fullgraph.memory.shapes import GraphShape, PartShape
from fullgraph.propagation.hops import hop_width
from fullgraph.training.config import TrainConfig


class HopsRank(RowRank):
    """:class:`~fullgraph.memory.replay.RankReplay` of SGC and SIGN (per-row layers on the
    hops)."""

    def __init__(
        self,
        part: PartShape,
        graph: GraphShape,
        cfg: TrainConfig,
        floor: int,
        predict: bool = False,
    ) -> None:
        super().__init__(part, graph, cfg, floor, predict)
        self.hops = 0  # no propagation after the last layer (appnp's)
        self.pre = True  # the first layer reads the hops; its input dropout drops them
        propagation, k, _ = self.kind.hop_options(self.options)
        self.propagation, self.num_hops = propagation, k
        #: the hops' width ``W``
        self.width = hop_width(self.kind.hop_input or "last", k, graph.num_features)
        #: the first layer is SIGN's inception layer (its per-hop outputs, concatenated)
        self.inception = self.kind.hop_input == "all" and len(self.dims) > 2

    def setup(self) -> None:
        """:func:`~fullgraph.training.assembly.assemble_rank` for SGC and SIGN."""
        led, p = self.led, self.p
        n, h, S = p.num_inner, p.num_halo, p.num_send
        led.phase = "setup"
        self._loaded_part("part indices")
        led.add("operator", "structure", I64 * (3 * (n + 1) + h + 1))  # the empty one
        led.add("plan send list", "structure", I64 * S)
        led.add("dropout ids", "structure", I64 * n)
        self._precompute()  # the set-up's peak: the hops computed (nothing cached yet)
        led.add("nonzero count", "working", n * self.g.num_features)
        led.drop("nonzero count")
        led.drop("part ids", "part indices")  # no edge structure is kept
        if self.g.edge_value_bytes(p):
            led.drop("part edge values")
        self.train_rows_inputs(self.width, BF16 if self.bf16 else F32)
        self._parameters()

    def _precompute(self) -> None:
        """The propagation operator, then ``K`` hops into the kept buffer."""
        led, p = self.led, self.p
        n, h, S, e = p.num_inner, p.num_halo, p.num_send, p.num_edges
        F = self.g.num_features
        ep = e + n if self.propagation in ("gcn", "ppr") else e  # GCN's self-loops
        led.add("hop operator build", "working", 3 * I64 * ep + (I64 + F32) * ep)
        blocks = (I32 + F32) * ep + 2 * I64 * (n + 1)
        led.add("hop operator", "structure", blocks)
        led.drop("hop operator build")
        led.add("hop operator order", "structure", blocks + 2 * I64 * n)  # the ordered rows
        led.add("hops", "features", F32 * n * self.width)
        if self.propagation == "ppr":
            led.add("alpha X", "working", F32 * n * F)
        previous = None
        for k in range(1, self.num_hops + 1):
            self.exchange(f"hop {k}", F, S, h, None, [(f"hop {k}", "working", F32 * n * F)])
            if previous is not None:
                led.drop(previous)
            previous = f"hop {k}"
        led.drop(previous or "", "alpha X", "hop operator", "hop operator order")
        if self.bf16:  # kept in bfloat16, the dtype the first product reads
            led.add("hops bf16", "features", BF16 * n * self.width)
            led.drop("hops")

    def layer_forward(self, i: int, training: bool, rebuild: bool) -> tuple[list[str], bool]:
        """Layer ``i``: the first reads the hops (their dropped copy kept in training with
        input dropout); the others are per-row layers. Leaves ``Y{i}`` live."""
        if i > 0:
            return super().layer_forward(i, training, rebuild)
        led, n, o = self.led, self.p.num_inner, self.dims[1]
        elem = BF16 if self.bf16 else F32
        saved: list[str] = []
        if training and self.p_in > 0:
            led.add("dropout mask", "working", F32 * n * self.width)
            led.add("hops dropped", "saved", elem * n * self.width)
            led.drop("dropout mask")
            saved.append("hops dropped")
        if self.bf16:  # the bf16 products, widened
            led.add("Y0 bf16", "working", BF16 * n * o)
        if self.inception:  # every hop's product, then their concatenation
            led.add("Y0 hops", "working", F32 * n * o)
        led.add("Y0", "working", F32 * n * o)
        led.drop("Y0 bf16", "Y0 hops")
        if not training:
            led.drop(*saved)
            saved = []
        return saved, True
