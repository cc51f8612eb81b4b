"""A full disk, a rendezvous that answers wrong, a peer gone: one line each, nothing lost.

- a full disk while a checkpoint is written: ``PATH: no space left on device``, exit status 1,
  the earlier checkpoint whole and no temporary left; while the log is written: the same
  line naming the log, the records before kept, no empty log left; while a partition or a
  dataset directory is written: the target named, nothing left (:func:`fullgraph.atomic.
  atomic_dir`). The disk fills by a write that raises ``ENOSPC`` for the file concerned
  (portable); with root, once more on a real 64 KiB tmpfs.
- a ``MASTER_ADDR:MASTER_PORT`` where something else listens: one line naming the address,
  without torch's C++ stack trace;
- a peer on another host that stops answering is named with its host.

Enters through :mod:`fullgraph.run.outputs`.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mp_utils import one_thread

from fullgraph.atomic import atomic_dir
from fullgraph.cli import main as cli_main
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic import generate
from fullgraph.errors import OutputError
from fullgraph.run.checkpoint import read_checkpoint_file

TRAIN = ["train", "--threads", "1", "--quiet", "--memory-check", "off"]
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``--dataset tiny --root DIR`` of a generated graph."""
    root = tmp_path_factory.mktemp("full-disk-data")
    write_ogb(generate("tiny", seed=0), root, "tiny")
    return ["--dataset", "tiny", "--root", str(root)]


def _run(argv: list[str], capsys) -> tuple[int, str]:
    with one_thread():
        code = cli_main(argv)
    return code, capsys.readouterr().err


def _one_line(code: int, err: str, path: Path) -> None:
    assert code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{path}: no space left on device" in err, err


def test_a_full_disk_keeps_the_earlier_checkpoint(data, tmp_path: Path, capsys, monkeypatch):
    """The second checkpoint's write fails: the first stays, whole, and nothing else."""
    ck = tmp_path / "ck"
    real_fsync, writes = os.fsync, []

    def fsync(fd: int) -> None:
        if ".checkpoint.pt.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
            writes.append(fd)
            if len(writes) > 1:
                raise ENOSPC
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    args = [*TRAIN, *data, "--epochs", "3", "--checkpoint", str(ck), "--checkpoint-every", "1"]
    code, err = _run(args, capsys)
    _one_line(code, err, ck / "checkpoint.pt")
    assert "the file there before is unchanged" in err
    assert read_checkpoint_file(ck / "checkpoint.pt")["epoch"] == 1
    assert sorted(p.name for p in ck.iterdir()) == [".lock", "checkpoint.pt", "config.json"]


class _FullDiskFile:
    """A text file whose device holds ``room`` bytes: a flush beyond raises ``ENOSPC`` (the
    records that fit are on disk, the rest stays buffered, as Python's own file does)."""

    def __init__(self, real, room: int) -> None:
        self.real, self.room, self.pending = real, room, ""
        self.name, self.mode = real.name, real.mode

    def write(self, text: str) -> int:
        self.pending += text
        return len(text)

    def flush(self) -> None:
        if self.real.tell() + len(self.pending) > self.room:
            raise ENOSPC
        self.real.write(self.pending)
        self.real.flush()
        self.pending = ""

    def close(self) -> None:
        self.real.close()
        if self.pending:
            raise ENOSPC


@pytest.mark.parametrize("room", [0, 2000])
def test_a_full_disk_keeps_the_log_records_before(
    data, tmp_path: Path, capsys, monkeypatch, room: int
) -> None:
    import fullgraph.run.outputs as outputs

    monkeypatch.setattr(outputs, "open", lambda *a: _FullDiskFile(open(*a), room), raising=False)
    log = tmp_path / "run.jsonl"
    code, err = _run([*TRAIN, *data, "--epochs", "10", "--log-json", str(log)], capsys)
    _one_line(code, err, log)
    if room == 0:  # nothing was written: no empty log left
        assert not log.exists()
    else:
        lines = log.read_text().splitlines()
        assert 0 < len(lines) < 10 and all(line.startswith('{"epoch": ') for line in lines)


def test_a_full_disk_while_a_directory_is_written_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "parts"
    with pytest.raises(OutputError, match=f"{target}: no space left on device .nothing was"):
        with atomic_dir(target) as tmp:
            (tmp / "a.npy").write_bytes(b"x")
            raise ENOSPC
    assert list(tmp_path.iterdir()) == []
    target.mkdir()
    (target / "old").write_text("kept")
    with pytest.raises(OutputError, match="directory there before is unchanged"):
        with atomic_dir(target, force=True) as tmp:
            raise ENOSPC
    assert [p.name for p in tmp_path.iterdir()] == ["parts"] and (target / "old").is_file()


def _tmpfs(path: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True
    )
    return made.returncode == 0


def test_a_real_full_disk(data, tmp_path: Path, capsys) -> None:
    """The same on a 64 KiB tmpfs (root only): a checkpoint that cannot fit, then a log."""
    full = tmp_path / "full"
    if not _tmpfs(full):
        pytest.skip("needs root and a tmpfs mount")
    try:
        ck = ["--checkpoint", str(full / "ck"), "--hidden", "256"]  # > 64 KiB
        code, err = _run([*TRAIN, *data, "--epochs", "2", *ck], capsys)
        _one_line(code, err, full / "ck" / "checkpoint.pt")
        assert not (full / "ck").exists()  # this run made it: its lock and config.json go too
        (full / "filler").write_bytes(bytes(48 * 1024))  # room for the claim and the config
        log = full / "run.jsonl"
        code, err = _run([*TRAIN, *data, "--epochs", "30", "--log-json", str(log)], capsys)
        _one_line(code, err, log)
        assert not [p for p in full.iterdir() if p.name.startswith(".")]  # no temporaries
    finally:
        subprocess.run(["umount", str(full)], check=False)


@pytest.mark.timeout(120)
def test_a_wrong_rendezvous_address_is_one_line(small_partitions, tmp_path: Path) -> None:
    """Something that is not a store listens at MASTER_ADDR:MASTER_PORT: torch's C++ stack
    trace (logged before the exception) is not printed; our line names the address."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]

    held = []  # an HTTP server answers what it is sent and keeps the connection a while

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=answer, daemon=True).start()
    launch = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    env = {**os.environ, **launch, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env.pop("TORCH_CPP_LOG_LEVEL", None)
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "fullgraph.cli",
                *TRAIN,
                "--parts",
                str(small_partitions[2]),
                "--epochs",
                "1",
                "--timeout",
                "5",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=100,
            cwd=tmp_path,
        )
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert run.returncode == 4, run.stderr
    assert run.stderr.count("\n") == 1 and "frame #" not in run.stderr, run.stderr
    assert f"rendezvous 127.0.0.1:{port}" in run.stderr
    assert "not a torch.distributed store" in run.stderr


def test_an_unreachable_peer_on_another_host_is_named_with_it() -> None:
    from fullgraph.distributed.network import PeerProbe, describe_unreachable

    probes = [PeerProbe() for _ in range(3)]
    probes[2].host = "node7"
    probes[0].set_peers([p.endpoint for p in probes], 0)
    probes[1].close()
    probes[2].close()
    gone = probes[0].unreachable(timeout_s=2.0)
    text = describe_unreachable(gone, probes[0], 3, 0)
    assert "rank 1 (127.0.0.1: connection refused)" in text  # this host: not repeated
    assert "rank 2 (host node7, 127.0.0.1: connection refused)" in text
    probes[0].close()
