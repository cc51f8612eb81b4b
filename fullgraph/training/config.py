"""What defines a full-batch training run, and where its data comes from.

:class:`TrainConfig` is the experiment (model, optimiser, epochs, halo compression): the fields
a resumed run must share with its checkpoint. :class:`TrainData` says what a rank trains on. Run
I/O (log, checkpoint, resume) and runtime (transport, device, threads, timeout) live in
:mod:`fullgraph.run.options`, shared with the mini-batch baseline. Every field carries its
default, help and check; ``fullgraph train``'s options are generated from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fullgraph.atomic import Place
from fullgraph.config import (
    NON_NEGATIVE,
    OPTIONAL_POSITIVE_INT,
    OPTIONAL_PROBABILITY,
    POSITIVE,
    POSITIVE_INT,
    PROBABILITY,
    SEED,
    Config,
    check_alpha,
    check_number,
    check_path,
    number,
    option,
)
from fullgraph.distributed.compression import CODECS
from fullgraph.errors import ConfigError
from fullgraph.metrics import METRIC_CHOICES
from fullgraph.models.gnn import GNN
from fullgraph.models.layers import (
    GraphLayer,
    LayerOptions,
    check_options,
    joined,
    kinds_with,
    layer_class,
    layer_kinds,
    option_names,
)
from fullgraph.models.layers.base import PROPAGATIONS
from fullgraph.models.layers.sage import AGGREGATIONS
from fullgraph.models.link_decoder import DECODERS, LinkModel, build_decoder
from fullgraph.models.norm import NORMS
from fullgraph.precision import precision_option
from fullgraph.propagation.correct_smooth import CorrectSmoothFields, correct_smooth_option
from fullgraph.run.optim import SCHEDULES

if TYPE_CHECKING:
    from fullgraph.partition import Partition, PartitionDir


class InputDropoutConfig:
    """Methods shared by the run configurations that hold ``dropout`` and ``input_dropout``."""

    dropout: float
    input_dropout: float | None

    def resolved_input_dropout(self) -> float:
        """Input dropout, defaulting to :attr:`dropout`."""
        return self.dropout if self.input_dropout is None else self.input_dropout

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with ``input_dropout`` resolved, for logs and ``config.json``."""
        d = Config.to_dict(self)  # type: ignore[arg-type]
        d["input_dropout"] = self.resolved_input_dropout()
        return d


#: The help of ``--metric`` (``fullgraph train`` and ``fullgraph minibatch``).
METRIC_HELP = (
    "the score reported and the best model picked by: acc, rocauc (binary tasks), auto = the "
    "dataset's own (tolokers: rocauc, ogbn-arxiv: acc, ...), else rocauc for 2 classes, acc "
    "for more"
)
#: The help of ``--split``.
SPLIT_HELP = "which of the dataset's fixed splits (tolokers: 0-9; default 0)"
OPTIONAL_SPLIT = number(low=0, integer=True, optional=True)


def _check_aggr(name: str, value: str | None) -> None:
    """``--aggr``: unset, or one of :data:`~fullgraph.models.layers.sage.AGGREGATIONS`."""
    if value is not None and value not in AGGREGATIONS:
        raise ConfigError(f"{name} must be one of {', '.join(AGGREGATIONS)}, not {value!r}")


#: The deepest model ``--layers`` accepts. Every layer is one halo exchange each way per epoch
#: and its activations kept for the backward pass; the deepest GNNs published train ~1000
#: layers (RevGNN, with reversible layers fullgraph does not have), and a deeper stack of these
#: layers only spends minutes building and oversmoothing (issue 31: 100000 ran silently).
MAX_LAYERS = 1000


def _check_layers(name: str, value: int) -> None:
    """``--layers``: an integer from 1 to :data:`MAX_LAYERS`, refused with the reason."""
    check_number(name, value, low=1, integer=True)
    if value > MAX_LAYERS:
        raise ConfigError(
            f"{name} {value} is beyond the {MAX_LAYERS} layers fullgraph trains (each layer is "
            f"a halo exchange each way per epoch and its activations kept; the deepest "
            f"published GNNs have about {MAX_LAYERS})"
        )


