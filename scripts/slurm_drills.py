"""Slurm drills on one machine: srun and sbatch start the ranks of fullgraph, measured.

A 2-node Slurm cluster of ``scripts/slurm-cluster.sh`` (slurmctld in the root namespace, one
slurmd in each node's network namespace), a tiny synthetic graph, and:

- ``exact``: 2 nodes x 2 ranks of ``fullgraph train`` under ``srun --mpi=pmi2`` (MPI, the
  mpich wheel) and plain ``srun`` (``--mpi=none``: gloo, meeting on the first node at a port
  derived from the job id), against one process and against ``mpirun`` (hydra over
  ``netns-exec.sh``) on the same parts; ``fullgraph minibatch`` the same (without mpirun);
- ``scancel``: the sbatch template (``examples/fullgraph.sbatch``) trains with checkpoints;
  ``scancel`` once the log shows a third of the epochs; seconds until every rank has ended, the
  checkpoint's epoch; the same job submitted again resumes: its losses against one process;
- ``requeue``: the same with ``scontrol requeue``: the job runs again by itself and resumes;
- ``dead-node``: ``srun`` training; node 2's slurmd killed (``kill -9``) mid-run: exit status,
  the lines that name the node, seconds until srun ends and until the last rank (the ones on
  the dead node too) has ended; the cluster is restarted afterwards;
- ``bad-input``: srun with 3 tasks for 4 parts; a partition on node 1's local scratch (not
  visible on node 2), by srun and by the template; an unreachable controller (slurmctld
  stopped): exit status, lines, seconds, and that nothing was written.

Usage (root; installs Debian's Slurm and munge when missing)::

    python scripts/slurm_drills.py [--prefix fgs] [--work DIR] [--epochs 20]
        [--long-epochs 400] [--timeout 20] [--drills exact,scancel,requeue,dead-node,bad-input]
        [--keep]

Exit status 1 when a drill misses: a loss more than 1e-4 (relative) from one process, a rank
alive later than ``--timeout`` + 30 s after scancel or the node's death, an unreadable
checkpoint, a resume that is not exact, an exit status 0 where the job failed, a bad input
without its line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLURM_SH = REPO / "scripts" / "slurm-cluster.sh"
LAUNCH_SH = REPO / "scripts" / "netns-launch.sh"
TEMPLATE = REPO / "examples" / "fullgraph.sbatch"
BIN = Path(sys.executable).parent
STATE = Path(os.environ.get("SLURM_CLUSTER_STATE", "/run/slurm-cluster"))
NETNS_STATE = Path(os.environ.get("NETNS_CLUSTER_STATE", "/run/netns-cluster"))
DRILLS = ("exact", "scancel", "requeue", "dead-node", "bad-input")
TOLERANCE = 1e-4
GRACE_S = 30.0


class Cluster:
    """The Slurm cluster of one prefix: commands with its ``SLURM_CONF`` and the venv first."""

    def __init__(self, prefix: str, subnet: str, port: int) -> None:
        self.prefix, self.subnet, self.port = prefix, subnet, port
        self.env = {
            **os.environ,
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
            "SLURM_CONF": str(STATE / prefix / "slurm.conf"),
        }

    def script(self, *args: str) -> subprocess.CompletedProcess:
        """``slurm-cluster.sh ARGS --prefix P`` (``up`` also gets the subnet and port)."""
        extra = ["--subnet", self.subnet, "--port", str(self.port)] if args[0] == "up" else []
        cmd = ["bash", str(SLURM_SH), *args, "--prefix", self.prefix, *extra]
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env)

    def run(self, cmd: list[str], timeout: float = 300, **kw: object) -> tuple[int, str, float]:
        """Run ``cmd``; (exit status, stdout + stderr, seconds)."""
        start = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout, **kw)  # type: ignore[call-overload]
        return r.returncode, r.stdout + r.stderr, time.monotonic() - start

    def node(self, i: int) -> str:
        """Name of node ``i`` (1-based)."""
        return f"{self.prefix}{i}"

    def pid_of(self, what: str) -> int:
        """The pid in a pid file of the cluster's state (``slurmctld``, ``slurmd-NODE``)."""
        return int((STATE / self.prefix / "run" / f"{what}.pid").read_text().strip())

    def job_state(self, job: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (empty once the controller forgot the job)."""
        r = subprocess.run(
            ["scontrol", "-o", "show", "job", job], capture_output=True, text=True, env=self.env
        )
        return dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)

    def wait_idle(self, limit: float = 90) -> None:
        """Wait until both nodes are idle (a finished job's nodes complete first)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            r = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, env=self.env
            )
            if r.stdout.split() == ["idle", "idle"]:
                return
            time.sleep(0.5)
        raise RuntimeError(f"nodes not idle after {limit:g} s: {r.stdout.split()}")


def losses(log: Path) -> list[float]:
    """Per-epoch losses of a JSON-lines log (a resumed run's epochs replace the earlier ones)."""
    by_epoch: dict[int, float] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if "epoch" in row and "loss" in row:
                by_epoch[int(row["epoch"])] = float(row["loss"])
    return [by_epoch[e] for e in sorted(by_epoch)]


def rel_diff(got: list[float], ref: list[float]) -> float:
    """Largest relative difference (inf when the lengths differ)."""
    if len(got) != len(ref) or not ref:
        return float("inf")
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, ref, strict=True))


