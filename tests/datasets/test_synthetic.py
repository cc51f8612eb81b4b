"""Synthetic DC-SBM generators: sizes, determinism, degree tails, locality, OGB round trip, CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from test_synthetic_papers import DIGESTS, digest

from fullgraph.cli import build_parser
from fullgraph.datasets import load
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.synthetic import PRESETS, generate, write_ogb
from fullgraph.errors import ConfigError
from fullgraph.partition.assign import assign_parts

ARRAYS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")


@pytest.fixture(scope="module")
def tiny() -> Graph:
    return generate("tiny", seed=0)


@pytest.fixture(scope="module")
def arxiv() -> Graph:
    return generate("arxiv", seed=0)


def halo_ratio(graph: Graph, num_parts: int) -> float:
    """METIS halo rows summed over parts / N: the mean rows a part sends per layer / (N/P)."""
    owner = assign_parts(graph, num_parts, "metis", seed=0)
    n = graph.num_nodes
    dst = np.repeat(np.arange(n), graph.in_degree())
    cut = owner[dst] != owner[graph.indices]
    return np.unique(owner[dst[cut]] * n + graph.indices[cut]).size / n


def assert_same(a: Graph, b: Graph) -> None:
    for k in ARRAYS:
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    assert a.num_classes == b.num_classes


def test_arrays_as_before_the_papers_preset(tiny: Graph, arxiv: Graph) -> None:
    """The fields the papers preset brought leave the older presets' graphs bit for bit."""
    assert digest(tiny) == DIGESTS["tiny"] and digest(arxiv) == DIGESTS["arxiv"]


def test_tiny_sizes_and_structure(tiny: Graph) -> None:
    cfg = PRESETS["tiny"]
    assert tiny.num_nodes == cfg.num_nodes
    assert tiny.num_edges == 2 * cfg.num_edges
    assert tiny.x.shape == (cfg.num_nodes, cfg.num_features) and tiny.x.dtype == np.float32
    assert tiny.num_classes == cfg.num_classes
    assert set(np.unique(tiny.y)) == set(range(cfg.num_classes))
    n = tiny.num_nodes
    rows = np.repeat(np.arange(n), tiny.in_degree())
    keys = rows * n + tiny.indices
    assert np.all(np.diff(keys) > 0) and not np.any(rows == tiny.indices)
    assert np.array_equal(keys, np.sort(tiny.indices * n + rows))  # symmetric
    deg = tiny.in_degree()
    assert deg.min() >= 1 and deg.max() >= 3 * deg.mean()  # no isolated nodes, heavy tail
    masks = tiny.train_mask.astype(int) + tiny.val_mask + tiny.test_mask
    assert np.all(masks == 1)
    assert int(tiny.train_mask.sum()) == round(cfg.train_frac * n)


def _homophily(g: Graph) -> float:
    rows = np.repeat(np.arange(g.num_nodes), g.in_degree())
    return float((g.y[rows] == g.y[g.indices]).mean())


def test_edge_homophily_is_moderate(tiny: Graph) -> None:
    assert 0.5 < _homophily(tiny) < 0.85


def test_deterministic_from_seed(tiny: Graph) -> None:
    assert_same(tiny, generate("tiny", seed=0))
    other = generate("tiny", seed=1)
    assert not np.array_equal(tiny.indices, other.indices)
    assert not np.array_equal(tiny.x, other.x)


def test_overrides_and_bad_config() -> None:
    g = generate("tiny", seed=3, num_nodes=500, num_edges=1500, num_features=8)
    assert (g.num_nodes, g.num_edges, g.num_features) == (500, 3000, 8)
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        generate("huge")
    with pytest.raises(ConfigError, match="unknown synthetic parameter"):
        generate("tiny", nodes=5)
    with pytest.raises(ConfigError, match="num_edges"):
        generate("tiny", num_nodes=10, num_edges=1000)


