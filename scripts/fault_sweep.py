"""Sweep of faults and bad input, tried as a careless or hostile user would; counts the outcomes.

Every case runs the real command line (``fullgraph ...`` or ``mpirun -n P fullgraph ...``) in a
scratch copy of a small workspace (a synthetic dataset, a 2-part METIS partition, a finished
run's checkpoint and log, an ``.npz`` dataset) and is classified:

- ``clean``: what was expected happened: for bad input one line naming the problem (argparse's
  usage block and MPI's own abort line aside), the expected exit status, no traceback;
- ``unclear``: it failed, but with a traceback, several lines or another exit status;
- ``hang``: it did not end within the case's time limit;
- ``running``: it ended, but a process it started (a rank) still runs in its directory;
- ``silent``: bad input accepted (exit 0);
- ``debris``: temporaries (``.*.tmp-*``) left behind (after the follow-up run, where a case
  has one);
- ``lost``: a file the case protects (an earlier result) changed or vanished.

Usage::

    python scripts/fault_sweep.py [--work DIR] [--csv runs/faults.csv] [--only 'SUBSTRING|...']

Prints one line per case and the counts; ``--csv`` writes them too. Exit status 1 when any case
is not clean.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent
FULLGRAPH = [sys.executable, "-m", "fullgraph.cli"]
MPIRUN = str(BIN / "mpirun") if (BIN / "mpirun").exists() else "mpirun"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def fg(*args: str) -> list[str]:
    """``fullgraph ARGS`` in this Python."""
    return [*FULLGRAPH, *args]


def mpi(ranks: int, *args: str) -> list[str]:
    """``mpirun -n RANKS fullgraph ARGS``."""
    return [MPIRUN, "-n", str(ranks), *FULLGRAPH, *args]


@dataclass
class Case:
    """One fault: a command (or several at once), what it may touch, what should happen.

    Attributes:
        name: short label.
        cmds: commands run at the same time (one, or two for races); ``{w}`` is the case dir.
        expect: ``error`` (bad input: exit 2), ``diverge`` (exit 3), ``ok`` (exit 0),
            ``one-ok`` (of concurrent commands exactly one succeeds, the others fail cleanly),
            ``signal`` (ended by the case's signal: exit 128+n or the launcher's non-zero),
            ``fails`` (a user's script fails: non-zero, ``needle`` in its output, its own
            traceback allowed).
        setup: prepares the case dir before the run (tampering).
        protect: paths (relative to the case dir) that must keep their content.
        signal: ``(signum, seconds, target)``: send it that long after the start (or after
            ``signal_when`` appears) to the ``main`` process or to one ``rank`` (the newest
            python child).
        signal_when: a glob (relative to the case dir) whose first match starts the signal's
            clock, so the signal lands while that output is being written.
        follow: a command run afterwards (e.g. the next run that must clean up).
        check: extra check after everything; returns a problem or ``None``.
        needle: text the error line must contain.
        timeout: seconds before the case counts as a hang.
        env: extra environment variables.
        code: the exit status an ``error`` case must end with (default 2).
    """

    name: str
    cmds: list[list[str]]
    expect: str = "error"
    setup: Callable[[Path], None] | None = None
    protect: list[str] = field(default_factory=list)
    signal: tuple[int, float, str] | None = None
    follow: list[str] | None = None
    check: Callable[[Path], str | None] | None = None
    needle: str = ""
    timeout: float = 120.0
    env: dict[str, str] = field(default_factory=dict)
    signal_when: str | None = None
    code: int | None = None


# -- the workspace ---------------------------------------------------------------------------


def _run(cmd: list[str], cwd: Path) -> None:
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
    _run(fg("data", "synth", "--preset", "tiny", "--name", "tiny", "--root", "data"), base)
    _run(fg("data", "synth", "--preset", "arxiv", "--name", "arxiv", "--root", "big"), base)
    _run(
        fg("partition", "--dataset", "tiny", "--root", "data", "--parts", "2", "--out", "p2"), base
    )
    train = ["train", "--parts", "p2", "--epochs", "3", "--quiet", "--checkpoint", "ck"]
    _run([MPIRUN, "-n", "2", *FULLGRAPH, *train, "--log-json", "logs/run.jsonl"], base)
    _write_npz_dataset(base / "data")


# -- tampering -------------------------------------------------------------------------------


def _edit_meta(
    key: str, scale: float | None = None, value: object = None
) -> Callable[[Path], None]:
    import json

    def setup(w: Path) -> None:
        path = w / "p2" / "meta.json"
        meta = json.loads(path.read_text())
        meta[key] = value if scale is None else type(meta[key])(meta[key] * scale)
        path.write_text(json.dumps(meta, indent=2))

    return setup


def _flip_byte(rel: str, offset: int = -40) -> Callable[[Path], None]:
    def setup(w: Path) -> None:
        path = w / rel
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x40
        path.write_bytes(bytes(data))

    return setup


def _write(rel: str, data: bytes) -> Callable[[Path], None]:
    def setup(w: Path) -> None:
        (w / rel).parent.mkdir(parents=True, exist_ok=True)
        (w / rel).write_bytes(data)

    return setup


def _gz_lines(rel: str, transform: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    def setup(w: Path) -> None:
        path = w / rel
        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        path.write_bytes(gzip.compress(("\n".join(transform(lines)) + "\n").encode()))
        shutil.rmtree(path.parents[1] / "processed", ignore_errors=True)

    return setup


def _npz_edit(**changes: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    def setup(w: Path) -> None:
        path = w / "data" / "amazon_photo" / "raw" / "amazon_electronics_photo.npz"
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
        for key, fn in changes.items():
            arrays[key] = fn(arrays[key])
        np.savez(path, **arrays)

    return setup


def _chain(*fns: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(w: Path) -> None:
        for fn in fns:
            fn(w)

    return setup


def _parts_whole(w: Path) -> str | None:
    proc = subprocess.run(fg("verify", "p2"), cwd=w, env=ENV, capture_output=True, text=True)
    return None if proc.returncode == 0 else f"p2 not whole after the case: {proc.stderr.strip()}"


def _nothing_outside(w: Path) -> str | None:
    strays = [p.name for p in w.parent.iterdir() if p.name in ("x", "escaped")]
    return f"wrote outside --root: {strays}" if strays else None


# -- the cases -------------------------------------------------------------------------------


def cases() -> list[Case]:
    """Every case of the sweep."""
    tr = ["train", "--parts", "p2", "--quiet"]
    mb = ["minibatch", "--dataset", "tiny", "--root", "data", "--quiet", "--epochs", "1"]
    out: list[Case] = []
    add = out.append
    # results of earlier runs
    add(
        Case(
            "train fresh on a used --checkpoint",
            [mpi(2, *tr, "--epochs", "2", "--checkpoint", "ck")],
            protect=["ck"],
            needle="--resume",
        )
    )
    add(
        Case(
            "two trainings on one --checkpoint",
            [
                mpi(2, *tr, "--epochs", "30", "--checkpoint", "ck2"),
                mpi(2, *tr, "--epochs", "30", "--checkpoint", "ck2"),
            ],
            expect="one-ok",
        )
    )
    add(
        Case(
            "two partitions to one --out",
            [
                fg(
                    "partition",
                    "--dataset",
                    "tiny",
                    "--root",
                    "data",
                    "--parts",
                    "2",
                    "--out",
                    "p2new",
                ),
                fg(
                    "partition",
                    "--dataset",
                    "tiny",
                    "--root",
                    "data",
                    "--parts",
                    "2",
                    "--out",
                    "p2new",
                ),
            ],
            expect="one-ok",
        )
    )
    for at in (0.0, 0.05, 0.2):
        add(
            Case(
                f"partition --force SIGKILL at {at} s",
                [
                    fg(
                        "partition",
                        "--dataset",
                        "arxiv",
                        "--root",
                        "big",
                        "--parts",
                        "2",
                        "--out",
                        "p2",
                        "--force",
                    )
                ],
                expect="signal",
                signal=(signal.SIGKILL, at, "main"),
                signal_when=".p2.tmp-*",
                check=_parts_whole,
                follow=fg(
                    "partition",
                    "--dataset",
                    "tiny",
                    "--root",
                    "data",
                    "--parts",
                    "2",
                    "--out",
                    "p2",
                    "--force",
                ),
                timeout=180,
            )
        )
    add(
        Case(
            "data synth --name . --force",
            [fg("data", "synth", "--name", ".", "--root", "data", "--force")],
            protect=["data"],
        )
    )
    add(
        Case(
            "data synth --name ../x",
            [fg("data", "synth", "--name", "../x", "--root", "data")],
            check=_nothing_outside,
        )
    )
    add(
        Case(
            "data synth --name /abs",
            [fg("data", "synth", "--name", "{w}/escaped", "--root", "data")],
            check=lambda w: "wrote /abs" if (w / "escaped").exists() else None,
        )
    )
    add(
        Case(
            "--log-json onto an existing log",
            [mpi(2, *tr, "--epochs", "2", "--log-json", "logs/run.jsonl")],
            protect=["logs"],
        )
    )
    add(
        Case(
            "minibatch --log-json onto an existing log",
            [fg(*mb, "--log-json", "logs/run.jsonl")],
            protect=["logs"],
        )
    )
    add(
        Case(
            "checkpoint with a flipped byte",
            [mpi(2, *tr, "--epochs", "6", "--checkpoint", "ck", "--resume")],
            setup=_flip_byte("ck/checkpoint.pt"),
            protect=["ck"],
            needle="checksum",
        )
    )
    for cmd, opts in (("train", tr), ("minibatch", mb)):
        for opt, val in (
            ("--lr", "nan"),
            ("--lr", "inf"),
            ("--weight-decay", "nan"),
            ("--weight-decay", "-5"),
            ("--timeout", "nan"),
            ("--timeout", "0"),
            ("--timeout", "-1"),
            ("--dropout", "1.5"),
            ("--epochs", "0"),
        ):
            add(Case(f"{cmd} {opt} {val}", [fg(*opts, f"{opt}={val}")], needle=opt))
    add(
        Case(
            "train diverges (--lr 1e30)",
            [
                mpi(
                    2,
                    *tr,
                    "--epochs",
                    "30",
                    "--lr",
                    "1e30",
                    "--checkpoint",
                    "ckd",
                    "--checkpoint-every",
                    "1",
                )
            ],
            expect="diverge",
            needle="loss",
        )
    )
    add(
        Case(
            "minibatch diverges (--lr 1e30)",
            [fg(*mb, "--epochs", "3", "--lr", "1e30")],
            expect="diverge",
            needle="loss",
        )
    )
    add(
        Case(
            "meta.json num_train_global x10",
            [mpi(2, *tr, "--epochs", "1")],
            setup=_edit_meta("num_train_global", 10),
        )
    )
    add(
        Case(
            "verify: meta.json num_train_global x10",
            [fg("verify", "p2")],
            setup=_edit_meta("num_train_global", 10),
        )
    )
    add(
        Case(
            "meta.json num_classes - 1",
            [mpi(2, *tr, "--epochs", "1")],
            setup=_edit_meta("num_classes", None, 3),
        )
    )
    add(
        Case(
            "verify: meta.json num_classes + 5",
            [fg("verify", "p2")],
            setup=_edit_meta("num_classes", None, 45),
        )
    )
    add(
        Case(
            "meta.json num_features + 1",
            [mpi(2, *tr, "--epochs", "1")],
            setup=_edit_meta("num_features", None, 33),
        )
    )
    add(
        Case(
            "verify: meta.json num_nodes",
            [fg("verify", "p2")],
            setup=_edit_meta("num_nodes", None, 2999),
        )
    )
    add(
        Case(
            "meta.json num_parts says 3",
            [mpi(2, *tr, "--epochs", "1")],
            setup=_edit_meta("num_parts", None, 3),
        )
    )
    add(
        Case(
            "meta.json not JSON",
            [mpi(2, *tr, "--epochs", "1")],
            setup=_write("p2/meta.json", b"{not json"),
        )
    )

    def add_train_node_to_test(w: Path) -> None:
        split = w / "data" / "tiny" / "split"
        scheme = next(p for p in split.iterdir() if p.is_dir())
        first_train = gzip.decompress((scheme / "train.csv.gz").read_bytes()).decode().split()[0]
        test = gzip.decompress((scheme / "test.csv.gz").read_bytes()).decode()
        (scheme / "test.csv.gz").write_bytes(gzip.compress((test + first_train + "\n").encode()))
        shutil.rmtree(w / "data" / "tiny" / "processed", ignore_errors=True)

    add(
        Case(
            "a node in train and test: data info",
            [fg("data", "info", "--dataset", "tiny", "--root", "data")],
            setup=add_train_node_to_test,
        )
    )
    add(
        Case(
            "a node in train and test: partition",
            [
                fg(
                    "partition",
                    "--dataset",
                    "tiny",
                    "--root",
                    "data",
                    "--parts",
                    "2",
                    "--out",
                    "p2x",
                )
            ],
            setup=add_train_node_to_test,
        )
    )
    add(
        Case(
            "a node in train and test: verify",
            [fg("verify", "p2", "--root", "data")],
            setup=add_train_node_to_test,
        )
    )
    add(
        Case(
            "--resume --epochs below the checkpoint",
            [mpi(2, *tr, "--epochs", "2", "--checkpoint", "ck", "--resume")],
            protect=["ck"],
            needle="--epochs",
        )
    )
    # malformed files
    edge = "data/tiny/raw/edge.csv.gz"

    def truncate(rel: str, keep: int) -> Callable[[Path], None]:
        def setup(w: Path) -> None:
            (w / rel).write_bytes((w / rel).read_bytes()[:keep])
            shutil.rmtree(w / "data" / "tiny" / "processed", ignore_errors=True)

        return setup

    info = fg("data", "info", "--dataset", "tiny", "--root", "data")
    add(Case("truncated edge.csv.gz", [info], setup=truncate(edge, 300)))
    add(
        Case(
            "edge.csv.gz not gzip",
            [info],
            setup=_chain(
                _write(edge, b"0,1\n1,2\n"),
                lambda w: shutil.rmtree(w / "data/tiny/processed", ignore_errors=True),
            ),
        )
    )
    add(
        Case(
            "edge.csv.gz with letters",
            [info],
            setup=_gz_lines(edge, lambda ls: [*ls[:5], "a,b", *ls[5:]]),
        )
    )
    add(
        Case(
            "edge.csv.gz with an id out of range",
            [info],
            setup=_gz_lines(edge, lambda ls: [*ls, "0,999999"]),
        )
    )
    add(
        Case(
            "edge.csv.gz with a negative id",
            [info],
            setup=_gz_lines(edge, lambda ls: [*ls, "-1,3"]),
        )
    )
    add(
        Case(
            "edge.csv.gz with three columns",
            [info],
            setup=_gz_lines(edge, lambda ls: [*ls[:3], "1,2,3", *ls[3:]]),
        )
    )
    add(
        Case(
            "edge.csv.gz empty",
            [info],
            setup=_chain(
                _write(edge, gzip.compress(b"")),
                lambda w: shutil.rmtree(w / "data/tiny/processed", ignore_errors=True),
            ),
        )
    )
    add(
        Case(
            "node-feat with NaN",
            [info],
            setup=_gz_lines(
                "data/tiny/raw/node-feat.csv.gz",
                lambda ls: [",".join(["nan"] * len(ls[0].split(","))), *ls[1:]],
            ),
        )
    )
    add(
        Case(
            "node-label out of range",
            [info],
            setup=_gz_lines("data/tiny/raw/node-label.csv.gz", lambda ls: ["9999", *ls[1:]]),
        )
    )
    add(
        Case(
            "node-label one row short",
            [info],
            setup=_gz_lines("data/tiny/raw/node-label.csv.gz", lambda ls: ls[:-1]),
        )
    )
    add(
        Case(
            "split file names an unknown node",
            [info],
            setup=_gz_lines("data/tiny/split/random/valid.csv.gz", lambda ls: [*ls, "123456789"]),
        )
    )
    npz_info = fg("data", "info", "--dataset", "amazon-photo", "--root", "data")
    add(Case("npz: valid (control)", [npz_info], expect="ok"))
    add(
        Case(
            "npz: CSR index out of range",
            [npz_info],
            setup=_npz_edit(adj_indices=lambda a: np.where(np.arange(a.size) == 0, 10**6, a)),
        )
    )
    add(
        Case(
            "npz: CSR indptr not monotone",
            [npz_info],
            setup=_npz_edit(adj_indptr=lambda a: a[::-1].copy()),
        )
    )
    add(Case("npz: indptr too short", [npz_info], setup=_npz_edit(adj_indptr=lambda a: a[:-5])))
    add(Case("npz: labels too short", [npz_info], setup=_npz_edit(labels=lambda a: a[:-3])))
    add(
        Case(
            "npz: negative label",
            [npz_info],
            setup=_npz_edit(labels=lambda a: np.where(np.arange(a.size) == 0, -7, a)),
        )
    )
    add(
        Case(
            "npz: NaN feature",
            [npz_info],
            setup=_npz_edit(
                attr_data=lambda a: np.where(np.arange(a.size) == 0, np.nan, a).astype(np.float32)
            ),
        )
    )
    add(
        Case(
            "npz: a text file",
            [npz_info],
            setup=_write(
                "data/amazon_photo/raw/amazon_electronics_photo.npz", b"hello, not an npz\n"
            ),
        )
    )
    add(
        Case(
            "npz: a zip that is not a zip",
            [npz_info],
            setup=_chain(
                lambda w: (w / "data/amazon_photo/raw/amazon_electronics_photo.npz").unlink(),
                _write("data/amazon_photo/raw/amazon-photo.zip", b"PK\x03\x04garbage"),
            ),
        )
    )
    # outputs in bad places
    for opt, rel, kind in (
        ("--log-json", "logs", "a directory"),
        ("--log-json", "p2/meta.json/x.jsonl", "under a file"),
        ("--log-json", "/proc/fg/x.jsonl", "read-only place"),
        ("--checkpoint", "/proc/fg/ck", "read-only place"),
        ("--checkpoint", "p2/meta.json", "a file"),
    ):
        add(
            Case(
                f"train {opt} {kind}",
                [mpi(2, *tr, "--epochs", "1", opt, rel)],
                protect=["p2", "logs"],
                check=lambda w: (
                    "stray config file"
                    if list(w.glob("**/*.config.json")) != [w / "logs" / "run.config.json"]
                    else None
                ),
            )
        )
    add(Case("minibatch --log-json a directory", [fg(*mb, "--log-json", "logs")], protect=["logs"]))
    add(
        Case(
            "partition --out read-only place",
            [
                fg(
                    "partition",
                    "--dataset",
                    "tiny",
                    "--root",
                    "data",
                    "--parts",
                    "2",
                    "--out",
                    "/proc/fg/p",
                )
            ],
        )
    )
    add(
        Case(
            "partition --out under a file",
            [
                fg(
                    "partition",
                    "--dataset",
                    "tiny",
                    "--root",
                    "data",
                    "--parts",
                    "2",
                    "--out",
                    "p2/meta.json/p",
                )
            ],
            protect=["p2"],
        )
    )
    add(
        Case(
            "data synth --root is a file",
            [fg("data", "synth", "--name", "t", "--root", "p2/meta.json")],
            protect=["p2"],
        )
    )
    add(Case("verify parts/meta.json", [fg("verify", "p2/meta.json")], expect="ok"))
    add(
        Case(
            "train --parts parts/meta.json",
            [mpi(2, "train", "--quiet", "--epochs", "1", "--parts", "p2/meta.json")],
            expect="ok",
        )
    )
    # debris
    add(
        Case(
            "partition SIGTERM",
            [
                fg(
                    "partition",
                    "--dataset",
                    "arxiv",
                    "--root",
                    "big",
                    "--parts",
                    "2",
                    "--out",
                    "pbig",
                )
            ],
            expect="signal",
            signal=(signal.SIGTERM, 0.05, "main"),
            signal_when=".pbig.tmp-*",
            timeout=180,
        )
    )
    add(
        Case(
            "partition SIGKILL, next run cleans",
            [
                fg(
                    "partition",
                    "--dataset",
                    "arxiv",
                    "--root",
                    "big",
                    "--parts",
                    "2",
                    "--out",
                    "pbig",
                )
            ],
            expect="signal",
            signal=(signal.SIGKILL, 0.05, "main"),
            signal_when=".pbig.tmp-*",
            follow=fg(
                "partition", "--dataset", "tiny", "--root", "data", "--parts", "2", "--out", "pbig"
            ),
            timeout=180,
        )
    )
    add(
        Case(
            "data synth SIGTERM",
            [fg("data", "synth", "--preset", "arxiv", "--name", "a2", "--root", "data")],
            expect="signal",
            signal=(signal.SIGTERM, 0.05, "main"),
            signal_when="data/.a2.tmp-*",
            timeout=180,
        )
    )
    add(
        Case(
            "train SIGKILL mid-checkpointing, next run cleans",
            [
                fg(
                    "train",
                    "--synthetic",
                    "tiny",
                    "--quiet",
                    "--epochs",
                    "100000",
                    "--checkpoint",
                    "cks",
                    "--checkpoint-every",
                    "1",
                )
            ],
            expect="signal",
            signal=(signal.SIGKILL, 6.0, "main"),
            follow=fg(
                "train",
                "--synthetic",
                "tiny",
                "--quiet",
                "--epochs",
                "1",
                "--checkpoint",
                "cks",
                "--force",
            ),
            timeout=200,
        )
    )
    # beyond the issue
    add(
        Case("mpirun -n 3 on 2 parts", [mpi(3, *tr, "--epochs", "1")], needle="2 parts but 3 ranks")
    )
    add(Case("--parts missing directory", [mpi(2, *tr, "--epochs", "1", "--parts", "nope")]))
    add(Case("--parts is a file", [mpi(2, "train", "--quiet", "--parts", "logs/run.jsonl")]))
    add(
        Case(
            "part file of rank 1 corrupted",
            [mpi(2, *tr, "--epochs", "1")],
            setup=_flip_byte("p2/part-1/x.npy"),
            needle="part-1",
        )
    )
    add(
        Case(
            "part file truncated",
            [mpi(2, *tr, "--epochs", "1")],
            setup=lambda w: (w / "p2/part-0/indices.npy").write_bytes(
                (w / "p2/part-0/indices.npy").read_bytes()[:64]
            ),
        )
    )
    add(
        Case(
            "part directory missing",
            [fg("verify", "p2")],
            setup=lambda w: shutil.rmtree(w / "p2" / "part-1"),
        )
    )
    add(
        Case(
            "meta.json missing",
            [mpi(2, *tr, "--epochs", "1")],
            setup=lambda w: (w / "p2/meta.json").unlink(),
        )
    )
    add(
        Case(
            "unknown dataset",
            [fg("partition", "--dataset", "nope", "--root", "data", "--parts", "2", "--out", "q")],
        )
    )
    add(Case("--root missing", [fg("data", "info", "--dataset", "tiny", "--root", "nowhere")]))
    add(
        Case(
            "partition --parts 0",
            [fg("partition", "--dataset", "tiny", "--root", "data", "--parts", "0", "--out", "q")],
        )
    )
    add(
        Case(
            "partition --parts > nodes",
            [
                fg(
                    "partition",
                    "--dataset",
                    "tiny",
                    "--root",
                    "data",
                    "--parts",
                    "5000",
                    "--out",
                    "q",
                )
            ],
        )
    )
    add(Case("--log-json empty", [fg("train", "--synthetic", "tiny", "--log-json", "")]))
    add(Case("--checkpoint empty", [fg("train", "--synthetic", "tiny", "--checkpoint", "")]))
    add(
        Case(
            "--resume, other model",
            [mpi(2, *tr, "--epochs", "6", "--checkpoint", "ck", "--resume", "--model", "sage")],
            protect=["ck"],
            needle="model",
        )
    )
    add(
        Case(
            "--resume, other partition",
            [mpi(2, *tr, "--epochs", "6", "--checkpoint", "ck", "--resume", "--parts", "p2b")],
            setup=lambda w: _run(
                fg(
                    "partition",
                    "--dataset",
                    "tiny",
                    "--root",
                    "data",
                    "--parts",
                    "2",
                    "--out",
                    "p2b",
                    "--method",
                    "random",
                ),
                w,
            ),
            protect=["ck"],
            needle="partition",
        )
    )
    add(
        Case(
            "--resume, no checkpoint",
            [mpi(2, *tr, "--epochs", "6", "--checkpoint", "empty", "--resume")],
            check=lambda w: "created an empty checkpoint dir" if (w / "empty").exists() else None,
        )
    )
    add(Case("--transport nccl without GPU", [mpi(2, *tr, "--epochs", "1", "--transport", "nccl")]))
    add(Case("--device cuda without GPU", [fg("train", "--synthetic", "tiny", "--device", "cuda")]))
    add(Case("minibatch --fanouts 0", [fg(*mb, "--fanouts", "5,0")]))
    add(Case("minibatch --batch-size 0", [fg(*mb, "--batch-size", "0")]))
    add(
        Case(
            "FULLGRAPH_FAIL_AT malformed",
            [fg("train", "--synthetic", "tiny", "--epochs", "1", "--quiet")],
            env={"FULLGRAPH_FAIL_AT": "0:x"},
        )
    )
    add(
        Case(
            "kill -9 one rank",
            [mpi(2, *tr, "--epochs", "100000", "--checkpoint", "ck9", "--checkpoint-every", "2")],
            expect="signal",
            signal=(signal.SIGKILL, 7.0, "rank"),
            timeout=90,
        )
    )
    add(
        Case(
            "SIGTERM one rank",
            [mpi(2, *tr, "--epochs", "100000")],
            expect="signal",
            signal=(signal.SIGTERM, 7.0, "rank"),
            timeout=90,
        )
    )
    add(
        Case(
            "SIGTERM mpirun",
            [mpi(2, *tr, "--epochs", "100000")],
            expect="signal",
            signal=(signal.SIGTERM, 7.0, "main"),
            timeout=90,
        )
    )
    add(
        Case(
            "SIGINT one process",
            [
                fg(
                    "train",
                    "--synthetic",
                    "tiny",
                    "--quiet",
                    "--epochs",
                    "100000",
                    "--log-json",
                    "l.jsonl",
                )
            ],
            expect="signal",
            signal=(signal.SIGINT, 5.0, "main"),
            timeout=90,
        )
    )
    add(
        Case(
            "PMI_RANK not a number",
            [fg("train", "--synthetic", "tiny", "--epochs", "1")],
            env={"PMI_RANK": "zero", "PMI_SIZE": "1"},
        )
    )
    out += second_sweep_cases(tr)
    return out


# -- the second sweep (issue 22): --force, overlapping outputs, bounded phases ----------------


def _copy_parts(*names: str) -> Callable[[Path], None]:
    """Copies of the workspace's partition ``p2`` under each of ``names``."""

    def setup(w: Path) -> None:
        for name in names:
            shutil.copytree(w / "p2", w / name)

    return setup


