"""The process watchdog: SIGTERM honoured in native code, start-up bounded, a dead launcher noticed.

Python runs signal handlers on the main thread only, between bytecodes: a rank blocked in native
code (``MPI_Init`` waiting for a peer, a large allocation, a long matrix product) does not
honour SIGTERM, and a wait without a timeout of its own (``MPI_Init`` again) never ends. One
daemon thread per process (:class:`Watchdog`; the command line installs it before the heavy
imports, ``fullgraph.pyg.load_part`` when it creates the communicator) covers what the main
thread cannot:

- SIGTERM: the C-level handler also writes the signal's number to a pipe
  (:func:`signal.set_wakeup_fd`) that the thread reads. When the main thread has not run the
  Python handler within :data:`TERM_GRACE_S` (it is in native code), the thread prints the line
  the main thread would have printed and ends the process with status 143.
- start-up phases (:func:`phase`): each has a deadline, ``--timeout`` (beyond it by
  :data:`SETUP_GRACE_S` where the waits inside have timeouts of their own). A phase that
  outlasts it ends the rank with one line naming the phase and what this node shows of the
  other ranks (stopped, exited, not running: :meth:`fullgraph.distributed.launch.LaunchInfo.
  rank_processes`), exit status 4, through ``MPI_Abort`` once MPI is up so that every
  rank ends (before it is up, the job's stopped ranks on this node are killed: no other signal
  reaches them). Rank 0 says when a phase is still running after :data:`NOTICE_AFTER_S`.
- the launcher: under ``mpirun`` (the rank's parent is hydra's proxy), ``torchrun`` (the
  agent) or ``srun`` (slurmstepd), a rank whose parent changes was re-parented to init or a
  subreaper because its launcher died: the thread ends it within :data:`POLL_S`. A process
  that no launcher started (launched from a shell) is never ended this way.

The thread runs Python, so it needs the GIL: native code that holds the GIL while it waits
blocks it too. mpi4py's ``MPI_Init`` does, hence :func:`fullgraph.distributed.mpi.init_mpi`.

The watchdog is process-wide state (signal handlers and the parent are the process's), so this
module keeps the one installed (:func:`current`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

#: Seconds the main thread has to run the SIGTERM handler before the watchdog ends the process.
TERM_GRACE_S = 2.0

#: Seconds a process whose main thread did run the SIGTERM handler has to finish its clean-up.
TERM_LIMIT_S = 6.0

#: Seconds between the watchdog's checks (launcher, deadlines).
POLL_S = 0.25

#: Seconds beyond ``--timeout`` for a phase whose waits have timeouts of their own (they end
#: it first, with a more precise line; the gloo set-up's own watchdog allows 10 s).
SETUP_GRACE_S = 15.0

#: Seconds after which rank 0 says that a start-up phase is still running (then every minute).
NOTICE_AFTER_S = 20.0
NOTICE_EVERY_S = 60.0

#: The start-up phase of ``MPI_Init`` (:func:`fullgraph.distributed.mpi.init_mpi`).
MPI_INIT_PHASE = "MPI initialisation"

#: Exit status of a rank ended for a phase past its deadline or a dead launcher
#: (:class:`~fullgraph.errors.PeerUnreachable`'s).
EXIT_UNREACHABLE = 4

#: Seconds the line has to reach the launcher before ``MPI_Abort`` tears the job down, and the
#: most the watchdog waits for ``MPI_Abort`` before it ends the process itself.
FLUSH_GRACE_S = 0.5
ABORT_WAIT_S = 3.0
#: The most a rank's forked helper waits for the launcher to reap the rank before it ends the
#: job's stopped ranks (:meth:`Watchdog._end_stopped_peers`).
REAPED_WAIT_S = 60.0
#: Then the most it waits for the launcher to end those ranks itself (hydra does, at once on a
#: quiet node; a kill first would make their signal the job's status).
PEERS_END_WAIT_S = 10.0


class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``kill``, ``timeout`` and Slurm send) turned into an exception.

    It derives from :class:`KeyboardInterrupt` so that every clean-up that runs on Ctrl-C
    (temporary directories, partial files) runs on SIGTERM too.
    """


class Launch(Protocol):
    """What the watchdog reads of the rank's launch: a
    :class:`~fullgraph.distributed.launch.LaunchInfo` (not imported: it lives above the ground
    floor)."""

    @property
    def rank(self) -> int:
        """Global rank."""

    @property
    def size(self) -> int:
        """Ranks in the job."""

    @property
    def local_size(self) -> int:
        """Ranks on this node."""

    @property
    def launcher(self) -> str:
        """``mpich``, ``openmpi``, ``slurm``, ``torchrun`` or ``none``."""

    def rank_processes(self, parent: int) -> dict[int, tuple[int, str]]:
        """The other ranks' processes on this node: rank -> (pid, state)."""


