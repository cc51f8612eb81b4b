"""The projection (:mod:`fullgraph.memory.projection`): its arithmetic is the memory model's.

- a described graph's parts have the stated sizes, and their memory is the memory model's
  prediction of that shape, rank by rank (the alike-parts shortcut included);
- the exchanges of a step are the replay's, and the bytes they add up to are what a P = 2 run
  of ``fullgraph train`` sends in a step (its ``halo_bytes``, receptive-field cut off);
- an epoch is the per-edge and per-row costs times the part's edges and rows plus what it sends
  at the bandwidth;
- bad input (parts or machines below 1, an unknown preset, costs no machine has) is one
  ``ConfigError``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mp_utils import run_mpi

from fullgraph.errors import ConfigError
from fullgraph.memory.model import GraphShape, predict
from fullgraph.memory.projection import (
    Costs,
    GraphSize,
    HaloModel,
    described_shape,
    preset,
    project,
    step_exchanges,
)
from fullgraph.partition import read_meta
from fullgraph.training.config import TrainConfig

SMALL = GraphSize("small", 10_000, 60_000, 16, 5, 2_000)
SAGE = TrainConfig(model="sage", layers=3, hidden=32)
COSTS = Costs(edge_s=2e-9, row_s=3e-7, bandwidth=1e9, halo_row_s=5e-8)


def test_described_parts_have_the_stated_sizes() -> None:
    halo = HaloModel(ratio=0.5, growth=1.0, reference_parts=2, edges_per_row=1.5)
    graph = described_shape(SMALL, 4, halo)
    assert graph.num_parts == 4 and len(graph.parts) == 4
    for r, p in enumerate(graph.parts):
        assert p.rank == r
        assert (p.num_inner, p.num_edges, p.num_train) == (2_500, 30_000, 500)
        assert p.num_halo == p.num_send == 2_500  # 0.5 x (4 / 2) ^ 1 rows a row
        assert p.halo_edges == 3_750
    capped = described_shape(SMALL, 4, HaloModel(ratio=10.0))
    assert capped.parts[0].num_halo == 7_500  # at most every other part's rows
    assert described_shape(SMALL, 1, halo).parts[0].num_halo == 0


def test_projected_memory_is_the_memory_models(small_partitions) -> None:
    for graph in (
        GraphShape.from_meta(read_meta(small_partitions[4])[0]),
        described_shape(SMALL, 3, HaloModel()),
    ):
        ranks = project(graph, SAGE, 300 * 2**20, COSTS)
        want = predict(graph, SAGE, 300 * 2**20)
        assert [r.memory.total for r in ranks] == [w.total for w in want]
        assert [r.memory.terms for r in ranks] == [w.terms for w in want]
        assert [r.part.rank for r in ranks] == list(range(graph.num_parts))


def test_step_time_is_the_costs_times_the_sizes() -> None:
    graph = described_shape(SMALL, 4, HaloModel())
    r = project(graph, SAGE, 0, COSTS)[0]
    p = r.part
    halo = 5e-8 * (p.num_send + p.num_halo)
    assert r.compute_s == pytest.approx(2e-9 * p.num_edges + 3e-7 * p.num_inner + halo)
    from fullgraph.memory.replay import parameter_count

    reduce_bytes = 2 * 4 * parameter_count(SAGE, 16, 5) * 3 // 4
    assert r.send_s == pytest.approx((r.halo_bytes + reduce_bytes) / 1e9)
    assert r.epoch_s == pytest.approx(r.compute_s + r.send_s)
    shared = Costs(2e-9, 3e-7, 1e9, halo_row_s=5e-8, shared=1.5)
    two = project(graph, SAGE, 0, shared, ranks_per_machine=2)[0]
    assert two.compute_s == pytest.approx(1.5 * (r.compute_s - halo) + halo)
    assert project(graph, SAGE, 0, shared)[0].compute_s == pytest.approx(r.compute_s)


def test_exchanges_are_the_layers_widths() -> None:
    """SAGE 16 -> 32 -> 32 -> 5: the first layer aggregates its input first (16 wide, no
    input gradient), the others transform first (32, 5) both ways."""
    graph = described_shape(SMALL, 4, HaloModel())
    p = graph.parts[0]
    got = [(x.tag, x.width, x.rows_sent, x.rows_received) for x in step_exchanges(p, graph, SAGE)]
    S, h = p.num_send, p.num_halo
    assert got == [
        ("fwd0", 16, S, h),
        ("fwd1", 32, S, h),
        ("fwd2", 5, S, h),
        ("bwd2", 5, h, S),
        ("bwd1", 32, h, S),
    ]
    sent = sum(x.bytes_sent for x in step_exchanges(p, graph, SAGE))
    assert sent == 4 * (S * (16 + 32 + 5) + h * (32 + 5))
    int8 = TrainConfig(model="sage", layers=3, hidden=32, compress_fwd="int8")
    assert sum(x.bytes_sent for x in step_exchanges(p, graph, int8)) < sent


@pytest.mark.slow  # a two-rank run: 5 s at best here
def test_halo_bytes_are_what_a_run_sends(small_partitions, tmp_path: Path) -> None:
    parts = small_partitions[2]
    graph = GraphShape.from_meta(read_meta(parts)[0])
    model = ["--model", "sage", "--layers", "3", "--hidden", "32", "--prune", "off"]
    cfg = TrainConfig(model="sage", layers=3, hidden=32, prune="off")
    log = tmp_path / "run.jsonl"
    run_mpi(
        2,
        ["-m", "fullgraph.cli", "train", "--parts", str(parts), *model, "--epochs", "2"]
        + ["--eval-every", "100", "--quiet", "--log-json", str(log), "--threads", "1"],
    )
    first = json.loads(log.read_text().splitlines()[0])  # epoch 1: no evaluation
    replayed = sum(x.bytes_sent for p in graph.parts for x in step_exchanges(p, graph, cfg))
    assert first["epoch"] == 1 and first["halo_bytes"] == replayed


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: described_shape(SMALL, 0, HaloModel()), "parts must be"),
        (lambda: described_shape(SMALL, 2, HaloModel(ratio=-1)), "halo"),
        (lambda: preset("papers1B"), "unknown preset 'papers1B'"),
        (lambda: project(described_shape(SMALL, 2, HaloModel()), SAGE, 0, Costs(0, 0, 1)), "costs"),
        (
            lambda: project(described_shape(SMALL, 2, HaloModel()), SAGE, 0, Costs(1, 1, 0)),
            "bandwidth",
        ),
        (lambda: described_shape(GraphSize("g", 10, 0, 4, 2, 1), 2, HaloModel()), "must be > 0"),
    ],
)
def test_bad_input_is_one_config_error(call, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as err:
        call()
    assert "\n" not in str(err.value)
