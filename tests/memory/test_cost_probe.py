"""The cost probe (:mod:`fullgraph.memory.cost_probe`): costs of the real trainer, measured.

- the one-process probe times the model's training steps on two random graphs (or a
  partition's inner rows) and gives non-negative per-edge and per-row costs, saying what it
  measured;
- the two-rank probe (``mpirun``) adds a per-halo-row cost from a run whose halo is the part's
  size, trained with the model's own options;
- too small a probe is one ``ConfigError``.
"""

from __future__ import annotations

import argparse

import pytest
from mp_utils import one_thread

from fullgraph.errors import ConfigError
from fullgraph.memory.cost_probe import _train_argv, probe_costs, probe_rows
from fullgraph.memory.model import GraphShape, PartShape
from fullgraph.training.config import TrainConfig

SAGE = TrainConfig(model="sage", layers=3, hidden=32)


def test_probe_measures_the_trainer() -> None:
    with one_thread():
        costs = probe_costs(SAGE, 16, 5, rows=512, degrees=(2, 16), steps=1)
    assert costs.edge_s >= 0 and costs.row_s >= 0 and costs.edge_s + costs.row_s > 0
    assert costs.halo_row_s == 0 and costs.threads == 1
    assert costs.source.startswith("measured") and "random graphs, 512 rows" in costs.source


def test_probe_on_a_partition_times_its_inner_rows(small_partitions) -> None:
    from fullgraph.partition import load_partition

    part = load_partition(small_partitions[2], 0)
    with one_thread():
        costs = probe_costs(SAGE, part.num_features, part.num_classes, steps=1,
                            parts=str(small_partitions[2]))  # fmt: skip
    assert costs.edge_s + costs.row_s > 0
    assert f"part 0 of {small_partitions[2]}, {part.num_inner} rows" in costs.source


@pytest.mark.slow  # a two-rank run: 4-6 s here
def test_halo_probe_runs_two_ranks_of_the_model() -> None:
    with one_thread():
        costs = probe_costs(SAGE, 16, 5, rows=512, degrees=(2, 16), steps=1, halo=True)
    assert costs.halo_row_s >= 0 and costs.shared > 0
    assert "512 rows x in-degree 8" in costs.source and "2 ranks" in costs.source


def test_the_runs_options_give_the_model() -> None:
    cfg = TrainConfig(model="gcn", layers=2, hidden=48, dropout=0.3, norm="layer", residual=True)
    parser = argparse.ArgumentParser()
    TrainConfig.add_arguments(parser)
    back = TrainConfig.from_args(parser.parse_args(_train_argv(cfg)))
    assert back.to_dict() == {**cfg.to_dict(), "lr": 1e-3, "lr_warmup": 0}


def test_probe_rows_are_a_parts_up_to_the_cap() -> None:
    def shape(n: int) -> GraphShape:
        return GraphShape("g", 1, 4, 2, (PartShape(0, n, 0, 4 * n, 0, 1, 0),))

    assert probe_rows(shape(1000)) == 1000
    assert probe_rows(shape(10**9)) == 2**18
    assert probe_rows(shape(3)) == 64


def test_too_small_a_probe_is_one_line() -> None:
    with pytest.raises(ConfigError, match="the cost probe needs"):
        probe_costs(SAGE, 16, 5, rows=8)
