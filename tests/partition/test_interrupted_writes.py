"""Writers interrupted or raced end clean: `partition`, `data synth` and the OGB cache.

- SIGTERM while writing: the command exits 143 with one line and leaves no temporary directory.
- SIGKILL while writing: the temporary directory stays (nothing can run), and the next run to
  the same output removes it (its writer is dead) and succeeds.
- Two runs to one output without ``--force``: the one that finishes second is refused at the
  final rename with one line, prints no success, and the first one's output stays as it is.

The subprocesses run the real command line (``fullgraph.cli.main``, with its SIGTERM handler)
with one write step slowed down by a sleep, so that the signal lands deterministically while
the temporary directory exists rather than depending on the machine's speed.

Enters through :mod:`fullgraph.partition.build`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import fullgraph.datasets.ogb_writer as ogb_writer
import fullgraph.partition.build as build
from fullgraph.cli import main
from fullgraph.datasets.synthetic import write_ogb

#: Runs ``fullgraph.cli.main(argv[5:])`` with ``argv[1].argv[2]`` sleeping ``argv[3]`` s first;
#: on entering the sleep it creates the file ``argv[4]`` (so the signal lands in the sleep, not
#: in whatever else the command does first, e.g. a first-time numba compilation).
SLOWED = """
import importlib, pathlib, sys, time
module, name, pause, marker = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
mod = importlib.import_module(module)
real = getattr(mod, name)
def slowed(*args, **kwargs):
    pathlib.Path(marker).touch()
    time.sleep(pause)
    return real(*args, **kwargs)
setattr(mod, name, slowed)
from fullgraph.cli import main
sys.exit(main(sys.argv[5:]))
"""

#: writer -> (module and function slowed, command, the directory written relative to tmp)
WRITERS = {
    "partition": ("fullgraph.partition.build", "save_array", "parts"),
    "synth": ("fullgraph.datasets.ogb_writer", "_write_columns", "data/synth_x"),
    "cache": ("fullgraph.datasets.ogb", "atomic_write_json", "data/disk/processed/sym"),
}


@pytest.fixture(scope="module")
def data_root(make_graph, tmp_path_factory) -> Path:
    """A dataset root holding a 600-node graph in OGB layout as ``disk`` (read-only)."""
    root = tmp_path_factory.mktemp("interrupted") / "data"
    write_ogb(make_graph(name="disk"), root, "disk")
    return root


def argv_for(writer: str, tmp: Path) -> list[str]:
    data = str(tmp / "data")
    if writer == "partition":
        out = ["--out", str(tmp / "parts"), "--method", "random"]
        return ["partition", "--dataset", "disk", "--root", data, "--parts", "3", *out]
    if writer == "synth":
        return ["data", "synth", "--name", "synth-x", "--root", data, "--seed", "3"]
    return ["data", "info", "--dataset", "disk", "--root", data]


def temporaries(target: Path) -> list[Path]:
    """The temporary siblings ``.NAME.tmp-*`` of ``target``."""
    if not target.parent.is_dir():
        return []
    return sorted(target.parent.glob(f".{target.name}.tmp-*"))


def start_and_signal(writer: str, tmp: Path, signum: int) -> subprocess.CompletedProcess:
    """Start the slowed command, wait for its temporary directory, send ``signum``."""
    module, name, rel = WRITERS[writer]
    target = tmp / rel
    marker = tmp / "slowed-call-entered"
    cmd = [sys.executable, "-c", SLOWED, module, name, "60", str(marker), *argv_for(writer, tmp)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (temporaries(target) and marker.exists()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no temporary, or no slowed call"
            time.sleep(0.02)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def copy_data(data_root: Path, tmp: Path) -> None:
    """The shared dataset root copied into ``tmp/data`` (the cache test writes into it)."""
    import shutil

    shutil.copytree(data_root, tmp / "data")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_sigterm_leaves_no_temporary(data_root: Path, tmp_path: Path, writer: str) -> None:
    copy_data(data_root, tmp_path)
    done = start_and_signal(writer, tmp_path, signal.SIGTERM)
    command = "data" if writer != "partition" else "partition"
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"fullgraph {command}: terminated (SIGTERM)"
    assert "Traceback" not in done.stderr and "wrote" not in done.stdout
    target = tmp_path / WRITERS[writer][2]
    assert temporaries(target) == [] and not target.exists()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_sigkill_debris_removed_by_next_run(
    data_root: Path, tmp_path: Path, capsys, writer: str
) -> None:
    copy_data(data_root, tmp_path)
    done = start_and_signal(writer, tmp_path, signal.SIGKILL)
    assert done.returncode == -signal.SIGKILL
    target = tmp_path / WRITERS[writer][2]
    debris = temporaries(target)
    assert len(debris) == 1 and not target.exists()  # nothing could clean up after SIGKILL
    assert main(argv_for(writer, tmp_path)) == 0, capsys.readouterr().err
    assert not debris[0].exists() and temporaries(target) == []
    assert target.is_dir()


def _appear(target: Path, real: Callable) -> Callable:
    """``real``, but the first call first creates ``target`` as another run would."""

    def wrapped(*args, **kwargs):
        if not target.exists():
            target.mkdir(parents=True)
            (target / "meta.json").write_text('{"written by": "the other run"}\n')
        return real(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("writer", ["partition", "synth"])
def test_output_appearing_meanwhile_is_not_replaced(
    data_root: Path, tmp_path: Path, monkeypatch, capsys, writer: str
) -> None:
    """Two runs to one output without --force: the second to finish is refused, one line."""
    copy_data(data_root, tmp_path)
    target = tmp_path / WRITERS[writer][2]
    module, name = (
        (build, "save_array") if writer == "partition" else (ogb_writer, "_write_columns")
    )
    monkeypatch.setattr(module, name, _appear(target, getattr(module, name)))
    assert main(argv_for(writer, tmp_path)) == 2
    captured = capsys.readouterr()
    command = "data" if writer == "synth" else "partition"
    assert captured.err.startswith(f"fullgraph {command}: error: ")
    assert captured.err.count("\n") == 1 and "appeared while this run was writing" in captured.err
    assert "wrote" not in captured.out and "partitioned" not in captured.out
    assert [p.name for p in target.iterdir()] == ["meta.json"]
    assert (target / "meta.json").read_text() == '{"written by": "the other run"}\n'
    assert temporaries(target) == []


def test_partition_report_printed_on_success(data_root: Path, tmp_path: Path, capsys) -> None:
    """The same command without the race succeeds and prints the report (control case)."""
    copy_data(data_root, tmp_path)
    assert main(argv_for("partition", tmp_path)) == 0
    out = capsys.readouterr().out
    assert "partitioned disk" in out and "wrote" in out
    assert (tmp_path / "parts" / "meta.json").is_file()
    assert temporaries(tmp_path / "parts") == []
