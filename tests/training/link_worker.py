"""Worker of ``tests/training/test_link_trainer.py``, run by :func:`harness.run_task`.

``link --parts DIR --transports T... --models M...``: trains each link model (encoder spec as
:func:`bitwise_worker.parse_spec`, plus ``decoder=``, ``link_batch=``, ``neg_ratio=``) for
:data:`EPOCHS` epochs on the supervision split of :func:`link_split` and saves (rank 0,
``.npz``) every epoch's loss, the final parameters and the last evaluation. The test calls
:func:`train_links` in-process on the whole graph for the reference.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from bitwise_worker import parse_spec
from harness import Tasks, communicators, main

EPOCHS = 4


def link_split(graph: Any) -> Any:
    """A link split of ``graph``: half its undirected edges to train on, 40 random pairs each
    to validate and test, and as many negative pairs (the runtime's exactness does not need
    the held-out edges removed from the graph)."""
    from fullgraph.datasets.link import LinkSplit

    n = graph.num_nodes
    rows = np.repeat(np.arange(n), np.diff(graph.indptr))
    upper = np.stack([graph.indices, rows], axis=1)
    upper = upper[upper[:, 0] < upper[:, 1]]
    rng = np.random.default_rng(7)
    train = upper[rng.permutation(len(upper))[: len(upper) // 2]]
    pick = rng.integers(0, n, size=(160, 2))
    pick = pick[pick[:, 0] != pick[:, 1]]
    return LinkSplit(
        name="sbm-link",
        num_nodes=n,
        edges={"train": train, "valid": pick[:40], "test": pick[40:80]},
        negatives={"valid": pick[80:120], "test": pick[120:160]},
        metric="auc",
    )


def train_links(part: Any, comm: Any, models: list[str], split: Any) -> dict[str, np.ndarray]:
    """Losses, final parameters and final validation AUC of each model, keyed ``model/...``;
    ``KIND:rank-order`` trains without the block tree (the negative control)."""
    from fullgraph.models.gnn import parameter_vector
    from fullgraph.training import RunOptions, TrainConfig
    from fullgraph.training.link_pairs import link_meta, rank_links
    from fullgraph.training.link_trainer import LinkTrainer

    links = rank_links(split, part.global_ids[: part.num_inner])
    out: dict[str, np.ndarray] = {}
    for model in models:
        kind, variant, overrides = parse_spec(model)
        settings: dict[str, Any] = dict(
            model=kind,
            layers=2,
            hidden=16,
            dropout=0.5,
            epochs=EPOCHS,
            seed=3,
            lr=0.05,
            task="link",
        )
        settings.update(overrides)
        tr = LinkTrainer(
            part, comm, TrainConfig(**settings), links, link_meta(split), run=RunOptions(quiet=True)
        )
        if variant == "rank-order":
            tr.ctx.blocks = None
        losses = [tr.train_epoch(epoch).loss for epoch in range(1, EPOCHS + 1)]
        scores = tr.evaluate()
        out[f"{model}/losses"] = np.asarray(losses)
        out[f"{model}/params"] = parameter_vector(tr.model).numpy().copy()
        out[f"{model}/val_auc"] = np.asarray(scores["val_auc"])
        out[f"{model}/blocks"] = np.asarray(tr.ctx.blocks is not None)
    return out


TASKS = Tasks()


@TASKS.task
def link(*, parts: Path, transports: list[str], models: list[str]) -> dict[str, np.ndarray]:
    """:func:`train_links` over each transport (the split rebuilt from the default SBM)."""
    from conftest import build_sbm_graph

    from fullgraph.partition import load_partition

    split = link_split(build_sbm_graph())
    result: dict[str, np.ndarray] = {}
    for transport, comm in communicators(transports):
        got = train_links(load_partition(parts, comm.rank), comm, models, split)
        result.update({f"{transport}/{k}": v for k, v in got.items()})
    return result


def trained_model_file(graph: Any, path: Path, decoder: str = "mlp") -> Path:
    """Train a small link model on the whole graph for 3 epochs and write its model file."""
    from fullgraph.distributed.communicator import Communicator
    from fullgraph.partition import whole_graph_part
    from fullgraph.training import RunOptions, TrainConfig
    from fullgraph.training.link_pairs import link_meta, rank_links
    from fullgraph.training.link_trainer import LinkTrainer
    from fullgraph.training.model_file import model_state, save_model_file

    split = link_split(graph)
    part = whole_graph_part(graph)
    cfg = TrainConfig(
        model="sage", layers=2, hidden=16, epochs=3, seed=1, task="link", decoder=decoder
    )
    links = rank_links(split, part.global_ids[: part.num_inner])
    tr = LinkTrainer(part, Communicator(), cfg, links, link_meta(split), run=RunOptions(quiet=True))
    for epoch in (1, 2, 3):
        tr.train_epoch(epoch)
    info = {"epoch": 3, "metric": "auc", "val": 0.0, "test": 0.0, "data": "sbm"}
    state = model_state(tr.model, tr.config, part.num_features, part.num_classes, info)
    return save_model_file(path, state)


@TASKS.task
def score(*, parts: Path, model: Path, pairs: Path) -> np.ndarray:
    """The scores of ``pairs`` (a .npy) with the link model file ``model`` on these parts."""
    from fullgraph.partition import load_partition
    from fullgraph.training.link_predict import LinkScorer, read_pairs
    from fullgraph.training.model_file import load_model_file

    _, comm = next(iter(communicators(["mpi"])))
    scorer = LinkScorer(load_partition(parts, comm.rank), comm, load_model_file(model))
    got = scorer.scores(read_pairs(pairs, scorer.num_nodes))
    return got if got is not None else np.zeros(0, np.float32)


if __name__ == "__main__":
    sys.exit(main(TASKS))
