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
  up, the part's own arrays (``16 (n + h) + 8 e + 8 S``; with stored edge values also
  ``4 e + 8 (n + h)`` for edge weights and their weighted in-degrees, ``4 e F_e`` for edge
  feature rows) and the building temporaries.
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

``fullgraph predict`` (``mode="predict"``) is replayed as its own code runs: the set-up of the
model's :func:`~fullgraph.training.inference.inference_config` (no pruning, no compression),
the parameters and the model file's copy of them (no gradients, no optimiser state), the
writer's row order (``16 n``), then the evaluation forward with every hidden layer's embeddings
written as it ends, and the predictions and probabilities written: per write, at most one
window (:data:`~fullgraph.training.inference.WRITE_WINDOW_BYTES`) of rows gathered, of rows
transformed and of the file mapped. Nothing is saved for a backward pass and there are no
gradients, so predict's peak lies below the training peak of the same model and parts
(``tests/memory/test_predict_plan.py`` compares them; docs/predict.md has measured peaks).
Covered: every layer kind whose :attr:`~fullgraph.models.layers.GraphLayer.replay` family has a
replay (:data:`REPLAYS`): ``--model gcn``, ``sage``, ``gin``, ``graphconv``
(:mod:`fullgraph.memory.linear`), ``gat`` (:mod:`fullgraph.memory.gat`) and ``sage`` /
``graphconv`` with ``--aggr max`` (:mod:`fullgraph.memory.max_aggr`), ``mlp`` and ``appnp``
with its propagation steps (:mod:`fullgraph.memory.rows`), ``sgc`` and ``sign`` with their
hops' precompute (:mod:`fullgraph.memory.hops`), with ``--norm`` and ``--residual``,
dense input features (:func:`check_modelled` says what is not).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fullgraph.errors import ConfigError
from fullgraph.memory.gat import GATRank
from fullgraph.memory.hops import HopsRank
from fullgraph.memory.ledger import TERMS, Ledger
from fullgraph.memory.linear import LinearRank
from fullgraph.memory.max_aggr import MaxRank
from fullgraph.memory.replay import RankReplay, parameter_count, widths
from fullgraph.memory.rows import RowRank
from fullgraph.memory.shapes import GraphShape, PartShape
from fullgraph.models.layers import joined, kinds_with, layer_class, layer_kinds
from fullgraph.training.config import TrainConfig
from fullgraph.training.inference import inference_config

if TYPE_CHECKING:
    from fullgraph.partition import Partition

__all__ = [
    "TERMS",
    "MODES",
    "GraphShape",
    "PartShape",
    "Prediction",
    "check_modelled",
    "measure_floor",
    "parameter_count",
    "predict",
    "predict_quickly",
    "predict_rank",
    "widths",
]


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


#: The replay of every family of layer kinds (:attr:`~fullgraph.models.layers.GraphLayer.replay`).
REPLAYS: dict[str, type[RankReplay]] = {
    "linear": LinearRank,
    "attention": GATRank,
    "max": MaxRank,
    "rows": RowRank,
    "hops": HopsRank,
}


def check_modelled(cfg: TrainConfig) -> None:
    """Refuse the configurations the model does not cover (one line).

    Raises:
        ConfigError: a layer kind whose replay family has no replay here (:data:`REPLAYS`).
    """
    if cfg.model not in layer_kinds() or layer_class(cfg.model).replay not in REPLAYS:
        covered = joined(kinds_with(lambda c: c.replay in REPLAYS))
        raise ConfigError(f"the memory model covers --model {covered}, not --model {cfg.model}")


#: What is replayed: ``fullgraph train``'s set-up, step and evaluation, or ``fullgraph
#: predict``'s pass.
MODES = ("train", "predict")


def predict_rank(
    part: PartShape, graph: GraphShape, cfg: TrainConfig, floor: int, mode: str = "train"
) -> Prediction:
    """The predicted peak of one rank: set-up, a training step and an evaluation replayed
    (``mode="predict"``: ``fullgraph predict``'s set-up and pass).

    Args:
        part: the rank's sizes.
        graph: the partition's sizes.
        cfg: the run's configuration (:func:`check_modelled` must accept it); for ``predict``
            the model file's.
        floor: the process floor, bytes (:func:`measure_floor`).
        mode: one of :data:`MODES`.

    Returns:
        The :class:`Prediction` (its terms add up to its total).
    """
    led = _replay(part, graph, cfg, floor, mode)
    return Prediction(rank=part.rank, phase=led.peak_phase, terms=dict(led.peak_terms))


def predict(
    graph: GraphShape, cfg: TrainConfig, floor: int, mode: str = "train"
) -> list[Prediction]:
    """:func:`predict_rank` for every rank of the partition."""
    return [predict_rank(p, graph, cfg, floor, mode) for p in graph.parts]


