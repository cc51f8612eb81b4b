"""Which ranks print the one error line of a check every rank makes before they connect.

Enters through :mod:`fullgraph.run.command`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _train(tmp_path: Path, rank: int, local_rank: int) -> subprocess.CompletedProcess[str]:
    """``fullgraph train --parts MISSING`` as rank ``rank`` of 4 (2 per node) under hydra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "SLURM_", "OMPI_"))}
    env.update(
        PMI_RANK=str(rank), PMI_SIZE="4", MPI_LOCALRANKID=str(local_rank), MPI_LOCALNRANKS="2"
    )
    cmd = [sys.executable, "-m", "fullgraph.cli", "train", "--parts", str(tmp_path / "missing")]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(
    ("rank", "local_rank", "printed"),
    [(0, 0, "plain"), (1, 1, "none"), (2, 0, "named"), (3, 1, "none")],
)
def test_presumed_replicated_error_lines(
    tmp_path: Path, rank: int, local_rank: int, printed: str
) -> None:
    """Rank 0 prints the line; the first rank of every other node prints it naming itself (a
    partition missing on that node alone fails there alone); the other ranks stay silent. All
    exit 2."""
    out = _train(tmp_path, rank, local_rank)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if "error:" in line]
    if printed == "none":
        assert lines == []
        return
    assert len(lines) == 1 and "partition directory" in lines[0], out.stderr
    assert ("rank 2 on " in lines[0]) == (printed == "named")


def test_a_negative_looking_value_is_a_value() -> None:
    """`--fanouts -1,5` (-1: every neighbour, as PyG's NeighborLoader) parses like
    `--fanouts=-1,5`; an option left without its value says how to give one."""
    from fullgraph.cli import NEGATIVE_VALUE, build_parser

    argv = ["minibatch", "--dataset", "tiny", "--root", "data", "--fanouts", "-1,5"]
    assert build_parser(argv).parse_args(argv).fanouts == "-1,5"
    assert NEGATIVE_VALUE.match("-1e-3") and not NEGATIVE_VALUE.match("-x")


def test_an_option_without_its_value_says_how_to_give_one(capsys) -> None:
    from fullgraph.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["data", "synth", "--name", "-x", "--root", "r"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--name=VALUE" in err, err


def test_edge_weights_missing_names_the_data_given(tmp_path: Path, capsys) -> None:
    """Issue 31: a run without a partition was told "the partition stores none"."""
    from fullgraph.cli import main

    argv = ["train", "--synthetic", "tiny", "--edge-weight", "--epochs", "1", "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--synthetic tiny generates no edge weights" in err, err
    assert "partition" not in err
