"""The memory model's replay of the per-row layers (a layer kind's
:attr:`~fullgraph.models.layers.GraphLayer.replay` ``rows``: ``--model mlp`` and ``appnp``,
:mod:`fullgraph.models.layers.mlp` and :mod:`~fullgraph.models.layers.appnp`).

Per layer ``i`` with input width ``d`` and output width ``o``:

- **set-up**: ``mlp`` has no operator (an empty one: row pointers only) and keeps no edge
  structure; ``appnp`` builds GCN's operator (:mod:`fullgraph.memory.linear`'s set-up, with the
  self-loops), the slices' halo blocks of its class-wide exchanges. No precomputed aggregation,
  no pruning.
- **forward**: the product ``Y = h W^T + b`` (``4 n o``), its input kept for the weight
  gradient (a dropped first-layer input too); under bf16-mixed the input's bfloat16 copy
  (``2 n d``, kept in training), the bfloat16 product and the float32 output before and after
  the bias. ``appnp``'s last layer then propagates ``K`` steps: ``H`` and ``alpha H`` alive
  throughout, per step one exchange of ``C`` columns (bfloat16 rows under bf16-mixed, with the
  float64 sums of the boundary rows) into a new ``Z_k`` while ``Z_(k-1)`` is alive; nothing is
  kept for the backward pass.
- **backward**: ``appnp``'s propagation first, per step the scaled output gradient, its
  reverse exchange into ``Â^T`` of it, and the sum of ``alpha H``'s gradients (``4 n C`` at
  most), then ``H``'s gradient; every layer but the first (a constant input) then its input
  gradient ``dY W`` (``4 n d``; under bf16-mixed from the bfloat16 ``dY`` and product).
"""

from __future__ import annotations

import dataclasses

from fullgraph.memory.ledger import BF16, F32, F64, I32, I64
from fullgraph.memory.linear import LinearRank
from fullgraph.memory.shapes import GraphShape, PartShape
from fullgraph.training.config import TrainConfig
from fullgraph.training.train_rows import restricts_stack


