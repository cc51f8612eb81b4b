"""Rows to runnable cases: templates expanded, steps and checks resolved, the machine's
``needs`` applied."""

from __future__ import annotations

import os
import shutil
import signal

from . import checks, steps
from .commands import argv
from .records import Case, Row
from .tables import TABLES


def available(row: Row) -> bool:
    """Whether this machine has what ``row`` needs (``root``, or a program on the PATH)."""
    return all(
        os.geteuid() == 0 if need == "root" else shutil.which(need) is not None
        for need in row.needs
    )


def to_case(row: Row) -> Case:
    """The runnable case of ``row``."""
    send = row.signal
    return Case(
        row.name,
        [argv(row.cmd) for _ in range(row.copies)],
        expect=row.expect,
        setup=steps.setup(row.setup),
        protect=list(row.protect),
        signal=None if send is None else (signal.Signals[send.sig], send.at, send.to),
        follow=None if row.follow is None else argv(row.follow),
        check=checks.check(row.check),
        needle=row.needle,
        timeout=row.timeout,
        env=dict(row.env),
        signal_when=None if send is None else send.when,
        code=row.code,
        family=row.family,
    )


def rows() -> list[Row]:
    """Every row of every table that this machine can run, in the sweep's order."""
    out = [row for table in TABLES for row in table if available(row)]
    names = [row.name for row in out]
    if len(set(names)) != len(names):
        raise ValueError(f"case names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return out


def cases() -> list[Case]:
    """Every case of the sweep."""
    return [to_case(row) for row in rows()]