def _partition_to(out: str) -> list[str]:
    """``fullgraph partition`` of the tiny dataset into ``out`` with ``--force``."""
    return fg(
        "partition", "--dataset", "tiny", "--root", "data", "--parts", "2", "--out", out, "--force"
    )


#: (name, command, setup, protected paths, needle): ``--force`` pointed at what fullgraph did not
#: write, or at an input of the same command; each must end with one line and touch nothing.
FORCE_CASES: list[tuple[str, list[str], Callable[[Path], None] | None, list[str], str]] = [
    (
        "partition --force --out the dataset read",
        _partition_to("data/tiny"),
        None,
        ["data"],
        "dataset",
    ),
    (
        "partition --force --out the dataset root",
        _partition_to("data"),
        _write("data/notes.txt", b"my notes\n"),
        ["data"],
        "root",
    ),
    (
        "partition --force --out a folder of two partitions",
        _partition_to("two"),
        _copy_parts("two/a", "two/b"),
        ["two"],
        "not a partition",
    ),
    (
        "partition --force --out a user folder",
        _partition_to("user"),
        _write("user/thesis.tex", b"\\documentclass{article}\n"),
        ["user"],
        "thesis.tex",
    ),
    (
        "data synth --force over a user folder",
        fg("data", "synth", "--preset", "tiny", "--name", "mine", "--root", "r", "--force"),
        _write("r/mine/thesis.tex", b"\\documentclass{article}\n"),
        ["r"],
        "thesis.tex",
    ),
]


