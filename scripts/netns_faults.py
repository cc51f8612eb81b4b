"""Network faults on a cluster of namespaces: what a training job does when its network fails.

Two nodes x two ranks (scripts/netns-cluster.sh), ``fullgraph train`` with checkpoints, over
``mpi`` (mpirun, hydra, netns-exec.sh in place of ssh) and ``gloo`` (torchrun's variables, the
rendezvous on node 1). Faults, injected once the log shows epoch ``--fault-epoch``:

- ``link-down``: node 2's link taken down (``ip link set ... down``), back up after the job ends;
- ``node-removed``: node 2 vanishes (its link deleted, every process in it killed, its
  namespace deleted), re-created empty after the job ends;
- ``loss-5%``: 5% of node 2's outgoing packets dropped for the whole run (netem, or a BPF filter
  where the kernel has no netem).

Measured per case: seconds from the fault to the end of the last process of the job, the exit
statuses, the error lines printed, the processes left behind (any process whose command line
names the case's checkpoint directory, and any process left in the namespaces), and then, with
the network back, whether ``--resume`` continues from the last checkpoint and reproduces an
uninterrupted run's losses exactly. For packet loss: the run must finish, with the same losses,
and the epoch time against the same run without loss.

Usage (root)::

    python scripts/netns_faults.py --parts /tmp/fg-data/parts/arxiv-4 [--timeout 20]
        [--epochs 12] [--fault-epoch 5] [--csv runs/netns_faults.csv]
        [--transports mpi,gloo] [--cases link-down,node-removed,loss-5%]

Exit status 1 when a case misses the requirements (ends later than timeout + 30 s, exit status
0, no error naming an unreachable rank, a process left, or a resume that is not exact).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from netns_cluster import NetnsCluster, cannot_make_namespaces

CASES = ("link-down", "node-removed", "loss-5%")
GRACE_S = 30.0


class Job:
    """The processes of one launch (one mpirun, or one process per rank)."""

    def __init__(self, cmds: list[list[str]], env: dict[str, str]) -> None:
        self.procs = [
            subprocess.Popen(
                c,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, **env},
                start_new_session=True,
            )
            for c in cmds
        ]
        self.outputs: list[tuple[str, str]] = []

    def wait(self, limit: float) -> tuple[list[int | None], float]:
        """Wait for every process, at most ``limit`` seconds; kill the rest after it.

        Returns:
            The exit statuses (``None``: killed as a hang) and the time the last one ended.
        """
        deadline = time.monotonic() + limit
        codes: list[int | None] = []
        for p in self.procs:
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                codes.append(p.returncode)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
                codes.append(None)
            self.outputs.append((out, err))
        return codes, time.monotonic()

    def errors(self) -> list[str]:
        """The non-empty stderr lines of every process."""
        return [line for _, err in self.outputs for line in err.splitlines() if line.strip()]


def launch(cluster: NetnsCluster, transport: str, args: list[str], port: int) -> Job:
    """2 nodes x 2 ranks of ``fullgraph train ARGS`` over ``transport``."""
    argv = [sys.executable, "-m", "fullgraph.cli", "train", *args, "--transport", transport]
    if transport == "mpi":
        return Job([cluster.mpirun(4, 2, argv)], {})
    return Job(cluster.torchrun_env(2, argv, port), {})


def losses(log: Path) -> list[float]:
    """Per-epoch losses of a JSON-lines log."""
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r["loss"] for r in rows if "epoch" in r and "loss" in r]


def epoch_times(log: Path) -> list[float]:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r["epoch_s"] for r in rows if "epoch_s" in r]


def wait_for_epoch(log: Path, epoch: int, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if len(losses(log)) >= epoch:
            return True
        time.sleep(0.1)
    return False


def left_behind(marker: str, cluster: NetnsCluster) -> list[str]:
    """Processes whose command line contains ``marker``, and any left in the namespaces."""
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmd:
                found.add(f"{d.name} {cmd[:80]}")
    return sorted(found) + [f"{pid} (in a node)" for pid in cluster.pids()]


def run_case(
    cluster: NetnsCluster,
    transport: str,
    case: str,
    a: argparse.Namespace,
    work: Path,
    reference: list[float],
    reference_epoch_s: float,
    port: int,
) -> dict:
    """One fault case: inject, measure the end, restore, resume; the row of results."""
    ck, log = work / f"{transport}-{case}-ck", work / f"{transport}-{case}.jsonl"
    common = [
        "--parts",
        a.parts,
        "--epochs",
        str(a.epochs),
        "--hidden",
        str(a.hidden),
        "--timeout",
        str(a.timeout),
        "--checkpoint",
        str(ck),
        "--checkpoint-every",
        "2",
        "--log-json",
        str(log),
        "--quiet",
    ]
    row: dict = {"transport": transport, "case": case, "timeout_s": a.timeout}
    if case == "loss-5%":
        cluster.shape(1, loss="5%")
    job = launch(cluster, transport, common, port)
    if case == "loss-5%":
        codes, t_end = job.wait(a.timeout * a.epochs + 300)
        cluster.shape(1, loss="0%")
        got = losses(log)
        row.update(
            exit=codes,
            seconds_to_exit="",
            errors=" | ".join(job.errors()[:3]),
            left=len(left_behind(str(ck), cluster)),
            finished=all(c == 0 for c in codes),
            exact=got == reference,
            checkpoint_epoch="",
            epoch_s_vs_no_loss=round(statistics_median(epoch_times(log)[1:]) / reference_epoch_s, 2)
            if got
            else "",
        )
        row["ok"] = row["finished"] and row["exact"] and row["left"] == 0
        return row
    if not wait_for_epoch(log, a.fault_epoch, 600):
        job.wait(1)
        row.update(ok=False, errors="never reached the fault epoch: " + " | ".join(job.errors()))
        return row
    t_fault = time.monotonic()
    if case == "link-down":
        cluster.set_link(1, up=False)
    else:
        cluster.remove_node(1)
    codes, t_end = job.wait(a.timeout + GRACE_S + 60)
    time.sleep(1.0)
    left = left_behind(str(ck), cluster)
    errors = job.errors()
    # the network comes back
    if case == "link-down":
        cluster.set_link(1, up=True)
    else:
        cluster.up()
    ckpt_epoch = _checkpoint_epoch(ck)
    resumed = launch(cluster, transport, [*common, "--resume"], port + 1)
    rcodes, _ = resumed.wait(a.timeout * a.epochs + 300)
    got = losses(log)
    row.update(
        seconds_to_exit=round(t_end - t_fault, 1),
        exit=codes,
        errors=" | ".join(errors[:3]) + (f" (+{len(errors) - 3} lines)" if len(errors) > 3 else ""),
        left=len(left),
        checkpoint_epoch=ckpt_epoch,
        resume_exit=rcodes,
        exact=got == reference,
        finished="",
    )
    named = any(re.search(r"unreachable: rank \d", e) for e in errors)
    row["ok"] = (
        t_end - t_fault <= a.timeout + GRACE_S
        and all(c not in (0, None) for c in codes)
        and named
        and not left
        and all(c == 0 for c in rcodes)
        and row["exact"]
    )
    return row


def statistics_median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if v else float("nan")


def _checkpoint_epoch(ck: Path) -> int | str:
    """The epoch the checkpoint directory's ``checkpoint.pt`` names (read without torch state)."""
    from fullgraph.run.checkpoint import read_checkpoint_file

    try:
        return int(read_checkpoint_file(ck / "checkpoint.pt")["epoch"])
    except Exception as exc:
        return f"unreadable: {exc}"


