"""``fullgraph data synth --force`` replaces only a dataset ``data synth`` wrote.

The data-loss case of the reliability sweep (issue 22, ``--name mine`` where ``r/mine`` is a
user's own folder) and its relatives as rows of :data:`REFUSED`; every row, with and without
``--force``: exit 2, one line, every file under the root byte for byte as before.

Enters through :mod:`fullgraph.datasets.ogb_writer`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from file_tree import tree

from fullgraph.cli import main
from fullgraph.datasets import load
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.synthetic import write_ogb
from fullgraph.errors import ConfigError


@pytest.fixture(scope="module")
def graph(make_graph) -> Graph:
    return make_graph(num_nodes=80, num_features=3, num_classes=2, seed=3, name="mine")


def _user_folder(d: Path, graph: Graph) -> None:
    d.mkdir(parents=True)
    (d / "thesis.tex").write_text("\\chapter{One}\n")


def _downloaded(d: Path, graph: Graph) -> None:
    """An OGB-layout dataset as downloaded: the same file names, no fullgraph marker."""
    write_ogb(graph, d.parent, d.name)
    (d / "meta.json").unlink()


def _synth_plus(rel: str) -> Callable[[Path, Graph], None]:
    def make(d: Path, graph: Graph) -> None:
        write_ogb(graph, d.parent, d.name)
        (d / rel).write_text("added by hand\n")

    return make


def _other_json(d: Path, graph: Graph) -> None:
    write_ogb(graph, d.parent, d.name)
    (d / "meta.json").write_text('{"format": "someone-else"}\n')


#: case -> (fills r/mine, what the one line says)
REFUSED: dict[str, tuple[Callable[[Path, Graph], None], str]] = {
    "a user's folder": (_user_folder, "it holds thesis.tex"),
    "a downloaded dataset": (_downloaded, "no meta.json marker"),
    "another program's marker": (_other_json, "it holds meta.json"),
    "a synth dataset plus notes": (_synth_plus("notes.txt"), "it holds notes.txt"),
    "a synth dataset plus a raw file": (_synth_plus("raw/extra.csv"), "it holds raw/extra.csv"),
}


@pytest.mark.parametrize("force", [True, False])
@pytest.mark.parametrize("case", REFUSED)
def test_a_directory_synth_did_not_write_is_refused(
    tmp_path: Path, graph: Graph, capsys, case: str, force: bool
) -> None:
    make, needle = REFUSED[case]
    root = tmp_path / "r"
    make(root / "mine", graph)
    before = tree(tmp_path)
    argv = ["data", "synth", "--name", "mine", "--root", str(root), "--seed", "1"]
    assert main([*argv, *(["--force"] if force else [])]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fullgraph data: error: dataset directory {root / 'mine'} "), err
    assert "is not a dataset written by fullgraph" in err and needle in err, err
    assert "wrote" not in captured.out
    assert tree(tmp_path) == before
    with pytest.raises(ConfigError, match="not a dataset written by fullgraph"):
        write_ogb(graph, root, "mine", force=True)
    assert tree(tmp_path) == before


def test_force_replaces_a_dataset_synth_wrote(tmp_path: Path, capsys) -> None:
    root = tmp_path / "r"
    argv = ["data", "synth", "--name", "mine", "--root", str(root)]
    assert main([*argv, "--seed", "0"]) == 0
    first = load("mine", root)  # writes the reader's cache, processed/, inside the dataset
    assert (root / "mine" / "processed").is_dir()
    assert main([*argv, "--seed", "1"]) == 2  # without --force: refused, kept
    assert "already exists (use --force" in capsys.readouterr().err
    assert main([*argv, "--seed", "1", "--force"]) == 0
    assert json.loads((root / "mine" / "meta.json").read_text())["source"]["seed"] == 1
    assert not (root / "mine" / "processed").exists()
    second = load("mine", root)
    assert second.num_edges != first.num_edges or (second.indices != first.indices).any()
    assert sorted(p.name for p in root.iterdir()) == ["mine"]  # no debris
