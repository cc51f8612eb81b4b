"""Where ``fullgraph train`` and ``fullgraph minibatch`` may write, and what ``--force`` replaces.

Two classes of case, each a table:

- :data:`OVERLAPS`: outputs that overlap an input or each other (a log inside the checkpoint
  directory, a checkpoint in the partition read, a log inside the dataset read) are refused
  before any work;
- :data:`FOREIGN`: a log, config, checkpoint or lock file that fullgraph did not write is never
  replaced, with ``--force`` or without.

Every row: exit 2, one line, every file under the test's directories byte for byte as before.
The positive cases: ``--force`` replaces a run's own log and checkpoint (also a log cut short or
left empty by an interrupted run).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_run import assert_one_line, run_cli
from file_tree import tree

from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic import generate
from fullgraph.partition import partition_graph

TRAIN = ["train", "--threads", "1", "--quiet", "--epochs", "2"]
MINIBATCH = ["minibatch", "--threads", "1", "--quiet", "--epochs", "1"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``data/tiny`` (a dataset) and ``p1`` (its one-part partition), read by the runs."""
    base = tmp_path_factory.mktemp("run-inputs")
    graph = generate("tiny", seed=0)
    write_ogb(graph, base / "data", "tiny")
    partition_graph(graph, 1, base / "p1", method="contiguous")
    return base


#: case -> (the command line, given (inputs, tmp); what the one line says)
OVERLAPS: dict[str, tuple[Callable[[Path, Path], list[str]], str]] = {
    "log = checkpoint's config.json": (
        lambda i, t: [
            *TRAIN,
            "--synthetic",
            "tiny",
            "--checkpoint",
            f"{t}/ck",
            "--log-json",
            f"{t}/ck/config.json",
        ],
        "is inside --checkpoint",
    ),
    "log = checkpoint.pt": (
        lambda i, t: [
            *TRAIN,
            "--synthetic",
            "tiny",
            "--checkpoint",
            f"{t}/ck",
            "--log-json",
            f"{t}/ck/checkpoint.pt",
        ],
        "is inside --checkpoint",
    ),
    "log = checkpoint directory": (
        lambda i, t: [
            *TRAIN,
            "--synthetic",
            "tiny",
            "--checkpoint",
            f"{t}/ck",
            "--log-json",
            f"{t}/ck",
        ],
        "are one path",
    ),
    "log inside the partition": (
        lambda i, t: [*TRAIN, "--parts", f"{i}/p1", "--log-json", f"{i}/p1/run.jsonl"],
        "is inside the partition this command reads",
    ),
    "checkpoint = the partition": (
        lambda i, t: [*TRAIN, "--parts", f"{i}/p1/meta.json", "--checkpoint", f"{i}/p1"],
        "is the partition this command reads",
    ),
    "checkpoint inside a part": (
        lambda i, t: [*TRAIN, "--parts", f"{i}/p1", "--checkpoint", f"{i}/p1/part-0"],
        "is inside the partition this command reads",
    ),
    "log inside the dataset": (
        lambda i, t: [
            *TRAIN,
            "--dataset",
            "tiny",
            "--root",
            f"{i}/data",
            "--log-json",
            f"{i}/data/tiny/run.jsonl",
        ],
        "is inside the dataset directory this command reads",
    ),
    "checkpoint = the dataset root": (
        lambda i, t: [
            *TRAIN,
            "--dataset",
            "tiny",
            "--root",
            f"{i}/data",
            "--checkpoint",
            f"{i}/data",
        ],
        "is the dataset root this command reads",
    ),
    "minibatch log inside the dataset": (
        lambda i, t: [
            *MINIBATCH,
            "--dataset",
            "tiny",
            "--root",
            f"{i}/data",
            "--log-json",
            f"{i}/data/tiny/raw/run.jsonl",
        ],
        "is inside the dataset directory this command reads",
    ),
    "minibatch log = the dataset": (
        lambda i, t: [
            *MINIBATCH,
            "--dataset",
            "tiny",
            "--root",
            f"{i}/data",
            "--log-json",
            f"{i}/data/tiny",
            "--force",
        ],
        "is the dataset directory this command reads",
    ),
}


@pytest.mark.parametrize("case", OVERLAPS)
def test_overlapping_outputs_are_refused_before_work(
    inputs: Path, tmp_path: Path, capsys, case: str
) -> None:
    argv, needle = OVERLAPS[case]
    before = tree(inputs, tmp_path)
    code, _, err = run_cli(argv(inputs, tmp_path), capsys)
    assert_one_line(code, err, needle)
    assert tree(inputs, tmp_path) == before


def _write(rel: str, data: bytes) -> Callable[[Path], None]:
    def make(tmp: Path) -> None:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)

    return make


_OUTPUTS = ["--log-json", "{t}/run.jsonl", "--checkpoint", "{t}/ck"]