#: A SIGTERM handler as ``signal.signal`` returns it (a function, ``SIG_DFL`` / ``SIG_IGN``,
#: or ``None`` for one not installed from Python).
SignalHandler = Callable[[int, FrameType | None], object] | int | None


@dataclass(eq=False)
class _Phase:
    what: str
    started: float
    deadline: float | None
    limit_s: float | None
    noticed: float


class Watchdog:
    """The daemon thread of this process (see the module docstring).

    Args:
        label: prefix of its lines (``fullgraph train``, ``fullgraph.pyg``).
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.info: Launch | None = None  # once attached
        self.timeout_s: float | None = None
        self.notices = False
        self._pid = os.getpid()
        self._parent = os.getppid()
        self._watch_parent = False
        self._phases: list[_Phase] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pipe: tuple[int, int] | None = None
        self._previous_fd = -1
        self._previous_handler: SignalHandler = None
        self._signals = False
        self._term_at: float | None = None
        self._term_handled = False
        self._thread: threading.Thread | None = None

    # -- set-up ------------------------------------------------------------------------------
    def install(self, signals: bool = True) -> Watchdog:
        """Start the thread; with ``signals``, own SIGTERM (raise :class:`Terminated` in the
        main thread, and end the process if the main thread does not). Only the main thread
        can install signal handlers: elsewhere ``signals`` is ignored.

        Returns:
            ``self``.
        """
        global _ACTIVE
        if signals and threading.current_thread() is threading.main_thread():
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            self._pipe = (r, w)
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            self._signals = True
        self._thread = threading.Thread(target=self._run, name="fullgraph-watchdog", daemon=True)
        self._thread.start()
        _ACTIVE = self
        return self

    def uninstall(self) -> None:
        """Stop the thread and give SIGTERM back to its previous handler (for in-process
        callers such as tests; a command's process simply exits)."""
        global _ACTIVE
        self._stop.set()
        if self._signals:
            signal.set_wakeup_fd(self._previous_fd)
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._signals = False
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.write(self._pipe[1], b"\0")  # wakes the thread's select
        if self._thread is not None and self._thread.is_alive():  # SIGTERM may beat its start
            self._thread.join(2 * POLL_S + 1.0)
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        if _ACTIVE is self:
            _ACTIVE = None

    def attach(self, info: Launch, timeout_s: float | None, notices: bool = False) -> None:
        """Tell the watchdog where this process sits in the job once that is known.

        Args:
            info: the :class:`~fullgraph.distributed.launch.LaunchInfo`; a launcher other than
                ``none`` turns on the launcher watch.
            timeout_s: ``--timeout``, the deadline of every start-up phase (with several ranks).
            notices: whether rank 0 says that a phase is still running.
        """
        self.info, self.timeout_s, self.notices = info, timeout_s, notices
        self._watch_parent = info.launcher != "none"

    @property
    def terminated(self) -> bool:
        """Whether SIGTERM reached this process's handler (native code an exception crossed on
        its way, such as numpy's C start-up during an import, may have turned the
        :class:`Terminated` into another error)."""
        return self._term_handled

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self._term_handled = True
        if os.getpid() != self._pid:  # a forked child: the default action
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        raise Terminated()

    # -- phases ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, what: str, limit_s: float | None = None) -> Iterator[None]:
        """Run the body as start-up phase ``what`` with a deadline.

        Args:
            what: the phase as a noun phrase (``MPI initialisation``, ``part loading``).
            limit_s: its deadline in seconds; by default ``--timeout`` plus
                :data:`SETUP_GRACE_S` with several ranks, none for one.
        """
        if limit_s is None and self.timeout_s is not None and self._size() > 1:
            limit_s = self.timeout_s + SETUP_GRACE_S
        now = time.monotonic()
        entry = _Phase(what, now, None if limit_s is None else now + limit_s, limit_s, now)
        with self._lock:
            self._phases.append(entry)
        try:
            yield
        finally:
            with self._lock:
                self._phases.remove(entry)

    def in_phase(self, what: str) -> bool:
        """Whether start-up phase ``what`` is running."""
        with self._lock:
            return any(entry.what == what for entry in self._phases)

    def _size(self) -> int:
        return int(self.info.size) if self.info is not None else 1

    def _rank_prefix(self) -> str:
        return f"rank {self.info.rank}: " if self.info is not None and self._size() > 1 else ""

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if self._pipe is not None:
                ready, _, _ = select.select([self._pipe[0]], [], [], POLL_S)
                if ready:
                    with contextlib.suppress(BlockingIOError, OSError):
                        received = os.read(self._pipe[0], 512)
                        if signal.SIGTERM in received and self._term_at is None:
                            self._term_at = time.monotonic()
            else:
                self._stop.wait(POLL_S)
            if not self._stop.is_set() and os.getpid() == self._pid:
                self._check(time.monotonic())

    def _check(self, now: float) -> None:
        if self._term_at is not None:
            limit = TERM_LIMIT_S if self._term_handled else TERM_GRACE_S
            if now - self._term_at > limit:
                if not self._term_handled:
                    rank = self._rank_prefix().replace(": ", " ")
                    self._say(f"{self.label}: {rank}terminated (SIGTERM)")
                self._end(128 + signal.SIGTERM, abort=not self._term_handled)
        if self._watch_parent and os.getppid() != self._parent:
            self._say(
                f"{self.label}: error: {self._rank_prefix()}the launcher that started this "
                f"rank ({self.info.launcher}, pid {self._parent}) is gone; ending the rank"
            )
            self._end(EXIT_UNREACHABLE, abort=False)
        with self._lock:
            phases = list(self._phases)
        for late in phases:
            if late.deadline is not None and now > late.deadline:
                self._say(
                    f"{self.label}: error: {self._rank_prefix()}{late.what} did not finish "
                    f"within {late.limit_s:g} s; {self.peers()}"
                )
                if not _mpi_active():
                    self._end_stopped_peers()
                self._end(EXIT_UNREACHABLE, abort=True)
        if not phases:
            return
        current = phases[-1]
        rank0 = self.info is not None and self.info.rank == 0
        if self.notices and rank0 and now - current.noticed >= NOTICE_AFTER_S:
            current.noticed = now + NOTICE_EVERY_S - NOTICE_AFTER_S
            elapsed = now - current.started
            self._say(f"{self.label}: {current.what} still running after {elapsed:.0f} s", fd=1)

    def peers(self, only_notable: bool = False) -> str:
        """What this node shows of the job's other ranks: those stopped, exited or not running
        (``rank 1 (pid 4817) is stopped``); with ``only_notable``, ``""`` when nothing is."""
        info = self.info
        if info is None or info.size == 1:
            return "" if only_notable else "no other rank"
        found = info.rank_processes(self._parent)
        notes = []
        for rank in range(info.size):
            if rank == info.rank:
                continue
            if rank in found:
                pid, state = found[rank]
                if state in ("T", "t"):
                    notes.append(f"rank {rank} (pid {pid}) is stopped")
                elif state in ("Z", "X"):
                    notes.append(f"rank {rank} (pid {pid}) has exited")
            elif info.local_size >= info.size:  # every rank is on this node
                notes.append(f"rank {rank} is not running (it exited or never started)")
        if notes or only_notable:
            return ", ".join(notes)
        if info.local_size < info.size:
            return "the ranks on this node are running; one on another node may be missing"
        return "every other rank is running (one may be stalled)"

    def _end_stopped_peers(self) -> None:
        """Kill this job's ranks on this node that are still stopped once the launcher has
        reaped this process and has not ended them itself: before MPI is up no ``MPI_Abort``
        reaches them and a stopped process acts on no signal but SIGKILL, so a launcher that
        did not kill them would wait for ever. A forked process does it (holding none of the
        job's pipes), after waiting for those states rather than for a fixed time, so that
        this rank's exit status is the job's: hydra ORs the statuses it recorded, and a
        SIGKILL from us before its own clean-up made a loaded CI run end with 9, not 4."""
        info = self.info
        if info is None or info.size == 1:
            return

        def stopped() -> list[int]:
            found = info.rank_processes(self._parent).values()
            return [pid for pid, state in found if state in ("T", "t")]

        if not stopped():
            return
        rank_pid = os.getpid()
        if os.fork() != 0:
            return
        try:  # the child: its parent, this rank, is about to exit
            os.closerange(0, 1 << 16)
            os.setsid()
            # Wait for the state, not a time: the launcher has reaped this rank (its status is
            # the job's), then has had a moment to end the stopped ranks itself (hydra does).
            _wait_for(lambda: not os.path.exists(f"/proc/{rank_pid}"), REAPED_WAIT_S)
            _wait_for(lambda: not stopped(), PEERS_END_WAIT_S)
            for pid in stopped():  # still the launcher's children, still stopped
                os.kill(pid, signal.SIGKILL)
        finally:
            os._exit(0)

    def _say(self, line: str, fd: int = 2) -> None:
        """One line on stderr (or ``fd``) in a single write, taking no lock the main thread
        may hold (``sys.stderr``'s would)."""
        with contextlib.suppress(OSError):
            os.write(fd, (line + "\n").encode())

    def _end(self, code: int, abort: bool) -> None:
        """End the process: with ``abort`` through ``MPI_Abort`` when MPI is up (every rank
        ends), else (or when that does not return soon) with ``os._exit``."""
        if abort and _mpi_active():
            mpi = sys.modules["mpi4py.MPI"]
            time.sleep(FLUSH_GRACE_S)
            threading.Thread(target=mpi.COMM_WORLD.Abort, args=(code,), daemon=True).start()
            time.sleep(ABORT_WAIT_S)
        if code == 128 + signal.SIGTERM and max(self._size(), launched_ranks()) > 1:
            end_by_sigterm()  # MPI not up (or its abort did not return): the launcher ends it
        os._exit(code)


#: The variables that give the size of the job a launcher started this process in (MPICH
#: and ``srun --mpi=pmi2``, Open MPI, torchrun; ``srun``'s own when in a job step), as
#: :mod:`fullgraph.distributed.launch` reads them.
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE")


def launched_ranks() -> int:
    """The number of ranks of the job this process was launched in, read from the launcher's
    environment without importing anything (SIGTERM may land while torch imports); 1 without
    a launcher or for a value that is not a number."""
    names = SIZE_VARIABLES + (("SLURM_NTASKS",) if "SLURM_STEP_ID" in os.environ else ())
    sizes = [os.environ.get(name, "") for name in names]
    return max([int(v) for v in sizes if v.strip().isdigit()], default=1)


def end_by_sigterm() -> None:
    """End this process by SIGTERM itself (its default action), after stderr is flushed.

    For a rank of a job of several that took SIGTERM and could not end the job through MPI:
    MPICH's hydra ends a job at once when one of its ranks dies of a signal, but when a rank
    exits with a status before MPI is initialised, the other ranks wait in MPI initialisation
    up to ``--timeout``. Returns only if the signal is not delivered within a second.
    """
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        else:  # the watchdog's thread: Python sets handlers in the main thread only, C anywhere
            ctypes.CDLL(None).signal(signal.SIGTERM, 0)  # 0: SIG_DFL
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception:  # the caller's exit must still run
        return
    time.sleep(1.0)


def _wait_for(done: Callable[[], bool], limit_s: float) -> None:
    """Poll ``done`` every 20 ms until it holds or ``limit_s`` seconds have passed."""
    deadline = time.monotonic() + limit_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)


