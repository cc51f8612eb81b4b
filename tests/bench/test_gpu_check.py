"""The one-call GPU check (``bench/gpu_check.sh``) works before a GPU is lent.

The dry run executes every step as the GPU run would, on the CPU and the tiny graph (the CUDA
kernel tests collected, not run): a moved test file, a renamed module, command or flag fails
here, not in the lent minutes. The driver's own promises are checked on made-up steps: a
failing step does not stop the later ones, a step past its budget is ended with its children,
and the summary is written whatever happened.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import gpu_check  # the repository root is on pytest's path (pyproject.toml)
from bench import gpu_check_commands as commands
from bench import gpu_check_report as report

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """``GPU_CHECK_DRY=1 bash bench/gpu_check.sh OUT``, once for the module."""
    root = tmp_path_factory.mktemp("gpu_check")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    env.update(GPU_CHECK_DRY="1", PYTHON=sys.executable, GPU_CHECK_WORK=str(root / "work"))
    cmd = ["bash", str(REPO / "bench" / "gpu_check.sh"), str(root / "out")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=600)  # ~2 min quiet, ~8 under a loaded machine
    except subprocess.TimeoutExpired:
        proc.terminate()  # the driver ends its steps and still writes the summary
        out, err = proc.communicate(timeout=60)
    return root / "out", subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.timeout(680)
def test_dry_run_every_step_runs_or_parses(dry_run) -> None:
    out, proc = dry_run
    assert proc.returncode == 0, f"dry run failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["mode"] == "dry"
    steps = {s["name"]: s for s in summary["steps"]}
    planned = gpu_check.plan(gpu_check.Settings(True, sys.executable, out, out))
    assert list(steps) == [s.name for s in planned]
    expected = {s.name: "passed" for s in planned}
    expected.update({s.name: "parsed" for s in planned if s.gpu_only})
    expected.update({s.name: "not available" for s in planned if not s.available})
    assert {n: s["status"] for n, s in steps.items()} == expected
    assert "test_kernel_cuda.py" in "\n".join(steps["kernel-tests"]["log_tail"])
    for name in ("exact-cuda", "nccl-1rank", "gloo-2ranks"):  # CPU against CPU: exact
        fig = steps[name]["figures"][0]
        assert fig["value"] is not None and fig["value"] <= gpu_check.EXACT_TOL, (name, fig)
    # the bit-identical contract on the dry run's CPU: the rerun, 2 ranks and the CPU reference
    # (here the same device) give every epoch's loss bit for bit
    for name in ("exact-cuda", "exact-rerun", "gloo-2ranks"):
        bits = next(f for f in steps[name]["figures"] if "differs in any bit" in f["name"])
        assert bits["value"] == 0.0, (name, bits)
    for name in ("spmm-arxiv", "spmm-products"):  # F=16: fwd, fwd+bwd x speedup, bandwidth
        figs = steps[name]["figures"]
        assert len(figs) == 4 and all(math.isfinite(f["value"]) and f["value"] > 0 for f in figs)
    ran = [n for n in ("train-gcn", "train-sage", "train-bf16") if expected[n] == "passed"]
    for name in ran:
        assert steps[name]["figures"][0]["value"] > 0
    if "train-bf16" in ran:  # a CPU without bfloat16 cannot run it
        assert steps["train-bf16"]["figures"][-1]["value"] > 0  # its speed-up over train-gcn
    assert steps["predict"]["figures"][0]["value"] == 1.0  # CPU against CPU: every node
    for f in (s for step in summary["steps"] for s in step["figures"]):
        assert f["met"] is None  # a dry run judges no GPU target


def test_dry_run_writes_csv_and_markdown(dry_run) -> None:
    out, _ = dry_run
    summary = json.loads((out / "gpu_check.json").read_text())
    with open(out / "gpu_check.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == report.FIELDS
        rows = list(reader)
    assert len(rows) == sum(max(1, len(s["figures"])) for s in summary["steps"])
    for row in rows:
        float(row["seconds"]), int(row["budget_s"])
        assert row["value"] == "" or math.isfinite(float(row["value"]))
        assert row["mode"] == "dry"
    md = (out / "gpu_check.md").read_text()
    assert md.count("\n| ") == len(rows) + 1  # header + one line per row
    for s in summary["steps"]:
        assert f"| {s['name']} | {s['status']}" in md
    log = (out / "gpu_check.log").read_text()
    assert all(f"===== {s['name']}: " in log for s in summary["steps"])
    assert {p.name for p in out.iterdir()} <= {
        "gpu_check.csv",
        "gpu_check.json",
        "gpu_check.md",
        "gpu_check.log",
        "kernels_arxiv.csv",
        "kernels_products.csv",
    }  # at most 8 files come back from a lent machine


def test_fill_doc_replaces_the_gpu_section(dry_run, tmp_path) -> None:
    out, _ = dry_run
    doc = tmp_path / "kernels.md"
    shutil.copy(REPO / "docs" / "kernels.md", doc)
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gpu_check",
            "fill-doc",
            str(out / "gpu_check.json"),
            str(doc),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert refused.returncode != 0 and "not a GPU result" in refused.stderr
    assert gpu_check.main(["fill-doc", str(out / "gpu_check.json"), str(doc), "--allow-dry"]) == 0
    section = doc.read_text().split(report.DOC_BEGIN)[1].split(report.DOC_END)[0]
    assert "never run" not in section and "| kernel-tests | parsed" in section


def test_docs_name_every_step_and_say_never_run() -> None:
    text = (REPO / "docs" / "kernels.md").read_text()
    section = text.split(report.DOC_BEGIN)[1].split(report.DOC_END)[0]
    assert "never run" in section.lower()
    s = gpu_check.Settings(False, "python3", Path("OUT"), Path("/tmp/x"))
    for step in gpu_check.plan(s):
        assert f"`{step.name}`" in text, step.name
        if step.available:
            assert f"| {step.budget_s} s" in text, f"{step.name}: its budget"
    assert sum(st.budget_s for st in gpu_check.plan(s) if not st.background) <= 495


def test_only_takes_what_a_step_needs() -> None:
    s = gpu_check.Settings(False, "python3", Path("OUT"), Path("/tmp/x"))
    names = [st.name for st in gpu_check.select(gpu_check.plan(s), ["spmm-products"])]
    assert names == ["install", "big-graph", "spmm-products"]
    with pytest.raises(SystemExit, match="unknown step"):
        gpu_check.select(gpu_check.plan(s), ["spmm"])


@pytest.mark.timeout(60)
def test_failures_are_recorded_and_later_steps_still_run(tmp_path) -> None:
    Step, py = gpu_check.Step, sys.executable
    pid_file = tmp_path / "child.pid"
    sleeper = (
        "import os, subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    steps = [
        Step("fails", "exits 3", (py, "-c", "raise SystemExit(3)"), 10),
        Step("slow", "outlives its budget", (py, "-c", sleeper), 2, background=True),
        Step("needs-fails", "skipped", (py, "-c", "pass"), 10, needs=("fails",)),
        Step("missing", "no such program", ("/nonexistent/program",), 10),
        Step(
            "after-slow",
            "waits for slow, then runs",
            (py, "-c", "print('ok')"),
            10,
            after=("slow",),
        ),
        Step("later", "not yet there", (), 0, available=False),
    ]
    s = gpu_check.Settings(False, py, tmp_path / "out", tmp_path / "work")
    t0 = time.monotonic()
    results = gpu_check.run_steps(steps, s, deadline_s=60)
    assert time.monotonic() - t0 < 30
    status = {r.step: r.status for r in results}
    assert status == {
        "fails": "failed",
        "slow": "timed out",
        "needs-fails": "skipped",
        "missing": "failed",
        "after-slow": "passed",
        "later": "not available",
    }
    child = int(pid_file.read_text())
    for _ in range(50):  # the step's whole process group was ended, its child too
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the timed-out step's child {child} still runs")
    doc = {
        "mode": "gpu",
        "started": "now",
        "wall_s": 1.0,
        "git_rev": "x",
        "env": {},
        "steps": [gpu_check.step_record(st, r) for st, r in zip(steps, results, strict=True)],
    }
    report.write_summary(doc, s.out, {r.step: r.log for r in results})
    assert json.loads((s.out / "gpu_check.json").read_text())["steps"][0]["returncode"] == 3
    assert "MISSED" not in (s.out / "gpu_check.md").read_text()


@pytest.mark.timeout(60)
def test_a_signal_ends_the_running_steps_and_keeps_the_summary(tmp_path) -> None:
    Step, py = gpu_check.Step, sys.executable
    kill_driver = (
        f"import os, signal, time; time.sleep(1); os.kill({os.getpid()}, signal.SIGTERM); "
        "time.sleep(60)"
    )
    steps = [
        Step("signals", "SIGTERM to the driver", (py, "-c", kill_driver), 30, background=True),
        Step("long", "runs when the signal comes", (py, "-c", "import time; time.sleep(60)"), 30),
        Step("never", "not started", (py, "-c", "pass"), 10),
    ]
    s = gpu_check.Settings(False, py, tmp_path / "out", tmp_path / "work")
    t0 = time.monotonic()
    results = gpu_check.run_steps(steps, s)
    assert time.monotonic() - t0 < 20
    assert [r.status for r in results] == ["interrupted", "interrupted", "not run"]


def test_figures_judge_targets_on_a_gpu_run() -> None:
    Figure = gpu_check.Figure
    assert Figure("a", 1.2, "x", ">=", 1.0).judge(dry=False).met is True
    assert Figure("b", 0.5, "", ">=", 0.7).judge(dry=False).met is False
    assert Figure("c", None, "", "<=", 1e-4).judge(dry=False).met is False
    assert Figure("d", float("nan"), "", "<=", 1e-4).judge(dry=False).met is False
    assert Figure("e", 3.0, "s").judge(dry=False).met is None
    assert Figure("f", 0.5, "", ">=", 0.7).judge(dry=True).met is None


def test_kernels_bench_reports_gpu_targets_without_a_gpu(capsys) -> None:
    """bench/kernels.py's CUDA report, fed made-up times (a peer left out reads as NaN)."""
    import torch

    from bench import kernels

    fwd = kernels.Best({"ours": 1e-3, "torch.sparse.mm": 2e-3})
    fwdbwd = kernels.Best({"ours": 3e-3, "torch.sparse.mm-cached": 4e-3})
    moved = {"fwd": 4e9, "fwdbwd": 8e9}
    summary = {("g", 64): ({"fwd": fwd, "fwdbwd": fwdbwd}, 1e-3, None, moved)}
    kernels.report_targets(summary, torch.device("cuda"), 4.8e12)
    out = capsys.readouterr().out
    assert "fwd vs cuSPARSE 2.00x" in out and "fwd+bwd vs cached cuSPARSE 1.33x" in out
    assert "fwd 83% of HBM" in out
    assert math.isnan(fwdbwd["torch.sparse.mm"]) and fwdbwd.best_of(kernels.SPARSE_MM) == 4e-3


@pytest.mark.timeout(60)
def test_install_fallback_finder_imports_this_checkout(tmp_path) -> None:
    """Where pip cannot install, the finder on PYTHONPATH maps fullgraph's package-dir."""
    shim = commands.write_finder(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)])}
    code = (
        "import sys, fullgraph.kernels, fullgraph.partition, fullgraph.datasets; "
        "print(type(sys.meta_path[0]).__name__, fullgraph.kernels.__file__)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    finder, path = p.stdout.split()
    assert finder == "PackageDirFinder" and Path(path) == REPO / "kernels" / "__init__.py"
    assert commands.imports_here(env) is None
