"""The in-memory OGB reader refuses, from the sizes alone (once the labels confirmed the node
count), a graph that cannot fit, naming the out-of-core conversion; and reads one that fits."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from fullgraph.datasets import ogb_memory
from fullgraph.datasets.ogb import read_ogb
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic import generate
from fullgraph.errors import ConfigError


def test_feature_width_reads_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "node-feat.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("0.5,1,2\n3,4,5\n")
    assert ogb_memory.feature_width(path) == 3
    assert ogb_memory.feature_width(tmp_path / "missing.csv.gz") == 0
    (tmp_path / "bad.csv.gz").write_bytes(b"not gzip")
    assert ogb_memory.feature_width(tmp_path / "bad.csv.gz") == 0


def test_too_large_is_refused_before_reading_and_names_ingest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = generate("tiny", seed=0)
    d = write_ogb(graph, tmp_path, "g")
    n, f = graph.num_nodes, graph.x.shape[1]
    assert ogb_memory.in_memory_bytes(n, 10, f) >= ogb_memory.FEATURE_BYTES * n * f
    read_ogb(tmp_path, "g", cache=False)  # fits this machine
    monkeypatch.setattr(ogb_memory, "node_memory_bytes", lambda: 1 << 20)  # a 1 MiB machine
    with pytest.raises(ConfigError, match=r"fullgraph data ingest --dataset g --root") as err:
        read_ogb(tmp_path, "g", cache=False)
    assert f"{f} features" in str(err.value) and "g-npy" in str(err.value)
    assert not (d / "processed").exists()  # refused before anything was parsed or cached