def second_sweep_cases(tr: list[str]) -> list[Case]:
    """The cases the second sweep added: data loss through --force, overlapping outputs."""
    out = [
        Case(name, [cmd], setup=setup, protect=protect, needle=needle)
        for name, cmd, setup, protect, needle in FORCE_CASES
    ]
    for log in ("ck/config.json", "ck/checkpoint.pt", "ck", "p2/run.jsonl"):
        out.append(
            Case(
                f"train --log-json {log} with --checkpoint ck",
                [mpi(2, *tr, "--epochs", "1", "--checkpoint", "ck", "--resume", "--log-json", log)],
                protect=["ck", "p2"],
            )
        )
    out.append(
        Case(
            "train --force --log-json a user's notes",
            [mpi(2, *tr, "--epochs", "1", "--force", "--log-json", "notes.jsonl")],
            setup=_write("notes.jsonl", b'{"my": "notes"}\n'),
            protect=["notes.jsonl"],
            needle="notes.jsonl",
        )
    )
    out += bounded_phase_cases(tr) + size_cases(tr) + oom_cases() + clear_error_cases(tr)
    out.append(
        Case(
            "train --force over its own log and checkpoint (control)",
            [
                mpi(
                    2,
                    *tr,
                    "--epochs",
                    "1",
                    "--force",
                    "--checkpoint",
                    "ck",
                    "--log-json",
                    "logs/run.jsonl",
                )
            ],
            expect="ok",
        )
    )
    return out