def _only(name: str) -> str:
    """``gcn only``: the kinds that take layer option ``name``, for its help."""
    return f"{joined(kinds_with(lambda c: name in c.accepts))} only"


_CODEC_HELP = (
    "fp16/bf16 casts, intN = per-row min/scale with stochastic rounding, packed; none = float32"
)


#: The most propagation steps ``--hops`` accepts: APPNP's published K is 10, SIGN's and SGC's
#: hops 2-5; beyond this the features are smoothed to the stationary vector and every hop is
#: an exchange of the whole feature width (in precompute) or the class width (APPNP, per epoch).
MAX_HOPS = 100


def _check_hops(name: str, value: int | None) -> None:
    """``--hops``: unset, or an integer from 1 to :data:`MAX_HOPS`."""
    if value is None:
        return
    check_number(name, value, low=1, integer=True)
    if value > MAX_HOPS:
        raise ConfigError(
            f"{name} {value} is beyond the {MAX_HOPS} propagation steps fullgraph runs (every "
            f"step is a halo exchange; by then the features are smoothed to the stationary "
            f"vector)"
        )


def _check_propagation(name: str, value: str | None) -> None:
    """``--propagation``: unset, or one of :data:`PROPAGATIONS`."""
    if value is not None and value not in PROPAGATIONS:
        raise ConfigError(f"{name} must be one of {', '.join(PROPAGATIONS)}, not {value!r}")


#: ``--task``: what a run trains.
TASKS = ("node", "link")

#: ``--sums``: the block tree (the bit-identical contract) or today's rank-order all-reduce.
SUMS = ("tree", "rank-order")