def _mpi_active() -> bool:
    """Whether mpi4py is loaded and MPI initialised and not finalised in this process (not
    asked of MPI while its initialisation runs: the answer is no, and the call may wait for
    the initialisation's lock)."""
    mpi = sys.modules.get("mpi4py.MPI")
    watchdog = _ACTIVE
    if mpi is None or (watchdog is not None and watchdog.in_phase(MPI_INIT_PHASE)):
        return False
    try:
        return bool(mpi.Is_initialized() and not mpi.Is_finalized())
    except Exception:  # the watchdog must not die here
        return False


#: The watchdog installed in this process, if any.
_ACTIVE: Watchdog | None = None


def current() -> Watchdog | None:
    """The watchdog installed in this process, if any."""
    return _ACTIVE


@contextlib.contextmanager
def phase(what: str, limit_s: float | None = None) -> Iterator[None]:
    """:meth:`Watchdog.phase` of the installed watchdog; nothing without one."""
    watchdog = _ACTIVE
    if watchdog is None:
        yield
        return
    with watchdog.phase(what, limit_s):
        yield


def peers_note() -> str:
    """``"; rank 1 (pid 4817) is stopped"`` when this node shows a rank of the job stopped,
    exited or not running; ``""`` otherwise or without a watchdog."""
    watchdog = _ACTIVE
    if watchdog is None:
        return ""
    try:
        note = watchdog.peers(only_notable=True)
    except OSError:
        return ""
    return f"; {note}" if note else ""


def _after_fork_in_child() -> None:
    """A forked child keeps neither the thread nor a claim on the parent's wakeup pipe."""
    watchdog = _ACTIVE
    if watchdog is not None and watchdog._signals:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)


os.register_at_fork(after_in_child=_after_fork_in_child)