#: A ``fullgraph.pyg`` script whose rank 1 fails before it calls ``load_part``.
PYG_FAILS_EARLY = b"""import os, sys
from fullgraph import pyg
if os.environ.get("PMI_RANK") == "1":
    raise ValueError("the script failed on rank 1")
pyg.load_part(sys.argv[1], timeout=10.0)
"""


def torchrun(ranks: int, *args: str) -> list[str]:
    """``torchrun --standalone --nproc-per-node RANKS fullgraph ARGS``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(ranks), "-m", "fullgraph.cli", *args]  # fmt: skip


def bounded_phase_cases(tr: list[str]) -> list[Case]:
    """Start-up stalls and dead launchers: every rank ends within ``--timeout`` (+ slack)."""
    forever = [*tr, "--epochs", "100000", "--timeout", "15", "--log-json", "l.jsonl"]
    return [
        Case(
            f"SIGSTOP one rank at {at} s (--timeout 15)",
            [mpi(2, *forever)],
            expect="signal",
            signal=(signal.SIGSTOP, at, "rank"),
            timeout=90,
        )
        for at in (0.5, 2.5)
    ] + [
        Case(
            "pyg: rank 1 raises before load_part",
            [[MPIRUN, "-n", "2", sys.executable, "script.py", "p2"]],
            expect="fails",
            setup=_write("script.py", PYG_FAILS_EARLY),
            needle="rank 1",
            timeout=90,
        ),
        Case(
            "kill -9 torchrun",
            [torchrun(2, *forever)],
            expect="signal",
            signal=(signal.SIGKILL, 1.0, "main"),
            signal_when="l.jsonl",
            timeout=90,
        ),
        Case(
            "SIGTERM one process during start-up",
            [fg("train", "--dataset", "arxiv", "--root", "big", "--epochs", "1", "--quiet")],
            expect="signal",
            signal=(signal.SIGTERM, 1.0, "main"),
            timeout=60,
        ),
    ]


def size_cases(tr: list[str]) -> list[Case]:
    """Sizes beyond the node's memory are refused before anything large is allocated."""
    one = ["train", "--synthetic", "tiny", "--quiet", "--epochs", "1"]
    return [
        Case(f"train {' '.join(opts)}", [fg(*one, *opts)], needle="memory plan", timeout=60)
        for opts in (
            ["--hidden", "10000000"],
            ["--model", "gat", "--heads", "100000"],
            ["--layers", "100000", "--hidden", "256"],
        )
    ] + [
        Case(
            "train --layers 100000 (fits at width 16), SIGTERM at 5 s",
            [fg(*one, "--layers", "100000")],
            expect="signal",
            signal=(signal.SIGTERM, 5.0, "main"),
            timeout=30,
        ),
        Case(
            "mpirun -n 2 train beyond the node's memory",
            [mpi(2, *tr, "--epochs", "1", "--hidden", "1000000")],
            needle="memory plan",
            timeout=60,
        ),
        Case(
            "minibatch --hidden 10000000",
            [
                fg(
                    "minibatch",
                    "--dataset",
                    "tiny",
                    "--root",
                    "data",
                    "--quiet",
                    "--epochs",
                    "1",
                    "--hidden",
                    "10000000",
                )
            ],  # fmt: skip
            needle="memory plan",
            timeout=60,
        ),
    ]