def test_arxiv_preset_sizes(arxiv: Graph) -> None:
    g = arxiv
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (
        169_343,
        2 * 1_166_243,
        128,
        40,
    )
    frac = g.train_mask.mean(), g.val_mask.mean(), g.test_mask.mean()
    np.testing.assert_allclose(frac, (0.54, 0.18, 0.28), atol=1e-3)
    assert g.in_degree().min() >= 1


def test_presets_are_sized_like_ogb() -> None:
    sizes = {
        "arxiv": (169_343, 1_166_243, 128, 40, 0.54, 0.18),
        "products": (2_449_029, 61_859_140, 100, 47, 0.08, 0.016),
    }
    for name, want in sizes.items():
        for preset in (name, f"{name}-stress"):
            c = PRESETS[preset]
            got = (c.num_nodes, c.num_edges, c.num_features, c.num_classes)
            assert got + (c.train_frac, c.val_frac) == want, preset
        assert PRESETS[name].locality == "ring"
        assert PRESETS[f"{name}-stress"].locality == "uniform"
    assert PRESETS["tiny"].locality == "uniform"


def test_stress_presets_are_the_uniform_generator() -> None:
    """``*-stress`` keep the earlier generator: 90% in-community, the rest to any node."""
    for name, block in (("arxiv-stress", 400), ("products-stress", 1000)):
        c = PRESETS[name]
        assert (c.block_size, c.p_local, c.label_purity, c.degree_exponent) == (
            block,
            0.9,
            0.8,
            2.5,
        )
    small = {"num_nodes": 4000, "num_edges": 24_000}
    g = generate("arxiv-stress", seed=0, **small)
    assert g.name == "synth-arxiv-stress"
    assert int(g.in_degree().max()) <= 400  # uniform model: hubs capped below a community
    assert_same(g, generate("arxiv-stress", seed=0, **small))


def test_ring_degree_tail_is_heavy(arxiv: Graph) -> None:
    deg = arxiv.in_degree()
    median, p99 = np.percentile(deg, [50, 99])
    assert 5_000 <= deg.max() <= 13_000  # ogbn-arxiv: about 13k
    assert p99 >= 5 * median and deg.max() >= 500 * deg.mean()
    assert 0.4 < _homophily(arxiv) < 0.7


def test_ring_deterministic_from_seed() -> None:
    small = {"num_nodes": 20_000, "num_edges": 140_000, "max_degree": 1500}
    a = generate("arxiv", seed=0, **small)
    assert_same(a, generate("arxiv", seed=0, **small))
    b = generate("arxiv", seed=1, **small)
    assert not np.array_equal(a.indices, b.indices)
    assert a.meta["params"]["locality"] == "ring"


def test_locality_halves_the_halo() -> None:
    """A scaled-down products graph (30k nodes, mean degree 50): nearby reach cuts the halo.

    Same sizes and degrees with ``reach_decay=1e9`` send every cross-community edge to the
    whole-graph window (uniform placement); ``products-stress`` is the uniform generator, whose
    halo on the full-size graph is about 4x the real one's.
    """
    n = 30_000
    small = {"num_nodes": n, "num_edges": round(n * 61_859_140 / 2_449_029), "block_size": 300}
    ring = generate("products", seed=0, max_degree=2000, **small)
    anywhere = generate("products", seed=0, max_degree=2000, reach_decay=1e9, **small)
    stress = generate("products-stress", seed=0, **small)
    for p in (4, 8):
        r, a, s = halo_ratio(ring, p), halo_ratio(anywhere, p), halo_ratio(stress, p)
        assert r < 0.5 * a, f"P={p}: ring {r:.3f} vs random reach {a:.3f}"
        assert r < 0.65 * s, f"P={p}: ring {r:.3f} vs stress {s:.3f}"


def test_ring_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown locality"):
        generate("arxiv", locality="grid", num_nodes=1000, num_edges=5000)
    with pytest.raises(ConfigError, match="max_degree"):
        generate("arxiv", num_nodes=1000, num_edges=5000, max_degree=5)
    with pytest.raises(ConfigError, match="topic_span"):
        generate("arxiv", num_nodes=1000, num_edges=5000, topic_span=0)


