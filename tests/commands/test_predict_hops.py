"""``fullgraph predict`` with a SIGN model: one process and 2 ranks (``mpirun``) write the same
logits bit for bit, whether the 2 ranks compute the hops (and keep them) or read them back; the
run says which.

Enters through :mod:`fullgraph.commands.predict`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_run import run_cli
from mp_utils import run_mpi

from fullgraph.partition import partition_graph


@pytest.mark.timeout(240)
def test_two_ranks_predict_one_process_bits(small_graph, tmp_path: Path, capsys) -> None:
    one, two = tmp_path / "parts-1", tmp_path / "parts-2"
    partition_graph(small_graph, 1, one, method="metis", seed=0)
    partition_graph(small_graph, 2, two, method="metis", seed=0)
    model = tmp_path / "sign.pt"
    fields = ["--model", "sign", "--hops", "2", "--propagation", "ppr", "--alpha", "0.2"]
    argv = ["train", "--parts", str(one), *fields, "--epochs", "5", "--save-model", str(model)]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    out1 = tmp_path / "pred-1"
    argv = ["predict", "--parts", str(one), "--model", str(model), "--out", str(out1), "--logits"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0 and "hops: read from" in out, (out, err)
    want = np.load(out1 / "logits.npy")
    for k, said in enumerate(("cached in", "hops: read from")):
        out2 = tmp_path / f"pred-2-{k}"
        job = run_mpi(
            2,
            ["-m", "fullgraph.cli", "predict", "--parts", str(two), "--model", str(model)]
            + ["--out", str(out2), "--logits", "--transport", "gloo" if k else "mpi"],
            timeout=200,
        )
        assert said in job.stdout, job.stdout
        got = np.load(out2 / "logits.npy")
        assert np.array_equal(got, want), float(np.abs(got - want).max())