def oom_cases() -> list[Case]:
    """An allocation that fails (``--memory-check warn`` past the plan, under a 6 GB address
    space limit so that the machine is not emptied): one line, exit status 1."""
    if not shutil.which("prlimit"):
        return []
    cap = ["prlimit", "--as=6000000000"]
    run = ["train", "--quiet", "--epochs", "1", "--hidden", "10000000", "--memory-check", "warn"]
    return [
        Case(
            "train out of memory (--memory-check warn)",
            [[*cap, *fg(*run, "--synthetic", "tiny")]],
            needle="out of memory",
            code=1,
            timeout=120,
        ),
    ]


def _full_disk(w: Path) -> None:
    """A 32 KiB tmpfs at ``w/full`` (root only; the check unmounts it)."""
    (w / "full").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(w / "full")],
                   check=True)  # fmt: skip
    (w / "full" / "filler").write_bytes(b"\0" * 28 * 1024)


def _unmount(w: Path) -> str | None:
    subprocess.run(["umount", str(w / "full")], check=False)
    return None


def _musae(w: Path) -> None:
    """A small GitHub MUSAE copy under the name it is distributed with (``github_musae``)."""
    raw = w / "data" / "github_musae" / "raw"
    raw.mkdir(parents=True)
    edges = "".join(f"{i},{(i * 7 + 3) % 200}\n" for i in range(200))
    (raw / "edges.csv").write_text("id_1,id_2\n" + edges)
    (raw / "target.csv").write_text("id,name,ml_target\n" + "".join(
        f"{i},dev{i},{i % 2}\n" for i in range(200)))  # fmt: skip


