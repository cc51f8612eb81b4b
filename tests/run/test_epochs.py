"""The epoch record and its line: the slowest rank's split adds up to the epoch time; the first
epoch of a process carries the start-up, which the final record and line report apart."""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from mp_utils import run_mpi

from fullgraph.run.epochs import EpochLoop, EpochStats, final_line
from fullgraph.run.log import split_text

TRAIN = ["-m", "fullgraph.cli", "train"]
#: ``12.3 ms (slowest rank 1: compute 4.0, comm 6.0, reduce 2.3)`` of the epoch line
LINE = re.compile(
    r"\| ([\d.]+) ms( with start-up)? \(slowest rank (\d+): compute ([\d.]+), comm ([\d.]+), "
    r"reduce ([\d.]+)\)"
)


class TwoRanks:
    """Rank 0 of two: its all-reduce adds the other rank's row, as the transports do."""

    rank, size, transport = 0, 2, "local"

    def __init__(self, other: list[float]) -> None:
        self.other = other
        self.bytes_sent: Counter = Counter()

    def allreduce_(self, t: torch.Tensor, op: str = "sum", tag: str = "reduce") -> torch.Tensor:
        assert op == "sum" and t.shape[0] == 2
        t[1] += torch.tensor(self.other, dtype=t.dtype)
        return t


def _record(other: list[float], mine: EpochStats, extra: dict[str, Any] | None = None) -> dict:
    loop = EpochLoop()
    loop.comm = TwoRanks(other)
    if extra is not None:
        loop.record_extra = lambda stats, maxes: {k: maxes[k] for k in extra}  # type: ignore
    return loop.epoch_record(3, mine, {}, 0.001, 0, 0)


def test_the_split_is_the_slowest_ranks_own() -> None:
    """Rank 1 is slower: its own split, which adds up to its epoch, is recorded and printed;
    the maxima over ranks (another rank's compute, this one's comm) stay as before."""
    mine = EpochStats(seconds=0.010, comm_s=0.006, reduce_s=0.001)  # rank 0: compute 3 ms
    # rank 1: epoch 12 ms = compute 8 + comm 1 + reduce 3 (epoch, compute, comm, reduce, eval,
    # sample, codec, peak MB, bytes, halo bytes, sampled edges)
    other = [0.012, 0.008, 0.001, 0.003, 0.002, 0.0, 0.0, 1e6, 1000.0, 600.0, 0.0]
    rec = _record(other, mine)
    assert rec["slowest_rank"] == 1 and rec["epoch_s"] == 0.012
    parts = [rec[f"slowest_{k}"] for k in ("compute_s", "comm_s", "reduce_s")]
    assert parts == pytest.approx([0.008, 0.001, 0.003], abs=1e-15)
    assert sum(parts) == pytest.approx(rec["epoch_s"], rel=1e-12)
    # the maxima over ranks, each of its own rank: their sum is past the epoch time
    assert (rec["compute_s"], rec["comm_s"], rec["reduce_s"]) == (0.008, 0.006, 0.003)
    assert rec["compute_s"] + rec["comm_s"] + rec["reduce_s"] > rec["epoch_s"]
    assert rec["comm_bytes"] == 1000 and rec["halo_bytes"] == 600 and rec["peak_rss_mb"] == 1e6
    assert "slowest_sample_s" not in rec and "slowest_codec_s" not in rec
    assert split_text(rec) == "12.0 ms (slowest rank 1: compute 8.0, comm 1.0, reduce 3.0)"


def test_a_tie_and_a_mini_batch_split() -> None:
    """Equal epochs: the lower rank's split. A trainer that samples: its split has sampling."""
    mine = EpochStats(seconds=0.010, sample_s=0.004, reduce_s=0.001)
    other = [0.010, 0.002, 0.0, 0.008, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 7.0]
    rec = _record(other, mine, extra={"sample_s": None})
    assert rec["slowest_rank"] == 0 and rec["sample_s"] == 0.004
    parts = [rec[f"slowest_{k}"] for k in ("compute_s", "comm_s", "sample_s", "reduce_s")]
    assert sum(parts) == pytest.approx(rec["epoch_s"], rel=1e-12)
    assert split_text(rec) == "10.0 ms (slowest rank 0: compute 5.0, sample 4.0, reduce 1.0)"
    rec["startup"] = True
    assert split_text(rec).startswith("10.0 ms with start-up (slowest rank 0:")