@dataclass
class TrainConfig(InputDropoutConfig, CorrectSmoothFields, Config):
    """The experiment of a full-batch run (saved in ``config.json`` and the checkpoint)."""

    model: str = option("gcn", "layer kind", choices=layer_kinds())
    layers: int = option(
        2,
        f"number of layers (at most {MAX_LAYERS})",
        check=_check_layers,
    )
    hidden: int = option(16, "hidden width", check=POSITIVE_INT)
    dropout: float = option(0.5, "dropout before hidden layers", check=PROBABILITY)
    input_dropout: float | None = option(
        None, "dropout of the input (default --dropout)", check=OPTIONAL_PROBABILITY
    )
    heads: int | None = option(
        None,
        f"attention heads of the hidden layers, concatenated ({_only('heads')}; default 1)",
        check=OPTIONAL_POSITIVE_INT,
    )
    output_heads: int | None = option(
        None,
        f"attention heads of the last layer, averaged ({_only('output_heads')}; default 1)",
        check=OPTIONAL_POSITIVE_INT,
    )
    attention_dropout: float | None = option(
        None,
        f"dropout of the attention coefficients ({_only('attention_dropout')}; default --dropout)",
        check=OPTIONAL_PROBABILITY,
    )
    aggr: str | None = option(
        None,
        "neighbour aggregation of sage (default mean) and graphconv (default sum): mean, sum "
        "or max",
        check=_check_aggr,
        metavar="{mean,sum,max}",
    )
    hops: int | None = option(
        None,
        "propagation steps: appnp's K steps of personalised PageRank after its MLP, or the "
        f"hops A^k X sgc and sign precompute (at most {MAX_HOPS}; default: the kind's: sgc 2, "
        "sign 3); sgc's and sign's are kept in --parts DIR/precompute/ for later runs and "
        "predict (recomputed with --force); a whole graph (--dataset, --synthetic) computes "
        "them every run",
        check=_check_hops,
        metavar="K",
    )
    alpha: float | None = option(
        None,
        "teleport probability of personalised-PageRank propagation, in (0, 1] (appnp, and "
        "--propagation ppr; default 0.1)",
        check=check_alpha,
    )
    propagation: str | None = option(
        None,
        "operator of the precomputed hops (sgc, sign): gcn = D^-1/2 (A + I) D^-1/2 (sgc's "
        "default), sym = D^-1/2 A D^-1/2 without self-loops (sign's default, PyG's SIGN), "
        "mean = the neighbour mean, ppr = personalised-PageRank diffusion on gcn's",
        check=_check_propagation,
        metavar="{" + ",".join(PROPAGATIONS) + "}",
    )
    edge_weight: bool = option(
        False,
        f"{_only('edge_weight')}: weigh every edge with the partition's stored edge weights "
        "(PyG GCNConv with edge_weight; global weighted degrees)",
    )
    improved: bool = option(
        False, f"{_only('improved')}: self-loop weight 2 (PyG GCNConv improved=True)"
    )
    norm: str = option(
        "none",
        "normalisation after every layer but the last: batch (over all nodes, statistics "
        "all-reduced), layer (per node) or none",
        choices=NORMS,
    )
    residual: bool = option(
        False, "add every layer's input to its output (projected when the widths differ)"
    )
    lr: float = option(
        0.01, "Adam learning rate (the peak, with a warm-up or schedule)", check=POSITIVE
    )
    lr_warmup: int = option(
        0,
        "epochs of linear learning-rate warm-up up to --lr, below --epochs (default 0: none)",
        check=number(low=0, integer=True),
    )
    lr_schedule: str = option(
        "constant",
        "learning rate after the warm-up: constant, or cosine (down to --lr/100 at the last epoch)",
        choices=SCHEDULES,
    )
    weight_decay: float = option(5e-4, "L2 penalty", check=NON_NEGATIVE)
    weight_decay_scope: str = option(
        "first",
        "apply weight decay to the first layer only (PyG/Kipf GCN, default) or all layers",
        choices=("first", "all"),
    )
    epochs: int = option(200, "epochs", check=POSITIVE_INT)
    seed: int = option(0, "seed of initial weights and dropout", check=SEED)
    normalize_features: bool = option(
        False, "row-normalise features as PyG's NormalizeFeatures (standard for Planetoid)"
    )
    precompute_first: str = option(
        "auto",
        "aggregate the input features once (exact; auto = when input dropout is 0)",
        choices=("auto", "on", "off"),
    )
    exchange_buffer_mb: float = option(
        32.0,
        "largest halo send/receive buffer; a wider uncompressed exchange goes in slices of every "
        "peer's rows, at most two in flight (less memory, an all-to-all per slice; default 32)",
        check=POSITIVE,
        metavar="MB",
    )
    compress_fwd: str = option(
        "none", f"codec of forward halo activations: {_CODEC_HELP}", choices=CODECS
    )
    compress_bwd: str = option(
        "none", "codec of backward halo gradients (same choices; default none)", choices=CODECS
    )
    error_feedback: bool = option(
        False, "add each sent row's last quantization residual before quantizing it again"
    )
    eval_every: int = option(1, "evaluate every N epochs", check=POSITIVE_INT)
    metric: str = option("auto", METRIC_HELP, choices=METRIC_CHOICES)
    prune: str = option(
        "auto",
        "in training, compute each layer only at the rows the loss reaches (exact; auto: "
        "gcn, sage, gin and graphconv without BatchNorm, the layers where it removes >= 10%% of "
        "the edges; mlp, sgc and sign: the steps on the training rows alone; off)",
        choices=("auto", "off"),
    )
    precision: str = precision_option()
    sums: str = option(
        "tree",
        "how the sums over nodes (weight and bias gradients, the loss, norm statistics) are "
        "added: tree (per fixed node block, then one fixed tree: the same bits at any rank "
        "count on a partition with blocks; default) or rank-order (each rank's share, then "
        "the all-reduce: faster in one process, equal to one process to float rounding only, "
        "bit-identical reruns at the same rank count; bf16-mixed's backward stays float32)",
        choices=SUMS,
    )
    # Correct & Smooth in evaluation: the best model by the smoothed validation metric
    # (defined once, with fullgraph predict's, in fullgraph.propagation.correct_smooth)
    correct_smooth: bool = correct_smooth_option("correct_smooth")
    correction_layers: int | None = correct_smooth_option("correction_layers")
    correction_alpha: float | None = correct_smooth_option("correction_alpha")
    smoothing_layers: int | None = correct_smooth_option("smoothing_layers")
    smoothing_alpha: float | None = correct_smooth_option("smoothing_alpha")
    correction_scale: str | float | None = correct_smooth_option("correction_scale")
    # link prediction (fullgraph.training.link_trainer)
    task: str = option(
        "node", "what to train: node classification or link prediction", choices=TASKS
    )
    decoder: str = option(
        "dot", "--task link: the pair score, dot product or OGB's Hadamard + MLP", choices=DECODERS
    )
    decoder_layers: int = option(3, "--task link: linears of --decoder mlp", check=POSITIVE_INT)
    embed_dim: int | None = option(
        None,
        "--task link: the encoder's output width (default --hidden)",
        check=OPTIONAL_POSITIVE_INT,
    )
    link_batch: int = option(
        0,
        "--task link: positive edges per optimiser step, each a full-graph forward (OGB's "
        "recipe); 0: every training edge in one step per epoch",
        check=number(low=0, integer=True),
    )
    neg_ratio: int = option(
        1,
        "--task link: negative pairs per positive edge, hashed from seed, epoch and edge",
        check=POSITIVE_INT,
    )
    extra: dict = option({}, "free-form notes kept with the config", cli=False)

    def check(self) -> None:
        """Rules between fields."""
        self.check_correct_smooth()
        self.check_task()
        given = {name: getattr(self, name) for name in option_names()}
        check_options(self.model, given, self.layer_options())
        if self.error_feedback and self.compress_fwd == self.compress_bwd == "none":
            raise ConfigError(
                "--error-feedback needs --compress-fwd or --compress-bwd other than none"
            )
        if self.precompute_first == "on" and self.resolved_input_dropout() > 0:
            raise ConfigError("--precompute-first on needs --input-dropout 0")
        if self.lr_warmup and self.lr_warmup >= self.epochs:
            raise ConfigError(
                f"--lr-warmup {self.lr_warmup} must be below --epochs {self.epochs}: the warm-up "
                f"would not reach --lr {self.lr:g} within the run"
            )

    def check_task(self) -> None:
        """Refuse link options without ``--task link``, and C&S with it (one line)."""
        if self.task == "link":
            if self.metric != "auto":
                raise ConfigError(
                    f"--metric {self.metric} scores node tasks; --task link is scored by its "
                    f"dataset's link metric (hits@K, mrr or auc: docs/link.md)"
                )
            if self.correct_smooth:
                raise ConfigError(
                    "--correct-smooth propagates node labels; --task link has none to propagate"
                )
            return
        defaults = {"decoder": "dot", "decoder_layers": 3, "embed_dim": None}
        defaults.update(link_batch=0, neg_ratio=1)
        for name, default in defaults.items():
            if getattr(self, name) != default:
                raise ConfigError(f"--{name.replace('_', '-')} applies to --task link")

    def layer_options(self) -> LayerOptions:
        """The per-kind layer options, defaults resolved."""
        drop = self.dropout if self.attention_dropout is None else self.attention_dropout
        return LayerOptions(
            edge_weight=self.edge_weight,
            improved=self.improved,
            heads=self.heads or 1,
            output_heads=self.output_heads or 1,
            attention_dropout=drop,
            aggr=self.aggr,
            hops=self.hops,
            alpha=self.alpha,
            propagation=self.propagation,
        )

    def layer_kind(self) -> type[GraphLayer]:
        """The layer class a model of this config stacks: its kind's variant under
        :meth:`layer_options` (whose operator, traits, part check and replay it has)."""
        return layer_class(self.model).variant(self.layer_options())

    def build_model(self, num_features: int, num_classes: int) -> GNN | LinkModel:
        """The configured :class:`~fullgraph.models.gnn.GNN` for ``num_features`` inputs and
        ``num_classes`` outputs (on torch's current default device); for ``--task link`` a
        :class:`~fullgraph.models.link_decoder.LinkModel`: the stack ``--embed-dim`` wide
        (``num_classes`` unused) and its decoder."""
        if self.task == "link":
            dim = self.embed_dim or self.hidden
            encoder = self._stack(num_features, dim)
            return LinkModel(encoder, build_decoder(self.decoder, dim, dim, self.decoder_layers))
        return self._stack(num_features, num_classes)

    def _stack(self, num_features: int, num_classes: int) -> GNN:
        """The layer stack, ``num_classes`` wide at the end."""
        return GNN(
            self.model,
            num_features,
            self.hidden,
            num_classes,
            self.layers,
            self.dropout,
            self.resolved_input_dropout(),
            options=self.layer_options(),
            norm=self.norm,
            residual=self.residual,
        )

    @property
    def compressed(self) -> bool:
        """Whether training exchanges are compressed in either direction."""
        return self.compress_fwd != "none" or self.compress_bwd != "none"


