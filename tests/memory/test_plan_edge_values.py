"""The memory model counts a part's stored edge values while the rank sets up.

``edge_weight`` (``4 e``), ``in_weight`` (``8 (n + h)``) and ``edge_attr`` (``4 e F_e``) are read
with the part and let go with it after set-up; ``fullgraph plan`` names them in a line.

Enters through :mod:`fullgraph.memory.model`.
"""

from __future__ import annotations

from dataclasses import replace

from fullgraph.cli import main
from fullgraph.datasets.synthetic import with_edge_values
from fullgraph.memory.model import _replay
from fullgraph.memory.replay import GraphShape
from fullgraph.partition import PartitionDir, partition_graph
from fullgraph.training.config import TrainConfig


def test_setup_counts_the_stored_edge_values(small_graph, tmp_path, capsys) -> None:
    partition_graph(with_edge_values(small_graph, edge_dim=5), 2, tmp_path / "p", seed=0)
    shape = GraphShape.from_meta(PartitionDir.open(tmp_path / "p").meta)
    assert shape.edge_weight and shape.edge_dim == 5
    part = shape.parts[0]
    n, h, e = part.num_inner, part.num_halo, part.num_edges
    assert shape.edge_value_bytes(part) == 4 * e + 8 * (n + h) + 4 * e * 5
    plain = replace(shape, edge_weight=False, edge_dim=0)
    for cfg in (TrainConfig(), TrainConfig(edge_weight=True, improved=True)):
        with_values = _replay(part, shape, cfg, 0).phase_peaks["setup"][0]
        without = _replay(part, plain, TrainConfig(), 0).phase_peaks["setup"][0]
        assert with_values - without >= shape.edge_value_bytes(part)
    assert main(["plan", "--parts", str(tmp_path / "p"), "--floor-mb", "100"]) == 0
    out = capsys.readouterr().out
    assert "stored edge values (edge weights + weighted degrees, 5-wide edge features)" in out


def test_plan_refuses_what_training_refuses(small_graph, tmp_path, capsys) -> None:
    """Negated weights leave GCN's ``D^-1/2`` undefined: ``fullgraph plan --edge-weight`` gives
    the line ``fullgraph train`` would, before any memory figure; unweighted, it plans."""
    weighted = with_edge_values(small_graph)
    negated = replace(weighted, edge_weight=-weighted.edge_weight)
    partition_graph(negated, 2, tmp_path / "p", seed=0)
    argv = ["plan", "--parts", str(tmp_path / "p"), "--floor-mb", "100"]
    assert main([*argv, "--edge-weight"]) == 2
    captured = capsys.readouterr()
    assert "D^-1/2 is not defined" in captured.err and "MiB" not in captured.out
    assert main(argv) == 0
