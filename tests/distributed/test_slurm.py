"""Slurm on one machine: srun and sbatch start fullgraph's ranks, as on a cluster.

``scripts/slurm-cluster.sh`` brings up a real Slurm cluster of 2 nodes (slurmctld in the root
namespace, one slurmd per network namespace of ``scripts/netns-cluster.sh``, munge; Debian's
packages, installed by the script when missing). On it, 3 epochs of ``fullgraph train`` on the
tiny preset, 2 nodes x 2 ranks, must give the one-process losses: started by
``srun --mpi=pmi2`` (MPI, the mpich wheel over Slurm's PMI) and by the sbatch template
``examples/fullgraph.sbatch`` with ``--mpi=none`` (gloo, meeting on the first node at a port
derived from the job id). Also: srun with 3 tasks for 4 parts, ``up`` again, a failed ``up``
rolled back and ``down`` leaving nothing. Skipped, with the reason, only where Slurm cannot run
(not root, no network namespaces, the packages not installable); the script's bad input and
srun's variables (two local processes, no Slurm) are checked everywhere.

Enters through :mod:`fullgraph.distributed.launch`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from netns_cluster import STATE_ROOT as NETNS_STATE
from netns_cluster import cannot_make_namespaces, run_all, unique_prefix

REPO = Path(__file__).resolve().parents[2]
SLURM_SH = REPO / "scripts" / "slurm-cluster.sh"
TEMPLATE = REPO / "examples" / "fullgraph.sbatch"
BIN = Path(sys.executable).parent
STATE = Path(os.environ.get("SLURM_CLUSTER_STATE", "/run/slurm-cluster"))
EPOCHS = 3


def fullgraph(*args: str) -> list[str]:
    return [sys.executable, "-m", "fullgraph.cli", *args]


def script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SLURM_SH), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def losses(log: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, log.read_text().splitlines()) if "loss" in r]


def free_port_pair() -> int:
    """A port P with P and P + 1 free here (the controller's and slurmd's)."""
    for _ in range(50):
        port = 20000 + uuid.uuid4().int % 9000
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


def subnets() -> list[str]:
    rnd = uuid.uuid4().int
    return [f"10.{90 + (rnd >> (8 * k)) % 150}.{(rnd >> (8 * k + 4)) % 256}" for k in range(4)]


def nothing_left(prefix: str) -> list[str]:
    """What of a cluster of ``prefix`` is still there."""
    left = []
    if (STATE / prefix).exists() or (NETNS_STATE / prefix).exists():
        left.append("state directory")
    if prefix in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout:
        left.append("namespaces")
    if f"netns-cluster:{prefix}" in Path("/etc/hosts").read_text():
        left.append("/etc/hosts lines")
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and f"/{prefix}/" in (p / "cmdline").read_text():
                left.append(f"process {p.name}")
        except OSError:
            continue
    link = Path("/etc/slurm/slurm.conf")
    if link.is_symlink() and prefix in os.readlink(link):
        left.append("/etc/slurm/slurm.conf link")
    return left


class Slurm:
    """A 2-node cluster of a prefix unique to the run; commands with its ``SLURM_CONF``."""

    def __init__(self) -> None:
        self.prefix, self.port = unique_prefix(), free_port_pair()
        self.env = {
            **os.environ,
            "SLURM_CONF": str(STATE / self.prefix / "slurm.conf"),
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        }
        self.up_args: list[str] = []

    def up(self) -> Slurm:
        err = ""
        for subnet in subnets():
            self.up_args = [
                "up",
                "2",
                "--prefix",
                self.prefix,
                "--subnet",
                subnet,
                "--port",
                str(self.port),
                "--rate",
                "1gbit",
            ]
            r = script(*self.up_args)
            if r.returncode == 0:
                return self
            err = r.stderr.strip()
            if "already in use" not in err:
                break
        raise RuntimeError(f"slurm-cluster.sh up failed: {err}")

    def down(self) -> None:
        script("down", "--prefix", self.prefix)

    def run(self, cmd: list[str], timeout: float = 150) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd, capture_output=True, text=True, env=self.env, cwd=REPO, timeout=timeout
        )


def cannot_run_slurm() -> str | None:
    """Why Slurm cannot run here (namespaces, root, the packages), or ``None``."""
    reason = cannot_make_namespaces()
    if reason is not None:
        return reason
    r = script("install")  # finds the packages, or installs Debian's (about 10 s)
    if r.returncode != 0:
        return f"Slurm is not installed and could not be: {r.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def slurm(request: pytest.FixtureRequest) -> Slurm:
    reason = cannot_run_slurm()
    if reason is not None:
        pytest.skip(f"no Slurm cluster on this machine: {reason}")
    cluster = Slurm()
    request.addfinalizer(cluster.down)  # registered first: it runs even if up() fails
    return cluster.up()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny preset, its 1- and 4-part partitions and the one-process log."""
    root = tmp_path_factory.mktemp("slurm-tiny")
    for args in (
        ["data", "synth", "--preset", "tiny", "--name", "tiny", "--root", str(root / "data")],
        [
            "partition",
            "--dataset",
            "tiny",
            "--root",
            str(root / "data"),
            "--parts",
            "1",
            "--out",
            str(root / "p1"),
        ],
        [
            "partition",
            "--dataset",
            "tiny",
            "--root",
            str(root / "data"),
            "--parts",
            "4",
            "--out",
            str(root / "p4"),
        ],
        [
            "train",
            "--parts",
            str(root / "p1"),
            "--epochs",
            str(EPOCHS),
            "--threads",
            "1",
            "--quiet",
            "--log-json",
            str(root / "one.jsonl"),
        ],
    ):
        r = subprocess.run(fullgraph(*args), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    return {"root": root, "p4": root / "p4", "one": root / "one.jsonl"}


def check_run(log: Path, one: Path, pmi: str, transport: str) -> None:
    """The one-process losses, and the launch every rank saw: Slurm's, 2 ranks per node."""
    assert losses(log) == pytest.approx(losses(one), rel=1e-5, abs=1e-6)
    final = [json.loads(line) for line in log.read_text().splitlines()][-1]
    assert final["ranks"] == 4 and final["transport"] == transport
    launch = json.loads(log.with_name(log.stem + ".config.json").read_text())["launch"]
    assert (launch["launcher"], launch["pmi"], launch["size"], launch["local_size"]) == (
        "slurm",
        pmi,
        4,
        2,
    )


@pytest.mark.timeout(240)
def test_srun_pmi2_ranks_match_one_process(slurm: Slurm, tiny: dict, tmp_path: Path) -> None:
    log = tmp_path / "srun.jsonl"
    r = slurm.run(
        [
            "srun",
            "-N",
            "2",
            "--ntasks-per-node",
            "2",
            "--mpi=pmi2",
            *fullgraph(
                "train",
                "--parts",
                str(tiny["p4"]),
                "--epochs",
                str(EPOCHS),
                "--quiet",
                "--timeout",
                "60",
                "--log-json",
                str(log),
            ),
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    check_run(log, tiny["one"], "pmi2", "mpi")


@pytest.mark.timeout(240)
def test_sbatch_template_over_gloo_matches_one_process(
    slurm: Slurm, tiny: dict, tmp_path: Path
) -> None:
    env = {
        "FG_DATASET": "tiny",
        "FG_ROOT": str(tiny["root"] / "data"),
        "FG_WORK": str(tmp_path),
        "FG_EPOCHS": str(EPOCHS),
        "FG_TIMEOUT": "60",
        "FG_MPI": "none",
        "FULLGRAPH": str(BIN / "fullgraph"),
    }
    r = subprocess.run(
        ["sbatch", "--wait", f"--output={tmp_path}/job.out", str(TEMPLATE)],
        capture_output=True,
        text=True,
        env={**slurm.env, **env},
        timeout=200,
        cwd=tmp_path,
    )
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert r.returncode == 0, r.stderr + out
    assert "OK " in out and "parts-4: 4 parts" in out  # fullgraph verify ran
    check_run(tmp_path / "train.jsonl", tiny["one"], "none", "gloo")
    assert (tmp_path / "checkpoint" / "checkpoint.pt").exists()


@pytest.mark.timeout(120)
def test_srun_task_count_other_than_the_parts(slurm: Slurm, tiny: dict, tmp_path: Path) -> None:
    log = tmp_path / "bad.jsonl"
    r = slurm.run(
        [
            "srun",
            "-N",
            "2",
            "-n",
            "3",
            "--mpi=pmi2",
            *fullgraph(
                "train",
                "--parts",
                str(tiny["p4"]),
                "--epochs",
                "1",
                "--quiet",
                "--timeout",
                "30",
                "--log-json",
                str(log),
            ),
        ]
    )
    assert r.returncode == 2
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("fullgraph")]
    assert len(ours) == 1 and "has 4 parts but 3 ranks were started" in ours[0], r.stderr
    assert not log.exists()


def test_up_again_is_idempotent(slurm: Slurm) -> None:
    r = script(*slurm.up_args)
    assert r.returncode == 0 and "already up" in r.stdout, r.stderr
    status = script("status", "--prefix", slurm.prefix).stdout
    assert f"{slurm.prefix}1 idle" in status and f"{slurm.prefix}2 idle" in status


@pytest.mark.timeout(180)
def test_failed_up_rolls_back_and_down_leaves_nothing(slurm: Slurm) -> None:
    prefix, port = unique_prefix(), free_port_pair()
    args = ["up", "1", "--prefix", prefix, "--subnet", subnets()[0], "--port", str(port)]
    try:
        failed = script(*args, env={"SLURM_CLUSTER_IDLE_WAIT_S": "0"})
        assert failed.returncode == 1 and "rolled back" in failed.stderr, failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1
        assert nothing_left(prefix) == []
        up = script(*args)
        assert up.returncode == 0, up.stderr
        assert script("down", "--prefix", prefix).returncode == 0
        assert nothing_left(prefix) == []
    finally:
        script("down", "--prefix", prefix)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "0"], "node count '0'"),
        (["up", "2", "--port", "80"], "--port 80"),
        (["up", "2", "--cpus", "many"], "--cpus many"),
        (["up", "2", "--subnet", "10.7"], "--subnet 10.7"),
        (["up", "2", "--rate", "10g"], "--rate 10g"),
        (["up", "2", "--bogus"], "unknown argument"),
        (["start"], "unknown command"),
    ],
)
def test_cluster_script_rejects_bad_input_before_anything(args: list[str], needle: str) -> None:
    prefix = unique_prefix()
    r = script(*args, "--prefix", prefix) if args[0] == "up" else script(*args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout
    assert not (STATE / prefix).exists() and not (NETNS_STATE / prefix).exists()


@pytest.mark.timeout(120)
def test_srun_variables_meet_without_mpi(small_partitions: dict, tmp_path: Path) -> None:
    """Two local processes with what srun --mpi=none sets: gloo, the first node's store."""
    one = tmp_path / "one.jsonl"
    args = ["train", "--epochs", "1", "--hidden", "16", "--quiet", "--timeout", "30"]
    r = subprocess.run(
        fullgraph(*args, "--parts", str(small_partitions[1]), "--log-json", str(one)),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    log, job = tmp_path / "srun.jsonl", str(1000 + uuid.uuid4().int % 100000)
    cmds = [
        [
            "env",
            f"SLURM_PROCID={rank}",
            "SLURM_NTASKS=2",
            f"SLURM_LOCALID={rank}",
            "SLURM_NODEID=0",
            "SLURM_STEP_ID=0",
            "SLURM_STEP_TASKS_PER_NODE=2",
            "SLURM_STEP_NODELIST=localhost",
            f"SLURM_JOB_ID={job}",
            *fullgraph(*args, "--parts", str(small_partitions[2]), "--log-json", str(log)),
        ]
        for rank in range(2)
    ]
    for rank, res in enumerate(run_all(cmds, timeout=90)):
        assert res.returncode == 0, f"rank {rank}: {res.stderr}"
    assert losses(log) == pytest.approx(losses(one), rel=1e-5, abs=1e-6)
    launch = json.loads(log.with_name("srun.config.json").read_text())["launch"]
    assert (launch["launcher"], launch["pmi"], launch["local_size"]) == ("slurm", "none", 2)
