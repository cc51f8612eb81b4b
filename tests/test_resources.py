"""The process defaults reach the libraries that read them once, when they load."""

from __future__ import annotations

import os
import subprocess
import sys


def test_wait_policy_is_set_before_torch_loads() -> None:
    """``fullgraph`` sets ``OMP_WAIT_POLICY`` before torch (and its OpenMP) is imported.

    GNU OpenMP reads the variable when the library loads; set after ``import torch`` it changed
    nothing, and a one-process run's threads spun against a loaded machine.
    """
    probe = (
        "import builtins, os, sys\n"
        "seen = []\n"
        "real = builtins.__import__\n"
        "def hook(name, *a, **k):\n"
        "    if name == 'torch' and not seen:\n"
        "        seen.append(os.environ.get('OMP_WAIT_POLICY'))\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = hook\n"
        "from fullgraph.cli import main\n"
        "try:\n"
        "    main(['train', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('policy', seen)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "usage: fullgraph train" in out.stdout, out.stderr
    assert "policy ['PASSIVE']" in out.stdout, out.stdout[-300:]


def test_user_wait_policy_wins() -> None:
    """A policy the user set is kept."""
    from fullgraph.resources import process_defaults

    old = os.environ.get("OMP_WAIT_POLICY")
    os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    try:
        process_defaults()
        assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    finally:
        if old is None:
            del os.environ["OMP_WAIT_POLICY"]
        else:
            os.environ["OMP_WAIT_POLICY"] = old


def test_a_pyg_script_gets_the_command_lines_defaults() -> None:
    """``import fullgraph.pyg`` before torch sets what ``fullgraph`` sets before torch loads:
    the wait policy, huge pages and torch's C++ log level (c10d's warnings would bury the one
    line that names a failure)."""
    names = ("OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE", "TORCH_CPP_LOG_LEVEL")
    probe = f"import os\nfrom fullgraph import pyg\nprint([os.environ.get(n) for n in {names}])"
    env = {k: v for k, v in os.environ.items() if k not in names}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split("\n")[-2] == "['PASSIVE', '1', 'ERROR']", out.stdout
