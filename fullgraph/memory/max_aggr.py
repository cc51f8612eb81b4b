"""The memory model's replay of the max layers (``--model sage`` or ``graphconv`` with
``--aggr max``; :class:`~fullgraph.models.layers.sage.SAGEMaxLayer`).

Per layer ``i`` with input width ``d`` and output width ``o``:

- **set-up**: no operator (an empty one: row pointers only) and no precomputed aggregation;
  the part's in-edges stay as the edge structure (its ``8 e`` column ids, row pointers and the
  local nodes' global ids, the tie-break), the exchange plan and the dropout ids.
- **forward**: the halo rows of the input arrive whole (``4 h d``,
  :class:`~fullgraph.distributed.halo.HaloExchange`), are joined to the inner rows
  (``4 (n + h) d``, let go once the maximum is taken); the maximum ``M`` (``4 n d``, kept for
  ``W_l``'s gradient) and its argmax (``4 n d``, int32, kept); the output ``4 n o`` with the root
  term added in place (the input is kept for ``W_r``'s gradient).
- **backward**: ``dM = dY W_l`` (``4 n d``) routed to the joined rows' gradient
  (``4 (n + h) d``), whose halo part goes back to its owners (``4 S d`` received, summed into a
  new ``4 n d``), then the three input-gradient terms are added (``dY W_r``, the inner part, the
  returned part). The first layer's input is a constant: no input gradient, no exchange back.
"""

from __future__ import annotations

from fullgraph.memory.ledger import F32, I32, I64
from fullgraph.memory.replay import RankReplay


class MaxRank(RankReplay):
    """:class:`~fullgraph.memory.replay.RankReplay` with max layers."""

    def setup(self) -> None:
        """:func:`~fullgraph.training.assembly.assemble_rank` for a max stack."""
        led, p, g = self.led, self.p, self.g
        n, h, S = p.num_inner, p.num_halo, p.num_send
        led.phase = "setup"
        self._loaded_part("edge structure")  # the part's column ids are kept
        # the empty operator: its blocks' and their transposes' row pointers
        led.add("operator", "structure", I64 * (3 * (n + 1) + h + 1))
        led.add("plan send list", "structure", I64 * S)
        led.add("dropout ids", "structure", I64 * n)
        led.add("nonzero count", "working", n * g.num_features)
        led.drop("nonzero count")
        led.drop("part ids")  # its global ids and row pointers stay with the edge structure
        led.add("structure ids", "structure", I64 * (n + h) + I64 * (n + 1))
        self._parameters()
        if self.cfg.error_feedback and self.codecs is not None:
            self._residuals()

    def _residuals(self) -> None:
        """Every layer's input rows go forward (``4 S d``), their gradients back (``4 h d``,
        not the first layer's)."""
        p, dims = self.p, self.dims
        fwd, bwd = self.codecs or ("none", "none")
        total = 0
        for i, d in enumerate(dims[:-1]):
            total += F32 * p.num_send * d if fwd != "none" else 0
            total += F32 * p.num_halo * d if bwd != "none" and i > 0 else 0
        self.led.add("error-feedback residuals", "compression", total)

    def _halo(self, tag: str, width: int, training: bool, direction: int) -> None:
        """A whole blocking exchange: forward leaves ``{tag} rows`` (``h`` rows) live,
        backward ``{tag} rows`` (``n`` rows: the ``S`` received summed into zeros)."""
        led, p = self.led, self.p
        n, h, S = p.num_inner, p.num_halo, p.num_send
        codec = self._codec(direction, training)
        budget, self.budget = self.budget, 1 << 62  # HaloExchange goes whole
        if direction == 0:
            self.exchange(tag, width, S, h, codec, [])
            led.add(f"{tag} rows", "working", F32 * h * width)
        else:
            self.exchange(tag, width, h, S, codec, [(f"{tag} rows", "working", F32 * n * width)])
        self.budget = budget

    def layer_forward(self, i: int, training: bool, rebuild: bool) -> tuple[list[str], bool]:
        """Layer ``i``: leaves ``Y{i}`` live; returns what it saves (the maximum, its argmax)
        and that it keeps its input (the root term's)."""
        led, p = self.led, self.p
        n, h = p.num_inner, p.num_halo
        d, o = self.dims[i], self.dims[i + 1]
        term = "saved" if training else "working"
        tag = f"fwd{i}" if training else f"eval{i}"
        if self.g.num_parts > 1:
            self._halo(tag, d, training, 0)
            led.add(f"joined{i}", "working", F32 * (n + h) * d)
            led.drop(f"{tag} rows")
        led.add(f"M{i}", term, F32 * n * d)
        led.add(f"arg{i}", term, I32 * n * d)
        led.drop(f"joined{i}")
        led.add(f"Y{i}", "working", F32 * n * o)
        saved = [f"M{i}", f"arg{i}"]
        if not training:
            led.drop(*saved)
        return saved, True

    def layer_backward(self, i: int, rebuild: bool) -> None:
        """Layer ``i``'s backward pass: from ``dY`` live to ``dh`` (for ``i > 0``) live."""
        led, p = self.led, self.p
        n, h = p.num_inner, p.num_halo
        d = self.dims[i]
        if i == 0:  # the input is a constant: the weights' gradients only
            return
        led.add("dh root", "working", F32 * n * d)  # dY W_r
        led.add("dM", "working", F32 * n * d)  # dY W_l
        led.add("d joined", "working", F32 * (n + h) * d)
        led.drop("dM")
        if self.g.num_parts > 1:
            self._halo(f"bwd{i}", d, True, 1)
        led.add("dh", "working", F32 * n * d)  # the three terms summed
        led.drop("dh root", "d joined", f"bwd{i} rows")
