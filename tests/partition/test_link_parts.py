"""Partitions that carry a link split's supervision edges (issue 35).

Checked without the verifier first (every edge once over the parts, at its source's owner,
sorted, equal to the split's rows), then load's and verify's refusals: damaged files, counts
that disagree, an edge at the wrong part, a row twice, a changed pair, a leak, another split;
the one-process part, and ``fullgraph partition`` / ``fullgraph verify`` on a link dataset.

Enters through :mod:`fullgraph.partition.link_parts` and :mod:`fullgraph.partition.link_verify`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from cli_run import assert_one_line, run_cli

import fullgraph.datasets
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.link import EVAL_SPLITS, LINK_SPLITS, LinkSplit, pair_keys
from fullgraph.errors import DataError, PartitionError
from fullgraph.partition import (
    load_partition,
    partition_graph,
    read_meta,
    verify_partitions,
    whole_graph_part,
    write_partitions,
)
from fullgraph.partition.format import sha256_file
from fullgraph.partition.link_parts import split_digest


def graph_of(pairs: np.ndarray, n: int, name: str, seed: int = 0) -> Graph:
    """The message-passing graph of ``pairs``: both directions, features, no labels."""
    src = np.concatenate([pairs[:, 0], pairs[:, 1]])
    dst = np.concatenate([pairs[:, 1], pairs[:, 0]])
    a = sp.csr_matrix((np.ones(src.size, dtype=np.bool_), (dst, src)), shape=(n, n))
    a.sort_indices()
    none = np.zeros(n, dtype=np.bool_)
    return Graph(
        name=name,
        num_nodes=n,
        indptr=a.indptr.astype(np.int64),
        indices=a.indices.astype(np.int64),
        x=np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32),
        y=np.zeros(n, dtype=np.int64),
        train_mask=none,
        val_mask=none.copy(),
        test_mask=none.copy(),
        num_classes=1,
    ).validate()


def make_link(
    n: int = 240, seed: int = 0, per_edge: bool = False, name: str = "linky", k: int = 5
) -> tuple[Graph, LinkSplit]:
    """A random undirected graph split 80/10/10 into train / valid / test edges (held-out
    edges left out of the message-passing graph), with negatives that are no positives."""
    rng = np.random.default_rng(seed)
    u, v = rng.integers(0, n, 5 * n), rng.integers(0, n, 5 * n)
    keep = u != v
    pairs = np.unique(np.stack([np.minimum(u, v), np.maximum(u, v)], 1)[keep], axis=0)
    pairs = pairs[rng.permutation(len(pairs))]
    flip = rng.random(len(pairs)) < 0.5
    pairs[flip] = pairs[flip][:, ::-1]  # sources on both ends: anchors spread over parts
    h = len(pairs) // 10
    edges = {"valid": pairs[:h], "test": pairs[h : 2 * h], "train": pairs[2 * h :]}
    positives = pair_keys(pairs, n, True)
    negatives = {}
    for s in EVAL_SPLITS:
        if per_edge:
            targets = rng.integers(0, n, (len(edges[s]), 4 * k))
            rows = []
            for src, cand in zip(edges[s][:, 0], targets, strict=True):
                pick = cand[(cand != src)]
                ok = ~np.isin(
                    pair_keys(np.stack([np.full(pick.size, src), pick], 1), n, True), positives
                )
                rows.append(pick[ok][:k])
            negatives[s] = np.stack(rows)
        else:
            cand = rng.integers(0, n, (3 * h, 2))
            cand = cand[cand[:, 0] != cand[:, 1]]
            cand = cand[~np.isin(pair_keys(cand, n, True), positives)]
            negatives[s] = cand[np.unique(pair_keys(cand, n, True), return_index=True)[1]][:h]
    split = LinkSplit(name, n, edges, negatives, per_edge_negatives=per_edge).check()
    return graph_of(edges["train"], n, name, seed), split


def rewrite(path: Path, key: str, array: np.ndarray, **counts: int) -> None:
    """Replace ``path/key`` with ``array``, record its checksum, size and shape in meta.json,
    and set ``parts[r].link`` counts given as ``r<rank>_<key>=value``."""
    np.save(path / key, array)
    meta = json.loads((path / "meta.json").read_text())
    meta["files"][key].update(
        sha256=sha256_file(path / key), bytes=(path / key).stat().st_size, shape=list(array.shape)
    )
    for name, value in counts.items():
        rank, field = name[1:].split("_", 1)
        meta["parts"][int(rank)]["link"][field] = value
    (path / "meta.json").write_text(json.dumps(meta))


def check_parts(out: Path, graph: Graph, split: LinkSplit) -> None:
    """Every supervision row once over the parts, at its source's owner, sorted, equal to the
    split's row (written out here without the verifier)."""
    meta, _ = read_meta(out)
    parts = [load_partition(out, r) for r in range(meta["num_parts"])]
    owner = np.full(graph.num_nodes, -1)
    for p in parts:
        owner[p.global_ids[: p.num_inner]] = p.rank
    for s in LINK_SPLITS:
        names = [(s, f"{s}_id", split.edges[s])]
        if s in EVAL_SPLITS and not split.per_edge_negatives:
            names.append((f"{s}_neg", f"{s}_neg_id", split.negatives[s]))
        for key, ids_key, rows in names:
            seen = np.zeros(len(rows), dtype=np.int64)
            for p in parts:
                got, ids = np.asarray(p.link[key]), np.asarray(p.link[ids_key])
                assert got.dtype == np.int64 and ids.dtype == np.int64
                assert np.array_equal(got, rows[ids])
                assert (owner[got[:, 0]] == p.rank).all()  # anchors inner
                assert np.array_equal(np.lexsort((ids, got[:, 0])), np.arange(len(ids)))
                np.add.at(seen, ids, 1)
                if key == s and s in EVAL_SPLITS and split.per_edge_negatives:
                    assert np.array_equal(p.link[f"{s}_neg"], split.negatives[s][ids])
                    assert f"{s}_neg_id" not in p.link
            assert (seen == 1).all(), (key, seen)
    info = meta["link"]
    assert info["split_sha256"] == split_digest(split)
    assert info["metric"] == split.metric and info["per_edge_negatives"] == split.per_edge_negatives
    assert info["counts"]["train"] == len(split.edges["train"])
    assert info["counts"]["test_neg"] == len(split.negatives["test"])
    for r, p in enumerate(parts):
        assert meta["parts"][r]["link"]["valid"] == len(p.link["valid"])
        for name in p.link:
            assert f"part-{r}/link_{name}.npy" in meta["files"]


