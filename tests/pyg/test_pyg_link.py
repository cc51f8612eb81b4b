"""A PyG link-prediction script on P ranks: ``load_part`` of a ``RandomLinkSplit``, pairs
indexed by ``edge_label_index``, ``pyg.negative_sampling`` and ``pyg.gather``.

- ``examples/gae_cora_distributed.py`` is ``examples/gae_cora.py`` with at most five lines
  changed, and prints the same bits on 1 and 3 ranks (losses, validation and test AUC);
- on one process the converted model's loss and gradients equal the original PyG model's on
  the same pairs (the hashed negatives given to both);
- the negatives are pairs of distinct nodes, no edge of the graph, no repeats, and a new draw
  every call; ``force_undirected`` gives both directions;
- bad input is one line: pairs out of range, labels of another length, an ``edge_index`` that
  is not a link split's, a wrong ``num_nodes``, rows that are not the rank's nodes, a plain
  tensor in the pairs' ``torch.cat``, a gather of rows picked by a mask.

Enters through :mod:`fullgraph.pyg.link_data`.
"""

from __future__ import annotations

import copy
import difflib
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from mp_utils import run_mpi

pytest.importorskip("torch_geometric.nn")
import torch_geometric.transforms as T
from torch_geometric.nn import GCNConv

from fullgraph import pyg
from fullgraph.datasets import Graph, to_pyg
from fullgraph.distributed import Communicator
from fullgraph.errors import ConfigError
from fullgraph.pyg.node_rows import tag

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


class Net(torch.nn.Module):
    """The encoder and decoder of ``examples/gae_cora.py``, small."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, 16)
        self.conv2 = GCNConv(16, 8)

    def encode(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def decode(self, z, edge_label_index):
        return (z[edge_label_index[0]] * z[edge_label_index[1]]).sum(dim=-1)


def _split(graph: Graph) -> tuple:
    torch.manual_seed(0)
    random.seed(0)
    split = T.RandomLinkSplit(
        num_val=0.05, num_test=0.1, is_undirected=True, add_negative_train_samples=False
    )
    return split(to_pyg(graph))


@pytest.fixture(scope="module")
def splits(small_graph: Graph) -> tuple:
    """RandomLinkSplit's (train, val, test) of the 600-node graph."""
    return _split(small_graph)


@pytest.fixture
def parts(splits: tuple) -> tuple:
    """This (one) process's link parts."""
    return pyg.load_part(splits, Communicator())


def _code(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_examples_differ_in_at_most_five_lines() -> None:
    """The distributed example is the single-process one with at most five lines changed or
    added (and the import it no longer needs removed); its docstring lists them."""
    single, dist = EXAMPLES / "gae_cora.py", EXAMPLES / "gae_cora_distributed.py"
    diff = list(difflib.unified_diff(_code(single), _code(dist), lineterm="", n=0))
    added = [d[1:] for d in diff if d.startswith("+") and not d.startswith("+++")]
    removed = [d[1:] for d in diff if d.startswith("-") and not d.startswith("---")]
    assert 0 < len(added) <= 5 and len(removed) <= 5, "\n".join(diff)
    doc = dist.read_text().split('"""')[1]
    for line in added:
        assert f"    {line.strip()}" in doc, f"the docstring does not show {line.strip()!r}"


#: Runs the distributed example's ``main`` and prints every number it returns in hex.
EXAMPLE_WORKER = """
import sys
sys.path.insert(0, sys.argv[1])
from gae_cora_distributed import main
losses, aucs = main(["--root", sys.argv[2], "--epochs", "3"])
print("numbers", " ".join(float(v).hex() for v in losses + aucs))
"""


def test_example_prints_the_same_bits_on_one_and_three_ranks(shared_dataset, tmp_path) -> None:
    root = str(shared_dataset("cora"))
    script = tmp_path / "gae_worker.py"
    script.write_text(EXAMPLE_WORKER)
    printed = []
    for ranks in (1, 3):
        proc = run_mpi(ranks, [str(script), str(EXAMPLES), root], timeout=300)
        found = re.findall(r"^numbers (.+)$", proc.stdout, re.M)
        assert len(found) == 1, proc.stdout  # printed once: the other ranks are quiet
        printed.append(found[0].split())
    assert len(printed[0]) == 9
    assert printed[1] == printed[0]
    losses = [float.fromhex(v) for v in printed[0][:3]]
    assert all(0.5 < v < 0.8 for v in losses), losses  # BCE near log 2 at the start


def test_one_process_converted_equals_the_original_on_the_same_pairs(splits, parts) -> None:
    train, _, _ = splits
    torch.manual_seed(0)
    original = Net(train.num_features)
    converted = pyg.distribute(copy.deepcopy(original), parts[0])
    data = parts[0]
    criterion = torch.nn.BCEWithLogitsLoss()

    z = converted.encode(data.x, data.edge_index)
    neg = pyg.negative_sampling(data.edge_index, num_neg_samples=data.edge_label_index.size(1))
    eli = torch.cat([data.edge_label_index, neg], dim=-1)
    label = torch.cat([data.edge_label, data.edge_label.new_zeros(neg.size(1))])
    loss = criterion(converted.decode(z, eli).view(-1), label)
    loss.backward()

    plain_eli = torch.cat([train.edge_label_index, neg.as_subclass(torch.Tensor)], dim=-1)
    plain_label = torch.cat([train.edge_label, torch.zeros(neg.size(1))])
    z0 = original.encode(train.x, train.edge_index)
    want = criterion(original.decode(z0, plain_eli).view(-1), plain_label)
    want.backward()

    assert torch.equal(data.edge_label_index.as_subclass(torch.Tensor), train.edge_label_index)
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-6)
    for (name, p), q in zip(converted.named_parameters(), original.parameters(), strict=True):
        np.testing.assert_allclose(
            p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-7, err_msg=name
        )


