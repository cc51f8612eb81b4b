"""The memory model's replay of GAT layers (:mod:`fullgraph.models.layers.gat`).

Per layer ``i`` with input width ``d``, ``k`` heads of width ``w`` (the last layer: the classes,
averaged) and ``ext = k (w + 2)`` columns of ``[x W | a_src . x' | a_dst . x']``:

- **set-up**: no aggregation operator; the part's in-edges stay as the attention graph (its
  ``8 e`` column ids, row pointers and the local nodes' global ids), its transpose by source
  (``16 e``, built once, kept), the exchange plan and the dropout ids.
- **forward**: when the input is narrower than ``k (w + 1)`` (what the layer exchanges then),
  the halo input rows arrive (``4 h d``), the rows and halo rows are joined (``4 (n + h) d``,
  kept for the weight gradient) and projected (``4 (n + h) ext``, kept by the attention);
  otherwise the inner rows are projected (``4 n ext``), their first ``k (w + 1)`` columns
  exchanged, and the joined rows (``4 (n + h) k (w + 1)``) kept. The attention keeps the
  destination terms and the per-row maximum and denominator (``12 n k``), never a per-edge
  tensor; its output is ``4 n k w``, the bias adds a new ``4 n o``.
- **backward**: the per-edge coefficients and score gradients are recomputed (``8 E k``,
  transient), the rows' gradient has the rows' shape, then the halo rows' gradients go back to
  their owners (``4 S`` rows received, summed into a new ``4 n`` block) and the input's
  gradient ``4 n d`` is formed.
"""

from __future__ import annotations

from fullgraph.memory.ledger import F32, I64
from fullgraph.memory.replay import RankReplay


