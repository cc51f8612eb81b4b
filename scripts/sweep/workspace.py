"""The small workspace every case copies: datasets, a partition, a finished run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from .commands import ENV, FULLGRAPH, MPIRUN, fg


def run_or_exit(cmd: list[str], cwd: Path) -> None:
    """Run ``cmd`` in ``cwd``; exit with its output if it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"setup failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")


def _write_npz_dataset(root: Path) -> None:
    """A small gnn-benchmark ``.npz`` (Amazon Photo layout) under ``root/amazon_photo/raw``."""
    rng = np.random.default_rng(0)
    n, f = 300, 16
    src, dst = rng.integers(0, n, 2000), rng.integers(0, n, 2000)
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    indptr = np.searchsorted(src, np.arange(n + 1)).astype(np.int64)
    x = rng.random((n, f)).astype(np.float32)
    raw = root / "amazon_photo" / "raw"
    raw.mkdir(parents=True)
    np.savez(
        raw / "amazon_electronics_photo.npz",
        adj_data=np.ones(dst.size, np.float32),
        adj_indices=dst.astype(np.int64),
        adj_indptr=indptr,
        adj_shape=np.array([n, n]),
        attr_data=x.reshape(-1),
        attr_indices=np.tile(np.arange(f), n),
        attr_indptr=np.arange(0, n * f + 1, f),
        attr_shape=np.array([n, f]),
        labels=rng.integers(0, 4, n),
    )


def build_workspace(base: Path) -> None:
    """Data, partitions and a finished run that the cases copy and tamper with."""
    base.mkdir(parents=True, exist_ok=True)
    run_or_exit(fg("data", "synth", "--preset", "tiny", "--name", "tiny", "--root", "data"), base)
    run_or_exit(fg("data", "synth", "--preset", "arxiv", "--name", "arxiv", "--root", "big"), base)
    run_or_exit(
        fg("partition", "--dataset", "tiny", "--root", "data", "--parts", "2", "--out", "p2"), base
    )
    train = ["train", "--parts", "p2", "--epochs", "3", "--quiet", "--checkpoint", "ck"]
    run_or_exit([MPIRUN, "-n", "2", *FULLGRAPH, *train, "--log-json", "logs/run.jsonl"], base)
    _write_npz_dataset(base / "data")