class RowRank(LinearRank):
    """:class:`~fullgraph.memory.replay.RankReplay` with per-row layers (and ``appnp``'s
    propagation after the last)."""

    def __init__(
        self,
        part: PartShape,
        graph: GraphShape,
        cfg: TrainConfig,
        floor: int,
        predict: bool = False,
    ) -> None:
        super().__init__(part, graph, cfg, floor, predict)
        self.pre = False  # nothing to aggregate once
        #: propagation steps after the last layer (``appnp``'s ``K``; 0: none)
        self.hops = int(getattr(self.model.layers[-1], "hops", 0))
        #: training steps run on the training rows alone (:mod:`fullgraph.training.train_rows`)
        self.rows_only = restricts_stack(self.model, cfg) and not predict

    def train_rows_inputs(self, hops_width: int = 0, elem: int = F32) -> None:
        """What :func:`~fullgraph.training.train_rows.train_rows` keeps for the run: the
        training rows' features, labels, ids and rows, and their precomputed hops
        (``hops_width`` values of ``elem`` bytes a row; 0: the stack reads no hops)."""
        if not self.rows_only:
            return
        t, F = self.p.num_train, self.g.num_features
        hops = elem * t * hops_width
        self.led.add("training rows", "features", hops + F32 * t * F + 4 * I64 * t)

    def train_step(self) -> None:
        """:meth:`~fullgraph.memory.replay.RankReplay.train_step`, on the training rows alone
        where the trainer restricts it."""
        if not self.rows_only:
            super().train_step()
            return
        whole = self.p
        self.p = dataclasses.replace(whole, num_inner=whole.num_train)
        try:
            super().train_step()
        finally:
            self.p = whole

    def setup(self) -> None:
        """:func:`~fullgraph.training.assembly.assemble_rank` for a per-row stack."""
        if self.hops:
            super().setup()  # GCN's operator, its blocks, transposes and slices
            return
        led, p = self.led, self.p
        n, h, S = p.num_inner, p.num_halo, p.num_send
        led.phase = "setup"
        self._loaded_part("part indices")
        # the empty operator: its blocks' and their transposes' row pointers
        led.add("operator", "structure", I64 * (3 * (n + 1) + h + 1))
        led.add("plan send list", "structure", I64 * S)
        led.add("dropout ids", "structure", I64 * n)
        led.add("nonzero count", "working", n * self.g.num_features)
        led.drop("nonzero count")
        led.drop("part ids", "part indices")  # no edge structure is kept
        if self.g.edge_value_bytes(p):
            led.drop("part edge values")
        self.train_rows_inputs()
        self._parameters()

    def _slice_structure(self, halo_edges: int) -> None:
        """The slices' halo blocks of the propagation's ``C``-wide exchanges."""
        p = self.p
        self._slices(self.dims[-1], None)
        for k in sorted(self.slice_counts):
            reached = min(k * p.num_inner, halo_edges)
            nbytes = (I32 + F32) * 2 * halo_edges + 2 * I64 * reached
            nbytes += I64 * (p.num_halo + k) + I64 * (p.num_send + p.num_halo)
            self.led.add(f"slices of {k}", "structure", nbytes)

    def _residuals(self) -> None:
        """Error feedback: every propagation step's rows forward (``4 S C``), their gradients
        back (``4 h C``)."""
        p, C = self.p, self.dims[-1]
        fwd, bwd = self.codecs or ("none", "none")
        total = self.hops * C * F32 * (p.num_send if fwd != "none" else 0)
        total += self.hops * C * F32 * (p.num_halo if bwd != "none" else 0)
        self.led.add("error-feedback residuals", "compression", total)

    def layer_forward(self, i: int, training: bool, rebuild: bool) -> tuple[list[str], bool]:
        """Layer ``i``: leaves ``Y{i}`` live; returns what it saves (its input's bfloat16 copy
        under bf16-mixed) and that it keeps its input."""
        led, n = self.led, self.p.num_inner
        d, o = self.dims[i], self.dims[i + 1]
        term = "saved" if training else "working"
        saved: list[str] = []
        if self.bf16:  # the bf16 copy the product reads (kept for dW), the bias added after
            led.add(f"h{i} bf16", term, BF16 * n * d)
            led.add(f"Y{i} bf16", "working", BF16 * n * o)
            led.add(f"Y{i} unbiased", "working", F32 * n * o)
            led.drop(f"Y{i} bf16")
            led.add(f"Y{i}", "working", F32 * n * o)
            led.drop(f"Y{i} unbiased")
            if training:
                saved.append(f"h{i} bf16")
            else:
                led.drop(f"h{i} bf16")
        else:
            led.add(f"Y{i}", "working", F32 * n * o)
        if self.hops and i == len(self.dims) - 2:
            self._propagate_forward(i, training)
        return saved, True

    def _propagate_forward(self, i: int, training: bool) -> None:
        """``K`` steps from ``H = Y{i}``: ``Z_k`` replaces ``Z_(k-1)``, ``H`` and ``alpha H``
        alive throughout; ``Y{i}`` is ``Z_K`` at the end."""
        led, p = self.led, self.p
        n, h, S, C = p.num_inner, p.num_halo, p.num_send, self.dims[-1]
        pending = min(n, p.halo_edges) if self.g.num_parts > 1 else 0
        codec = self._codec(0, training)
        tag = f"fwd{i}" if training else f"eval{i}"
        led.add("alpha H", "working", F32 * n * C)
        current = f"Y{i}"
        for k in range(1, self.hops + 1):
            new = [(f"Z{k}", "working", F32 * n * C)]
            if self.bf16:  # the rows read in bf16, the boundary rows' sums in float64
                led.add(f"Z{k - 1} bf16", "working", BF16 * n * C)
                new.append((f"Z{k} sums", "working", F64 * pending * C))
            self.exchange(f"{tag} step {k}", C, S, h, codec, new, BF16 if self.bf16 else F32)
            led.drop(f"Z{k - 1} bf16", f"Z{k} sums")
            if current != f"Y{i}":
                led.drop(current)
            current = f"Z{k}"
        led.drop("alpha H", f"Y{i}")
        led.rename(current, f"Y{i}")

    def layer_backward(self, i: int, rebuild: bool) -> None:
        """Layer ``i``'s backward pass: from ``dY`` live to ``dh`` (for ``i > 0``) live."""
        led, n = self.led, self.p.num_inner
        d, o = self.dims[i], self.dims[i + 1]
        if self.hops and i == len(self.dims) - 2:
            self._propagate_backward()
        if i == 0:  # the input is a constant: the weights' gradients only
            return
        if self.bf16:  # dY and the product in bf16, the input gradient widened by autograd
            led.add("dY bf16", "working", BF16 * n * o)
            led.add("dh bf16", "working", BF16 * n * d)
            led.add("dh", "working", F32 * n * d)
            led.drop("dY bf16", "dh bf16")
            return
        led.add("dh", "working", F32 * n * d)

    def _propagate_backward(self) -> None:
        """From ``Z_K``'s gradient (``dY``) to ``H``'s (``dY`` again): per step the scaled
        gradient, ``Â^T`` of it (the reverse exchange), ``alpha H``'s gradients summed."""
        led, p = self.led, self.p
        n, h, S, C = p.num_inner, p.num_halo, p.num_send, self.dims[-1]
        codec = self._codec(1, True)
        led.rename("dY", "g")
        for k in range(self.hops, 0, -1):
            if k < self.hops:  # added to alpha H's gradient (the first is held as it is)
                led.add("d alpha H sum", "working", F32 * n * C)
                led.drop("d alpha H")
                led.rename("d alpha H sum", "d alpha H")
            led.add("g scaled", "working", F32 * n * C)
            self.exchange(f"bwd step {k}", C, h, S, codec, [("A^T g", "working", F32 * n * C)])
            led.drop("g scaled")
            if k == self.hops:
                led.rename("g", "d alpha H")
            else:
                led.drop("g")
            led.rename("A^T g", "g")
        # H's gradient: Z_0's plus alpha times alpha H's
        led.add("alpha dH", "working", F32 * n * C)
        led.drop("d alpha H")
        led.add("dY", "working", F32 * n * C)
        led.drop("alpha dH", "g")