def clear_error_cases(tr: list[str]) -> list[Case]:
    """A full disk, a rendezvous nobody answers, an edgeless graph, MUSAE's own names."""
    npz = ["data", "info", "--dataset", "amazon-photo", "--root", "data"]
    out = [
        Case(
            "gloo rendezvous at an address nobody answers",
            [fg(*tr, "--epochs", "1", "--transport", "gloo", "--timeout", "10")],
            env={
                "RANK": "1",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "9",
            },  # fmt: skip
            needle="127.0.0.1",
            code=4,
            timeout=60,
        ),
        Case(
            "npz: a graph with no edges",
            [fg(*npz)],
            expect="ok",
            setup=_npz_edit(
                adj_data=lambda a: a[:0],
                adj_indices=lambda a: a[:0],
                adj_indptr=lambda a: np.zeros_like(a),
            ),
        ),
        Case(
            "MUSAE under its own directory name",
            [fg("data", "info", "--dataset", "github", "--root", "data")],
            expect="ok",
            setup=_musae,
        ),  # fmt: skip
    ]
    if os.geteuid() == 0 and shutil.which("mount"):
        out += [
            Case(
                f"full disk while writing the {what}",
                [fg("train", "--synthetic", "tiny", "--quiet", "--epochs", "3", *opts)],
                setup=_full_disk,
                check=_unmount,
                needle="no space left on device",
                code=1,
                timeout=60,
            )
            for what, opts in (
                ("checkpoint", ["--checkpoint", "full/ck", "--checkpoint-every", "1"]),
                ("log", ["--log-json", "full/run.jsonl"]),
            )
        ]
    return out


