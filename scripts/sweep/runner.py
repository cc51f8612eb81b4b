"""Runs one case in a copy of the workspace and classifies the outcome: ``clean``,
``unclear``, ``hang``, ``running``, ``silent``, ``debris`` or ``lost``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .commands import ENV
from .records import Case

#: The outcomes, in the order the counts are printed.
OUTCOMES = ("clean", "unclear", "hang", "running", "silent", "debris", "lost", "late")


def _digest(root: Path, rels: list[str]) -> dict[str, str]:
    out = {}
    for rel in rels:
        p = root / rel
        files = (
            [p]
            if p.is_file()
            else sorted(q for q in p.rglob("*") if q.is_file())
            if p.exists()
            else []
        )
        for q in files:
            if q.name == ".lock":
                continue
            out[str(q.relative_to(root))] = hashlib.sha256(q.read_bytes()).hexdigest()
    return out


def _newest_python_child(pid: int) -> int | None:
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return None
    kids = [int(k) for k in out.split()]
    found = []
    for k in kids:
        found += (
            [k]
            if "python" in Path(f"/proc/{k}/cmdline").read_bytes().decode(errors="replace")
            else []
        )
        grand = _newest_python_child(k)
        found += [grand] if grand else []
    return max(found) if found else None


def error_lines(stderr: str) -> list[str]:
    """Lines that count: argparse's usage block, warnings and MPI's own abort lines aside."""
    keep = []
    in_usage = False
    for line in stderr.splitlines():
        if not line.strip():
            continue
        if line.startswith("usage:"):
            in_usage = True
            continue
        if in_usage and line.startswith(" "):
            continue
        in_usage = False
        if line.startswith(
            ("Abort(", "MPICH", "[", "=", "YOUR APPLICATION", "This typically", "Please see")
        ):
            continue
        if "Warning" in line or ": warning: " in line or ": note: " in line:
            continue
        keep.append(line)
    return keep


def _left_running(w: Path, grace: float = 5.0) -> list[int]:
    """Processes still working in the case dir ``w`` ``grace`` seconds after its command ended
    (a rank its killed launcher left behind); they are killed."""
    deadline = time.monotonic() + grace
    while True:
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if Path(os.readlink(proc / "cwd")).is_relative_to(w):
                    pids.append(int(proc.name))
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (exists and is not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _send_signal(
    case: Case, sent: tuple[int, float, str], w: Path, procs: list[subprocess.Popen], t0: float
) -> bool:
    """Send ``sent`` (the case's signal) when its time (after ``signal_when``) has come;
    whether it reached a running process (``False``: the command had already ended, so the
    case measured nothing: outcome ``late``)."""
    signum, after, target = sent
    if case.signal_when:
        while not list(w.glob(case.signal_when)) and time.monotonic() - t0 < case.timeout:
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
    time.sleep(after)
    pid = procs[0].pid if target == "main" else _newest_python_child(procs[0].pid)
    if not pid or not _alive(pid):
        return False
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def classify_exits(
    case: Case, results: list[tuple[int, str, str]], seconds: float
) -> tuple[str, str]:
    """The outcome of the commands' ``(exit status, stdout, stderr)`` against the case's
    expectation (the run itself having ended, left nothing running and lost nothing)."""
    codes = [r[0] for r in results]
    if case.expect == "one-ok":
        ok = [r for r in results if r[0] == 0]
        bad = [r for r in results if r[0] != 0]
        if len(ok) != 1:
            return "silent" if len(ok) > 1 else "unclear", f"exit codes {codes}"
        lines = error_lines(bad[0][2])
        if len(lines) != 1 or "Traceback" in bad[0][2]:
            return "unclear", " | ".join(lines[:3])
        return "clean", f"{seconds:.1f} s: {lines[0][:150]}"
    code, _, err = results[0]
    lines = error_lines(err)
    if case.expect == "ok":
        return (
            ("clean", f"{seconds:.1f} s: exit 0")
            if code == 0
            else ("unclear", f"exit {code}: {' | '.join(lines[:2])}")
        )
    if case.expect == "signal":
        if code == 0:
            return "silent", "exit 0 after the signal"
        if "Traceback" in err:
            return "unclear", "traceback after the signal"
        return "clean", f"{seconds:.1f} s, exit {code}: {(lines or [''])[0][:150]}"
    if code == 0:
        return "silent", "exit 0"
    if case.expect == "fails":
        if case.needle not in err:
            return "unclear", f"exit {code}: no {case.needle!r}: {' | '.join(lines[-3:])[:300]}"
        return "clean", f"{seconds:.1f} s, exit {code}: {lines[-1][:150]}"
    want = case.code if case.code is not None else 3 if case.expect == "diverge" else 2
    if "Traceback" in err or len(lines) != 1 or code != want or case.needle not in lines[0]:
        return "unclear", f"exit {code}: {' | '.join(lines[:3])[:300]}"
    return "clean", f"{seconds:.1f} s: {lines[0][:150]}"


def _default_signals() -> None:
    """In the child before it runs: SIGINT and SIGQUIT at their defaults. A sweep started in
    the background of a shell (``... &``) ignores them, and an ignored signal stays ignored
    across ``exec``, so its cases' SIGINT would never arrive (a false hang)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def run_case(case: Case, base: Path, work: Path) -> tuple[str, str]:
    """Run ``case`` in a fresh copy of ``base``; return ``(outcome, detail)``."""
    w = work / case.name.replace(" ", "_").replace("/", "_")
    shutil.rmtree(w, ignore_errors=True)
    shutil.copytree(base, w, symlinks=True, ignore=shutil.ignore_patterns("big"))
    (w / "big").symlink_to(base / "big")
    env = {**ENV, **case.env}
    if case.setup:
        case.setup(w)
    protected = _digest(w, case.protect)
    cmds = [[a.replace("{w}", str(w)) for a in c] for c in case.cmds]
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            c,
            cwd=w,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_default_signals,
        )
        for c in cmds
    ]
    delivered = _send_signal(case, case.signal, w, procs, t0) if case.signal else True
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, case.timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            return "hang", f"no end within {case.timeout:g} s"
        results.append((proc.returncode, out, err))
    seconds = time.monotonic() - t0
    if not delivered:
        _left_running(w)
        return "late", "the signal found the command already ended: nothing measured (rerun)"
    left = _left_running(w)
    if left:
        return "running", f"{len(left)} process(es) still running in the case dir after the end"
    if case.follow:
        try:
            subprocess.run(case.follow, cwd=w, env=env, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return "hang", "the follow-up run did not end within 300 s"
    if _digest(w, case.protect) != protected:
        return "lost", f"a protected file changed ({', '.join(case.protect)})"
    debris = [str(p.relative_to(w)) for p in w.rglob(".*.tmp-*")] + [
        str(p.relative_to(w)) for p in w.rglob(".*.old-*")
    ]
    if debris:
        return "debris", ", ".join(debris[:3])
    if case.check:
        problem = case.check(w)
        if problem:
            return "lost" if "not whole" in problem or "wrote" in problem else "debris", problem
    return classify_exits(case, results, seconds)
