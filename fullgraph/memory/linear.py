"""The memory model's replay of the layers whose body is
:func:`~fullgraph.models.graph_linear.graph_linear` on an operator (a layer kind's
:attr:`~fullgraph.models.layers.GraphLayer.replay` ``linear``: GCN, SAGE and GraphConv with the
mean or the sum, GIN): the operator's set-up (with GCN's self-loops, a kind's
:attr:`~fullgraph.models.layers.GraphLayer.self_loops`), receptive-field pruning, the slices'
halo blocks, and every layer forward (float32 or bf16-mixed) and backward."""

from __future__ import annotations

from fullgraph.memory.ledger import BF16, F32, F64, I32, I64
from fullgraph.memory.replay import RankReplay
from fullgraph.models.graph_linear import BLOCK_ELEMENTS  # the row blocks the layer body uses

#: Transient bytes per stored entry of building one transpose (:meth:`CSRMatrix.t`): the
#: entry permutation (int32), scipy's CSC copy (int32 ids and permuted values), the order as
#: int64, the transposed ids as int64 then int32, the permuted values.
TRANSPOSE_BYTES_PER_ENTRY = 4 + 8 + 8 + 8 + 4 + 4


class LinearRank(RankReplay):
    """:class:`~fullgraph.memory.replay.RankReplay` with ``linear`` layers."""

    def setup(self) -> None:
        """:func:`~fullgraph.training.assembly.assemble_rank` on the loaded part."""
        led, p, g = self.led, self.p, self.g
        n, h, e, S = p.num_inner, p.num_halo, p.num_edges, p.num_send
        F = g.num_features
        led.phase = "setup"
        self._loaded_part("part indices")
        ep = e
        if self.kind.self_loops:  # with_self_loops (int64 ids), then the GCN weights
            ep = e + n
            led.add("operator ids", "structure", I64 * ep)
            if self.options.edge_weight or self.options.improved:  # float64 weights, degrees, mask
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
                sums = [
                    (f"M{i} f32", "working", F32 * n * d),
                    (f"M{i} sums", "working", F64 * pending * d),
                ]
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
