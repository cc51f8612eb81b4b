"""The command line run in this process, and the shape of its one-line errors, for the tests
of what ``fullgraph COMMAND`` prints (one thread, as the tests run)."""

from __future__ import annotations

import pytest
from mp_utils import one_thread

from fullgraph.cli import main as cli_main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``fullgraph ARGV`` in this process, one thread: ``(exit status, stdout, stderr)``."""
    with one_thread():
        code = cli_main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(code: int, err: str, *needles: str, prefix: str = "fullgraph ") -> None:
    """``err`` is one line starting with ``prefix`` and holding every needle, no traceback,
    and the status is 2 (bad input)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(prefix), (prefix, lines[0])
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
