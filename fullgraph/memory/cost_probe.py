"""What a training step costs on this machine: per stored edge, per inner row, per halo row.

:func:`probe_costs` measures the costs :mod:`fullgraph.memory.projection` multiplies by a
part's sizes, for the run's own model, by timing the real trainer:

- **per edge and per row**, in this process: training steps on two graphs of the same rows
  that differ only in their edges: random graphs of in-degree 2 and 32 (:func:`_probe_graph`;
  their row gathers reach anywhere, an upper bound on a real graph's), or with ``parts`` the
  inner rows of a partition's part 0 with all their edges and every 8th (the graph's own
  locality, :func:`_inner_graph`). The step time difference over the edge difference is the
  per-edge cost, what is left of the sparser graph's step per row the per-row cost;
- **per halo row** (with ``halo=True``): ``mpirun -n 2 fullgraph train`` twice on random
  graphs of in-degree 8 cut into two contiguous halves, the same sizes, once with every edge
  inside its half (no halo) and once with the sources drawn from the whole graph (each rank's
  halo about its own rows). The slowest rank's compute (the step less its halo wait and
  reduction, as the run logs it) with the halo less without it, over the rows it sends and
  receives, is the cost of a halo row: the rows packed and unpacked, the products of the rows
  returned in the backward pass. The run without a halo against one process training one such
  half alone is the **sharing factor**: how much slower a rank computes while another rank
  runs on the same machine (memory bandwidth, the shared cache), which the projection applies
  to machines of several ranks. It needs ``mpirun`` and two ranks' threads of cores.

Every time is the fastest of a few steps after a warm-up (on a shared machine, the least
disturbed one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fullgraph.errors import ConfigError
from fullgraph.memory.model import check_modelled
from fullgraph.memory.projection import Costs
from fullgraph.memory.shapes import GraphShape
from fullgraph.training.config import TrainConfig

if TYPE_CHECKING:
    from fullgraph.datasets.graph import Graph
    from fullgraph.partition import Partition

__all__ = ["PROBE_ROWS", "probe_costs", "probe_rows"]

#: The cost probe's rows at most: ``[rows, 256]`` float32 is 256 MiB, far beyond a last-level
#: cache (random row gathers then run at the memory's rate, as on a papers100M-sized part).
PROBE_ROWS = 2**18


def probe_rows(graph: GraphShape) -> int:
    """The cost probe's rows for ``graph``: its largest part's, at most :data:`PROBE_ROWS`."""
    return max(64, min(PROBE_ROWS, max(p.num_inner for p in graph.parts)))


def _probe_graph(
    rows: int, degree: int, features: int, classes: int, train: float, halves: bool = False
) -> Graph:
    """``rows`` rows of ``degree`` uniformly random in-edges each (no self-loops); with
    ``halves`` every row's sources lie in its own half of the rows."""
    import numpy as np

    from fullgraph.datasets.graph import Graph

    rng = np.random.default_rng(degree)
    own = np.broadcast_to(np.arange(rows)[:, None], (rows, degree))
    if halves:
        half = rows // 2
        start = np.where(own >= half, half, 0)
        size = np.where(own >= half, rows - half, half)
        cols = start + rng.integers(0, 2**62, (rows, degree)) % size
        loops = cols == own
        cols[loops] = start[loops] + (own[loops] - start[loops] + 1) % size[loops]
    else:
        cols = rng.integers(0, rows, (rows, degree))
        loops = cols == own
        cols[loops] = (own[loops] + 1) % rows
    cols.sort(axis=1)
    train_mask = rng.random(rows) < train
    return Graph(
        name=f"cost-probe-{degree}",
        num_nodes=rows,
        indptr=np.arange(0, rows * degree + 1, degree, dtype=np.int64),
        indices=cols.reshape(-1).astype(np.int64),
        x=rng.normal(size=(rows, features)).astype(np.float32),
        y=rng.integers(0, classes, rows).astype(np.int64),
        train_mask=train_mask,
        val_mask=~train_mask,
        test_mask=np.zeros(rows, bool),
        num_classes=classes,
    )


