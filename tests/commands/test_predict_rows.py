"""``--model mlp`` and ``appnp`` from ``fullgraph train --save-model`` to ``fullgraph predict``.

For each kind: trained in one process on the 1-part partition, the model file keeps the kind
and its options (appnp's K and alpha) and rebuilds the model the run trained; ``predict`` at
P = 1 writes the logits of that model's evaluation forward, the embeddings of its hidden
layer, and at P = 2 (mpi) the very same bits (the propagation's sums in ascending global id).

Enters through :mod:`fullgraph.commands.predict`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from mp_utils import one_thread, run_mpi

from fullgraph.cli import main as cli_main
from fullgraph.distributed.communicator import Communicator
from fullgraph.partition import load_partition
from fullgraph.training.assembly import assemble_rank
from fullgraph.training.model_file import load_model_file

KINDS = {
    "mlp": ["--model", "mlp"],
    "appnp": ["--model", "appnp", "--hops", "3", "--alpha", "0.2"],
}


def _cli(argv: list[str]) -> None:
    with one_thread():
        assert cli_main([*argv, "--threads", "1"]) == 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_model_file_and_predict_round_trip(kind: str, small_partitions, tmp_path: Path) -> None:
    model = tmp_path / f"{kind}.pt"
    one = str(small_partitions[1])
    train = ["train", "--parts", one, *KINDS[kind], "--layers", "2", "--hidden", "16"]
    _cli([*train, "--epochs", "4", "--quiet", "--save-model", str(model)])
    mf = load_model_file(model)
    assert mf.config.model == kind
    if kind == "appnp":
        assert (mf.config.hops, mf.config.alpha) == (3, 0.2)
        assert mf.build().layers[-1].hops == 3
    # the model's own evaluation forward on the part, in global order
    part = load_partition(small_partitions[1], 0, mmap=False)
    rank = assemble_rank(part, Communicator(), mf.config)
    with torch.no_grad():
        rows = mf.build()(rank.data["x"], rank.ctx, training=False).numpy()
    want = np.empty_like(rows)
    want[np.asarray(part.global_ids)] = rows
    common = ["--model", str(model), "--embeddings", "1", "--logits", "--quiet"]
    out1 = tmp_path / "p1"
    _cli(["predict", "--parts", one, *common, "--out", str(out1)])
    logits = np.load(out1 / "logits.npy")
    assert np.array_equal(logits, want)
    assert np.load(out1 / "embeddings-1.npy").shape == (part.num_inner, 16)
    np.testing.assert_array_equal(np.load(out1 / "predictions.npy"), want.argmax(axis=1))
    if kind != "appnp":  # mlp reads no other row: P = 2 is the same computation
        return
    out2 = tmp_path / "p2"
    argv = ["-m", "fullgraph.cli", "predict", "--threads", "1", "--parts"]
    run_mpi(2, [*argv, str(small_partitions[2]), *common, "--out", str(out2)], 200)
    for name in ("logits.npy", "embeddings-1.npy", "predictions.npy"):
        assert np.array_equal(np.load(out2 / name), np.load(out1 / name)), name
