"""The model file follows every output's rules (issue 31, Lost/Debris): ``--save-model`` replaces
only a model file (``--force`` or not), no output goes inside another command's directory, one
writer per output file (:class:`~fullgraph.run.claim.FileClaim`), predict takes its disk room
before it maps a row, and a checkpoint run that fails before its first save leaves nothing of
its own while an earlier run's files stay.

Enters through :mod:`fullgraph.run.claim`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from cli_run import assert_one_line, run_cli
from file_tree import tree
from mp_utils import one_thread

from fullgraph.cli import main as cli_main
from fullgraph.errors import ConfigError, OutputError
from fullgraph.run.checkpoint import CheckpointDir
from fullgraph.run.claim import FileClaim, claim_path
from fullgraph.training import inference
from fullgraph.training.inference import create_files

TRAIN = ["train", "--threads", "1", "--quiet", "--synthetic", "tiny", "--epochs", "2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run's outputs: ``ck/`` (a checkpoint), ``run.jsonl`` and ``run.model.pt``,
    and a prediction ``pred/`` of that model."""
    base = tmp_path_factory.mktemp("finished")
    with one_thread():
        code = cli_main(
            [*TRAIN, "--checkpoint", str(base / "ck"), "--log-json", str(base / "run.jsonl")]
        )
        assert code == 0
        argv = ["predict", "--synthetic", "tiny", "--model", str(base / "run.model.pt")]
        assert cli_main([*argv, "--out", str(base / "pred"), "--threads", "1"]) == 0
    return base


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("ck/checkpoint.pt", "is inside"),
        ("run.jsonl", "is not a model file"),
        ("pred/predictions.npy", "is inside"),
        ("pred/m.pt", "is inside"),
    ],
)
def test_save_model_never_replaces_another_kind_of_output(
    finished: Path, target: str, needle: str, force: bool, capsys
) -> None:
    before = tree(finished)
    argv = [*TRAIN, "--save-model", str(finished / target), *(["--force"] if force else [])]
    code, _, err = run_cli(argv, capsys)
    assert_one_line(code, err, needle)
    assert tree(finished) == before


def test_a_model_file_is_replaced_by_force(finished: Path, tmp_path: Path, capsys) -> None:
    model = tmp_path / "m.pt"
    model.write_bytes((finished / "run.model.pt").read_bytes())
    inode = model.stat().st_ino
    code, _, err = run_cli([*TRAIN, "--save-model", str(model), "--force"], capsys)
    assert code == 0 and model.stat().st_ino != inode, err  # written anew, renamed over it
    assert not claim_path(model).exists()  # the claim leaves nothing beside the model


@pytest.mark.parametrize("force", [False, True])
def test_a_checkpoint_into_a_prediction_is_refused(finished: Path, force: bool, capsys) -> None:
    before = tree(finished)
    argv = [*TRAIN, "--checkpoint", str(finished / "pred"), *(["--force"] if force else [])]
    code, _, err = run_cli(argv, capsys)
    assert_one_line(code, err, "--checkpoint")
    assert tree(finished) == before


def test_a_second_writer_of_one_output_is_refused_naming_the_first(tmp_path: Path) -> None:
    target = tmp_path / "m.pt"
    first = FileClaim(target, "--save-model")
    first.acquire()
    try:
        second = FileClaim(target, "--save-model")
        with pytest.raises(ConfigError, match=f"being written by another run \\(pid {os.getpid()}"):
            second.acquire()
    finally:
        first.release()
    assert not claim_path(target).exists()
    again = FileClaim(target, "--save-model")  # free once the first is done
    again.acquire()
    again.release()
    assert list(tmp_path.iterdir()) == []


def test_a_claim_left_by_a_killed_run_is_taken_over(tmp_path: Path) -> None:
    target = tmp_path / "m.pt"
    claim_path(target).write_text("pid 1 on elsewhere\n")  # its holder died: no flock on it
    claim = FileClaim(target, "--save-model")
    claim.acquire()
    assert str(os.getpid()) in claim_path(target).read_text()
    claim.release()
    assert list(tmp_path.iterdir()) == []


def test_predict_without_room_fails_in_one_line_before_any_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"predictions.npy": ((1000,), "int64"), "logits.npy": ((1000, 7), "float32")}

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(inference.os, "posix_fallocate", full)
    with pytest.raises(OutputError, match="--out out: no space left on device .* nothing was"):
        create_files(tmp_path, files, Path("out"))


def test_predict_counts_its_bytes_before_it_creates_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Tiny:
        f_bavail, f_frsize = 3, 4096

    monkeypatch.setattr(inference.os, "statvfs", lambda _: Tiny())
    with pytest.raises(OutputError, match="they need 8\\.0 MiB, 12 KiB free there"):
        create_files(tmp_path, {"logits.npy": ((1 << 20,), "float64")}, Path("out"))
    assert list(tmp_path.iterdir()) == []


def test_a_failed_checkpoint_run_removes_only_its_own_files(tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    ck = CheckpointDir(directory, 0)
    ck.open()
    ck.write_config({"epochs": 1})
    (directory / "rank-1-epoch-1.pt").write_bytes(b"")  # a rank's state before the first save
    ck.close(discard=True)
    assert not directory.exists()


def test_a_failed_force_run_keeps_the_earlier_checkpoint_and_its_config(tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    earlier = CheckpointDir(directory, 0)
    earlier.open()
    earlier.write_config({"epochs": 3})
    earlier.save({"model": {}, "optimizer": {}, "epoch": 3})
    earlier.close()
    before = tree(tmp_path)
    ck = CheckpointDir(directory, 0, force=True)
    ck.open()
    ck.write_config({"epochs": 9})  # kept back until this run's first checkpoint
    assert tree(tmp_path) == before
    ck.close(discard=True)
    assert tree(tmp_path) == before
    ck = CheckpointDir(directory, 0, force=True)
    ck.open()
    ck.write_config({"epochs": 9})
    ck.save({"model": {}, "optimizer": {}, "epoch": 1})
    ck.close()
    assert '"epochs": 9' in (directory / "config.json").read_text()
