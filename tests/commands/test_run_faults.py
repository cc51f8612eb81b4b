"""Faults and bad input of ``fullgraph train`` and ``fullgraph minibatch``, one test per class.

Every case must end clean: one line naming the problem, exit status 2 for bad input (3 for a
diverged run), nothing overwritten, nothing left behind. Classes:

- numeric options out of range or not finite, refused before any work;
- outputs holding an earlier run's result (checkpoint, log) refused unless ``--force`` /
  ``--resume``, and a checkpoint directory in use by another run;
- outputs of the wrong kind or in places that cannot be written;
- corrupted or unusable checkpoints on ``--resume``;
- a non-finite loss: training stops, the last good checkpoint is kept;
- debris: temporaries of killed writers removed, SIGTERM cleaned up like SIGINT;
- errors every rank raises alike are printed once, by rank 0 (through ``mpirun``);
- signals, stopped ranks and dead launchers, in training and during start-up: SIGTERM gives its
  line and status 143 within seconds, a rank stopped before MPI initialisation is named once
  ``--timeout`` has passed, ``kill -9`` of torchrun or of hydra's proxy ends every rank. These
  tests wait for a state (a rank process, its SIGTERM handler, an epoch in the log), never for
  a fixed time, so that a loaded machine does not change what they test.

Enters through :mod:`fullgraph.commands.train` and :mod:`fullgraph.commands.minibatch`.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mp_utils import (
    gone,
    handles_sigterm,
    lines_of,
    mpi_command,
    one_thread,
    parent_of,
    rank_pids,
    run_mpi,
    wait_until,
)

from fullgraph.cli import main as cli_main
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic import generate
from fullgraph.run.checkpoint import CheckpointDir, read_checkpoint_file

TRAIN = ["train", "--synthetic", "tiny", "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults-data")
    write_ogb(generate("tiny", seed=0), root, "tiny")
    return root


def _tree(path: Path) -> dict[str, str]:
    """Every file under ``path`` (hidden ones too) with its sha256: to prove nothing changed."""
    if not path.exists():
        return {}
    files = [p for p in sorted(path.rglob("*")) if p.is_file()] if path.is_dir() else [path]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _one_error_line(err: str, code: int, got: int, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == code, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("fullgraph "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _cli(args: list[str], capsys) -> tuple[int, str]:
    with one_thread():
        code = cli_main(args)
    return code, capsys.readouterr().err


BAD_OPTIONS = [
    ("--lr", "nan"),
    ("--lr", "inf"),
    ("--lr", "0"),
    ("--lr", "-0.001"),
    ("--weight-decay", "nan"),
    ("--weight-decay", "-5"),
    ("--dropout", "1"),
    ("--dropout", "-0.1"),
    ("--input-dropout", "nan"),
    ("--timeout", "nan"),
    ("--timeout", "0"),
    ("--timeout", "-3"),
    ("--timeout", "inf"),
    ("--epochs", "0"),
    ("--seed", "-1"),
]


@pytest.mark.parametrize("command", ["train", "minibatch"])
@pytest.mark.parametrize(("option", "value"), BAD_OPTIONS)
def test_numeric_options_out_of_range_are_refused_before_work(
    command: str, option: str, value: str, tiny_root: Path, tmp_path: Path, capsys
) -> None:
    log = tmp_path / "run.jsonl"
    source = ["--synthetic", "tiny"] if command == "train" else ["--dataset", "tiny"]
    source += [] if command == "train" else ["--root", str(tiny_root)]
    code, err = _cli([command, *source, f"{option}={value}", "--log-json", str(log)], capsys)
    _one_error_line(err, 2, code, option, value)
    assert list(tmp_path.iterdir()) == []  # no log, no config file


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--threads", "0"], "--threads"),
        (["--exchange-buffer-mb", "nan"], "--exchange-buffer-mb"),
        (["--hidden", "0"], "--hidden"),
        (["--checkpoint-every", "0"], "--checkpoint-every"),
        (["--resume", "--force", "--checkpoint", "x"], "give one"),
    ],
)
def test_train_only_options_are_refused(args: list[str], needle: str, capsys) -> None:
    code, err = _cli([*TRAIN, *args], capsys)
    _one_error_line(err, 2, code, needle)


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--batch-size", "0"], "--batch-size"), (["--fanouts", "5,-2"], "fanouts")],
)
def test_minibatch_only_options_are_refused(
    args: list[str], needle: str, tiny_root: Path, capsys
) -> None:
    code, err = _cli(["minibatch", "--dataset", "tiny", "--root", str(tiny_root), *args], capsys)
    _one_error_line(err, 2, code, needle)


def test_outputs_of_an_earlier_run_are_kept(tiny_root: Path, tmp_path: Path, capsys) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    outputs = ["--checkpoint", str(ckpt), "--log-json", str(log)]
    code, err = _cli([*TRAIN, "--epochs", "3", *outputs], capsys)
    assert code == 0, err
    before = {**_tree(ckpt), **_tree(log), **_tree(tmp_path / "run.config.json")}
    assert read_checkpoint_file(ckpt / "checkpoint.pt")["epoch"] == 3

    # a fresh run on the same checkpoint or log: refused, nothing touched
    code, err = _cli([*TRAIN, "--epochs", "2", "--checkpoint", str(ckpt)], capsys)
    _one_error_line(err, 2, code, "holds the checkpoint of epoch 3", "--resume", "--force")
    code, err = _cli([*TRAIN, "--epochs", "2", "--log-json", str(log)], capsys)
    _one_error_line(err, 2, code, "already exists", "--force")
    mini_log = ["--log-json", str(log), "--epochs", "1"]
    code, err = _cli(
        ["minibatch", "--dataset", "tiny", "--root", str(tiny_root), *mini_log], capsys
    )
    _one_error_line(err, 2, code, "already exists")
    # --resume with nothing left to train: refused
    code, err = _cli([*TRAIN, "--epochs", "2", *outputs, "--resume"], capsys)
    _one_error_line(err, 2, code, "at epoch 3", "--epochs 2")
    after = {**_tree(ckpt), **_tree(log), **_tree(tmp_path / "run.config.json")}
    assert after == before

    # another run holding the directory: refused at once
    holder = CheckpointDir(ckpt, 0, resume=True)
    holder.open()
    try:
        code, err = _cli([*TRAIN, "--epochs", "5", *outputs, "--resume"], capsys)
        _one_error_line(err, 2, code, "in use by another run", f"pid {os.getpid()}")
    finally:
        holder.close()
    assert {**_tree(ckpt), **_tree(log), **_tree(tmp_path / "run.config.json")} == before

    # --resume continues; --force starts over
    code, err = _cli([*TRAIN, "--epochs", "5", *outputs, "--resume"], capsys)
    assert code == 0, err
    assert [json.loads(s).get("epoch") for s in log.read_text().splitlines()] == [
        *range(1, 6),
        None,
    ]
    code, err = _cli([*TRAIN, "--epochs", "2", *outputs, "--force"], capsys)
    assert code == 0, err
    assert read_checkpoint_file(ckpt / "checkpoint.pt")["epoch"] == 2
    assert len(log.read_text().splitlines()) == 3


def test_a_checkpoint_replaced_meanwhile_is_not_overwritten(tmp_path: Path) -> None:
    ckpt = CheckpointDir(tmp_path / "ckpt", 0)
    ckpt.open()
    ckpt.save({"epoch": 1})
    other = CheckpointDir(tmp_path / "ckpt", 1)  # not rank 0: no lock, like a foreign writer
    from fullgraph.atomic import atomic_write_bytes
    from fullgraph.run.checkpoint import encode_checkpoint

    atomic_write_bytes(other.file, encode_checkpoint({"epoch": 7}))
    with pytest.raises(Exception, match="was replaced by someone else"):
        ckpt.save({"epoch": 2})
    ckpt.close()
    assert read_checkpoint_file(other.file)["epoch"] == 7


@pytest.mark.parametrize(
    ("path", "kind", "needle"),
    [
        ("dir", "log", "is a directory"),
        ("file/run.jsonl", "log", "is a file, not a directory"),
        ("/proc/fullgraph-test/run.jsonl", "log", "cannot write there"),
        ("file/ckpt", "checkpoint", "is a file, not a directory"),
        ("file", "checkpoint", "is a file; give a directory"),
        ("/proc/fullgraph-test/ckpt", "checkpoint", "cannot write there"),
    ],
)
def test_outputs_that_cannot_be_written_are_refused_before_work(
    path: str, kind: str, needle: str, tmp_path: Path, capsys
) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("a regular file\n")
    before = _tree(tmp_path)
    target = path if path.startswith("/") else str(tmp_path / path)
    option = "--log-json" if kind == "log" else "--checkpoint"
    code, err = _cli([*TRAIN, "--epochs", "2", option, target], capsys)
    _one_error_line(err, 2, code, option, needle)
    assert _tree(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # inside the archive
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("tamper", "needle"),
    [
        (_flip_last_byte, "fails its sha256 checksum"),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "not a fullgraph checkpoint"),
        (lambda p: p.write_bytes(b"PK\x03\x04 not ours"), "not a fullgraph checkpoint"),
        (lambda p: p.unlink(), "no checkpoint at"),
    ],
)
def test_corrupted_checkpoints_are_refused_on_resume(
    tamper, needle: str, tmp_path: Path, capsys
) -> None:
    ckpt = tmp_path / "ckpt"
    code, err = _cli([*TRAIN, "--epochs", "2", "--checkpoint", str(ckpt)], capsys)
    assert code == 0, err
    tamper(ckpt / "checkpoint.pt")
    before = _tree(ckpt)
    code, err = _cli([*TRAIN, "--epochs", "4", "--checkpoint", str(ckpt), "--resume"], capsys)
    _one_error_line(err, 2, code, needle)
    assert _tree(ckpt) == before


def test_a_non_finite_loss_stops_training_and_keeps_the_checkpoint(tmp_path: Path, capsys) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    args = [*TRAIN, "--epochs", "20", "--lr", "1e30", "--checkpoint", str(ckpt)]
    code, err = _cli([*args, "--checkpoint-every", "1", "--log-json", str(log)], capsys)
    _one_error_line(err, 3, code, "the loss is nan", "stopped before the update")
    epoch = read_checkpoint_file(ckpt / "checkpoint.pt")["epoch"]
    logged = [json.loads(s) for s in log.read_text().splitlines()]
    assert 1 <= epoch == logged[-1]["epoch"] < 20  # the last good epoch, checkpointed
    state = read_checkpoint_file(ckpt / "checkpoint.pt")
    assert all(bool(v.isfinite().all()) for v in state["model"].values())


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path, capsys) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    host = socket.gethostname()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    pid = int(dead.stdout)
    stale = ckpt / f".checkpoint.pt.tmp-{pid}-0badcafe@{host}"
    stale.write_bytes(b"half a checkpoint")
    foreign = ckpt / f".checkpoint.pt.tmp-{pid}-0badcafe@another-host"
    foreign.write_bytes(b"someone else's")
    code, err = _cli([*TRAIN, "--epochs", "1", "--checkpoint", str(ckpt)], capsys)
    assert code == 0, err
    assert not stale.exists() and foreign.exists()


@pytest.mark.timeout(120)
def test_sigterm_ends_training_cleanly(tmp_path: Path) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    cmd = [sys.executable, "-m", "fullgraph.cli", *TRAIN, "--epochs", "100000"]
    cmd += ["--checkpoint", str(ckpt), "--checkpoint-every", "1", "--log-json", str(log)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    # training, with a checkpoint written: two epochs logged (each checkpointed before the next)
    wait_until(lambda: len(lines_of(log)) >= 2 or proc.poll() is not None, 90, "two epochs")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "fullgraph train: terminated (SIGTERM)", err
    assert not [p for p in tmp_path.rglob(".*tmp-*")]
    assert read_checkpoint_file(ckpt / "checkpoint.pt")["epoch"] >= 1


@pytest.mark.timeout(120)
def test_sigterm_during_start_up_prints_the_line(tmp_path: Path) -> None:
    """SIGTERM as soon as the process has its handler (it is still importing torch): the same
    line and status as in training, within seconds."""
    log = tmp_path / "run.jsonl"
    cmd = [sys.executable, "-m", "fullgraph.cli", *TRAIN, "--epochs", "100000", "--log-json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*cmd, str(log)], stderr=subprocess.PIPE, text=True, env=env)
    wait_until(lambda: handles_sigterm(proc.pid) or proc.poll() is not None, 60, "the handler")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert time.monotonic() - t0 < 10, err
    assert err.splitlines() == ["fullgraph train: terminated (SIGTERM)"], err
    assert not log.exists()  # it was starting: nothing written


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_errors_every_rank_raises_are_printed_once(small_partitions, tmp_path: Path) -> None:
    parts = str(small_partitions[2])
    train = ["-m", "fullgraph.cli", "train", "--parts", parts, "--quiet"]
    proc = run_mpi(2, [*train, "--lr", "nan"], 60, expect_ok=False)
    _one_error_line(proc.stderr, 2, proc.returncode, "--lr must be a finite number")
    ckpt = tmp_path / "ckpt"
    run_mpi(2, [*train, "--epochs", "2", "--checkpoint", str(ckpt)], 90)
    proc = run_mpi(2, [*train, "--epochs", "2", "--checkpoint", str(ckpt)], 60, expect_ok=False)
    _one_error_line(proc.stderr, 2, proc.returncode, "holds the checkpoint of epoch 2")
    proc = run_mpi(2, [*train, "--epochs", "30", "--lr", "1e30"], 90, expect_ok=False)
    _one_error_line(proc.stderr, 3, proc.returncode, "the loss is nan")


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_signalled_rank_ends_the_whole_job(signum: int, small_partitions, tmp_path) -> None:
    """SIGTERM (handled, like Ctrl-C) or SIGKILL on one rank: every rank ends, none hangs."""
    log = tmp_path / "run.jsonl"
    args = ["-m", "fullgraph.cli", "train", "--parts", str(small_partitions[2]), "--quiet"]
    cmd = mpi_command(2, [*args, "--epochs", "1000000", "--log-json", str(log)])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    ranks = rank_pids(proc.pid, 2)
    wait_until(lambda: lines_of(log) or proc.poll() is not None, 120, "the first epoch")
    os.kill(ranks[1], signum)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and time.monotonic() - t0 < 30, err
    assert "Traceback" not in err, err
    if signum == signal.SIGTERM:
        assert "rank 1 terminated (SIGTERM); ending every rank" in err, err
    wait_until(lambda: all(gone(p) for p in ranks.values()), 10, "every rank to end")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_on_one_rank_during_start_up_ends_the_job(small_partitions) -> None:
    """SIGTERM on rank 1 as soon as it has its handler (still importing torch, MPI not up, so
    no MPI_Abort can end the job): rank 1 prints its line and dies of the signal, and the
    launcher ends rank 0, which would otherwise wait in MPI initialisation up to --timeout."""
    cmd = mpi_command(2, ["-m", "fullgraph.cli", *_train_job(small_partitions[2])])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    ranks = rank_pids(proc.pid, 2)
    try:
        wait_until(lambda: handles_sigterm(ranks[1]) or proc.poll() is not None, 60, "handler")
        os.kill(ranks[1], signal.SIGTERM)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        for pid in [proc.pid, *ranks.values()]:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode != 0 and time.monotonic() - t0 < 30, err
    assert "fullgraph train: terminated (SIGTERM)" in err and "Traceback" not in err, err
    wait_until(lambda: all(gone(p) for p in ranks.values()), 10, "every rank to end")


def _train_job(parts: Path, *options: str) -> list[str]:
    return ["train", "--parts", str(parts), "--quiet", "--epochs", "1000000", *options]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("then", ["wait", "sigterm"])
def test_a_rank_stopped_during_start_up_is_named(then: str, small_partitions) -> None:
    """Rank 1 stopped as soon as it exists (it is still starting Python): rank 0, waiting in
    MPI initialisation (native code that no timeout of MPI's bounds), ends once --timeout has
    passed with one line naming the phase and rank 1; SIGTERM ends it within seconds there."""
    timeout = 10
    cmd = mpi_command(2, ["-m", "fullgraph.cli", *_train_job(small_partitions[2])])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [*cmd, "--timeout", str(timeout)], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        ranks = rank_pids(proc.pid, 2)
        os.kill(ranks[1], signal.SIGSTOP)
        t0 = time.monotonic()
        if then == "sigterm":  # once rank 0 has loaded MPI, it is initialising it
            maps = Path(f"/proc/{ranks[0]}/maps")
            wait_until(lambda: gone(ranks[0]) or "libmpi" in maps.read_text(), 120, "MPI")
            os.kill(ranks[0], signal.SIGTERM)
            t0 = time.monotonic()
            wait_until(lambda: gone(ranks[0]), 10, "rank 0 to honour SIGTERM")
        else:
            wait_until(lambda: gone(ranks[0]), timeout + 60, "rank 0 to end")
            assert time.monotonic() - t0 >= timeout
    finally:
        if not gone(ranks[1]):
            os.kill(ranks[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    if then == "sigterm":
        assert "terminated (SIGTERM)" in err, err
    else:
        expected = (
            f"fullgraph train: error: rank 0: MPI initialisation did not finish within "
            f"{timeout} s; rank 1 (pid {ranks[1]}) is stopped"
        )
        assert expected in err.splitlines(), err
    assert "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_ranks_end_when_their_launcher_is_killed(launcher: str, small_partitions, tmp_path) -> None:
    """``kill -9`` of torchrun (the ranks' parent), or of the hydra proxy that mpirun started
    the ranks under: every rank ends within --timeout (the watchdog sees its parent change)."""
    log, timeout = tmp_path / "run.jsonl", 10
    args = _train_job(small_partitions[2], "--timeout", str(timeout), "--log-json", str(log))
    if launcher == "torchrun":
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "fullgraph.cli",
            *args,
        ]
    else:
        cmd = mpi_command(2, ["-m", "fullgraph.cli", *args])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    ranks = rank_pids(proc.pid, 2)
    try:
        wait_until(lambda: lines_of(log) or proc.poll() is not None, 120, "the first epoch")
        assert proc.poll() is None, proc.communicate()[1]
        launcher_pid = proc.pid if launcher == "torchrun" else parent_of(ranks[0])
        assert launcher_pid is not None
        os.kill(launcher_pid, signal.SIGKILL)
        wait_until(lambda: all(gone(p) for p in ranks.values()), timeout, "the ranks to end")
    finally:
        for pid in ranks.values():
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=60)
    if launcher == "torchrun":  # (under mpirun the ranks' output went through the proxy)
        assert f"the launcher that started this rank (torchrun, pid {proc.pid}) is gone" in err