def _inner_graph(parts: str, rank: int, keep: int) -> Graph:
    """Part ``rank`` of a partition on disk as a graph of its inner rows alone (edges from halo
    rows dropped), every ``keep``-th of its remaining edges kept: the part's own locality."""
    import numpy as np

    from fullgraph.datasets.graph import Graph
    from fullgraph.partition import load_partition

    part = load_partition(parts, rank)
    n = part.num_inner
    indptr, indices = np.asarray(part.indptr), np.asarray(part.indices)
    rows = np.repeat(np.arange(n), np.diff(indptr[: n + 1]))
    inner = indices[: indptr[n]] < n
    chosen = np.flatnonzero(inner)[::keep]
    counts = np.bincount(rows[chosen], minlength=n)
    return Graph(
        name=f"cost-probe-part-{rank}",
        num_nodes=n,
        indptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        indices=indices[chosen].astype(np.int64),
        x=np.asarray(part.x[:n], dtype=np.float32),
        y=np.asarray(part.y[:n]).astype(np.int64),
        train_mask=np.asarray(part.train_mask[:n]),
        val_mask=np.asarray(part.val_mask[:n]),
        test_mask=np.asarray(part.test_mask[:n]),
        num_classes=part.num_classes,
    )


#: In-degree of the halo probe's graphs: with the halves joined, about every row of the other
#: half is a source (a halo as large as the part).
HALO_DEGREE = 8

#: A gentle learning rate, as the floor probe's: the steps only time the model.
_GENTLE = {"lr": 1e-3, "lr_warmup": 0}


def _step_seconds(part: Partition, cfg: TrainConfig, steps: int) -> float:
    """The fastest of ``steps`` training steps of the real trainer on ``part`` (after one
    warm-up): on a shared machine the least disturbed one."""
    from fullgraph.distributed.communicator import Communicator
    from fullgraph.run.options import RunOptions
    from fullgraph.training.trainer import Trainer

    settings = {**cfg.to_dict(), "epochs": steps + 1, **_GENTLE, "extra": {}}
    trainer = Trainer(part, Communicator(), TrainConfig(**settings), RunOptions(quiet=True))
    trainer.train_step(1)
    times = []
    for epoch in range(2, steps + 2):
        t0 = time.perf_counter()
        trainer.train_step(epoch, keep_logits=False)
        times.append(time.perf_counter() - t0)
    return min(times)