@pytest.mark.parametrize(
    ("num_parts", "method", "per_edge"),
    [(3, "random", False), (2, "metis", False), (3, "contiguous", True), (1, "metis", True)],
)
def test_parts_carry_every_edge_once_at_its_source(tmp_path, num_parts, method, per_edge):
    graph, split = make_link(per_edge=per_edge, seed=num_parts)
    out = tmp_path / "parts"
    partition_graph(graph, num_parts, out, method=method, link=split)
    check_parts(out, graph, split)
    summary = verify_partitions(out, graph, split)
    assert summary["link"]["counts"]["valid"] == len(split.edges["valid"])
    assert summary["link"]["leaked"] == 0
    assert summary["link"]["num_negatives_per_edge"] == (5 if per_edge else 0)


def test_files_follow_the_edges_not_the_row_order(tmp_path):
    graph, split = make_link(seed=4)
    partition_graph(graph, 2, tmp_path / "a", method="random", link=split)
    partition_graph(graph, 2, tmp_path / "b", method="random", link=split)
    perm = np.random.default_rng(1).permutation(len(split.edges["train"]))
    edges = {**split.edges, "train": split.edges["train"][perm]}
    shuffled = LinkSplit(split.name, split.num_nodes, edges, split.negatives).check()
    partition_graph(graph, 2, tmp_path / "c", method="random", link=shuffled)
    for r in range(2):
        a, b, c = (load_partition(tmp_path / d, r).link for d in "abc")
        for key in a:
            assert (tmp_path / "a" / f"part-{r}/link_{key}.npy").read_bytes() == (
                tmp_path / "b" / f"part-{r}/link_{key}.npy"
            ).read_bytes()
        # the same pairs in each part, in anchor order (ties by row id: the split's order)
        assert np.array_equal(a["train"][:, 0], c["train"][:, 0])
        assert np.array_equal(np.unique(a["train"], axis=0), np.unique(c["train"], axis=0))
        assert np.array_equal(np.sort(perm[c["train_id"]]), np.sort(a["train_id"]))