@dataclass
class TrainData(Config):
    """What ``fullgraph train`` trains on: parts (P ranks) or a whole graph (one process)."""

    parts: str | None = option(None, "partition directory written by `fullgraph partition`")
    dataset: str | None = option(None, "dataset name, trained whole in one process")
    root: str | None = option(None, "dataset root directory for --dataset")
    split: int | None = option(None, SPLIT_HELP, check=OPTIONAL_SPLIT, metavar="K")
    synthetic: str | None = option(
        None, "train on a generated graph (tiny, arxiv, ...)", metavar="PRESET"
    )
    no_verify: bool = option(False, "skip part checksum verification")

    def check(self) -> None:
        """Exactly one source; ``--dataset`` with ``--root``; no empty values."""
        for name in ("parts", "dataset", "root", "synthetic"):
            check_path(f"--{name}", getattr(self, name))
        sources = [s for s in ("parts", "dataset", "synthetic") if getattr(self, s) is not None]
        if len(sources) != 1:
            raise ConfigError("give exactly one of --parts, --dataset (with --root), --synthetic")
        if self.dataset and not self.root:
            raise ConfigError("--dataset needs --root (the dataset root directory)")
        if self.split is not None and not self.dataset:
            raise ConfigError(
                "--split applies to --dataset; a partition holds the split it was written with "
                "(`fullgraph partition --split K`)"
            )

    @property
    def label(self) -> str:
        """How the run names its data in ``config.json``."""
        return self.parts or self.dataset or f"synthetic:{self.synthetic}"

    def inputs(self, parts: PartitionDir | None) -> list[Place]:
        """What a run on this data reads, for the outputs' overlap check.

        Args:
            parts: the opened ``--parts`` directory, or ``None`` for a whole graph.
        """
        if parts is not None:
            return [Place(parts.root, f"--parts {self.parts}", "the partition")]
        if self.dataset:
            from fullgraph.datasets.paths import dataset_inputs

            return dataset_inputs(self.dataset, self.root)
        return []

    def load_part(
        self, parts: PartitionDir | None, rank: int, seed: int, link: bool = False
    ) -> Partition:
        """This rank's part of ``parts``, or the whole graph as the one part of a one-process
        run (``--synthetic`` generated with ``seed``; ``part.meta`` names a fixed split, as a
        partition's ``meta.json`` does; ``link``: with the dataset's link split, when it has
        one)."""
        from fullgraph.partition import load_partition, whole_graph_part

        if parts is not None:
            return load_partition(parts, rank, mmap=False, verify_checksums=not self.no_verify)
        if self.synthetic:
            from fullgraph.datasets.synthetic import generate

            return whole_graph_part(generate(self.synthetic, seed=seed))
        from fullgraph.datasets import load, load_link_split

        graph = load(self.dataset, self.root, split=self.split)
        split = load_link_split(self.dataset, self.root) if link else None
        return whole_graph_part(graph, link=split) if split is not None else whole_graph_part(graph)
