"""The weaker contract of the lossy paths (issue 33): compressed halos (``--compress-fwd``,
``--compress-bwd``, with error feedback) are not the one-process bits, since the codes round
the rows a rank receives and one process receives none; what holds is bit-identical reruns at
the same P: the same run twice (over mpi, then gloo, in one job) gives the same losses and
parameters, and the codes are in force (the uncompressed run trains other bits).

Enters through :mod:`fullgraph.training.trainer`.
"""

from __future__ import annotations

from pathlib import Path

import bitwise_worker
import numpy as np
import pytest
from harness import run_task

from fullgraph.partition import partition_graph

SPECS = [
    "gcn;compress_fwd=int8;compress_bwd=int4;error_feedback=true",
    "sage;compress_fwd=bf16;compress_bwd=int8",
]


@pytest.mark.timeout(240)
def test_compressed_halos_rerun_bit_for_bit(small_graph, tmp_path: Path) -> None:
    parts = tmp_path / "parts-2"
    partition_graph(small_graph, 2, parts, method="metis", seed=0)
    result = run_task(
        bitwise_worker.bitwise,
        ranks=2,
        out=tmp_path / "result.npz",
        timeout=200,
        parts=parts,
        transports=["mpi", "gloo"],
        models=[*SPECS, "gcn"],
    )
    for spec in SPECS:
        for what in ("losses", "params"):
            first, again = result[f"mpi/{spec}/{what}"], result[f"gloo/{spec}/{what}"]
            assert np.array_equal(first, again), (spec, what)
        assert np.isfinite(result[f"mpi/{spec}/losses"]).all()
    # the codes are in force: the uncompressed run trains other bits
    assert not np.array_equal(result[f"mpi/{SPECS[0]}/params"], result["mpi/gcn/params"])