def test_leak_and_other_graph_refused_before_any_work(tmp_path, monkeypatch):
    graph, split = make_link(seed=5)
    import fullgraph.partition.build as build

    def never(*args, **kwargs):
        raise AssertionError("the assignment ran")

    monkeypatch.setattr(build, "assign_owners", never)
    leaky = LinkSplit(split.name, split.num_nodes, dict(split.edges), split.negatives)
    leaky.edges["valid"] = np.concatenate([split.edges["train"][:3], split.edges["valid"][3:]])
    leaky.edges["train"] = split.edges["train"][3:]
    with pytest.raises(DataError, match=r"3 of \d+ valid edges are still in the message-passing"):
        partition_graph(graph, 2, tmp_path / "p", link=leaky)
    other = LinkSplit(split.name, graph.num_nodes + 1, split.edges, split.negatives)
    with pytest.raises(DataError, match=r"graph of 241 nodes but linky has 240"):
        partition_graph(graph, 2, tmp_path / "p", link=other)
    assert not (tmp_path / "p").exists()


def test_whole_graph_part_is_the_one_part(tmp_path):
    graph, split = make_link(seed=6, per_edge=True)
    part = whole_graph_part(graph, link=split)
    partition_graph(graph, 1, tmp_path / "one", link=split)
    loaded = load_partition(tmp_path / "one", 0)
    assert set(part.link) == set(loaded.link)
    for key in part.link:
        assert np.array_equal(part.link[key], loaded.link[key]), key
    assert part.meta["link"] == loaded.meta["link"]
    assert whole_graph_part(graph, link=split).partition_hash == part.partition_hash
    with pytest.raises(DataError, match="no training nodes"):
        whole_graph_part(graph)  # the link graph has no labelled nodes: its split is needed


def test_node_partition_has_no_link(small_partitions):
    part = load_partition(small_partitions[2], 0)
    assert part.link is None and "link" not in part.meta
    assert verify_partitions(small_partitions[2])["link"] is None


@pytest.fixture()
def parts2(tmp_path) -> tuple[Path, Graph, LinkSplit]:
    graph, split = make_link(seed=7)
    out = tmp_path / "parts"
    partition_graph(graph, 2, out, method="random", link=split)
    return out, graph, split


def test_load_refuses_damaged_or_miscounted_arrays(parts2):
    out, _, _ = parts2
    f = out / "part-1" / "link_valid_neg.npy"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match=r"part-1/link_valid_neg\.npy fails its sha256"):
        load_partition(out, 1)
    with pytest.raises(PartitionError, match=r"link_valid_neg\.npy"):
        verify_partitions(out)
    meta = json.loads((out / "meta.json").read_text())
    meta["link"]["num_nodes"] += 1
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match=r"link\.num_nodes is 241 but num_nodes is 240"):
        load_partition(out, 0)
    meta["link"]["num_nodes"] -= 1
    meta["parts"][0]["link"]["train"] += 1
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match=r"link\.counts\.train is \d+ but the parts'"):
        load_partition(out, 0)
    meta["parts"][1]["link"]["train"] -= 1  # the sums agree, part 0's shapes do not
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match=r"part-0/link_train\.npy has shape \[\d+, 2\]"):
        load_partition(out, 0)