def launch_of(log: Path) -> str:
    """``launcher/pmi, local_size, threads`` of a run, from its resolved config."""
    cfg = json.loads(log.with_name(log.stem + ".config.json").read_text())
    la = cfg["launch"]
    return (
        f"{la['launcher']}{'/' + la['pmi'] if la.get('pmi') else ''}, {la['size']} ranks, "
        f"{la['local_size']} per node, {cfg.get('threads_per_rank')} thread(s)"
    )


def processes_naming(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (this script excepted)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                out.append(int(p.name))
        except OSError:
            continue
    return out


def wait_pids_gone(pids: list[int], limit: float) -> float:
    """Seconds until none of ``pids`` runs (inf after ``limit``)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if not any(Path(f"/proc/{p}").exists() for p in pids):
            return time.monotonic() - start
        time.sleep(0.1)
    return float("inf")


def wait_for_epoch(log: Path, epoch: int, limit: float) -> bool:
    """Wait until ``log`` shows ``epoch`` epochs."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if len(losses(log)) >= epoch:
                return True
        except (json.JSONDecodeError, OSError):
            pass
        time.sleep(0.2)
    return False


def checkpoint_epoch(ck: Path) -> int | str:
    """The epoch ``ck/checkpoint.pt`` names, or why it cannot be read."""
    from fullgraph.run.checkpoint import read_checkpoint_file

    try:
        return int(read_checkpoint_file(ck / "checkpoint.pt")["epoch"])
    except Exception as exc:  # any failure is the finding
        return f"unreadable: {exc}"


def error_lines(text: str) -> list[str]:
    """The lines worth reporting: errors and srun's notes, without MPICH's error stacks."""
    keep = re.compile(r"error|Error|terminated|Abort\(|CANCELLED|failure|unreachable")
    return [ln for ln in text.splitlines() if keep.search(ln) and not ln.startswith(" ")]


class Drills:
    """The drills and their results (``failures`` lists what missed a requirement)."""

    def __init__(self, cluster: Cluster, work: Path, args: argparse.Namespace) -> None:
        self.c, self.work, self.a = cluster, work, args
        self.failures: list[str] = []
        self.fg = str(BIN / "fullgraph")

    def check(self, ok: bool, what: str) -> None:
        """Record a requirement; print its outcome."""
        print(f"    {'ok  ' if ok else 'MISS'} {what}")
        if not ok:
            self.failures.append(what)

    # -- data ---------------------------------------------------------------------------------
    def data(self) -> None:
        """The tiny graph, its 1- and 4-part partitions, and the one-process references."""
        w = self.work
        for cmd in (
            [
                self.fg,
                "data",
                "synth",
                "--preset",
                "tiny",
                "--name",
                "tiny",
                "--root",
                str(w / "data"),
                "--seed",
                "0",
                "--force",
            ],
            [
                self.fg,
                "partition",
                "--dataset",
                "tiny",
                "--root",
                str(w / "data"),
                "--parts",
                "1",
                "--out",
                str(w / "p1"),
                "--force",
            ],
            [
                self.fg,
                "partition",
                "--dataset",
                "tiny",
                "--root",
                str(w / "data"),
                "--parts",
                "4",
                "--out",
                str(w / "p4"),
                "--force",
            ],
        ):
            rc, out, _ = self.c.run(cmd)
            if rc != 0:
                raise RuntimeError(f"{' '.join(cmd[:3])} failed: {out[-500:]}")

    def train(self, epochs: int, log: Path, parts: str | Path = "p4") -> list[str]:
        """``fullgraph train`` arguments (``parts`` relative to the run directory)."""
        return [
            self.fg,
            "train",
            "--parts",
            str(self.work / parts),
            "--epochs",
            str(epochs),
            "--quiet",
            "--timeout",
            str(self.a.timeout),
            "--force",
            "--log-json",
            str(log),
        ]

    def minibatch(self, log: Path) -> list[str]:
        """``fullgraph minibatch`` arguments (2 epochs, fan-outs 5,3)."""
        return [
            self.fg,
            "minibatch",
            "--dataset",
            "tiny",
            "--root",
            str(self.work / "data"),
            "--epochs",
            "2",
            "--fanouts",
            "5,3",
            "--batch-size",
            "128",
            "--quiet",
            "--timeout",
            str(self.a.timeout),
            "--force",
            "--log-json",
            str(log),
        ]

    def srun(self, mpi: str, argv: list[str]) -> list[str]:
        """``srun -N 2 --ntasks-per-node 2 --mpi=MPI ARGV``."""
        return ["srun", "-N", "2", "--ntasks-per-node", "2", f"--mpi={mpi}", *argv]

    # -- drills -------------------------------------------------------------------------------
    def exact(self) -> None:
        """srun (MPI and gloo) against one process and mpirun: train and minibatch."""
        w, e = self.work, self.a.epochs
        print(f"exact: 2 nodes x 2 ranks, train {e} epochs and minibatch 2 epochs, tiny graph")
        runs = {
            "one": [*self.train(e, w / "one.jsonl", "p1"), "--threads", "1"],
            "mpirun": [
                str(LAUNCH_SH),
                "mpirun",
                "--prefix",
                self.c.prefix,
                "-n",
                "4",
                "--",
                *self.train(e, w / "mpirun.jsonl"),
                "--transport",
                "mpi",
            ],
            "srun-pmi2": self.srun("pmi2", self.train(e, w / "srun-pmi2.jsonl")),
            "srun-none": self.srun("none", self.train(e, w / "srun-none.jsonl")),
            "mb-one": [*self.minibatch(w / "mb-one.jsonl"), "--threads", "1"],
            "mb-mpirun": [
                str(LAUNCH_SH),
                "mpirun",
                "--prefix",
                self.c.prefix,
                "-n",
                "4",
                "--",
                *self.minibatch(w / "mb-mpirun.jsonl"),
                "--transport",
                "mpi",
            ],
            "mb-srun-pmi2": self.srun("pmi2", self.minibatch(w / "mb-srun-pmi2.jsonl")),
            "mb-srun-none": self.srun("none", self.minibatch(w / "mb-srun-none.jsonl")),
        }
        for name, cmd in runs.items():
            rc, out, secs = self.c.run(cmd)
            shown = " ".join(cmd).replace(str(BIN) + "/", "").replace(str(w) + "/", "")
            print(f"  {name}: {shown}\n    exit {rc}, {secs:.1f} s")
            self.check(rc == 0, f"{name} exits 0" + ("" if rc == 0 else f": {out[-800:]}"))
        for kind in ("", "mb-"):
            one, mpirun = losses(w / f"{kind}one.jsonl"), losses(w / f"{kind}mpirun.jsonl")
            for name in (f"{kind}mpirun", f"{kind}srun-pmi2", f"{kind}srun-none"):
                got = losses(w / f"{name}.jsonl")
                d = rel_diff(got, one)
                also = "" if name.endswith("mpirun") else f", to mpirun {rel_diff(got, mpirun):.1e}"
                print(
                    f"  {name}: {len(got)} epochs, largest relative loss difference to one "
                    f"process {d:.1e}{also}; {launch_of(w / f'{name}.jsonl')}"
                )
                self.check(d <= TOLERANCE, f"{name} within {TOLERANCE:g} of one process")

    def _sbatch(self, run_dir: Path, extra: dict[str, str], output: Path | None = None) -> str:
        """Submit the template for ``run_dir``; the job id."""
        env = {
            "FG_DATASET": "tiny",
            "FG_ROOT": str(self.work / "data"),
            "FG_WORK": str(run_dir),
            "FG_EPOCHS": str(self.a.long_epochs),
            "FG_CHECKPOINT_EVERY": "10",
            "FG_TIMEOUT": str(self.a.timeout),
            "FG_MPI": "pmi2",
            **extra,
        }
        out = output or run_dir
        out.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            ["sbatch", "--parsable", f"--output={out}/job-%j.out", str(TEMPLATE)],
            capture_output=True,
            text=True,
            env={**self.c.env, **env},
            cwd=self.work,
        )
        if r.returncode != 0:
            raise RuntimeError(f"sbatch failed: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def _wait_job_gone(self, job: str, limit: float) -> float:
        """Seconds until the job has left squeue (or finished)."""
        start = time.monotonic()
        while time.monotonic() - start < limit:
            state = self.c.job_state(job).get("JobState", "")
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED"):
                return time.monotonic() - start
            time.sleep(0.2)
        return float("inf")

    def _reference(self, epochs: int) -> list[float]:
        log = self.work / f"one-{epochs}.jsonl"
        if not log.exists():
            self.c.run([*self.train(epochs, log, "p1"), "--threads", "1"])
        return losses(log)

    def scancel(self, how: str) -> None:
        """scancel (then resubmit) or scontrol requeue of the template's job mid-run."""
        n = self.a.long_epochs
        run_dir = self.work / f"job-{how}"
        print(
            f"{how}: the sbatch template, {n} epochs, checkpoints every 10, --timeout "
            f"{self.a.timeout}; {how} at epoch {n // 3}"
        )
        job = self._sbatch(run_dir, {})
        log = run_dir / "train.jsonl"
        if not wait_for_epoch(log, n // 3, 300):
            self.check(False, f"{how}: the job reached epoch {n // 3}")
            return
        cmd = ["scancel", job] if how == "scancel" else ["scontrol", "requeue", job]
        ranks = processes_naming(str(run_dir / "parts-"))
        stopped = time.monotonic()
        subprocess.run(cmd, env=self.c.env, check=True)
        secs = wait_pids_gone(ranks, self.a.timeout + GRACE_S + 30) if ranks else float("nan")
        print(
            f"  {' '.join(cmd)}: the {len(ranks)} ranks running then all ended {secs:.1f} s later"
        )
        self.check(
            secs <= self.a.timeout + GRACE_S,
            f"{how}: every rank ends within --timeout + {GRACE_S:g} s",
        )
        if how == "scancel":
            self._wait_job_gone(job, 120)
            state = self.c.job_state(job)
            print(f"  job state {state.get('JobState')}, exit {state.get('ExitCode')}")
            ck = checkpoint_epoch(run_dir / "checkpoint")
            print(f"  checkpoint after {how}: epoch {ck}")
            self.check(isinstance(ck, int), f"{how}: the checkpoint is readable")
            self.c.wait_idle()
            job = self._sbatch(run_dir, {})
        else:
            while time.monotonic() - stopped < 900:
                state = self.c.job_state(job)
                if state.get("Restarts") == "1" and state.get("JobState") == "RUNNING":
                    break
                time.sleep(0.5)
            print(
                f"  the job ran again {time.monotonic() - stopped:.0f} s after the requeue "
                f"(Slurm holds a requeued job back before it starts it again)"
            )
        self._wait_job_gone(job, 900)
        state = self.c.job_state(job)
        out = "".join(p.read_text() for p in sorted(run_dir.glob("job-*.out")))
        resumed = "resuming from" in out
        d = rel_diff(losses(log), self._reference(n))
        print(
            f"  job {job} again: {state.get('JobState')}, restarts {state.get('Restarts')}, "
            f"resumed: {resumed}; largest relative loss difference to an uninterrupted "
            f"one-process run over {n} epochs {d:.1e}"
        )
        self.check(state.get("JobState") == "COMPLETED" and resumed, f"{how}: resumed, completed")
        self.check(d <= TOLERANCE, f"{how}: the resumed run matches one process")

    def dead_node(self) -> None:
        """kill -9 of node 2's slurmd during an srun training job."""
        n, node = 100000, self.c.node(2)
        log = self.work / "dead.jsonl"
        print(f"dead-node: srun --mpi=pmi2 training; node {node}'s slurmd killed at epoch 30")
        proc = subprocess.Popen(
            self.srun("pmi2", self.train(n, log)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.c.env,
        )
        if not wait_for_epoch(log, 30, 300):
            proc.kill()
            self.check(False, "dead-node: the job reached epoch 30")
            return
        start = time.monotonic()
        os.kill(self.c.pid_of(f"slurmd-{node}"), 9)
        out, _ = proc.communicate(timeout=600)
        srun_s = time.monotonic() - start
        left_s = float("inf")
        while time.monotonic() - start < 300:
            if not processes_naming(str(log)):
                left_s = time.monotonic() - start
                break
            time.sleep(0.2)
        named = [ln for ln in error_lines(out) if node in ln]
        print(
            f"  srun exit {proc.returncode} after {srun_s:.1f} s; last rank ended after "
            f"{left_s:.1f} s; lines naming {node}:"
        )
        for ln in named:
            print(f"      {ln}")
        print("  other lines: " + " | ".join(ln for ln in error_lines(out) if node not in ln))
        self.check(proc.returncode != 0, "dead-node: non-zero exit")
        self.check(bool(named), f"dead-node: a line names {node}")
        self.check(left_s <= self.a.timeout + GRACE_S + 20, "dead-node: every rank ends")
        r = self.c.script("up", "2")  # restarts the broken cluster
        print(f"  cluster restarted: {r.stdout.strip() or r.stderr.strip()}")

    def bad_input(self) -> None:
        """Task count, partition not visible on a node, unreachable controller."""
        w = self.work
        print("bad-input:")
        local = STATE / self.c.prefix / "node-local"
        rc, out, _ = self.c.run(
            [
                "srun",
                "-w",
                self.c.node(1),
                "-N",
                "1",
                "-n",
                "1",
                self.fg,
                "partition",
                "--dataset",
                "tiny",
                "--root",
                str(w / "data"),
                "--parts",
                "4",
                "--out",
                str(local / "p4"),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"partition on node 1's local scratch failed: {out[-300:]}")
        cases = {
            "3 tasks, 4 parts": [
                "srun",
                "-N",
                "2",
                "-n",
                "3",
                "--mpi=pmi2",
                *self.train(3, w / "bad1.jsonl"),
            ],
            "partition on node 1 only (srun)": [
                "srun",
                "-N",
                "2",
                "--ntasks-per-node",
                "2",
                "--mpi=pmi2",
                "--kill-on-bad-exit=1",
                *self.train(3, w / "bad2.jsonl", local / "p4"),
            ],
        }
        for name, cmd in cases.items():
            log = Path(cmd[cmd.index("--log-json") + 1])
            rc, out, secs = self.c.run(cmd)
            lines = [ln for ln in out.splitlines() if "queued" not in ln and "allocated" not in ln]
            print(f"  {name}: exit {rc} after {secs:.1f} s, {log.name} written: {log.exists()}")
            for ln in lines:
                print(f"      {ln}")
            self.check(
                rc != 0 and not log.exists(), f"bad input '{name}': non-zero, nothing written"
            )
        # the template checks every node first
        run_dir = local / "run"
        job = self._sbatch(run_dir, {"FG_EPOCHS": "3"}, output=w / "job-local")
        self._wait_job_gone(job, 120)
        state = self.c.job_state(job)
        out = (w / "job-local" / f"job-{job}.out").read_text()
        said = [ln for ln in out.splitlines() if "error" in ln]
        print(
            f"  partition on node 1's local scratch (the template): {state.get('JobState')}, "
            f"exit {state.get('ExitCode')}:"
        )
        for ln in said:
            print(f"      {ln}")
        self.check(any(self.c.node(2) in ln for ln in said), "template names the blind node")
        # unreachable controller
        self.c.wait_idle()
        os.kill(self.c.pid_of("slurmctld"), 15)
        time.sleep(1)
        rc, out, secs = self.c.run(self.srun("pmi2", self.train(3, w / "bad3.jsonl")), timeout=200)
        print(
            f"  controller stopped: exit {rc} after {secs:.1f} s, written: "
            f"{(w / 'bad3.jsonl').exists()}"
        )
        for ln in out.splitlines():
            print(f"      {ln}")
        self.check(rc != 0 and not (w / "bad3.jsonl").exists(), "unreachable controller")
        r = self.c.script("up", "2")
        print(f"  cluster restarted: {r.stdout.strip() or r.stderr.strip()}")


def main() -> int:
    """Parse arguments, bring the cluster up, run the drills; exit 1 if one missed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", default="fgs")
    ap.add_argument("--subnet", default="10.78.0")
    ap.add_argument("--port", type=int, default=6917)
    ap.add_argument("--work", type=Path, help="shared run directory (default: a temporary one)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--long-epochs", type=int, default=400)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--drills", default=",".join(DRILLS))
    ap.add_argument("--keep", action="store_true", help="leave the cluster up")
    args = ap.parse_args()
    drills = args.drills.split(",")
    unknown = set(drills) - set(DRILLS)
    if unknown:
        ap.error(f"unknown drill(s) {', '.join(sorted(unknown))} (choose from {', '.join(DRILLS)})")
    cluster = Cluster(args.prefix, args.subnet, args.port)
    was_up = (STATE / args.prefix / "slurm.conf").exists()
    r = cluster.script("up", "2")
    if r.returncode != 0:
        print(r.stderr.strip(), file=sys.stderr)
        return 1
    print(r.stdout.strip())
    work = args.work or Path(tempfile.mkdtemp(prefix="slurm-drills-"))
    work.mkdir(parents=True, exist_ok=True)
    d = Drills(cluster, work.resolve(), args)
    try:
        d.data()
        for name in drills:
            start = time.monotonic()
            if name == "exact":
                d.exact()
            elif name in ("scancel", "requeue"):
                d.scancel(name)
            elif name == "dead-node":
                d.dead_node()
            else:
                d.bad_input()
            print(f"  ({name}: {time.monotonic() - start:.0f} s)")
    finally:
        if not (args.keep or was_up):
            cluster.script("down")
    print("missed: " + "; ".join(d.failures) if d.failures else "every drill met its requirements")
    return 1 if d.failures else 0


if __name__ == "__main__":
    sys.exit(main())