class GATRank(RankReplay):
    """:class:`~fullgraph.memory.replay.RankReplay` with GAT layers."""

    def _heads(self, i: int) -> tuple[int, int]:
        """``(heads, width per head)`` of layer ``i``."""
        layer = self.model.layers[i]
        return layer.heads, layer.width

    def _exchanges_input(self, i: int) -> bool:
        """Whether layer ``i`` exchanges its input rows (else the projected rows)."""
        return self.g.num_parts > 1 and self.model.layers[i].exchanges_input

    def setup(self) -> None:
        """:func:`~fullgraph.training.assembly.assemble_rank` for GAT."""
        led, p, g = self.led, self.p, self.g
        n, h, e, S = p.num_inner, p.num_halo, p.num_edges, p.num_send
        F = g.num_features
        led.phase = "setup"
        self._loaded_part("attention graph")  # the part's column ids are kept
        led.add("plan send list", "structure", I64 * S)
        led.add("dropout ids", "structure", I64 * n)
        led.add("nonzero count", "working", n * F)
        led.drop("nonzero count")
        led.drop("part ids")  # its global ids and row pointers stay with the attention graph
        led.add("attention ids", "structure", I64 * (n + h) + I64 * (n + 1))
        led.add("self-loop test", "working", I64 * e + e)  # row of every entry
        led.drop("self-loop test")
        # the transpose by source node, built on first use and kept
        led.add("transpose temporaries", "working", 2 * I64 * e)
        led.add("attention transpose", "structure", 2 * I64 * e + I64 * (n + h + 1))
        led.drop("transpose temporaries")
        self._parameters()
        if self.cfg.error_feedback and self.codecs is not None:
            self._residuals()

    def _halo_in(self, tag: str, width: int, training: bool, direction: int) -> None:
        """A blocking exchange (:class:`~fullgraph.distributed.halo.HaloExchange`): forward
        leaves ``{tag} rows`` (the ``h`` rows received) live; backward ``{tag} rows`` (``n``
        rows: the ``S`` received gradients summed into zeros)."""
        led, p = self.led, self.p
        n, h, S = p.num_inner, p.num_halo, p.num_send
        codec = self._codec(direction, training)
        if direction == 0:
            self.exchange(tag, width, S, h, codec, [])
            led.add(f"{tag} rows", "working", F32 * h * width)
        else:
            self.exchange(tag, width, h, S, codec, [(f"{tag} rows", "working", F32 * n * width)])

    def layer_forward(self, i: int, training: bool, rebuild: bool) -> tuple[list[str], bool]:
        """Layer ``i``: leaves ``Y{i}`` live; returns what it saves and whether it saves its
        input (the projection of the inner rows does)."""
        led, p = self.led, self.p
        n, h = p.num_inner, p.num_halo
        d, o = self.dims[i], self.dims[i + 1]
        k, w = self._heads(i)
        ext, sent = k * (w + 2), k * (w + 1)
        term = "saved" if training else "working"
        tag = f"fwd{i}" if training else f"eval{i}"
        if self._exchanges_input(i):
            self._halo_in(tag, d, training, 0)
            led.add(f"cat{i}", term, F32 * (n + h) * d)
            led.drop(f"{tag} rows")
            led.add(f"rows{i}", term, F32 * (n + h) * ext)
            saved, keep_h = [f"cat{i}", f"rows{i}"], False
        else:
            led.add(f"local rows{i}", "working", F32 * n * ext)
            if self.g.num_parts > 1:
                self._halo_in(tag, sent, training, 0)
                led.add(f"rows{i}", term, F32 * (n + h) * sent)
                led.drop(f"{tag} rows")
            saved, keep_h = [f"rows{i}"], True
        led.add(f"adst{i}", term, F32 * n * k)
        led.add(f"row stats{i}", term, 2 * F32 * n * k)
        saved += [f"adst{i}", f"row stats{i}"]
        led.add(f"att{i}", "working", F32 * n * k * w)
        if self.g.num_parts == 1 and not self._exchanges_input(i):
            led.rename(f"local rows{i}", f"rows{i}", term)  # kept by the attention
        led.drop(f"local rows{i}")
        if k > 1 and o == w:  # the last layer averages its heads
            led.add(f"head mean{i}", "working", F32 * n * o)
            led.drop(f"att{i}")
        led.add(f"Y{i}", "working", F32 * n * o)  # + bias
        led.drop(f"att{i}", f"head mean{i}")
        if not training:
            led.drop(*saved)
        return saved, keep_h

    def layer_backward(self, i: int, rebuild: bool) -> None:
        """Layer ``i``'s backward pass: from ``dY`` to ``dh`` (for ``i > 0``)."""
        led, p = self.led, self.p
        n, h, e = p.num_inner, p.num_halo, p.num_edges
        d, o = self.dims[i], self.dims[i + 1]
        k, w = self._heads(i)
        ext, sent = k * (w + 2), k * (w + 1)
        inputs = self._exchanges_input(i)
        if k > 1 and o == w:  # the heads' mean, spread back
            led.add("d heads", "working", F32 * n * k * w)
        rows = (n + h) * (ext if inputs else sent) if self.g.num_parts > 1 else n * ext
        led.add("edge coefficients", "working", 2 * F32 * (e + n) * k)
        led.add("grad adst", "working", F32 * n * k)
        led.add("grad rows", "working", F32 * rows)
        led.drop("edge coefficients", "d heads", f"rows{i}", f"adst{i}", f"row stats{i}")
        if inputs:  # d cat = d rows W; its halo rows' gradients go to their owners
            led.drop("grad adst")
            if i > 0:
                led.add("d cat", "working", F32 * (n + h) * d)
            led.drop("grad rows", f"cat{i}")
            if i > 0:
                self._halo_in(f"bwd{i}", d, True, 1)
                led.add("dh", "working", F32 * n * d)
                led.drop("d cat", f"bwd{i} rows")
            return
        if self.g.num_parts > 1:  # the halo part of the rows' gradient goes back
            self._halo_in(f"bwd{i}", sent, True, 1)
            led.add("d local rows", "working", F32 * n * ext)
            led.drop(f"bwd{i} rows")
        else:
            led.rename("grad rows", "d local rows")
        led.drop("grad rows", "grad adst")
        if i > 0:
            led.add("dh", "working", F32 * n * d)
        led.drop("d local rows")