def test_verify_refuses_an_edge_at_the_wrong_part(parts2):
    out, _, _ = parts2
    # read into memory: the files below are rewritten in place
    p0, p1 = (load_partition(out, r, mmap=False).link for r in range(2))
    moved = np.concatenate([p0["train"], p1["train"][:1]])
    ids = np.concatenate([p0["train_id"], p1["train_id"][:1]])
    n0, n1 = len(moved), len(p1["train"]) - 1
    rewrite(out, "part-0/link_train.npy", moved, r0_train=n0)
    rewrite(out, "part-0/link_train_id.npy", ids)
    rewrite(out, "part-1/link_train.npy", np.asarray(p1["train"][1:]), r1_train=n1)
    rewrite(out, "part-1/link_train_id.npy", np.asarray(p1["train_id"][1:]))
    with pytest.raises(PartitionError, match=r"part-0: row \d+ of link_train is anchored at node"):
        verify_partitions(out)


def test_verify_refuses_a_row_twice_and_a_changed_pair(parts2):
    out, graph, _ = parts2
    link = load_partition(out, 0, mmap=False).link  # its files are rewritten in place below
    ids = np.array(link["test_id"])
    i = int(np.flatnonzero(np.diff(link["test"][:, 0]) > 0)[0])  # rows i, i+1: two anchors
    ids[i + 1] = ids[i]
    rewrite(out, "part-0/link_test_id.npy", ids)
    with pytest.raises(PartitionError, match=r"of the test link arrays is stored [02] times"):
        verify_partitions(out)
    rewrite(out, "part-0/link_test_id.npy", np.asarray(link["test_id"]))
    verify_partitions(out)
    pairs = np.array(link["train"])
    pairs[0, 1] = (pairs[0, 1] + 1) % graph.num_nodes
    rewrite(out, "part-0/link_train.npy", pairs)
    with pytest.raises(PartitionError, match=r"differ from the split_sha256"):
        verify_partitions(out)


def test_verify_counts_the_leak_and_refuses_another_split(tmp_path, parts2):
    out, graph, split = parts2
    leaky = LinkSplit(split.name, split.num_nodes, dict(split.edges), split.negatives)
    leaky.edges["test"] = np.concatenate([split.edges["train"][:4], split.edges["test"][4:]])
    owner = np.zeros(graph.num_nodes, dtype=np.int64)
    owner[graph.num_nodes // 2 :] = 1
    write_partitions(
        graph, owner, tmp_path / "leaky", method="contiguous", seed=0, link=leaky, link_checked=True
    )
    with pytest.raises(PartitionError, match=r"^4 of \d+ test edges are edges of the parts'"):
        verify_partitions(tmp_path / "leaky")
    with pytest.raises(PartitionError, match="differs from the one the partition was built with"):
        verify_partitions(out, graph, leaky)


def test_partition_and_verify_commands(tmp_path, monkeypatch, capsys):
    from fullgraph.datasets.ogb_writer import write_ogb

    graph, split = make_link(seed=8)
    third = np.arange(graph.num_nodes) * 3 // graph.num_nodes  # the OGB node layout wants splits
    masks = {m: third == i for i, m in enumerate(("train_mask", "val_mask", "test_mask"))}
    graph = replace(graph, **masks).validate()
    root = tmp_path / "data"
    write_ogb(graph, root, "linky")
    splits = {"linky": split}
    monkeypatch.setattr(
        fullgraph.datasets, "load_link_split", lambda name, r: splits.get(name), raising=False
    )
    out = tmp_path / "parts"
    argv = ["partition", "--dataset", "linky", "--root", str(root), "--parts", "2"]
    code, stdout, err = run_cli([*argv, "--out", str(out), "--method", "random"], capsys)
    assert code == 0, err
    assert "link split linky (auc)" in stdout and "per part:" in stdout
    check_parts(out, graph, split)
    code, stdout, err = run_cli(["verify", str(out), "--root", str(root)], capsys)
    assert code == 0, err
    assert f"OK link split linky: {len(split.edges['train']):,} train" in stdout
    assert f"({len(split.negatives['test']):,} negatives) each stored once" in stdout
    leaky = LinkSplit(split.name, split.num_nodes, dict(split.edges), split.negatives)
    leaky.edges["valid"] = np.concatenate([split.edges["train"][:2], split.edges["valid"]])
    leaky.edges["train"] = split.edges["train"][2:]
    splits["linky"] = leaky
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "p2")], capsys)
    assert_one_line(code, err, "2 of", "valid edges", "leak")
    assert not (tmp_path / "p2").exists()
