"""``fullgraph partition --force`` replaces only a partition fullgraph wrote, never an input.

Each data-loss case of the reliability sweep (issue 22) as a row of :data:`REFUSED`: ``--out``
set to the dataset being read, to its root, to another dataset root holding a dataset and a
user's notes, to a folder holding two other partitions, to a user's folder holding only
``thesis.tex``, to a partition a user added a file to. Every row, with and without ``--force``:
exit 2, one line, every file under the test's directory byte for byte as before.

Enters through :mod:`fullgraph.partition.build`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from file_tree import tree

from fullgraph.cli import main
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.synthetic import write_ogb
from fullgraph.errors import ConfigError
from fullgraph.partition import build, partition_graph, verify_partitions


@pytest.fixture(scope="module")
def graph(make_graph) -> Graph:
    return make_graph(num_nodes=120, num_features=4, num_classes=3, seed=5, name="victim")


@pytest.fixture
def place(tmp_path: Path, graph: Graph) -> Path:
    """``ds/`` holding the dataset ``victim`` (read by every case), ``other`` and notes."""
    write_ogb(graph, tmp_path / "ds", "victim")
    write_ogb(graph, tmp_path / "ds", "other")
    (tmp_path / "ds" / "notes.txt").write_text("my notes\n")
    return tmp_path


def _another_root(tmp: Path, graph: Graph) -> Path:
    write_ogb(graph, tmp / "ds2", "mine")
    (tmp / "ds2" / "notes.txt").write_text("keep\n")
    return tmp / "ds2"


def _two_partitions(tmp: Path, graph: Graph) -> Path:
    partition_graph(graph, 2, tmp / "parts" / "a")
    partition_graph(graph, 3, tmp / "parts" / "b")
    return tmp / "parts"


def _thesis(tmp: Path, graph: Graph) -> Path:
    (tmp / "user").mkdir()
    (tmp / "user" / "thesis.tex").write_text("\\chapter{One}\n")
    return tmp / "user"


def _partition_plus(name: str) -> Callable[[Path, Graph], Path]:
    def make(tmp: Path, graph: Graph) -> Path:
        partition_graph(graph, 2, tmp / "p")
        (tmp / "p" / name).write_text("added by hand\n")
        return tmp / "p"

    return make


#: case -> (makes the --out, what the one line says)
REFUSED: dict[str, tuple[Callable[[Path, Graph], Path], str]] = {
    "the dataset being read": (
        lambda tmp, g: tmp / "ds" / "victim",
        "is the dataset directory this command reads",
    ),
    "inside the dataset being read": (
        lambda tmp, g: tmp / "ds" / "victim" / "parts",
        "is inside the dataset directory this command reads",
    ),
    "the dataset root": (lambda tmp, g: tmp / "ds", "is the dataset root this command reads"),
    "above the dataset root": (lambda tmp, g: tmp, "holds the dataset root"),
    "another dataset's directory": (
        lambda tmp, g: tmp / "ds" / "other",
        "is not a partition written by fullgraph",
    ),
    "another root: a dataset and notes": (_another_root, "it holds mine/, notes.txt"),
    "a folder holding two partitions": (_two_partitions, "it holds a/, b/"),
    "a folder holding only thesis.tex": (_thesis, "it holds thesis.tex"),
    "a partition plus a user's file": (_partition_plus("notes.txt"), "it holds notes.txt"),
    "a partition plus a file in a part": (
        _partition_plus("part-0/extra.txt"),
        "it holds part-0/extra.txt",
    ),
}


@pytest.mark.parametrize("force", [True, False])
@pytest.mark.parametrize("case", REFUSED)
def test_out_that_fullgraph_did_not_write_is_refused(
    place: Path, graph: Graph, capsys, case: str, force: bool
) -> None:
    make, needle = REFUSED[case]
    out = make(place, graph)
    before = tree(place)
    argv = ["partition", "--dataset", "victim", "--root", str(place / "ds"), "--parts", "2"]
    assert main([*argv, "--out", str(out), *(["--force"] if force else [])]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fullgraph partition: error: --out {out} "), err
    assert needle in err, err
    assert "wrote" not in captured.out
    assert tree(place) == before


def test_force_replaces_a_partition_fullgraph_wrote(place: Path, graph: Graph, capsys) -> None:
    out = place / "parts" / "victim-2"
    argv = ["partition", "--dataset", "victim", "--root", str(place / "ds"), "--out", str(out)]
    assert main([*argv, "--parts", "2"]) == 0
    assert main([*argv, "--parts", "3"]) == 2  # without --force: refused, kept
    assert "already exists (use --force" in capsys.readouterr().err
    assert json.loads((out / "meta.json").read_text())["num_parts"] == 2
    assert main([*argv, "--parts", "3", "--force"]) == 0
    assert json.loads((out / "meta.json").read_text())["num_parts"] == 3
    assert verify_partitions(out)["num_parts"] == 3
    assert sorted(p.name for p in out.parent.iterdir()) == ["victim-2"]  # no debris
    (place / "empty").mkdir()  # an empty directory holds nothing to lose
    assert main([*argv[:-1], str(place / "empty"), "--parts", "2", "--force"]) == 0


def test_library_refuses_the_same(tmp_path: Path, graph: Graph) -> None:
    user = _thesis(tmp_path, graph)
    before = tree(tmp_path)
    with pytest.raises(ConfigError, match="not a partition written by fullgraph.*thesis.tex"):
        partition_graph(graph, 2, user, force=True)
    assert tree(tmp_path) == before


def test_a_folder_that_appears_while_writing_is_not_replaced(
    tmp_path: Path, graph: Graph, monkeypatch
) -> None:
    """--force on a new --out, and a user's folder appears there before the final rename:
    refused at the rename, the folder kept, the temporary removed."""
    out = tmp_path / "out"
    real = build.save_array

    def save_and_meddle(*args, **kwargs):
        if not out.exists():
            _thesis(tmp_path, graph).rename(out)
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "save_array", save_and_meddle)
    with pytest.raises(ConfigError, match="thesis.tex"):
        partition_graph(graph, 2, out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_out_inside_a_musae_dataset_under_its_distributed_name_is_refused(
    tmp_path: Path, capsys
) -> None:
    """``--dataset github`` reads ``github_musae/`` (the name it is distributed with): an
    ``--out`` inside that directory is refused like one inside ``github/``."""
    raw = tmp_path / "ds" / "github_musae" / "raw"
    raw.mkdir(parents=True)
    (raw / "edges.csv").write_text(
        "id_1,id_2\n" + "".join(f"{i},{(i + 1) % 40}\n" for i in range(40))
    )
    (raw / "target.csv").write_text(
        "id,name,ml_target\n" + "".join(f"{i},dev{i},{i % 2}\n" for i in range(40))
    )
    before = tree(tmp_path)
    out = tmp_path / "ds" / "github_musae" / "parts"
    argv = ["partition", "--dataset", "github", "--root", str(tmp_path / "ds"), "--parts", "2"]
    assert main([*argv, "--method", "random", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "inside the dataset directory this command reads" in err[0], err
    assert tree(tmp_path) == before