def test_negatives_are_new_non_edges_of_distinct_nodes(splits, parts) -> None:
    train, _, _ = splits
    data = parts[0]
    edges = {tuple(e) for e in train.edge_index.t().tolist()}
    asked = 400
    first = pyg.negative_sampling(data.edge_index, data.num_nodes, asked)
    again = pyg.negative_sampling(data.edge_index, data.num_nodes, asked)
    for neg in (first, again):
        pairs = [tuple(p) for p in neg.as_subclass(torch.Tensor).t().tolist()]
        assert 0.9 * asked <= len(pairs) <= asked
        assert len(set(pairs)) == len(pairs)
        assert not any(a == b for a, b in pairs)
        assert not any(p in edges for p in pairs)
    assert not torch.equal(first.as_subclass(torch.Tensor), again.as_subclass(torch.Tensor))
    fresh = pyg.load_part(splits, Communicator())  # a new run draws the same pairs
    assert torch.equal(
        pyg.negative_sampling(fresh[0].edge_index, num_neg_samples=asked).as_subclass(torch.Tensor),
        first.as_subclass(torch.Tensor),
    )
    both = pyg.negative_sampling(data.edge_index, num_neg_samples=50, force_undirected=True)
    pairs = {tuple(p) for p in both.as_subclass(torch.Tensor).t().tolist()}
    assert all((b, a) in pairs for a, b in pairs)


def test_gather_gives_every_row_in_key_order(parts) -> None:
    data = parts[1]
    torch.manual_seed(0)
    model = pyg.distribute(Net(data.num_features), parts[0])
    with torch.no_grad():
        z = model.encode(data.x, data.edge_index)
        out = model.decode(z, data.edge_label_index).sigmoid()
    label, score = pyg.gather(data.edge_label, out)
    assert np.array_equal(label, data.edge_label.as_subclass(torch.Tensor).numpy())
    assert np.array_equal(score, out.as_subclass(torch.Tensor).numpy())
    with pytest.raises(ConfigError, match="neither the rank's nodes nor a pair set's"):
        pyg.gather(out[data.edge_label > 0])