#: Layers replayed one by one by :func:`predict_quickly`; a deeper model is extended.
REPLAYED_LAYERS = 128


def _replay(
    part: PartShape, graph: GraphShape, cfg: TrainConfig, floor: int, mode: str = "train"
) -> Ledger:
    check_modelled(cfg)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    predicting = mode == "predict"
    if predicting:
        cfg = inference_config(cfg)
    replay = REPLAYS[cfg.layer_kind().replay]
    rank = replay(part, graph, cfg, floor, predicting)
    rank.setup()
    if predicting:
        rank.predict()
    else:
        rank.train_step()
        rank.evaluate()
    return rank.led


def predict_quickly(
    graph: GraphShape, cfg: TrainConfig, floor: int, mode: str = "train"
) -> list[Prediction]:
    """:func:`predict` up to :data:`REPLAYED_LAYERS` layers; beyond, a lower bound of it in
    well under a second at any depth (``--layers 100000``: the replay and the meta-device
    model it reads its shapes from take time linear in the layers, 20 s there).

    The model is replayed at ``K - 1`` and ``K`` layers and extended linearly to the depth
    asked for: the peak (the largest of phases that each grow linearly with the depth) along
    its secant, and each phase of the whole model (:data:`~fullgraph.memory.replay.
    WHOLE_MODEL_PHASES`: the loss's, where every saved activation is live, grows fastest)
    along its own line; the largest of these. Neither exceeds the exact replay; the deepest
    phases differ from the loss's by one layer's temporaries (``tests/memory/test_plan.py``
    compares them). ``mode`` is :func:`predict_rank`'s.

    Returns:
        One :class:`Prediction` per rank; an extended one says so in its phase.
    """
    if cfg.layers <= REPLAYED_LAYERS:
        return predict(graph, cfg, floor, mode)
    k, more = REPLAYED_LAYERS, cfg.layers - REPLAYED_LAYERS
    out = []
    for part in graph.parts:
        a = _replay(part, graph, replace(cfg, layers=k - 1), floor, mode)
        b = _replay(part, graph, replace(cfg, layers=k), floor, mode)
        lines = [(b.peak_phase, a.peak_terms, b.peak_terms)]
        lines += [
            (p, a.phase_peaks[p][1], t) for p, (_, t) in b.phase_peaks.items() if p in a.phase_peaks
        ]
        best: tuple[int, str, dict[str, int]] = (-1, "", {})
        for phase, at_a, at_b in lines:
            terms = {t: v + more * max(0, v - at_a[t]) for t, v in at_b.items()}
            best = max(best, (sum(terms.values()), phase, terms), key=lambda x: x[0])
        phase = f"{best[1]} (at least: replayed at {k} layers, extended to {cfg.layers})"
        out.append(Prediction(rank=part.rank, phase=phase, terms=best[2]))
    return out


def _tiny_part(num_features: int, num_classes: int) -> Partition:
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
        edge_weight=np.ones(a.nnz, np.float32),  # for a run with --edge-weight
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
    that has imported the training stack and started MPI, as a rank has: the libraries' pages
    that only the imports touched leave the resident set first, as the rank start-up drops
    them (:func:`~fullgraph.resources.drop_library_pages`), so the floor holds the code the
    kernels' loading and the epochs touch again, as a rank's does.

    Args:
        cfg: the run's configuration (model, widths, dropout, compression).
        num_features: the real input width.
        num_classes: the real number of classes.

    Returns:
        Bytes.
    """
    import gc

    from fullgraph.distributed.communicator import Communicator
    from fullgraph.resources import drop_library_pages
    from fullgraph.run.options import RunOptions
    from fullgraph.training.trainer import Trainer

    drop_library_pages()  # as the rank start-up does
    # the run's model and exchange options; a gentle learning rate (the probe's steps only
    # load code: a run's own lr could make the tiny model diverge, which is not the point)
    settings = {**cfg.to_dict(), "epochs": 2, "eval_every": 1, "lr": 1e-3, "lr_warmup": 0}
    if cfg.task == "link":  # its encoder, trained as a node model as wide as the embeddings
        num_classes = cfg.embed_dim or cfg.hidden
        for name in ("task", "decoder", "decoder_layers", "embed_dim", "link_batch", "neg_ratio"):
            settings.pop(name)
    probe = TrainConfig(**{**settings, "extra": {}})
    trainer = Trainer(
        _tiny_part(num_features, num_classes), Communicator(), probe, RunOptions(quiet=True)
    )
    for epoch in (1, 2):  # the steps and evaluations of fit(), without its hooks and log
        trainer.train_step(epoch)
        trainer.evaluate()
    del trainer
    gc.collect()
    return current_rss_bytes()