def test_cli_offers_every_preset() -> None:
    for preset in PRESETS:
        argv = ["data", "synth", "--preset", preset, "--name", "x", "--root", "r"]
        assert build_parser(argv).parse_args(argv).preset == preset


def test_write_ogb_round_trip(tiny: Graph, tmp_path: Path) -> None:
    path = write_ogb(tiny, tmp_path, "my-synth")
    assert path == tmp_path / "my_synth"
    assert (path / "raw" / "edge.csv.gz").is_file() and (path / "meta.json").is_file()
    back = load("my-synth", tmp_path)
    assert_same(tiny, back)
    assert back.meta["source"]["preset"] == "tiny"
    directed = load("my-synth", tmp_path, symmetric=False)
    assert directed.num_edges == tiny.num_edges // 2  # each undirected edge once, as OGB
    with pytest.raises(FileExistsError):
        write_ogb(tiny, tmp_path, "my-synth")
    write_ogb(generate("tiny", seed=1), tmp_path, "my-synth", force=True)
    assert not np.array_equal(load("my-synth", tmp_path).x, tiny.x)  # cache invalidated


def _accuracy(graph: Graph, use_graph: bool, epochs: int = 200) -> float:
    """Test accuracy (at best validation) of a 2-layer GCN, or an MLP when not use_graph."""
    torch.manual_seed(0)
    n = graph.num_nodes
    a = sp.csr_matrix(
        (np.ones(graph.num_edges, dtype=np.float32), graph.indices, graph.indptr), shape=(n, n)
    ) + sp.eye(n, dtype=np.float32)
    d = np.asarray(a.sum(axis=1)).ravel() ** -0.5
    a = (sp.diags(d) @ a @ sp.diags(d)).tocoo()
    adj = torch.sparse_coo_tensor(
        np.vstack([a.row, a.col]), a.data, (n, n), check_invariants=True
    ).coalesce()
    x, y = torch.from_numpy(graph.x), torch.from_numpy(graph.y)
    tr, va, te = (torch.from_numpy(m) for m in (graph.train_mask, graph.val_mask, graph.test_mask))
    lin1 = torch.nn.Linear(x.shape[1], 64)
    lin2 = torch.nn.Linear(64, graph.num_classes)
    params = list(lin1.parameters()) + list(lin2.parameters())
    opt = torch.optim.Adam(params, lr=0.01, weight_decay=5e-4)

    def forward(train: bool) -> torch.Tensor:
        h = lin1(torch.nn.functional.dropout(x, 0.5, train))
        h = torch.sparse.mm(adj, h) if use_graph else h
        h = lin2(torch.nn.functional.dropout(torch.relu(h), 0.5, train))
        return torch.sparse.mm(adj, h) if use_graph else h

    best_val, best_test = -1.0, 0.0
    for epoch in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(forward(True)[tr], y[tr]).backward()
        opt.step()
        if epoch % 10 == 9:
            with torch.no_grad():
                pred = forward(False).argmax(1)
            val = (pred[va] == y[va]).float().mean().item()
            if val > best_val:
                best_val, best_test = val, (pred[te] == y[te]).float().mean().item()
    return best_test


def test_gcn_clearly_beats_mlp(tiny: Graph) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small ops: extra threads only spin on a busy 2-core machine
    try:
        mlp = _accuracy(tiny, use_graph=False)
        gcn = _accuracy(tiny, use_graph=True)
    finally:
        torch.set_num_threads(threads)
    assert mlp < 0.65, f"features alone too informative: MLP {mlp:.3f}"
    assert gcn > 0.7, f"GCN only {gcn:.3f}"
    assert gcn - mlp > 0.15, f"GCN {gcn:.3f} vs MLP {mlp:.3f}"


def test_cli_synth_then_info(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "fullgraph.cli",
        "data",
        "synth",
        "--preset",
        "tiny",
        "--name",
        "t-synth",
        "--root",
        str(tmp_path),
        "--seed",
        "2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert_same(load("t-synth", tmp_path), generate("tiny", seed=2))
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1].startswith("fullgraph data: error:")
    assert "--force" in again.stderr