def _train_argv(cfg: TrainConfig) -> list[str]:
    """``fullgraph train`` options giving ``cfg`` (those away from their defaults)."""
    argv = []
    base = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        value = {**cfg.to_dict(), **_GENTLE}.get(f.name)
        if not f.metadata.get("cli", True) or f.name == "extra" or value == getattr(base, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        elif value is not None:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return argv


def _mpirun() -> str:
    """The ``mpirun`` beside this Python (the mpich wheel's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpirun"
    found = str(local) if local.exists() else shutil.which("mpirun")
    if not found:
        raise ConfigError("the halo probe needs mpirun (the mpich extra); give --halo-row-us")
    return found


def _two_ranks(cfg: TrainConfig, graph: Graph, threads: int, steps: int) -> tuple[float, dict]:
    """The fastest step's compute of the slowest rank of ``mpirun -n 2 fullgraph train`` on
    ``graph`` cut into contiguous halves, and that rank's sizes."""
    from fullgraph.partition import partition_graph

    with tempfile.TemporaryDirectory(prefix="fullgraph-halo-probe-") as tmp:
        parts, log = Path(tmp) / "parts", Path(tmp) / "log.jsonl"
        meta = partition_graph(graph, 2, parts, method="contiguous")
        cmd = [_mpirun(), "-n", "2", sys.executable, "-m", "fullgraph.cli", "train"]
        cmd += ["--parts", str(parts), *_train_argv(cfg), "--epochs", str(steps + 1)]
        cmd += ["--eval-every", str(steps + 10), "--threads", str(threads), "--quiet"]
        cmd += ["--memory-check", "off", "--log-json", str(log)]
        run = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        if run.returncode != 0:
            tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigError(f"the halo probe's two-rank run failed: {tail}")
        records = [json.loads(line) for line in log.read_text().splitlines()]
    steps_run = [r for r in records if "epoch_s" in r][1:]  # after the warm-up
    best = min(steps_run, key=lambda r: r["slowest_compute_s"])
    return best["slowest_compute_s"], meta["parts"][best["slowest_rank"]]


def _halo_row_seconds(
    cfg: TrainConfig, features: int, classes: int, *, threads: int, rows: int, steps: int,
    train: float,
) -> tuple[float, float, str]:  # fmt: skip
    """The halo row's cost and the sharing factor from a one-process run and two two-rank runs
    (module docstring), and what was measured."""
    from fullgraph.partition.whole import whole_graph_part

    one = _probe_graph(rows, HALO_DEGREE, features, classes, train)
    single = _step_seconds(whole_graph_part(one), cfg, steps)
    del one
    apart = _probe_graph(2 * rows, HALO_DEGREE, features, classes, train, halves=True)
    alone, _ = _two_ranks(cfg, apart, threads, steps)
    del apart
    joined = _probe_graph(2 * rows, HALO_DEGREE, features, classes, train)
    together, rank = _two_ranks(cfg, joined, threads, steps)
    exchanged = rank["num_send"] + rank["num_halo"]
    halo_row_s = max(0.0, (together - alone) / max(exchanged, 1))
    said = (
        f"{rows} rows x in-degree {HALO_DEGREE}: {single:.3f} s alone, 2 ranks {alone:.3f} s "
        f"apart, {together:.3f} s with {exchanged} halo rows sent + received"
    )
    return halo_row_s, alone / single, said


def probe_costs(
    cfg: TrainConfig,
    num_features: int,
    num_classes: int,
    *,
    threads: int = 1,
    rows: int = PROBE_ROWS,
    degrees: tuple[int, int] = (2, 32),
    steps: int = 3,
    train_share: float = 0.5,
    bandwidth: float = 12.5e9,
    halo: bool = False,
    parts: str | None = None,
) -> Costs:
    """Measure the per-edge and per-row costs (and with ``halo`` the per-halo-row cost) of
    ``cfg``'s model on this machine, now (module docstring).

    Args:
        cfg: the run's configuration (:func:`~fullgraph.memory.model.check_modelled`).
        num_features: the real input width.
        num_classes: the real number of classes.
        threads: threads of a rank.
        rows: rows of the probe graphs (of each rank's part in the halo probe): the parts'
            own, since a row gather's cost depends on whether the rows it reads stay in the
            cache (at :data:`PROBE_ROWS` a layer's ``[rows, H]`` is far beyond it).
        degrees: the two in-degrees (low, high).
        steps: timed steps a graph (the fastest counts), after a warm-up.
        train_share: the training rows' share (the loss's rows, the last layer's cut).
        bandwidth: bytes a second a rank sends (given, not measured).
        halo: also run the two-rank halo probe (``mpirun``).
        parts: a partition on disk: the per-edge and per-row costs on its part 0's inner rows
            (all their edges, then every 8th), the graph's own locality, instead of random
            graphs (whose row gathers reach anywhere: an upper bound on a real graph's).

    Raises:
        ConfigError: a model the memory model does not cover, probe sizes too small, or a
            halo probe that cannot run.
    """
    from fullgraph.kernels.cpu_launch import set_threads

    check_modelled(cfg)
    lo, hi = degrees
    if rows < 64 or not 1 <= lo < hi < rows or steps < 1 or not 0 < train_share <= 1:
        raise ConfigError("the cost probe needs >= 64 rows, 1 <= degrees low < high < rows")
    from fullgraph.partition.whole import whole_graph_part

    set_threads(threads)
    seconds, edges = [], []
    for degree in (lo, hi) if parts is None else (8, 1):
        if parts is None:
            graph = _probe_graph(rows, degree, num_features, num_classes, train_share)
        else:
            graph = _inner_graph(parts, 0, degree)
        n = graph.num_nodes
        edges.append(graph.num_edges)
        seconds.append(_step_seconds(whole_graph_part(graph), cfg, steps))
        del graph
    edge_s = max(0.0, (seconds[1] - seconds[0]) / max(edges[1] - edges[0], 1))
    row_s = max(0.0, (seconds[0] - edge_s * edges[0]) / n)
    what = f"part 0 of {parts}" if parts else "random graphs"
    source = (
        f"measured: fastest of {steps} step(s) on {what}, {n} rows x {edges[0]} and {edges[1]} "
        f"edges, {threads} thread(s): {seconds[0]:.3f} s and {seconds[1]:.3f} s"
    )
    halo_row_s, shared = 0.0, 1.0
    if halo:
        halo_row_s, shared, said = _halo_row_seconds(
            cfg, num_features, num_classes,
            threads=threads, rows=rows, steps=steps, train=train_share,
        )  # fmt: skip
        source += f"; {said}"
    return Costs(edge_s, row_s, bandwidth, threads, source, halo_row_s, shared)
