"""The hops kept with their partition: written once and read by later runs (nothing recomputed:
counted), another key another entry, a damaged entry refused with one line and recomputed
only with ``force``, an unwritable directory computed without caching (one line), and the
command line: ``fullgraph train`` twice and ``fullgraph predict`` on the same partition.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_run import run_cli

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.halo import HaloPlan
from fullgraph.errors import ConfigError
from fullgraph.models.local_graph import as_tensor
from fullgraph.partition import load_partition, partition_graph
from fullgraph.propagation import features
from fullgraph.propagation.cache import MANIFEST, HopCache, part_name
from fullgraph.propagation.features import HopSpec, hop_features

SPEC = HopSpec("gcn", 2, None, "all")


@pytest.fixture
def parts(small_graph, tmp_path: Path) -> Path:
    """A one-part partition of the test graph, of this test's own (it is written into)."""
    root = tmp_path / "parts-1"
    partition_graph(small_graph, 1, root, method="metis", seed=0)
    return root


@pytest.fixture
def computed(monkeypatch) -> list[int]:
    """How many times the hops were computed (``propagate_hops`` calls)."""
    calls: list[int] = []
    real = features.propagate_hops

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(features, "propagate_hops", counting)
    return calls


def _hops(parts: Path, spec: HopSpec = SPEC, **cache) -> torch.Tensor:
    part, comm = load_partition(parts, 0), Communicator()
    plan = HaloPlan.from_partition(part, comm)
    store = HopCache.of_run(parts, **{"force": False, "verify": True, "quiet": False, **cache})
    return hop_features(part, as_tensor(part.x, np.float32), plan, spec, cache=store)


def _entry(parts: Path) -> Path:
    (entry,) = (parts / "precompute").iterdir()
    return entry


def test_written_once_then_read(parts: Path, computed: list[int], capsys) -> None:
    first = _hops(parts)
    assert "cached in" in capsys.readouterr().out
    entry = _entry(parts)
    record = json.loads((entry / MANIFEST).read_text())
    assert record["key"]["hops"] == 2 and record["key"]["propagation"] == "gcn"
    assert set(record["parts"]) == {part_name(0)}
    second = _hops(parts)
    out = capsys.readouterr().out
    assert computed == [1], "the second run computed the hops again"
    assert "hops: read from" in out and "hop 1/2" not in out
    assert torch.equal(first, second)
    assert first.shape == (600, 3 * 12)


def test_another_key_is_another_entry(parts: Path, computed: list[int]) -> None:
    _hops(parts)
    _hops(parts, HopSpec("gcn", 3, None, "all"))
    _hops(parts, HopSpec("gcn", 2, None, "last"))
    _hops(parts, HopSpec("ppr", 2, 0.1, "all"))
    _hops(parts, HopSpec("ppr", 2, 0.2, "all"))
    names = sorted(p.name for p in (parts / "precompute").iterdir())
    assert len(names) == 5 and computed == [1] * 5, names
    _hops(parts, HopSpec("ppr", 2, 0.2, "all"))
    assert len(computed) == 5


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-4])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_truncate, "has 86524 bytes, hops.json records 86528"),
        (_flip, "fails its sha256 checksum"),
        (lambda p: p.unlink(), "is missing"),
        (lambda p: (p.parent / MANIFEST).write_text("{not json"), "hops.json: unreadable"),
    ],
    ids=["truncated", "flipped", "missing", "manifest"],
)
def test_a_damaged_entry_is_refused_then_recomputed_with_force(
    parts: Path, computed: list[int], damage, message: str, capsys
) -> None:
    good = _hops(parts)
    damage(_entry(parts) / part_name(0))
    with pytest.raises(ConfigError) as err:
        _hops(parts)
    line = str(err.value)
    assert "\n" not in line and message in line and "--force" in line, line
    assert computed == [1]
    again = _hops(parts, force=True)
    assert computed == [1, 1] and torch.equal(again, good)
    capsys.readouterr()
    _hops(parts)  # whole again: read
    assert computed == [1, 1] and "read from" in capsys.readouterr().out


def test_no_verify_checks_sizes_only(parts: Path, computed: list[int]) -> None:
    _hops(parts)
    _flip(_entry(parts) / part_name(0))
    _hops(parts, verify=False)  # the size matches: read without hashing
    assert computed == [1]


def test_an_unfinished_entry_is_computed_again(parts: Path, computed: list[int]) -> None:
    _hops(parts)
    (_entry(parts) / MANIFEST).unlink()  # as if rank 0 died before writing it
    _hops(parts)
    assert computed == [1, 1] and (_entry(parts) / MANIFEST).is_file()


def test_an_unwritable_partition_computes_without_caching(
    parts: Path, computed: list[int], capsys
) -> None:
    (parts / "precompute").write_text("in the way")  # mkdir fails as on a read-only disk
    got = _hops(parts)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("hops:")]
    assert len(lines) == 1 and "not cached: rank 0 cannot write" in lines[0], lines
    assert got.shape == (600, 36)
    _hops(parts)
    assert computed == [1, 1]


def test_a_whole_graph_keeps_nothing(small_graph, computed: list[int], capsys) -> None:
    from fullgraph.partition import whole_graph_part

    part, comm = whole_graph_part(small_graph), Communicator()
    plan = HaloPlan.from_partition(part, comm)
    x = as_tensor(part.x, np.float32)
    hop_features(
        part, x, plan, SPEC, cache=HopCache.of_run(None, force=False, verify=True, quiet=False)
    )
    assert "not cached (a whole graph)" in capsys.readouterr().out


def test_train_twice_and_predict_read_the_cache(parts: Path, tmp_path: Path, capsys) -> None:
    common = ["--parts", str(parts), "--model", "sign", "--hops", "2", "--epochs", "3"]
    model = tmp_path / "sign.pt"
    code, out, err = run_cli(["train", *common, "--save-model", str(model)], capsys)
    assert code == 0, err
    assert "hop 2/2 (sym)" in out and "cached in" in out, out
    code, out, err = run_cli(["train", *common], capsys)
    assert code == 0, err
    assert "hops: read from" in out and "hop 1/2" not in out, out
    argv = ["predict", "--parts", str(parts), "--model", str(model), "--out", str(tmp_path / "p")]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "hops: read from" in out, out
    assert len(list((parts / "precompute").iterdir())) == 1


def test_a_partition_with_its_hops_is_still_ours(parts: Path, computed: list[int]) -> None:
    """``fullgraph partition --force`` replaces a partition holding hops (and them with it);
    a stray file beside them is still someone else's."""
    from fullgraph.partition.output_kind import PARTITION

    _hops(parts)
    assert PARTITION.foreign(parts) is None
    (parts / "notes.txt").write_text("mine")
    assert "notes.txt" in (PARTITION.foreign(parts) or "")
