"""The one-call GPU check: the steps a session lent a GPU runs, written as data.

Each :class:`Step` is one command with a time budget and, where the issue gives one, a target.
The driver runs them in order (a few in the background, beside the others), ends a step's whole
process group when its budget is spent, records every failure and goes on; at the end it prints
one summary table and writes it to ``OUT/gpu_check.csv``, ``.json`` and ``.md``
(``OUT/gpu_check.log`` holds every step's output; :mod:`bench.gpu_check_report`). The driver
itself imports nothing beyond the standard library, so that it reports even when the machine's
packages do not import; the steps' own commands besides fullgraph's are in
:mod:`bench.gpu_check_commands`. Every command runs in the repository root.

    bash bench/gpu_check.sh [OUT_DIR]                # on the lent machine (default $OUT)
    GPU_CHECK_DRY=1 bash bench/gpu_check.sh DIR      # no GPU: the same steps on the CPU, tiny graph
    GPU_CHECK_ONLY=spmm-products,train-gcn bash bench/gpu_check.sh   # some steps (+ what they need)
    python -m bench.gpu_check list                   # the steps, their budgets and targets
    python -m bench.gpu_check fill-doc OUT/gpu_check.json    # docs/kernels.md's GPU section

Dry run (``--dry``): every command runs as it would on the GPU, with ``--device cpu`` (``nccl``
becomes ``gloo``), the tiny graph instead of the products-size one and fewer feature widths and
rounds; the CUDA kernel tests are collected, not run (``pytest --collect-only``). So a moved test
file, a renamed module or flag fails the dry run (``tests/bench/test_gpu_check.py``), not the
lent minutes.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

# both import the standard library only
from bench.common import git_revision, machine_name
from bench.gpu_check_report import OK, fill_doc, write_summary

REPO = Path(__file__).resolve().parents[1]

#: One lent call runs at most 10 minutes: no step starts later than this, so the summary comes.
DEADLINE_S = 540
#: Seconds a step's process group gets after SIGTERM before SIGKILL.
KILL_GRACE_S = 5
#: Each step in a process group of its own, in the driver's session: a lent machine ends what a
#: call's session leaves running, but not processes that started a session of their own.
NEW_GROUP: dict = (
    {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
)
#: A dry run's budgets and deadline are this many times the GPU run's.
DRY_BUDGET_FACTOR = 4
EXACT_EPOCHS = 20
EXACT_TOL = 1e-4


@dataclass
class Figure:
    """One measured number and, where the issue gives one, its target (``value op bound``)."""

    name: str
    value: float | None
    unit: str = ""
    op: str = ""  # ">=", "<=" or "" (no target)
    bound: float | None = None
    met: bool | None = None
    note: str = ""

    @property
    def target(self) -> str:
        return f"{self.op} {self.bound:g}" if self.op else ""

    def judge(self, dry: bool) -> Figure:
        """Set ``met`` (``None`` in a dry run: CPU figures say nothing of GPU targets)."""
        if dry or not self.op:
            self.met = None
        elif self.value is None or math.isnan(self.value):
            self.met = False
        else:
            self.met = self.value >= self.bound if self.op == ">=" else self.value <= self.bound
        return self


@dataclass(frozen=True)
class Settings:
    """What differs between the GPU run and the dry run, and where files go."""

    dry: bool
    python: str
    out: Path
    work: Path

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    @property
    def mode(self) -> str:
        return "dry" if self.dry else "gpu"

    @property
    def budget_factor(self) -> int:
        """Budgets are the GPU machine's; a dry run shares a small, busy CPU: 4x as long."""
        return DRY_BUDGET_FACTOR if self.dry else 1

    def path(self, *parts: str) -> str:
        return str(self.work.joinpath(*parts))


@dataclass(frozen=True)
class Step:
    """One command of the check.

    Attributes:
        name: short id (``--only`` takes these).
        what: what it runs or measures, one line.
        command: argv, run in the repository root.
        budget_s: its time limit; past it the step's process group is ended.
        target: the issue's target in words ("" when it gives none).
        needs: steps whose output this one reads: waited for; skipped if one did not pass.
        after: steps only waited for (a timing step does not share the GPU with them).
        background: started, then the next steps run beside it.
        gpu_only: meaningful on a GPU only: the dry run runs ``command`` as a parse-only check
            (it is built that way for the dry run) and records ``parsed``.
        available: ``False`` for what fullgraph does not have yet (never run).
        outputs: files it writes; removed before it runs, so a figure never comes from an
            earlier run.
        figures: reads its outputs after the run, returns its figures.
    """

    name: str
    what: str
    command: tuple[str, ...]
    budget_s: int
    target: str = ""
    needs: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    background: bool = False
    gpu_only: bool = False
    available: bool = True
    outputs: tuple[str, ...] = ()
    figures: Callable[[], list[Figure]] | None = None