def test_bad_input_is_one_line(splits, parts) -> None:
    train, val, test = splits
    bad = val.clone()
    bad.edge_label_index = val.edge_label_index.clone()
    bad.edge_label_index[1, 3] = train.num_nodes
    with pytest.raises(ConfigError, match=r"val_data.edge_label_index has 1 pairs with a node id"):
        pyg.load_part((train, bad, test), Communicator())
    short = val.clone()
    short.edge_label = val.edge_label[:-1]
    with pytest.raises(ConfigError, match="val_data.edge_label must hold one value per pair"):
        pyg.load_part((train, short, test), Communicator())
    with pytest.raises(ConfigError, match=r"a link split is \(train_data, val_data, test_data\)"):
        pyg.load_part((train, val), Communicator())
    data = parts[0]
    with pytest.raises(ConfigError, match="edge_index must be train_data.edge_index"):
        pyg.negative_sampling(train.edge_index)
    with pytest.raises(ConfigError, match="num_nodes=7 is neither"):
        pyg.negative_sampling(data.edge_index, num_nodes=7)
    with pytest.raises(ConfigError, match="must hold one row per node of the rank"):
        torch.zeros(5, 3)[data.edge_label_index[0]]
    with pytest.raises(ConfigError, match="cat of edge_label_index with a plain tensor"):
        torch.cat([data.edge_label_index, train.edge_label_index], dim=-1)


#: Loads a link partition's parts on every rank and prints, on rank 0, every split's gathered
#: (label, first node, second node) in key order (the nodes' global ids as the rows fetched).
PARTS_WORKER = """
import sys
import numpy as np
import torch
from fullgraph import pyg
from fullgraph.pyg.node_rows import tag
splits = pyg.load_part(sys.argv[1], threads=1)
part = splits[0].fullgraph
ids = tag(torch.from_numpy(part.global_ids.astype(np.float64))[:, None], part)
for data in splits:
    eli = data.edge_label_index
    label, u, v = pyg.gather(data.edge_label, ids[eli[0]], ids[eli[1]])
    print("split", " ".join(str(int(x)) for x in np.concatenate([label, u[:, 0], v[:, 0]])))
"""


def _link_partition(small_graph: Graph, parts: int, out: Path, per_edge: int = 0) -> object:
    from fullgraph.datasets.link_split import split_edges
    from fullgraph.partition import partition_graph

    graph, split = split_edges(small_graph, val=30, test=30, seed=3, neg_per_edge=per_edge)
    partition_graph(graph, parts, out, method="metis", seed=0, link=split)
    return split


def _expected(split: object) -> list[list[int]]:
    """Every split's labels, first and second nodes: positives, then negatives."""
    out = []
    for s in ("train", "valid", "test"):
        pos = split.edges[s]
        neg = split.negatives.get(s, np.zeros((0, 2), dtype=np.int64))
        if split.per_edge_negatives and s != "train":
            k = neg.shape[1]
            neg = np.stack([np.repeat(pos[:, 0], k), neg.reshape(-1)], axis=1)
        labels = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
        both = np.concatenate([pos, neg])
        out.append(np.concatenate([labels, both[:, 0], both[:, 1]]).astype(int).tolist())
    return out


def test_a_link_partition_directory_gives_its_pairs_in_order(small_graph, tmp_path) -> None:
    """``load_part(DIR)`` of ``fullgraph partition`` of a link split: each split's positives,
    then its negatives, every rank reading its own; at P = 1 in process, at P = 2 gathered."""
    for per_edge in (0, 3):  # negative pairs, and citation2's per-edge negative targets
        one = _link_partition(small_graph, 1, tmp_path / f"one-{per_edge}", per_edge)
        splits = pyg.load_part(tmp_path / f"one-{per_edge}", Communicator())
        part = splits[0].fullgraph
        ids = tag(torch.from_numpy(part.global_ids.astype(np.float64))[:, None], part)
        for data, want in zip(splits, _expected(one), strict=True):
            eli = data.edge_label_index
            label, u, v = pyg.gather(data.edge_label, ids[eli[0]], ids[eli[1]])
            got = np.concatenate([label, u[:, 0], v[:, 0]]).astype(int).tolist()
            assert got == want, per_edge
    two = _link_partition(small_graph, 2, tmp_path / "two")
    script = tmp_path / "parts_worker.py"
    script.write_text(PARTS_WORKER)
    proc = run_mpi(2, [str(script), str(tmp_path / "two")], timeout=200)
    got = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("split ")]
    assert [[int(x) for x in g] for g in got] == _expected(two)
