"""``--method kaminpar``: k-way KaMinPar parts that verify, keep its node balance and cut far
fewer edges than random; the one line when the package is missing.

Enters through :mod:`fullgraph.partition.assign`.
"""

from __future__ import annotations

import builtins
import math

import numpy as np
import pytest

from fullgraph.errors import ConfigError
from fullgraph.partition import assign_parts, partition_graph, verify_partitions
from fullgraph.partition.assign import KAMINPAR_EPSILON, KAMINPAR_MISSING, resolve_assign

pytest.importorskip("kaminpar")


def cut(graph, owner: np.ndarray) -> int:
    """Stored edges whose two ends have different owners."""
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return int((owner[graph.indices] != owner[dst]).sum())


@pytest.mark.parametrize("num_parts", [2, 4])
def test_kaminpar_parts_verify_balance_and_cut(small_graph, tmp_path, num_parts):
    out = tmp_path / "parts"
    meta = partition_graph(small_graph, num_parts, out, method="kaminpar", seed=1)
    verify_partitions(out, small_graph)
    assert meta["method"] == "kaminpar"
    owner = assign_parts(small_graph, num_parts, method="kaminpar", seed=1)
    sizes = np.bincount(owner, minlength=num_parts)
    assert sizes.min() > 0
    assert sizes.max() <= (1 + KAMINPAR_EPSILON) * math.ceil(small_graph.num_nodes / num_parts)
    random = assign_parts(small_graph, num_parts, method="random", seed=1)
    assert cut(small_graph, owner) < 0.5 * cut(small_graph, random)
    assert meta["edge_cut"] < 0.5 * cut(small_graph, random)


def test_kaminpar_has_no_blocks():
    assert resolve_assign("kaminpar", None) is None
    with pytest.raises(ConfigError, match="applies to --method metis"):
        resolve_assign("kaminpar", "blocks")


def test_kaminpar_missing_is_one_config_line(small_graph, monkeypatch):
    real_import = builtins.__import__

    def no_kaminpar(name, *args, **kwargs):
        if name == "kaminpar":
            raise ImportError("No module named 'kaminpar'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_kaminpar)
    with pytest.raises(ConfigError) as info:
        assign_parts(small_graph, 4, method="kaminpar")
    assert str(info.value) == KAMINPAR_MISSING
    assert "\n" not in str(info.value) and "--method metis" in str(info.value)


def test_kaminpar_failing_is_one_config_line(small_graph, monkeypatch):
    import kaminpar

    class Broken:
        def __init__(self, threads: int, ctx: object) -> None:
            pass

        def compute_partition(self, *args: object) -> list[int]:
            raise RuntimeError("out of memory")

    monkeypatch.setattr(kaminpar, "KaMinPar", Broken)
    with pytest.raises(ConfigError, match=r"KaMinPar failed on sbm-test: out of memory; use --m"):
        assign_parts(small_graph, 4, method="kaminpar")
