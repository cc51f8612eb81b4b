"""Compressed halo exchange across ranks: P = 2 and 4 over mpi and gloo, and the CLI's JSON.

Each (P, transports) pair is one ``mpirun`` launch of ``comm_worker.compress``, which checks on
every rank that every codec delivers ``dequantize(quantize(rows))`` to the right halo slots and
returns compressed gradients to their owners, that bytes are booked exactly, that ``none`` is
bit-identical to the default, that evaluation exchanges float32 and that training learns.

Enters through :mod:`fullgraph.distributed.compression`.
"""

from __future__ import annotations

import json
from pathlib import Path

import comm_worker
import numpy as np
import pytest
from harness import run_task
from mp_utils import run_mpi

from fullgraph.distributed.compression import record_bytes
from fullgraph.partition import load_partition


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_compressed_exchange_on_every_rank(ranks: int, small_partitions, tmp_path: Path) -> None:
    result = run_task(
        comm_worker.compress,
        ranks=ranks,
        out=tmp_path / "result.json",
        timeout=280,
        parts=small_partitions[ranks],
        transports=["mpi", "gloo"],
    )
    assert result["failures"] == [], "\n".join(result["failures"])
    figures = result["figures"]
    for transport in ("mpi", "gloo"):
        assert figures[f"{transport}/int2_last_loss"] < figures[f"{transport}/int2_first_loss"]
    assert figures["mpi/grad_cosine_int4_int8"] == figures["gloo/grad_cosine_int4_int8"]


def _halo_bytes_per_epoch(parts: Path, ranks: int) -> int:
    """Default 2-layer GCN (12 -> 16 -> 4, input dropout on, so nothing is precomputed).

    Training: forward int4 at width 12 (layer 1 aggregates first) and 4 (layer 2 transforms
    first); backward int2 at width 4 only (the input features need no gradient). Evaluation:
    the same two forward exchanges in float32.
    """
    total = 0
    for rank in range(ranks):
        part = load_partition(parts, rank)
        send = int(np.diff(part.send_offsets).sum() - np.diff(part.send_offsets)[rank])
        recv = int(np.diff(part.recv_offsets).sum() - np.diff(part.recv_offsets)[rank])
        train = send * (record_bytes("int4", 12) + record_bytes("int4", 4))
        train += recv * record_bytes("int2", 4)
        total += train + send * 4 * (12 + 4)
    return total


@pytest.mark.timeout(200)
def test_cli_logs_compression_and_exact_bytes(small_partitions, tmp_path: Path) -> None:
    parts = small_partitions[2]
    log = tmp_path / "run.jsonl"
    args = ["-m", "fullgraph.cli", "train", "--parts", str(parts), "--epochs", "3", "--quiet"]
    args += ["--compress-fwd", "int4", "--compress-bwd", "int2", "--error-feedback"]
    args += ["--prune", "off"]  # the whole plan every layer: the formula reads the parts
    run_mpi(2, [*args, "--log-json", str(log)], 180)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    epochs, final = rows[:-1], rows[-1]
    assert len(epochs) == 3 and final["final"] is True
    want = _halo_bytes_per_epoch(parts, 2)
    for rec in epochs:
        assert (rec["compress_fwd"], rec["compress_bwd"], rec["error_feedback"]) == (
            "int4",
            "int2",
            True,
        )
        assert rec["halo_bytes"] == want
        assert rec["comm_bytes"] > rec["halo_bytes"] and rec["codec_s"] > 0
    assert final["compress_fwd"] == "int4" and final["error_feedback"] is True
    config = json.loads((tmp_path / "run.config.json").read_text())["config"]
    assert config["compress_bwd"] == "int2" and config["error_feedback"] is True


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_with_error_feedback_is_exact(small_partitions, tmp_path: Path) -> None:
    """The residuals of every rank are checkpointed: the resumed run loses nothing."""
    args = ["-m", "fullgraph.cli", "train", "--parts", str(small_partitions[2]), "--quiet"]
    args += ["--epochs", "4", "--compress-fwd", "int2", "--compress-bwd", "int2"]
    args += ["--error-feedback"]
    full, log, ckpt = tmp_path / "full.jsonl", tmp_path / "resumed.jsonl", tmp_path / "ckpt"
    run_mpi(2, [*args, "--log-json", str(full)], 120)
    with_ckpt = [*args, "--checkpoint", str(ckpt), "--checkpoint-every", "1"]
    failed = run_mpi(
        2,
        [*with_ckpt, "--log-json", str(log)],
        120,
        expect_ok=False,
        env={"FULLGRAPH_FAIL_AT": "1:4"},
    )
    assert failed.returncode != 0
    assert sorted(p.name for p in ckpt.glob("rank-*.pt")) == [
        "rank-0-epoch-3.pt",
        "rank-1-epoch-3.pt",
    ]
    run_mpi(2, [*with_ckpt, "--resume", "--log-json", str(log)], 120)

    def losses(path: Path) -> dict[int, float]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return {r["epoch"]: r["loss"] for r in rows if not r.get("final")}

    assert losses(log)[4] == losses(full)[4]
    other = [a if a != "int2" else "int4" for a in with_ckpt]
    refused = run_mpi(2, [*other, "--resume"], 120, expect_ok=False)
    assert refused.returncode != 0 and "compress_fwd" in refused.stderr
