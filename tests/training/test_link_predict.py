"""``fullgraph predict`` of a link model: the scores of given pairs at P = 2 are one process's
bit for bit (the decoder reads one pair's rows alone), and a malformed pair file is refused in
one line."""

from __future__ import annotations

from pathlib import Path

import link_worker
import numpy as np
import pytest
from harness import run_task
from link_worker import trained_model_file

from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import DataError
from fullgraph.partition import whole_graph_part
from fullgraph.training.link_predict import LinkScorer, read_pairs
from fullgraph.training.model_file import load_model_file


@pytest.mark.timeout(240)
def test_two_ranks_score_as_one_process(small_graph, small_partitions, tmp_path: Path) -> None:
    model = trained_model_file(small_graph, tmp_path / "link.pt")
    rng = np.random.default_rng(3)
    pairs = rng.integers(0, small_graph.num_nodes, size=(500, 2))
    np.save(tmp_path / "pairs.npy", pairs)
    scorer = LinkScorer(whole_graph_part(small_graph), Communicator(), load_model_file(model))
    want = scorer.scores(pairs)
    got = run_task(
        link_worker.score,
        ranks=2,
        out=tmp_path / "scores.npy",
        timeout=200,
        parts=small_partitions[2],
        model=model,
        pairs=tmp_path / "pairs.npy",
    )
    assert np.array_equal(got, want)
    assert np.isfinite(want).all() and want.std() > 0


def test_pair_files_are_checked(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("0 1\n# a comment\n2,3\n")
    assert read_pairs(tmp_path / "ok.txt", 4).tolist() == [[0, 1], [2, 3]]
    (tmp_path / "far.txt").write_text("0 1\n2 9\n")
    with pytest.raises(DataError, match=r"pair 1 \(2, 9\) is out of range for 4 nodes"):
        read_pairs(tmp_path / "far.txt", 4)
    (tmp_path / "three.txt").write_text("0 1 2\n")
    with pytest.raises(DataError, match="line 1 holds 3 values"):
        read_pairs(tmp_path / "three.txt", 4)
    np.save(tmp_path / "float.npy", np.zeros((2, 2)))
    with pytest.raises(DataError, match="integer pairs"):
        read_pairs(tmp_path / "float.npy", 4)
