"""The partition's memory plan: each stage's terms from the sizes (32-bit METIS half of
pymetis' graph and hierarchy, KaMinPar per edge and node, the build's node arrays and one
part), the larger stage on the floor."""

from __future__ import annotations

from fullgraph.memory import partition_peak as pp

SIZES = pp.PartitionSizes(num_nodes=1_000_000, num_edges=20_000_000, num_features=100)


def test_metis_terms_and_its_index_width() -> None:
    n, e = SIZES.num_nodes, SIZES.num_edges
    for library, idx in (("libmetis", 4), ("pymetis", 8)):
        graph = idx * (n + 1) + 2 * idx * e + idx * pp.CONSTRAINTS * n
        want = int(graph + pp.METIS_LEVELS * 2 * idx * e + 8 * n)
        assert pp.assign_bytes(SIZES, "metis", library) == want
    lib, wide = (pp.assign_bytes(SIZES, "metis", m) for m in ("libmetis", "pymetis"))
    assert 1.9 < wide / lib < 2.0  # the 64-bit METIS holds about twice as much


def test_other_methods_and_the_build() -> None:
    n, e = SIZES.num_nodes, SIZES.num_edges
    kp = pp.assign_bytes(SIZES, "kaminpar", "-")
    assert kp == int(
        pp.KAMINPAR_BASE_BYTES + pp.KAMINPAR_EDGE_BYTES * e + pp.KAMINPAR_NODE_BYTES * n
    )
    assert pp.assign_bytes(SIZES, "random", "-") == 16 * n
    for parts in (4, 8):
        per_part, halo = -(-n // parts), min(e, n * (parts - 1))
        chunk = min(pp.CHUNK_VALUES, max(-(-e // parts), per_part * SIZES.num_features))
        want = pp.BUILD_NODE_BYTES * n + 8 * halo + pp.PART_NODE_BYTES * per_part + 16 * chunk
        assert pp.build_bytes(SIZES, parts) == want
    assert pp.build_bytes(pp.PartitionSizes(64, 100, 4), 2) < 1 << 20  # no chunk-sized buffer


def test_the_peak_is_the_larger_stage_on_the_floor() -> None:
    peak = pp.predict_partition(SIZES, 4, "metis", "libmetis", floor=300 << 20)
    assert peak.assign_mapped == 0 and peak.build_mapped == pp.graph_bytes(SIZES)
    assert peak.total == peak.floor + max(peak.assign, peak.build + peak.build_mapped)
    assert peak.needed == peak.floor + max(peak.assign, peak.build) <= peak.total
    assign_larger = peak.assign > peak.build + peak.build_mapped
    assert peak.stage == ("assign" if assign_larger else "build")
    kp = pp.predict_partition(SIZES, 4, "kaminpar", "-", floor=0)
    assert kp.assign_mapped == 8 * (SIZES.num_nodes + 1 + SIZES.num_edges)
    small = pp.predict_partition(pp.PartitionSizes(100, 10, 4), 2, "random", "-", floor=0)
    assert small.stage == "build" and small.total == small.build + small.build_mapped