# -- running and classifying ----------------------------------------------------------------


def _digest(root: Path, rels: list[str]) -> dict[str, str]:
    out = {}
    for rel in rels:
        p = root / rel
        files = (
            [p]
            if p.is_file()
            else sorted(q for q in p.rglob("*") if q.is_file())
            if p.exists()
            else []
        )
        for q in files:
            if q.name == ".lock":
                continue
            out[str(q.relative_to(root))] = hashlib.sha256(q.read_bytes()).hexdigest()
    return out


def _newest_python_child(pid: int) -> int | None:
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return None
    kids = [int(k) for k in out.split()]
    found = []
    for k in kids:
        found += (
            [k]
            if "python" in Path(f"/proc/{k}/cmdline").read_bytes().decode(errors="replace")
            else []
        )
        grand = _newest_python_child(k)
        found += [grand] if grand else []
    return max(found) if found else None


def _error_lines(stderr: str) -> list[str]:
    """Lines that count: argparse's usage block, warnings and MPI's own abort lines aside."""
    keep = []
    in_usage = False
    for line in stderr.splitlines():
        if not line.strip():
            continue
        if line.startswith("usage:"):
            in_usage = True
            continue
        if in_usage and line.startswith(" "):
            continue
        in_usage = False
        if line.startswith(
            ("Abort(", "MPICH", "[", "=", "YOUR APPLICATION", "This typically", "Please see")
        ):
            continue
        if "Warning" in line or ": warning: " in line:
            continue
        keep.append(line)
    return keep


