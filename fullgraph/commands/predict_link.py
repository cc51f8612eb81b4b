"""``fullgraph predict`` of a link model (``--pairs FILE``): the checks of the request and
the run (:class:`~fullgraph.training.link_predict.LinkScorer`), beside the node path of
:mod:`fullgraph.commands.predict`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fullgraph.errors import ConfigError

if TYPE_CHECKING:
    from fullgraph.run.command import Job
    from fullgraph.training.model_file import ModelFile


def check_link_request(
    model: ModelFile, pairs: str | None, embeddings: list[int], logits: bool, smooth: bool
) -> None:
    """Refuse, in one line, ``--pairs`` for a node model, a link model without it, and the
    node outputs (``--embeddings``, ``--logits``, ``--correct-smooth``) for a link model."""
    if model.config.task != "link":
        raise ConfigError(
            f"--pairs scores node pairs with a link model; {model.path} was trained with "
            f"--task {model.config.task} (predict its nodes without --pairs)"
        )
    if not pairs:
        raise ConfigError(
            f"{model.path} is a link model (--task link): give --pairs FILE, the node pairs to "
            f"score"
        )
    for given, flag in (
        (embeddings, "--embeddings"),
        (logits, "--logits"),
        (smooth, "--correct-smooth"),
    ):
        if given:
            raise ConfigError(f"{flag} applies to node models; a link model writes pair scores")


def run_link(cmd: Any, job: Job) -> dict[str, Any]:
    """Score ``--pairs`` with the link model on every rank; rank 0 writes ``scores.npy``,
    ``probabilities.npy`` and ``predict.json`` (one directory, atomic).

    Args:
        cmd: the :class:`~fullgraph.commands.predict.PredictCommand` (checked, configured).
        job: its job.
    """
    import numpy as np

    from fullgraph.atomic import atomic_dir, atomic_write_json, check_output
    from fullgraph.resources import peak_rss_mb
    from fullgraph.run.prediction_dir import PREDICTION, PROBABILITIES, SCORES
    from fullgraph.training.link_predict import LinkScorer, read_pairs
    from fullgraph.watchdog import phase

    comm, opts, mf = job.comm, cmd.options, cmd.model_file
    assert mf is not None and opts.out is not None and opts.pairs is not None
    out, first = Path(opts.out), comm.rank == 0
    job.agree(
        lambda: (
            check_output(out, "--out", kind="dir", exist_ok=opts.force, ours=PREDICTION)
            if first
            else None
        )
    )
    with phase("part loading"):
        part = job.agree(lambda: cmd.data.load_part(cmd.parts, comm.rank, mf.config.seed, True))
    width = int(part.num_features)
    if width != mf.num_features:
        from fullgraph.training.inference import check_widths

        job.agree(lambda: check_widths(mf, width, mf.num_classes, cmd._named()))
    with phase("model set-up"):
        scorer = LinkScorer(part, comm, mf, job.device, cmd.precision)
    del part
    pairs = job.agree(lambda: read_pairs(opts.pairs, scorer.num_nodes))
    t0 = time.perf_counter()
    scores = scorer.scores(pairs)
    seconds = time.perf_counter() - t0
    peaks = comm.allgather_object(peak_rss_mb())
    record: dict[str, Any] = {
        "format": "fullgraph-predict",
        "version": 1,
        "task": "link",
        "model": {
            "path": str(Path(mf.path).resolve()),
            "sha256": mf.sha256,
            "config": mf.config.to_dict(),
            "epoch": mf.info.get("epoch"),
            "trained_on": mf.info.get("data"),
        },
        "pairs": {"path": str(Path(opts.pairs).resolve()), "count": int(len(pairs))},
        "data": cmd._named(),
        "ranks": comm.size,
        "files": {
            SCORES: {"shape": [len(pairs)], "dtype": "float32", "what": "the decoder's logits"},
            PROBABILITIES: {"shape": [len(pairs)], "dtype": "float32", "what": "sigmoid"},
        },
        "seconds": seconds,
        "peak_rss_mb": [round(p, 1) for p in peaks],
    }
    if first:
        assert scores is not None
        with atomic_dir(out, force=opts.force, ours=PREDICTION, option="--out") as tmp:
            np.save(tmp / SCORES, scores)
            np.save(
                tmp / PROBABILITIES,
                (1.0 / (1.0 + np.exp(-scores.astype(np.float64)))).astype(np.float32),
            )
            atomic_write_json(tmp / "predict.json", record)
        print(
            f"scored {len(pairs)} pairs in {seconds:.2f} s with {mf.path}; written to {out}",
            flush=True,
        )
    return record
