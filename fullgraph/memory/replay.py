"""The replay behind the memory model (:mod:`fullgraph.memory.model`): one rank's set-up,
training step and evaluation (or ``fullgraph predict``'s pass), buffer by buffer into a
:class:`~fullgraph.memory.ledger.Ledger`, with ``--norm`` and ``--residual`` between the
layers. :class:`RankReplay` holds what every stack shares (the exchanges, the step, the
evaluation, predict's writes); the layers and the set-up of their operator are a replay family's
(a layer kind's :attr:`~fullgraph.models.layers.GraphLayer.replay`): ``linear``
(:mod:`fullgraph.memory.linear`: GCN, SAGE, GIN, GraphConv), ``attention``
(:mod:`fullgraph.memory.gat`), ``max`` (:mod:`fullgraph.memory.max_aggr`) and ``rows``
(:mod:`fullgraph.memory.rows`: MLP, APPNP)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from fullgraph.distributed.exchange_slices import slice_count
from fullgraph.memory.ledger import F32, I64, TERMS, Ledger
from fullgraph.memory.shapes import GraphShape, PartShape
from fullgraph.training.config import TrainConfig
from fullgraph.training.inference import WRITE_WINDOW_BYTES, window_rows

if TYPE_CHECKING:
    from fullgraph.models.gnn import GNN

__all__ = ["TERMS", "GraphShape", "PartShape", "RankReplay", "parameter_count", "widths"]


def _meta_model(cfg: TrainConfig, num_features: int, num_classes: int, whole: bool = False) -> GNN:
    """The run's :class:`~fullgraph.models.gnn.GNN` on torch's meta device (shapes only): a
    link model's encoder (its decoder too with ``whole``; the pairs' buffers are not
    replayed)."""
    import torch

    from fullgraph.models.link_decoder import LinkModel

    with torch.device("meta"):
        model = cfg.build_model(num_features, num_classes)
    return model.encoder if isinstance(model, LinkModel) and not whole else model


def parameter_count(cfg: TrainConfig, num_features: int, num_classes: int) -> int:
    """Parameters of the model (weights, biases, attention vectors, norms, projections; a
    link model's decoder)."""
    model = _meta_model(cfg, num_features, num_classes, whole=True)
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
        self,
        part: PartShape,
        graph: GraphShape,
        cfg: TrainConfig,
        floor: int,
        predict: bool = False,
    ) -> None:
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
        #: the layer options and the kind's class under them (its traits)
        self.options = cfg.layer_options()
        self.kind = cfg.layer_kind()
        kind = self.kind
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

    def exchange(
        self,
        tag: str,
        width: int,
        sent: int,
        received: int,
        codec: str | None,
        before_wait: list[tuple[str, str, float]],
        elem: int = F32,
    ) -> None:
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
        """:func:`~fullgraph.training.assembly.assemble_rank` on the loaded part (the family's)."""
        raise NotImplementedError

    def layer_forward(self, i: int, training: bool, rebuild: bool) -> tuple[list[str], bool]:
        """Layer ``i``: leaves its output ``Y{i}`` live; returns the buffers it saves for the
        backward pass and whether it also saves its input (the family's)."""
        raise NotImplementedError

    def layer_backward(self, i: int, rebuild: bool) -> None:
        """Layer ``i``'s backward pass: from ``dY`` live to ``dh`` (the input's gradient, for
        ``i > 0``) live (the family's)."""
        raise NotImplementedError

    def _parameters(self) -> None:
        """Training: parameters, gradients and Adam's two moments. Predicting: the parameters
        and the model file's copy of them (the ``optimizer`` term then holds no more)."""
        if self.predicting:
            self.led.add("parameters and the model file's", "optimizer", 2 * F32 * self.params)
        else:
            self.led.add("parameters, gradients, Adam moments", "optimizer", 4 * F32 * self.params)

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
        if self.cfg.task == "link":
            self._link_pairs(C)
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

    def _link_pairs(self, d: int) -> None:
        """A link step's pairs (:mod:`fullgraph.training.link_trainer`): ``m`` pairs of the
        rank (its training edges in one batch, with their negatives), their anchor and target
        rows and the fetched remote rows, the decoder's saved rows, then the backward's pair
        gradients and the ordered terms of every node's sum (``2 m`` rows)."""
        led, p, cfg = self.led, self.p, self.cfg
        total = max(self.g.link_train_total, 1)
        share = min(1.0, cfg.link_batch / total) if cfg.link_batch else 1.0
        m = math.ceil((1 + cfg.neg_ratio) * p.link_train * share)
        fetched = min(m, self.num_nodes - p.num_inner)
        hidden = cfg.decoder_layers if cfg.decoder == "mlp" else 0
        led.phase = "loss, link pairs"
        led.add("pair rows", "working", F32 * d * (2 * m + fetched))
        led.add("decoder rows", "saved", F32 * d * m * hidden)
        led.phase = "backward, link pairs"
        led.add("pair gradients", "working", F32 * d * m * 4 + I64 * 2 * m)
        led.drop("decoder rows", "pair rows")
        led.add("dH", "working", F32 * d * p.num_inner)
        led.drop("pair gradients", "dH")
        led.phase = "loss"

    def _link_scores(self, d: int) -> None:
        """An evaluation's scores: one chunk of pairs' rows at a time, every rank's scores of
        a split gathered on every rank (scores and their rows)."""
        from fullgraph.training.link_pairs import SCORE_CHUNK

        led, g = self.led, self.g
        mine = math.ceil(g.link_eval_pairs * self.p.num_inner / max(self.num_nodes, 1))
        chunk = min(SCORE_CHUNK, mine)  # the rank's pairs: its share of the split's
        fetched = min(chunk, self.num_nodes - self.p.num_inner)
        led.phase = "evaluation, link scores"
        led.add("gathered scores", "working", (F32 + I64) * 2 * g.link_eval_pairs)
        led.add("scored rows", "working", F32 * d * (3 * chunk + fetched))
        led.drop("scored rows", "gathered scores")

    def evaluate(self) -> None:
        """The evaluation forward pass (no dropout, float32 exchanges, nothing saved)."""
        led, p, dims = self.led, self.p, self.dims
        L = len(dims) - 1
        self._forward_without_grad("evaluation")
        if self.cfg.task == "link":
            self._link_scores(dims[-1])
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