@dataclass
class Result:
    """What became of one step."""

    step: str
    status: (
        str  # passed, parsed, not available (OK); failed, timed out, skipped, not run, interrupted
    )
    seconds: float = 0.0
    returncode: int | None = None
    detail: str = ""
    figures: list[Figure] = field(default_factory=list)
    log: str = ""


# -- the steps -----------------------------------------------------------------------------------
def plan(s: Settings) -> list[Step]:
    """The steps of one call, in order (docs/kernels.md, "GPU", lists them with their budgets).

    Commands are written with ``{placeholders}`` for what differs between the GPU run and the
    dry run (device, graph, widths) and for paths.
    """
    dry, q = s.dry, shlex.quote
    # a dry run's bf16-mixed step needs a CPU that computes bfloat16 (some of ours do not)
    no_bf16 = _dry_cpu_without_bf16() if dry else ""
    big = "tiny" if dry else "products"
    # SpMM widths, timed rounds, seconds per provider beyond them, CPU threads; training epochs
    widths, rounds, budget, threads, epochs = (
        ("16", 1, 0, 2, 2) if dry else ("64,128,256", 3, 1, 8, 4)
    )
    py = q(s.python)
    v = {  # every value quoted for the shell syntax of the commands (shlex.split)
        "py": py,
        "fg": f"{py} -m fullgraph.cli",
        "dev": s.device,
        "nccl": "gloo" if dry else "nccl",
        "work": q(str(s.work)),
        "data": q(s.path("data")),
        "tiny": f"--dataset tiny-synth --root {q(s.path('data'))}",
        "tiny2": q(s.path("parts", "tiny-2")),
        "big": big,
        "big1": q(s.path("parts", f"{big}-1")),
        "runs": q(s.path("runs")),
        "out": q(str(s.out)),
        "xml": q(s.path("kernel_tests.xml")),
        "cuda": "" if dry else "--require-cuda",
        "collect": "--collect-only" if dry else "",
        "exact": f"--model gcn --layers 3 --hidden 64 --dropout 0.5 --epochs {EXACT_EPOCHS} "
        "--threads 2 --quiet --force",
        "kernels": f"{py} -m bench.kernels --device {s.device} --no-variants --features {widths} "
        f"--rounds {rounds} --budget {budget} --threads {threads}",
        "train": f"--no-verify --device {s.device} --layers 3 --hidden 256 --dropout 0.5 "
        f"--epochs {epochs} --eval-every {epochs} --force",
    }

    def cmd(text: str) -> tuple[str, ...]:
        return tuple(shlex.split(text.format(**v)))

    runs = partial(s.path, "runs")
    xml = s.path("kernel_tests.xml")
    vs_cpu = partial(loss_agreement, runs("exact-cpu.jsonl"))
    exact_target = f"losses within {EXACT_TOL:g} of the CPU run's, {EXACT_EPOCHS} epochs"
    spmm_target = ">= 1.0x cuSPARSE, >= 70% of HBM"
    return [
        Step(
            "env",
            "interpreter, torch, Triton, CUDA device, nvidia-smi",
            cmd("{py} -m bench.gpu_check_commands env --json {work}/env.json {cuda}"),
            20,
            target="torch sees a CUDA device",
        ),
        Step(
            "install",
            "fullgraph importable from this checkout: else pip install --no-deps "
            "--no-build-isolation -e ., else a finder on PYTHONPATH",
            cmd("{py} -m bench.gpu_check_commands install --work {work}"),
            25,
        ),
        Step(
            "tiny-graph",
            "tiny synthetic graph on disk (fullgraph data synth)",
            cmd("{fg} data synth --preset tiny --name tiny-synth --root {data} --force"),
            15,
            needs=("install",),
        ),
        Step(
            "tiny-parts",
            "its 2-part blocks partition (fullgraph partition: fixed node blocks, METIS's or, "
            "without METIS, the reverse Cuthill-McKee order's)",
            cmd("{fg} partition {tiny} --parts 2 --out {tiny2} --force"),
            15,
            needs=("tiny-graph",),
        ),
        Step(
            "big-graph",
            f"{big}-size graph generated in memory, written as a one-part "
            "contiguous partition (no text layout, no METIS)",
            cmd("{py} -m bench.gpu_check_commands make-parts --preset {big} --out {big1}"),
            150,
            needs=("install",),
            background=True,
        ),
        Step(
            "kernel-tests",
            "kernel tests on CUDA, Triton compiled (not interpreted)",
            cmd(
                "{py} -m pytest -q -p no:cacheprovider --timeout 60 --junitxml {xml} {collect} "
                "tests/kernels/test_kernel_cuda.py tests/kernels/test_kernel_csr.py"
            ),
            90,
            target="0 failed, 0 skipped",
            needs=("install",),
            background=True,
            gpu_only=True,
            outputs=(xml,),
            figures=partial(junit_figures, xml),
        ),
        Step(
            "exact-cpu",
            f"reference: GCN 3 x 64, dropout 0.5, {EXACT_EPOCHS} epochs, tiny "
            "graph, one process on the CPU",
            cmd("{fg} train {tiny} --device cpu {exact} --log-json {runs}/exact-cpu.jsonl"),
            30,
            needs=("tiny-graph",),
            background=True,
            outputs=(runs("exact-cpu.jsonl"),),
        ),
        Step(
            "exact-cuda",
            "the same run on the GPU, losses against exact-cpu",
            cmd("{fg} train {tiny} --device {dev} {exact} --log-json {runs}/exact-cuda.jsonl"),
            20,
            target=exact_target,
            needs=("tiny-graph",),
            outputs=(runs("exact-cuda.jsonl"),),
            figures=lambda: [
                *vs_cpu(runs("exact-cuda.jsonl")),
                *loss_bits(runs("exact-cpu.jsonl"), runs("exact-cuda.jsonl"), "exact-cpu", False),
            ],
        ),
        Step(
            "exact-rerun",
            "exact-cuda again: the device's rerun contract (the same bits run after run)",
            cmd("{fg} train {tiny} --device {dev} {exact} --log-json {runs}/exact-rerun.jsonl"),
            20,
            target="every epoch's loss bit for bit exact-cuda's",
            needs=("tiny-graph", "exact-cuda"),
            background=True,
            outputs=(runs("exact-rerun.jsonl"),),
            figures=partial(
                loss_bits, runs("exact-cuda.jsonl"), runs("exact-rerun.jsonl"), "exact-cuda", True
            ),
        ),
        Step(
            "nccl-1rank",
            "the same run through the nccl transport, world size 1: set-up, "
            "process group, device placement (its collectives short-cut at size 1)",
            cmd(
                "{fg} train {tiny} --transport {nccl} --device {dev} {exact} "
                "--log-json {runs}/nccl-1rank.jsonl"
            ),
            20,
            target=exact_target,
            needs=("tiny-graph",),
            outputs=(runs("nccl-1rank.jsonl"),),
            figures=partial(vs_cpu, runs("nccl-1rank.jsonl")),
        ),
        Step(
            "nccl-collectives",
            "NCCL all-reduce, all-to-all and all-gather on the world-size-1 "
            "group fullgraph's nccl communicator builds (its own collectives short-cut at size 1)",
            cmd("{py} -m bench.gpu_check_commands collectives --transport {nccl}"),
            20,
            target="every collective returns its input",
            needs=("install",),
        ),
        Step(
            "gloo-2ranks",
            "2 ranks on the one GPU (torchrun, gloo moving CUDA tensors): "
            "halo rows and halo gradients exchanged as device tensors between ranks",
            cmd(
                "{py} -m torch.distributed.run --standalone --nproc-per-node 2 -m fullgraph.cli "
                "train --parts {tiny2} --transport gloo --device {dev} --timeout 60 {exact} "
                "--log-json {runs}/gloo-2ranks.jsonl"
            ),
            35,
            target=exact_target,
            needs=("tiny-parts", "exact-cuda"),
            outputs=(runs("gloo-2ranks.jsonl"),),
            figures=lambda: [
                *vs_cpu(runs("gloo-2ranks.jsonl")),
                *loss_bits(runs("exact-cuda.jsonl"), runs("gloo-2ranks.jsonl"), "exact-cuda", True),
            ],
        ),
        Step(
            "predict-cpu",
            "fullgraph predict of exact-cpu's model file on the CPU, every "
            "node (the reference of predict)",
            cmd(
                "{fg} predict {tiny} --model {runs}/exact-cpu.model.pt --device cpu "
                "--threads 2 --out {runs}/predict-cpu --force --quiet"
            ),
            25,
            needs=("exact-cpu",),
            background=True,
            outputs=(runs("predict-cpu/predictions.npy"),),
        ),
        Step(
            "predict",
            "the same prediction on the device, against predict-cpu",
            cmd(
                "{fg} predict {tiny} --model {runs}/exact-cpu.model.pt --device {dev} "
                "--threads 2 --out {runs}/predict-dev --force --quiet"
            ),
            25,
            target="the same class for every node as predict-cpu",
            needs=("exact-cpu", "predict-cpu"),
            background=True,
            outputs=(runs("predict-dev/predictions.npy"),),
            figures=partial(predict_agreement, runs("predict-cpu"), runs("predict-dev")),
        ),
        Step(
            "spmm-arxiv",
            "SpMM fwd and fwd+bwd at F=64/128/256 on the arxiv-size graph: "
            "ours (Triton) vs cuSPARSE (torch.sparse.mm on CSR; transpose cached)",
            cmd(
                "{kernels} --graphs "
                + ("tiny" if dry else "arxiv")
                + " --data-root {data} --out {out}/kernels_arxiv.csv"
            ),
            35,
            target=spmm_target,
            needs=("install",),
            after=("kernel-tests", "exact-cpu", "exact-rerun", "predict-cpu", "predict"),
            outputs=(str(s.out / "kernels_arxiv.csv"),),
            figures=partial(spmm_figures, s.out / "kernels_arxiv.csv", dry),
        ),
        Step(
            "spmm-products",
            f"the same on the {big}-size graph",
            cmd("{kernels} --graphs {big1} --out {out}/kernels_products.csv"),
            60,
            target=spmm_target,
            needs=("big-graph",),
            outputs=(str(s.out / "kernels_products.csv"),),
            figures=partial(spmm_figures, s.out / "kernels_products.csv", dry),
        ),
        Step(
            "train-gcn",
            f"one-GPU training epochs, GCN 3 x 256 fp32, {big}-size graph",
            cmd("{fg} train --parts {big1} {train} --model gcn --log-json {runs}/train-gcn.jsonl"),
            75,
            target="none given: epoch time recorded",
            needs=("big-graph",),
            outputs=(runs("train-gcn.jsonl"),),
            figures=partial(train_figures, runs("train-gcn.jsonl")),
        ),
        Step(
            "train-bf16",
            "the GCN run of train-gcn in --precision bf16-mixed (bf16 tensor "
            "cores, forward halo rows and Triton sums of bf16 rows in float64)",
            cmd(
                "{fg} train --parts {big1} {train} --model gcn --precision bf16-mixed "
                "--log-json {runs}/train-bf16.jsonl"
            ),
            75,
            target=no_bf16 or "none given: epoch time and speed-up over train-gcn recorded",
            needs=("big-graph",),
            after=("train-gcn",),
            available=not no_bf16,
            outputs=(runs("train-bf16.jsonl"),),
            figures=partial(bf16_figures, runs("train-gcn.jsonl"), runs("train-bf16.jsonl")),
        ),
        Step(
            "train-sage",
            "the train-gcn run with GraphSAGE (mean) 3 x 256 fp32",
            cmd(
                "{fg} train --parts {big1} {train} --model sage --log-json {runs}/train-sage.jsonl"
            ),
            75,
            target="none given: epoch time recorded",
            needs=("big-graph",),
            outputs=(runs("train-sage.jsonl"),),
            figures=partial(train_figures, runs("train-sage.jsonl")),
        ),
    ]