#: case -> (puts someone else's file in the run's way, the command, what the one line says)
FOREIGN: dict[str, tuple[Callable[[Path], None], list[str], str]] = {
    "log: a user's text": (
        _write("run.jsonl", b"my notes\n"),
        [*TRAIN, "--synthetic", "tiny", *_OUTPUTS],
        "--log-json {t}/run.jsonl is not a training log written by fullgraph (line 1 is not",
    ),
    "log: other JSON lines": (
        _write("run.jsonl", b'{"step": 1, "loss": 0.5}\n'),
        [*TRAIN, "--synthetic", "tiny", *_OUTPUTS],
        "(line 1 is not an epoch record)",
    ),
    "log's config file": (
        _write("run.config.json", b'{"lr": 0.1}\n'),
        [*TRAIN, "--synthetic", "tiny", *_OUTPUTS],
        "is not a run's configuration written by fullgraph",
    ),
    "checkpoint.pt": (
        _write("ck/checkpoint.pt", b"PK\x03\x04 another program's weights"),
        [*TRAIN, "--synthetic", "tiny", *_OUTPUTS],
        "--checkpoint {t}/ck/checkpoint.pt is not a checkpoint written by fullgraph",
    ),
    "a rank's state file": (
        _write("ck/rank-0-epoch-3.pt", b"weights"),
        [*TRAIN, "--synthetic", "tiny", *_OUTPUTS],
        "rank-0-epoch-3.pt is not a checkpoint written by fullgraph",
    ),
    "the checkpoint's config.json": (
        _write("ck/config.json", b'{"experiment": "mine"}\n'),
        [*TRAIN, "--synthetic", "tiny", *_OUTPUTS],
        "--checkpoint {t}/ck/config.json is not a run's configuration written by fullgraph",
    ),
    "the checkpoint's .lock": (
        _write("ck/.lock", b"do not delete\n"),
        [*TRAIN, "--synthetic", "tiny", *_OUTPUTS],
        "--checkpoint {t}/ck/.lock is not a checkpoint lock written by fullgraph",
    ),
    "minibatch log": (
        _write("run.jsonl", b"my notes\n"),
        [*MINIBATCH, "--dataset", "tiny", "--root", "{i}/data", "--log-json", "{t}/run.jsonl"],
        "is not a training log written by fullgraph",
    ),
}


@pytest.mark.parametrize("force", [True, False])
@pytest.mark.parametrize("case", FOREIGN)
def test_files_fullgraph_did_not_write_are_never_replaced(
    inputs: Path, tmp_path: Path, capsys, case: str, force: bool
) -> None:
    make, argv, needle = FOREIGN[case]
    make(tmp_path)
    before = tree(inputs, tmp_path)
    argv = [a.format(t=tmp_path, i=inputs) for a in argv] + (["--force"] if force else [])
    code, _, err = run_cli(argv, capsys)
    assert_one_line(code, err, needle.format(t=tmp_path), "choose another", "remove it yourself")
    assert tree(inputs, tmp_path) == before


def test_resume_never_cuts_a_foreign_log(tmp_path: Path, capsys) -> None:
    ckpt, log = tmp_path / "ck", tmp_path / "run.jsonl"
    outputs = ["--synthetic", "tiny", "--checkpoint", str(ckpt), "--log-json", str(log)]
    code, _, err = run_cli([*TRAIN, *outputs], capsys)
    assert code == 0, err
    log.write_text("my notes\n")
    before = tree(tmp_path)
    code, _, err = run_cli([*TRAIN[:-1], "3", *outputs, "--resume"], capsys)
    assert_one_line(code, err, "is not a training log written by fullgraph")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("left", ["whole", "cut short", "empty"])
def test_force_replaces_a_runs_own_log_and_checkpoint(
    inputs: Path, tmp_path: Path, capsys, left: str
) -> None:
    ckpt, log = tmp_path / "ck", tmp_path / "run.jsonl"
    outputs = ["--synthetic", "tiny", "--checkpoint", str(ckpt), "--log-json", str(log)]
    code, _, err = run_cli([*TRAIN, *outputs], capsys)
    assert code == 0, err
    if left == "cut short":  # an interrupted run: the last record half written
        log.write_bytes(log.read_bytes()[:-30])
    elif left == "empty":  # a run that failed before its first epoch (a full disk)
        log.write_bytes(b"")
    code, _, err = run_cli([*TRAIN, *outputs, "--force"], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r.get("epoch") for r in records] == [1, 2, None] and records[-1]["final"]
    # minibatch replaces its own log too
    mini = [*MINIBATCH, "--dataset", "tiny", "--root", str(inputs / "data"), "--log-json"]
    code, _, err = run_cli([*mini, str(log), "--force"], capsys)
    assert code == 0, err
    assert json.loads(log.read_text().splitlines()[-1])["final"] is True
