"""The case record of the tables (``Row``, its signal ``Send``) and the runnable ``Case``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

#: A setup step or a check: a verb of ``steps.SETUP_STEPS`` / ``checks.CHECKS``, then its
#: arguments, e.g. ``("flip byte", "ck/checkpoint.pt")`` or ``("truncate", "p2/x.npy", 64)``.
Step = tuple[Any, ...]


@dataclass(frozen=True)
class Send:
    """A signal sent during the run.

    Attributes:
        sig: its name (``SIGKILL``, ``SIGTERM``, ``SIGINT``, ``SIGSTOP``).
        at: seconds after the start (or after ``when`` appears).
        to: ``main`` (the process started) or ``rank`` (its newest python descendant).
        when: a glob (relative to the case dir) whose first match starts the clock.
    """

    sig: str
    at: float
    to: str = "main"
    when: str | None = None


@dataclass(frozen=True)
class Row:
    """One case as data: a command template, its tampering, what should happen.

    Attributes:
        name: short label (unique; ``--only`` matches it).
        cmd: the command, a template (see ``commands.argv``): launchers ``fullgraph``,
            ``mpirun``, ``torchrun``, ``python``, placeholders ``{train}``, ``{minibatch}``,
            ``{tiny}``, ``{arxiv}`` and ``{w}`` (the case dir, filled in at run time).
        family: the table it belongs to (set by ``table``).
        expect: ``error`` (exit ``code``, default 2), ``diverge`` (exit 3), ``ok`` (exit 0),
            ``one-ok`` (of the concurrent copies exactly one succeeds, the others fail
            cleanly), ``signal`` (ended by ``signal``), ``fails`` (a user's script fails:
            non-zero, ``needle`` in its output, its own traceback allowed).
        code: the exit status an ``error`` case must end with (``None``: 2).
        needle: text the error line must contain.
        setup: steps that tamper with the case dir before the run.
        protect: paths (relative to the case dir) that must keep their content.
        signal: a signal sent during the run.
        follow: a command template run afterwards (e.g. the next run that must clean up).
        check: a check after everything (``checks.CHECKS``).
        timeout: seconds before the case counts as a hang.
        env: extra environment variables.
        copies: how many copies of ``cmd`` run at the same time (2 for races).
        needs: what the machine must have for the case to exist: ``root`` or a program.
    """

    name: str
    cmd: str
    family: str = ""
    expect: str = "error"
    code: int | None = None
    needle: str = ""
    setup: tuple[Step, ...] = ()
    protect: tuple[str, ...] = ()
    signal: Send | None = None
    follow: str | None = None
    check: Step | None = None
    timeout: float = 120.0
    env: dict[str, str] = field(default_factory=dict)
    copies: int = 1
    needs: tuple[str, ...] = ()


def table(family: str, *rows: Row) -> list[Row]:
    """The rows of one family, each stamped with ``family`` unless it already has one."""
    return [r if r.family else replace(r, family=family) for r in rows]


@dataclass
class Case:
    """One fault ready to run: a row with its commands expanded and its steps resolved.

    Attributes:
        name: short label.
        cmds: commands run at the same time (one, or two for races); ``{w}`` is the case dir.
        expect: as ``Row.expect``.
        setup: prepares the case dir before the run (tampering).
        protect: paths (relative to the case dir) that must keep their content.
        signal: ``(signum, seconds, target)``: send it that long after the start (or after
            ``signal_when`` appears) to the ``main`` process or to one ``rank`` (the newest
            python child).
        follow: a command run afterwards (e.g. the next run that must clean up).
        check: extra check after everything; returns a problem or ``None``.
        needle: text the error line must contain.
        timeout: seconds before the case counts as a hang.
        env: extra environment variables.
        signal_when: a glob (relative to the case dir) whose first match starts the signal's
            clock, so the signal lands while that output is being written.
        code: the exit status an ``error`` case must end with (default 2).
        family: the table the case comes from.
    """

    name: str
    cmds: list[list[str]]
    expect: str = "error"
    setup: Callable[[Path], None] | None = None
    protect: list[str] = field(default_factory=list)
    signal: tuple[int, float, str] | None = None
    follow: list[str] | None = None
    check: Callable[[Path], str | None] | None = None
    needle: str = ""
    timeout: float = 120.0
    env: dict[str, str] = field(default_factory=dict)
    signal_when: str | None = None
    code: int | None = None
    family: str = ""