def test_final_line_reports_the_start_up_apart() -> None:
    final = {"metric": "acc", "best_val_acc": 0.5, "test_acc": 0.4, "best_epoch": 4}
    final.update(ranks=2, median_epoch_s=0.0175, epochs=10, startup_epoch=1, startup_epoch_s=2.1)
    line = final_line(final, 1)
    assert "median epoch 17.5 ms (epoch 1 left out: 2.10 s with the start-up), 2 rank(s)" in line
    final.update(epochs=1, median_epoch_s=2.1)  # the start-up epoch alone: nothing left out
    assert "median epoch 2100.0 ms, 2 rank(s)" in final_line(final, 1)


@pytest.mark.timeout(240)
def test_two_ranks_split_adds_up_on_every_record(small_partitions, tmp_path: Path) -> None:
    """A 2-rank run: on every record and every line, the slowest rank's compute + comm +
    reduce is the epoch time; epoch 1 is marked as the start-up and the median leaves it out."""
    log = tmp_path / "run.jsonl"
    args = ["--parts", str(small_partitions[2]), "--epochs", "5", "--eval-every", "2"]
    proc = run_mpi(2, [*TRAIN, *args, "--log-json", str(log)], timeout=200)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    final, epochs = rows[-1], rows[:-1]
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4, 5] and final["final"]
    for r in epochs:
        parts = [r[f"slowest_{k}"] for k in ("compute_s", "comm_s", "reduce_s")]
        assert sum(parts) == pytest.approx(r["epoch_s"], rel=1e-9), r
        assert r["slowest_rank"] in (0, 1)
        for k in ("compute_s", "comm_s", "reduce_s"):  # one rank's part <= the maximum
            assert r[f"slowest_{k}"] <= r[k]
    assert [bool(r.get("startup")) for r in epochs] == [True, False, False, False, False]
    assert final["startup_epoch"] == 1 and final["startup_epoch_s"] == epochs[0]["epoch_s"]
    assert final["median_epoch_s"] == statistics.median(r["epoch_s"] for r in epochs[1:])
    lines = [m for m in map(LINE.search, proc.stdout.splitlines()) if m is not None]
    assert len(lines) == 5, proc.stdout
    for i, m in enumerate(lines):
        total, startup, rank, *split = m.groups()
        assert bool(startup) == (i == 0) and int(rank) == epochs[i]["slowest_rank"]
        # each figure rounded to 0.1 ms: the printed parts add up within their rounding
        assert abs(sum(map(float, split)) - float(total)) <= 0.15, m.group(0)
    assert "(epoch 1 left out: " in proc.stdout and "with the start-up)" in proc.stdout


@pytest.mark.parametrize("command", ["train", "minibatch"])
def test_a_diverged_run_leaves_its_best_model(command: str, tmp_path: Path, capsys) -> None:
    """``EpochLoop.on_diverged``: the loss goes NaN in epoch 2 (``--lr 1e30``); the run exits 3
    with its line, and the model file of epoch 1, the best so far, is written."""
    from cli_run import run_cli

    from fullgraph.datasets.ogb_writer import write_ogb
    from fullgraph.datasets.synthetic import generate
    from fullgraph.training.model_file import load_model_file

    write_ogb(generate("tiny", seed=0), tmp_path / "data", "tiny")
    model = tmp_path / "m.pt"
    data = ["--dataset", "tiny", "--root", str(tmp_path / "data")]
    argv = [command, *data, "--lr", "1e30", "--epochs", "5", "--quiet", "--save-model", str(model)]
    code, _, err = run_cli(argv, capsys)
    assert code == 3 and "the loss is nan" in err, err
    assert load_model_file(model).info["epoch"] == 1
