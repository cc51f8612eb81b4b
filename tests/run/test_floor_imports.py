"""The per-rank floor's mechanisms: what a training rank imports, and the libraries' pages its
start-up drops (docs/scale.md, "the floor").

Enters through :mod:`fullgraph.run.rank_start`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from mp_utils import threads_restored

import fullgraph.run.rank_start as rank_start
from fullgraph.resources import LIBRARY_PAGES_ENV, clean_library_mappings

#: Modules a training rank no longer imports (``partition/rcm.py`` imports csgraph in its
#: function): scipy.sparse.csgraph brings scipy.sparse.linalg with it.
LAZY = ("scipy.sparse.csgraph", "scipy.sparse.linalg")


def _run(code: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_training_rank_does_not_import_the_lazy_modules() -> None:
    """The modules ``fullgraph train`` imports on a rank (its parser, the command, the trainer,
    the memory plan, the rank start-up, the part loader) leave :data:`LAZY` out."""
    code = (
        "import sys\n"
        "from fullgraph.cli import build_parser\n"
        "build_parser(['train'])\n"
        "import fullgraph.commands.train, fullgraph.training.trainer, fullgraph.memory.plan\n"
        "import fullgraph.run.rank_start, fullgraph.partition.load, fullgraph.partition.whole\n"
        f"print(sorted(m for m in {LAZY!r} if m in sys.modules))\n"
        "import scipy.sparse.csgraph\n"  # the same check sees them once they are imported
        f"print(sorted(m for m in {LAZY!r} if m in sys.modules))\n"
    )
    lines = _run(code).splitlines()
    assert lines[-2] == "[]"
    assert lines[-1] == str(sorted(LAZY))


_SMAPS = """\
7f0000000000-7f0000001000 r--p 00000000 fd:01 11 /lib/libgood.so.6
Rss:                   4 kB
Anonymous:             0 kB
7f0000001000-7f0000003000 r-xp 00001000 fd:01 11 /lib/libgood.so.6
Size:                  8 kB
Rss:                   8 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
7f0000003000-7f0000004000 r--p 00003000 fd:01 11 /lib/libgood.so.6
Rss:                   4 kB
Anonymous:             4 kB
7f0000004000-7f0000005000 rw-p 00004000 fd:01 11 /lib/libgood.so.6
Rss:                   4 kB
Anonymous:             0 kB
7f0000005000-7f0000006000 r--s 00000000 fd:01 12 /dev/shm/mpich_shm.so
Rss:                   4 kB
Anonymous:             0 kB
7f0000006000-7f0000007000 r-xp 00000000 fd:01 13 /tmp/gone.so (deleted)
Rss:                   4 kB
Anonymous:             0 kB
7f0000007000-7f0000008000 r--p 00000000 fd:01 14 /parts/part-0/x.npy
Rss:                   4 kB
Anonymous:             0 kB
7f0000008000-7f0000009000 rw-p 00000000 00:00 0
Rss:                   4 kB
Anonymous:             4 kB
7f0000009000-7f000000a000 r-xp 00000000 fd:01 15 /site/_umath.cpython-311-x86_64-linux-gnu.so
Rss:                   0 kB
Anonymous:             0 kB
7f000000a000-7f000000c000 r-xp 00000000 fd:01 16 /site/_last.cpython-311-x86_64-linux-gnu.so
Rss:                   8 kB
Anonymous:             0 kB
"""


def test_only_clean_private_read_only_library_pages_are_chosen() -> None:
    """Chosen: a library's read-only and code maps with no page written. Left: a relocated
    (copied-on-write) one, writable, shared, deleted, data files, anonymous, nothing resident."""
    base = 0x7F0000000000
    assert clean_library_mappings(_SMAPS) == [
        (base, base + 0x1000, 4),
        (base + 0x1000, base + 0x3000, 8),
        (base + 0xA000, base + 0xC000, 8),
    ]
    assert clean_library_mappings("") == []


def test_the_process_runs_on_after_its_library_pages_go() -> None:
    """torch, numpy and a freshly compiled numba function work after the drop, with the
    same results; the file-backed resident set shrank."""
    code = (
        "import numba, numpy as np, torch\n"
        "from fullgraph.resources import drop_library_pages\n"
        "def file_kib():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('RssFile:'):\n"
        "            return int(line.split()[1])\n"
        "x = torch.arange(12.0).reshape(3, 4)\n"
        "before = (x @ x.T).sum().item(), float(np.linalg.norm(np.arange(5.0)))\n"
        "resident = file_kib()\n"
        "dropped = drop_library_pages()\n"
        "after_drop = file_kib()\n"
        "f = numba.njit(lambda a: a.sum() * 2)\n"
        "after = (x @ x.T).sum().item(), float(np.linalg.norm(np.arange(5.0)))\n"
        "print(dropped > 0, after_drop < resident, before == after, f(np.arange(4)) == 12)\n"
    )
    assert _run(code).split() == ["True"] * 4


def test_start_rank_drops_the_start_ups_library_pages(monkeypatch) -> None:
    """The rank start-up drops the pages once the communicator is up (MPI's libraries in)."""
    import fullgraph.resources
    from fullgraph.distributed import detect_launch

    calls: list[Any] = []
    monkeypatch.setattr(fullgraph.resources, "drop_library_pages", lambda: calls.append(1) or 0.0)
    with threads_restored():
        comm, _ = rank_start.start_rank("fullgraph test", detect_launch(), "local", 5.0, 1)
    comm.close()
    assert calls == [1]


@pytest.mark.parametrize("value", ["", "anything"])
def test_only_keep_turns_the_drop_off(monkeypatch, value: str) -> None:
    from fullgraph.resources import drop_library_pages

    monkeypatch.setenv(LIBRARY_PAGES_ENV, value)
    assert drop_library_pages() > 0.0  # this process's libraries: some pages are resident
    monkeypatch.setenv(LIBRARY_PAGES_ENV, "keep")
    assert drop_library_pages() == 0.0


def test_a_rank_command_loads_numba_then_torch_each_dropped_before_the_next() -> None:
    """``fullgraph train`` (a rank command) imports numba, drops, then torch, drops, before
    its parser is built; ``fullgraph data`` does neither."""
    code = (
        "import sys\n"
        "import fullgraph.resources as resources\n"
        "seen = []\n"
        "resources.drop_library_pages = lambda: seen.append(\n"
        "    [m for m in ('numba', 'torch') if m in sys.modules]) or 0.0\n"
        "from fullgraph.cli import main\n"
        "try:\n"
        "    main([sys.argv[1], '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('calls', seen[:2])\n"
    )
    for command, calls in (("train", [["numba"], ["numba", "torch"]]), ("data", [])):
        out = subprocess.run(
            [sys.executable, "-c", code, command], capture_output=True, text=True, timeout=120
        )
        assert f"usage: fullgraph {command}" in out.stdout, out.stderr
        assert out.stdout.splitlines()[-1] == f"calls {calls}"