def _left_running(w: Path, grace: float = 5.0) -> list[int]:
    """Processes still working in the case dir ``w`` ``grace`` seconds after its command ended
    (a rank its killed launcher left behind); they are killed."""
    deadline = time.monotonic() + grace
    while True:
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if Path(os.readlink(proc / "cwd")).is_relative_to(w):
                    pids.append(int(proc.name))
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def run_case(case: Case, base: Path, work: Path) -> tuple[str, str]:
    """Run ``case`` in a fresh copy of ``base``; return ``(outcome, detail)``."""
    w = work / case.name.replace(" ", "_").replace("/", "_")
    shutil.rmtree(w, ignore_errors=True)
    shutil.copytree(base, w, symlinks=True, ignore=shutil.ignore_patterns("big"))
    (w / "big").symlink_to(base / "big")
    env = {**ENV, **case.env}
    if case.setup:
        case.setup(w)
    protected = _digest(w, case.protect)
    cmds = [[a.replace("{w}", str(w)) for a in c] for c in case.cmds]
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            c,
            cwd=w,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for c in cmds
    ]
    if case.signal:
        signum, after, target = case.signal
        if case.signal_when:
            while not list(w.glob(case.signal_when)) and time.monotonic() - t0 < case.timeout:
                if all(p.poll() is not None for p in procs):
                    break
                time.sleep(0.01)
        time.sleep(after)
        pid = procs[0].pid if target == "main" else _newest_python_child(procs[0].pid)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, case.timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            return "hang", f"no end within {case.timeout:g} s"
        results.append((proc.returncode, out, err))
    seconds = time.monotonic() - t0
    left = _left_running(w)
    if left:
        return "running", f"{len(left)} process(es) still running in the case dir after the end"
    if case.follow:
        try:
            subprocess.run(case.follow, cwd=w, env=env, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return "hang", "the follow-up run did not end within 300 s"
    if _digest(w, case.protect) != protected:
        return "lost", f"a protected file changed ({', '.join(case.protect)})"
    debris = [str(p.relative_to(w)) for p in w.rglob(".*.tmp-*")] + [
        str(p.relative_to(w)) for p in w.rglob(".*.old-*")
    ]
    if debris:
        return "debris", ", ".join(debris[:3])
    if case.check:
        problem = case.check(w)
        if problem:
            return "lost" if "not whole" in problem or "wrote" in problem else "debris", problem
    codes = [r[0] for r in results]
    if case.expect == "one-ok":
        ok = [r for r in results if r[0] == 0]
        bad = [r for r in results if r[0] != 0]
        if len(ok) != 1:
            return "silent" if len(ok) > 1 else "unclear", f"exit codes {codes}"
        lines = _error_lines(bad[0][2])
        if len(lines) != 1 or "Traceback" in bad[0][2]:
            return "unclear", " | ".join(lines[:3])
        return "clean", f"{seconds:.1f} s: {lines[0][:150]}"
    code, _, err = results[0]
    lines = _error_lines(err)
    if case.expect == "ok":
        return (
            ("clean", f"{seconds:.1f} s: exit 0")
            if code == 0
            else ("unclear", f"exit {code}: {' | '.join(lines[:2])}")
        )
    if case.expect == "signal":
        if code == 0:
            return "silent", "exit 0 after the signal"
        if "Traceback" in err:
            return "unclear", "traceback after the signal"
        return "clean", f"{seconds:.1f} s, exit {code}: {(lines or [''])[0][:150]}"
    if code == 0:
        return "silent", "exit 0"
    if case.expect == "fails":
        if case.needle not in err:
            return "unclear", f"exit {code}: no {case.needle!r}: {' | '.join(lines[-3:])[:300]}"
        return "clean", f"{seconds:.1f} s, exit {code}: {lines[-1][:150]}"
    want = case.code if case.code is not None else 3 if case.expect == "diverge" else 2
    if "Traceback" in err or len(lines) != 1 or code != want or case.needle not in lines[0]:
        return "unclear", f"exit {code}: {' | '.join(lines[:3])[:300]}"
    return "clean", f"{seconds:.1f} s: {lines[0][:150]}"


def main() -> int:
    """Build the workspace, run every case (or those matching ``--only``), print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work", type=Path, default=None, help="scratch directory (default: a temporary one)"
    )
    parser.add_argument("--csv", type=Path, default=None, help="write one row per case here")
    parser.add_argument(
        "--only", default="", help="run the cases whose name contains this ('a|b': either)"
    )
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="fullgraph-faults-"))
    base = work / "base"
    if not (base / "p2" / "meta.json").exists():
        print(f"building the workspace in {base} ...", flush=True)
        shutil.rmtree(base, ignore_errors=True)
        build_workspace(base)
    rows = []
    counts: Counter[str] = Counter()
    for case in cases():
        if args.only and not any(part in case.name for part in args.only.split("|")):
            continue
        outcome, detail = run_case(case, base, work / "cases")
        counts[outcome] += 1
        rows.append((case.name, outcome, detail))
        print(f"{outcome:8s} {case.name:50s} {detail}", flush=True)
    total = sum(counts.values())
    summary = ", ".join(
        f"{k} {counts.get(k, 0)}"
        for k in ("clean", "unclear", "hang", "running", "silent", "debris", "lost")
    )
    print(f"\n{total} cases: {summary}")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["case", "outcome", "detail"])
            writer.writerows(rows)
    return 0 if counts.get("clean", 0) == total else 1


if __name__ == "__main__":
    sys.exit(main())