def main() -> int:
    """Parse arguments, run every case, print the table; exit 1 if a case misses."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", required=True, help="a 4-part partition")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--fault-epoch", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--transports", default="mpi,gloo")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()
    reason = cannot_make_namespaces()
    if reason:
        print(f"netns_faults: cannot run: {reason}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="fg-faults-") as tmp, NetnsCluster(2, a.rate) as c:
        work = Path(tmp)
        ref_log = work / "reference.jsonl"
        ref = launch(
            c,
            "mpi",
            [
                "--parts",
                a.parts,
                "--epochs",
                str(a.epochs),
                "--hidden",
                str(a.hidden),
                "--timeout",
                str(a.timeout),
                "--log-json",
                str(ref_log),
                "--quiet",
            ],
            29600,
        )
        codes, _ = ref.wait(a.timeout * a.epochs + 300)
        if codes != [0]:
            print("reference run failed:\n" + "\n".join(ref.errors()), file=sys.stderr)
            return 1
        reference = losses(ref_log)
        reference_epoch_s = statistics_median(epoch_times(ref_log)[1:])
        print(f"reference: {a.epochs} epochs, median epoch {reference_epoch_s:.2f} s", flush=True)
        port = 29610
        for transport in a.transports.split(","):
            for case in a.cases.split(","):
                row = run_case(c, transport, case, a, work, reference, reference_epoch_s, port)
                port += 2
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.csv:
        Path(a.csv).parent.mkdir(parents=True, exist_ok=True)
        keys = sorted({k for r in rows for k in r})
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
    missed = [f"{r['transport']}/{r['case']}" for r in rows if not r.get("ok")]
    print("all cases met" if not missed else f"missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