def select(steps: list[Step], only: Sequence[str]) -> list[Step]:
    """The steps named in ``only`` and, transitively, the steps they need (in plan order)."""
    by_name = {s.name: s for s in steps}
    unknown = sorted(set(only) - set(by_name))
    if unknown:
        raise SystemExit(f"unknown step(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    chosen: set[str] = set()
    todo = list(only)
    while todo:
        name = todo.pop()
        if name not in chosen:
            chosen.add(name)
            todo.extend(by_name[name].needs)
    return [s for s in steps if s.name in chosen]


# -- figures -------------------------------------------------------------------------------------
def junit_figures(path: str) -> list[Figure]:
    """Passed, failed (+ errors) and skipped counts of a pytest JUnit XML report."""
    import xml.etree.ElementTree as ET

    if not Path(path).is_file():
        return [Figure("tests failed", None, "", "<=", 0, note=f"{path} not written")]
    suites = ET.parse(path).getroot()
    suites = [suites] if suites.tag == "testsuite" else list(suites.iter("testsuite"))
    total = {
        k: sum(int(x.get(k, 0)) for x in suites) for k in ("tests", "failures", "errors", "skipped")
    }
    failed = total["failures"] + total["errors"]
    passed = total["tests"] - failed - total["skipped"]
    return [
        Figure("tests passed", passed),
        Figure("tests failed", failed, "", "<=", 0),
        Figure("tests skipped (CUDA not seen?)", total["skipped"], "", "<=", 0),
    ]


def read_log(path: str) -> list[dict]:
    """The records of a ``--log-json`` file (one JSON object a line)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def read_losses(path: str) -> list[float]:
    """Per-epoch losses of a ``--log-json`` file."""
    return [r["loss"] for r in read_log(path) if not r.get("final")]


def loss_agreement(reference: str, path: str) -> list[Figure]:
    """Largest |loss - reference loss| over the epochs (both runs must have every epoch)."""
    name = f"max loss difference vs CPU, {EXACT_EPOCHS} epochs"
    try:
        ref, got = read_losses(reference), read_losses(path)
    except (OSError, ValueError, KeyError) as exc:
        return [Figure(name, None, "", "<=", EXACT_TOL, note=f"unreadable: {exc}")]
    if len(got) != EXACT_EPOCHS or len(ref) != EXACT_EPOCHS:
        note = f"epochs: {len(got)} here, {len(ref)} in the reference"
        return [Figure(name, None, "", "<=", EXACT_TOL, note=note)]
    return [
        Figure(name, max(abs(a - b) for a, b in zip(got, ref, strict=True)), "", "<=", EXACT_TOL)
    ]


def loss_bits(reference: str, path: str, against: str, contract: bool) -> list[Figure]:
    """The epochs whose loss differs in any bit from ``reference``'s (the JSON lines hold
    every loss's exact float), and the largest difference. ``contract``: the figure is a
    target (``<= 0``: the device's own contract, a rerun or another rank count on it), else it
    only states what holds (the GPU against the CPU: other GEMM kernels, other bits)."""
    name = f"epochs whose loss differs in any bit from {against}"
    op, bound = ("<=", 0.0) if contract else ("", None)
    try:
        ref, got = read_losses(reference), read_losses(path)
    except (OSError, ValueError, KeyError) as exc:
        return [Figure(name, None, "", op, bound, note=f"unreadable: {exc}")]
    if len(got) != len(ref) or not got:
        note = f"epochs: {len(got)} here, {len(ref)} in {against}"
        return [Figure(name, None, "", op, bound, note=note)]
    differing = sum(a != b for a, b in zip(got, ref, strict=True))
    largest = max(abs(a - b) for a, b in zip(got, ref, strict=True))
    return [
        Figure(name, float(differing), "", op, bound, note=f"of {len(got)}"),
        Figure(f"max loss difference vs {against}", largest, ""),
    ]


def _dry_cpu_without_bf16() -> str:
    """Why this CPU cannot run the dry run's bf16-mixed step, or ``""`` when it can."""
    from fullgraph.precision import bf16_unsupported

    why = bf16_unsupported("cpu")
    return f"the dry run's CPU computes no bfloat16: {why}" if why else ""


def bf16_figures(fp32: str, bf16: str) -> list[Figure]:
    """:func:`train_figures` of the bf16-mixed run and its speed-up over the float32 run."""
    figures = train_figures(bf16)
    try:
        ratio = _median_epoch(fp32) / _median_epoch(bf16)
    except (OSError, ValueError, KeyError, StopIteration, ZeroDivisionError) as exc:
        return [*figures, Figure("speed-up over float32", None, "x", note=f"unreadable: {exc}")]
    return [*figures, Figure("speed-up over float32 (median epoch)", ratio, "x")]


def _median_epoch(path: str) -> float:
    return float(next(r for r in read_log(path) if r.get("final"))["median_epoch_s"])


def predict_agreement(reference: str, path: str) -> list[Figure]:
    """The share of nodes whose predicted class equals the reference prediction's (read with
    the standard library only: a ``.npy`` of int64 in C order)."""
    name = "nodes predicted as on the CPU"
    try:
        want, got = (
            _npy_int64(Path(reference) / "predictions.npy"),
            _npy_int64(Path(path) / "predictions.npy"),
        )
    except (OSError, ValueError) as exc:
        return [Figure(name, None, "", ">=", 1.0, note=f"unreadable: {exc}")]
    if len(want) != len(got) or not want:
        return [Figure(name, None, "", ">=", 1.0, note=f"{len(got)} vs {len(want)} nodes")]
    same = sum(a == b for a, b in zip(got, want, strict=True)) / len(want)
    return [Figure(name, same, "", ">=", 1.0), Figure("nodes predicted", len(got))]


def _npy_int64(path: Path) -> list[int]:
    """The values of a 1-D little-endian int64 ``.npy`` file (format 1.0 / 2.0)."""
    import array
    import ast

    raw = path.read_bytes()
    if raw[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    major = raw[6]
    size_bytes = 2 if major == 1 else 4
    header_len = int.from_bytes(raw[8 : 8 + size_bytes], "little")
    start = 8 + size_bytes
    header = ast.literal_eval(raw[start : start + header_len].decode("latin1"))
    if header.get("descr") != "<i8" or header.get("fortran_order"):
        raise ValueError(f"{path}: expected little-endian int64, got {header}")
    values = array.array("q")
    values.frombytes(raw[start + header_len :])
    return values.tolist()


def spmm_figures(path: Path, dry: bool) -> list[Figure]:
    """Ours against ``torch.sparse.mm`` and against the memory bandwidth, per F and mode."""
    peer = "torch.sparse.mm (CPU)" if dry else "cuSPARSE"
    bandwidth = "STREAM" if dry else "HBM"
    labels = {
        ("fwd", "speedup_vs_sparse_mm"): (f"fwd vs {peer}", "x", ">=", 1.0),
        ("fwdbwd", "speedup_vs_sparse_mm"): (f"fwd+bwd vs cached {peer}", "x", ">=", 1.0),
        ("fwd", "fraction_of_memory_bandwidth"): (f"fwd of {bandwidth}", "", ">=", 0.7),
        ("fwdbwd", "fraction_of_memory_bandwidth"): (f"fwd+bwd of {bandwidth}", "", ">=", 0.7),
    }
    if not path.is_file():
        return [Figure("spmm rows", None, note=f"{path} not written")]
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if (row["what"], row["provider"]) == ("machine", "device-copy"):
                out.append(Figure("device copy bandwidth", float(row["y"]), "GB/s"))
            mode = row["what"].rpartition("-")[2]
            label = labels.get((mode, row["metric"]))
            if label is None or row["provider"] != "ours":
                continue
            graph = row["what"][len("spmm-") : -len(mode) - 1]
            text, unit, op, bound = label
            name = f"{graph} F={row['x']}: {text}"
            out.append(Figure(name, float(row["y"]), unit, op, bound))
    if not any(f.op for f in out):
        out.append(Figure("spmm rows", None, "", ">=", 1.0, note=f"none of ours in {path}"))
    return out


def train_figures(path: str) -> list[Figure]:
    """Median and first epoch time and the test accuracy of a ``--log-json`` file."""
    try:
        rows = read_log(path)
        final = next(r for r in rows if r.get("final"))
        epochs = [r for r in rows if not r.get("final")]
        return [
            Figure("median epoch", final["median_epoch_s"], "s"),
            Figure("first epoch (compiles)", epochs[0]["epoch_s"], "s"),
            Figure("test accuracy", final["test_acc"]),
        ]
    except (OSError, ValueError, KeyError, StopIteration, IndexError) as exc:
        return [Figure("median epoch", None, "s", note=f"unreadable: {exc}")]


# -- running -------------------------------------------------------------------------------------
@dataclass
class Running:
    """A started step; a watcher thread ends its process group at its limit."""

    step: Step
    proc: subprocess.Popen | None
    started: float
    log: Path
    error: str = ""
    ended: float | None = None
    timed_out: bool = False
    watcher: threading.Thread | None = None


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to a step's process group, SIGKILL to what is left of it after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie still counts as a member of the group
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def watch(r: Running, limit_s: float) -> None:
    """Wait for ``r``'s process up to ``limit_s``; then (or when it exits) end its group, so
    nothing a step started outlives it (GPU memory held by an orphaned rank, say)."""
    assert r.proc is not None
    try:
        r.proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        r.timed_out = True
        end_group(r.proc)
        r.proc.wait()
    r.ended = time.monotonic()
    try:
        os.killpg(r.proc.pid, signal.SIGKILL)  # leftovers of a step that exited
    except ProcessLookupError:
        pass


def step_env(s: Settings) -> dict[str, str]:
    """The steps' environment: unbuffered output; on the GPU no interpreter or forced kernel;
    the install step's fallback finder (``work/shim``) on the path when it had to write one."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not s.dry:
        env.pop("TRITON_INTERPRET", None)
        env.pop("FULLGRAPH_KERNEL", None)
    shim = s.work / "shim"
    if (shim / "sitecustomize.py").is_file():
        path = [str(shim), str(REPO), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env


def start(step: Step, s: Settings, limit_s: float) -> Running:
    """Start ``step`` in a process group of its own (output to its log file) and its watcher."""
    log = s.work / "logs" / f"{step.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    for out in step.outputs:
        Path(out).unlink(missing_ok=True)
    now = time.monotonic()
    with open(log, "w") as f:
        f.write(f"$ {shlex.join(step.command)}\n")
        f.flush()
        try:
            proc = subprocess.Popen(
                step.command,
                cwd=REPO,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=step_env(s),
                **NEW_GROUP,
            )
        except OSError as exc:
            return Running(step, None, now, log, error=f"could not start: {exc}")
    r = Running(step, proc, now, log)
    r.watcher = threading.Thread(target=watch, args=(r, limit_s), daemon=True)
    r.watcher.start()
    return r


def finish(r: Running, dry: bool) -> Result:
    """Wait for a started step (its watcher ends it at its limit); its result."""
    if r.proc is None or r.watcher is None:
        return Result(r.step.name, "failed", 0.0, None, r.error, log=r.error)
    r.watcher.join()
    seconds = (r.ended or time.monotonic()) - r.started
    rc = r.proc.returncode
    if r.timed_out:
        status, detail = "timed out", f"ended at its limit, {seconds:.0f} s"
    elif rc == 0:
        status, detail = ("parsed" if dry and r.step.gpu_only else "passed"), ""
    else:
        status, detail = "failed", f"exit status {rc}"
    return Result(r.step.name, status, seconds, rc, detail, log=r.log.read_text(errors="replace"))


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def report_end(res: Result) -> None:
    say(
        f"{res.step}: {res.status} in {res.seconds:.1f} s"
        + (f" ({res.detail})" if res.detail else "")
    )
    if res.status not in OK:
        for line in res.log.splitlines()[-20:]:
            print(f"    | {line}", flush=True)


class Interrupted(Exception):
    """The driver got SIGTERM, SIGINT or SIGHUP (the call's own limit, Ctrl-C)."""


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


def run_steps(steps: list[Step], s: Settings, deadline_s: float | None = None) -> list[Result]:
    """Run ``steps`` (see :class:`Step`); every step gets a :class:`Result`, in plan order.

    On SIGTERM, SIGINT or SIGHUP the running steps' process groups are ended (marked
    ``interrupted``), the steps not started are ``not run``, and the results still return, so
    that the summary is written.
    """
    results: dict[str, Result] = {}
    running: dict[str, Running] = {}
    end = time.monotonic() + (deadline_s or DEADLINE_S * s.budget_factor)

    def join(name: str) -> None:
        if name in running:
            results[name] = finish(running[name], s.dry)
            del running[name]
            report_end(results[name])

    previous = {}
    if threading.current_thread() is threading.main_thread():  # where Python takes signals
        signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {sig: signal.signal(sig, _interrupt) for sig in signals}
    try:
        for i, step in enumerate(steps, 1):
            for dep in (*step.needs, *step.after):
                join(dep)
            if not step.available:
                results[step.name] = Result(step.name, "not available", detail=step.target)
                say(f"{step.name}: not available ({step.target})")
                continue
            failed = [d for d in step.needs if results.get(d, Result(d, "")).status not in OK]
            if failed:
                detail = f"needs {', '.join(failed)}"
                results[step.name] = Result(step.name, "skipped", detail=detail)
                say(f"{step.name}: skipped ({detail})")
                continue
            left = end - time.monotonic()
            if left < 5:
                results[step.name] = Result(step.name, "not run", detail="the call's deadline")
                say(f"{step.name}: not run (the call's deadline)")
                continue
            limit = min(step.budget_s * s.budget_factor, left)
            bg = ", background" if step.background else ""
            say(f"[{i}/{len(steps)}] {step.name} (budget {limit:.0f} s{bg}): {step.what}")
            running[step.name] = start(step, s, limit)
            if not step.background:
                join(step.name)
        for name in list(running):
            join(name)
    except Interrupted as exc:
        say(f"{exc}: ending {', '.join(running) or 'no step'}; writing the summary")
        for name, r in running.items():
            if r.proc is not None:
                end_group(r.proc)
            log = r.log.read_text(errors="replace") if r.log.is_file() else ""
            seconds = time.monotonic() - r.started
            results[name] = Result(name, "interrupted", seconds, None, f"driver got {exc}", log=log)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for st in steps:
        results.setdefault(st.name, Result(st.name, "not run", detail="the driver was interrupted"))
    by_step = {st.name: st for st in steps}
    for res in results.values():
        fig = by_step[res.step].figures
        if fig is not None and res.status == "passed":
            try:
                res.figures = [f.judge(s.dry) for f in fig()]
            except Exception as exc:  # a figure reader's bug must not lose the summary
                res.figures = [Figure("figures", None, note=f"reader failed: {exc!r}")]
    return [results[st.name] for st in steps]


def run_check(args: argparse.Namespace) -> int:
    """Run the plan (or ``--only`` steps), write the summary; 1 when a step did not run as it
    should."""
    dry = args.dry or os.environ.get("GPU_CHECK_DRY", "0") == "1"
    out = Path(args.out or os.environ.get("OUT") or REPO / "bench" / "results" / "gpu_check")
    work = Path(args.work or os.environ.get("GPU_CHECK_WORK") or "/tmp/fg-gpu-check")
    s = Settings(dry, args.python, out.resolve(), work.resolve())
    steps = plan(s)
    only = args.only or os.environ.get("GPU_CHECK_ONLY", "")
    if only:
        steps = select(steps, [n.strip() for n in only.split(",") if n.strip()])
    s.out.mkdir(parents=True, exist_ok=True)
    s.work.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    fg = sum(st.budget_s for st in steps if not st.background)
    say(
        f"GPU check, {s.mode} run: {len(steps)} steps, {fg} s of foreground budgets "
        f"(x{s.budget_factor}), python {s.python}, out {s.out}, work {s.work}"
    )
    t0 = time.monotonic()
    results = run_steps(steps, s, args.deadline)
    env_file = s.work / "env.json"
    doc = {
        "mode": s.mode,
        "started": started,
        "wall_s": round(time.monotonic() - t0, 1),
        "git_rev": git_revision(),
        "machine": machine_name(),
        "env": json.loads(env_file.read_text()) if env_file.is_file() else {},
        "deadline_s": args.deadline or DEADLINE_S * s.budget_factor,
        "foreground_budget_s": fg,
        "steps": [step_record(st, r) for st, r in zip(steps, results, strict=True)],
    }
    write_summary(doc, s.out, {r.step: r.log for r in results})
    bad = [r.step for r in results if r.status not in OK]
    met = [f.met for r in results for f in r.figures if f.met is not None]
    targets = "" if dry else f"; targets: {sum(met)} met, {len(met) - sum(met)} missed"
    not_ok = f"; not: {', '.join(bad)}" if bad else ""
    print(f"\n{len(results) - len(bad)}/{len(results)} steps ran as they should{not_ok}{targets}")
    print(f"written: {s.out}/gpu_check.{{csv,json,md,log}}", flush=True)
    return 1 if bad else 0


def step_record(step: Step, r: Result) -> dict:
    """One step of the summary document (:mod:`bench.gpu_check_report`)."""
    return {
        "name": step.name,
        "what": step.what,
        "command": list(step.command),
        "status": r.status,
        "detail": r.detail,
        "returncode": r.returncode,
        "seconds": round(r.seconds, 2),
        "budget_s": step.budget_s,
        "background": step.background,
        "target": step.target,
        "figures": [asdict(f) for f in r.figures],
        "log_tail": r.log.splitlines()[-30:],
    }


def list_steps(args: argparse.Namespace) -> int:
    """Print the GPU run's steps as a markdown table (docs/kernels.md holds it)."""
    steps = plan(Settings(False, "python3", Path("OUT"), Path("/tmp/fg-gpu-check")))
    print("| step | budget | runs | target |\n|---|---:|---|---|")
    for st in steps:
        budget = f"{st.budget_s} s" + " (bg)" * st.background if st.available else "-"
        print(f"| `{st.name}` | {budget} | {st.what} | {st.target} |")
    fg = sum(st.budget_s for st in steps if not st.background)
    print(f"\nforeground budgets: {fg} s; no step starts after {DEADLINE_S} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the steps, write the summary")
    r.add_argument("--out", help="summary directory (default $OUT, else bench/results/gpu_check)")
    r.add_argument("--work", help="scratch (default $GPU_CHECK_WORK, else /tmp/fg-gpu-check)")
    r.add_argument("--dry", action="store_true", help="no GPU: CPU, tiny graph (GPU_CHECK_DRY=1)")
    r.add_argument("--only", help="comma list of steps, with what they need (GPU_CHECK_ONLY)")
    r.add_argument("--python", default=sys.executable, help="interpreter of the steps")
    r.add_argument("--deadline", type=float, help=f"no step starts later (default {DEADLINE_S} s)")
    r.set_defaults(func=run_check)
    d = sub.add_parser("fill-doc", help="fill docs/kernels.md's GPU section from a summary")
    d.add_argument("summary", type=Path, help="gpu_check.json of a GPU run")
    d.add_argument("doc", nargs="?", type=Path, default=REPO / "docs" / "kernels.md")
    d.add_argument("--allow-dry", action="store_true", help="accept a dry run's summary (tests)")
    d.set_defaults(func=lambda a: fill_doc(a.summary, a.doc, a.allow_dry))
    ls = sub.add_parser("list", help="the steps as a markdown table")
    ls.set_defaults(func=list_steps)
    args = p.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
