"""Benchmark of compressed halo exchange (issue 5): bytes, accuracy, codec overhead, link model.

For each dataset (arxiv-like synthetic graph, Amazon Computers, Coauthor Physics) one
``mpirun -n P`` launch (METIS partition, seed 0, the same for every run) trains a GCN with
hidden 256 under every codec and seed, each run from the same initial weights as its fp32 peer:

- bytes: halo bytes of one training step (forward + backward, counted where sent, summed over
  ranks) against fp32; targets int8 >= 3.5x fewer, int4 >= 6.5x, int2 >= 11x;
- accuracy: test accuracy at the best validation epoch, mean of the seeds; targets int8 within
  0.3 points of fp32, int4 within 0.5, int2 within 1.5; int2 with error feedback reported beside;
- time: quantize + pack + unpack seconds per step (max over ranks) / fp32 step time (target
  <= 10% at hidden 256);
- projected epoch time on a link of bandwidth B (10 Gb/s, 100 Gb/s, 400 GB/s), the link model
  ``v1`` of ``bench/link_model.py`` with one rank a node: ``T = compute_fp32 + codec +
  blocked + (max over ranks of halo + all-reduce bytes sent) / B``, compute = measured step time
  minus the time blocked in the exchange and all-reduce, ``blocked`` = that blocked time (the
  wait for the slowest rank stays on a network), no overlap credited. B is nominal here; the
  measured links of ``bench/multinode_compress.py`` carry less.

Usage: ``python -m bench.compress [--datasets arxiv-synth,amazon-computers,coauthor-physics]
[--epochs arxiv-synth=4,amazon-computers=80,coauthor-physics=30] [--seeds 0,1,2]
[--out bench/results]``. Writes
``OUT/compress.csv`` (long format, bench/common.py), ``OUT/compress_accuracy.png`` and
``OUT/compress_links.png``; prints a table and the targets met or missed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.child import bench_command, child_env, run_checked
from bench.common import CSVWriter, command_line
from bench.link_model import LinkRun, projected_epoch_s
from bench.plot import BarPanel, Bars, LinePanel, Series, save_figure

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHARED = REPO.parent / "shared" / "datasets"
#: (label, forward codec, backward codec, error feedback)
CONFIGS = [
    ("fp32", "none", "none", False),
    ("fp16", "fp16", "fp16", False),
    ("bf16", "bf16", "bf16", False),
    ("int8", "int8", "int8", False),
    ("int4", "int4", "int4", False),
    ("int2", "int2", "int2", False),
    ("int2+ef", "int2", "int2", True),
]
TARGET_RATIO = {"int8": 3.5, "int4": 6.5, "int2": 11.0}
TARGET_POINTS = {"int8": 0.3, "int4": 0.5, "int2": 1.5}
LINKS = {"10Gb/s": 10e9 / 8, "100Gb/s": 100e9 / 8, "400GB/s": 400e9}
#: Per dataset: layers, input dropout (0 precomputes the first aggregation), lr. With 3 layers
#: on arxiv-synth (first aggregation precomputed) the exchanges are 256 and 40 wide; with 2
#: layers and input dropout on the real graphs they are 256 and the class count wide.
RECIPES = {
    "arxiv-synth": {"layers": 3, "input_dropout": 0.0, "lr": 0.01},
    "amazon-computers": {"layers": 2, "input_dropout": 0.5, "lr": 0.01},
    "coauthor-physics": {"layers": 2, "input_dropout": 0.5, "lr": 0.005},
}
DEFAULT_EPOCHS = "arxiv-synth=4,amazon-computers=80,coauthor-physics=30"


# -- worker: one rank of the mpirun launch ----------------------------------------------------
def worker(a: argparse.Namespace) -> None:
    """Train every config x seed on this rank's part; rank 0 writes the results as JSON."""
    import torch

    from fullgraph.distributed.launch import detect_launch
    from fullgraph.partition import load_partition
    from fullgraph.run.rank_start import start_rank
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    comm, _ = start_rank("bench", detect_launch(), "mpi", 900, 1)  # as `fullgraph train`
    part = load_partition(a.parts, comm.rank, mmap=False)
    results = []
    for label, fwd, bwd, ef in CONFIGS:
        if label not in a.configs.split(","):
            continue
        for seed in [int(s) for s in a.seeds.split(",")]:
            cfg = TrainConfig(
                model="gcn",
                layers=a.layers,
                hidden=256,
                dropout=0.5,
                input_dropout=a.input_dropout,
                lr=a.lr,
                epochs=a.worker_epochs,
                seed=seed,
                compress_fwd=fwd,
                compress_bwd=bwd,
                error_feedback=ef,
            )
            tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
            best_val, test_at_best, steps = -1.0, 0.0, []
            for epoch in range(1, a.worker_epochs + 1):
                halo0, red0 = comm.bytes_sent["halo"], comm.bytes_sent["reduce"]
                step = tr.train_step(epoch)
                sent = comm.bytes_sent["halo"] - halo0
                reduced = comm.bytes_sent["reduce"] - red0
                local = [step.seconds, step.seconds - step.comm_s - step.reduce_s, step.codec_s]
                stats = torch.tensor([*local, sent + reduced], dtype=torch.float64)
                maxes = comm.allreduce_(stats.clone(), "max", tag="bench").tolist()
                total = comm.allreduce_(torch.tensor([float(sent)], dtype=torch.float64), "sum")
                steps.append(
                    {
                        "step_s": maxes[0],
                        "compute_s": maxes[1],
                        "codec_s": maxes[2],
                        "max_rank_bytes": maxes[3],
                        "halo_bytes": float(total[0]),
                    }
                )
                if epoch % a.eval_every == 0 or epoch == a.worker_epochs:
                    acc = tr.evaluate()
                    if acc["val_acc"] > best_val:
                        best_val, test_at_best = acc["val_acc"], acc["test_acc"]
            timed = steps[1:] or steps  # the first step pays for warm-up
            summary = {k: statistics.median(s[k] for s in timed) for k in timed[0]}
            summary.update(label=label, seed=seed, best_val=best_val, test_acc=test_at_best)
            results.append(summary)
            if comm.rank == 0:
                print(json.dumps(summary), flush=True)
    if comm.rank == 0:
        Path(a.result).write_text(json.dumps(results))
    comm.close()


# -- driver -----------------------------------------------------------------------------------
def prepare(name: str, tmp: Path, arxiv_root: Path, ranks: int, parts_root: Path) -> Path:
    """The METIS partition of ``name`` into ``ranks`` parts (written once, then reused)."""
    out = parts_root / f"{name}-{ranks}"
    if (out / "meta.json").is_file():
        return out
    from fullgraph.datasets import load
    from fullgraph.partition import partition_graph

    if name == "arxiv-synth":
        root = arxiv_root
    else:
        raw = SHARED / name.replace("-", "_") / "raw"
        if not raw.is_dir():
            raise SystemExit(f"{raw} not found: cannot benchmark {name}")
        root = tmp
        (root / name.replace("-", "_")).mkdir(parents=True, exist_ok=True)
        link = root / name.replace("-", "_") / "raw"
        if not link.exists():
            link.symlink_to(raw)
    partition_graph(load(name, root), ranks, out, method="metis", seed=0)
    return out


def run_dataset(name: str, parts: Path, a: argparse.Namespace, out: Path) -> list[dict]:
    """One mpirun launch training every config and seed on ``name``; its results."""
    r = RECIPES[name]
    epochs = {k: int(v) for k, v in (e.split("=") for e in a.epochs.split(","))}[name]
    result = out / f"compress-{name}.json"
    cmd = [str(BIN / "mpirun"), "-n", str(a.ranks), *bench_command("compress", "--worker")]
    cmd += ["--parts", str(parts), "--result", str(result), "--seeds", a.seeds]
    cmd += ["--configs", a.configs, "--worker-epochs", str(epochs), "--layers", str(r["layers"])]
    cmd += ["--input-dropout", str(r["input_dropout"]), "--lr", str(r["lr"])]
    cmd += ["--eval-every", str(a.eval_every)]
    t0 = time.perf_counter()
    run_checked(cmd, env=child_env({"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}))
    print(
        f"{name}: {epochs} epochs x {len(a.seeds.split(','))} seeds x configs "
        f"{a.configs} in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    return json.loads(result.read_text())


def summarise(name: str, runs: list[dict], csv: CSVWriter, ranks: int) -> list[str]:
    """CSV rows and the per-config table of one dataset; returns the target verdict lines."""
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["label"], []).append(r)
    mean = {
        k: {m: statistics.mean(r[m] for r in v) for m in v[0] if m not in ("label",)}
        for k, v in by.items()
    }
    base = mean["fp32"]
    verdicts = []
    print(f"\n{name} (P={ranks}, hidden 256, mean of {len(by['fp32'])} seeds)")
    print(
        f"{'config':>8} {'test %':>7} {'d pts':>6} {'MB/step':>8} {'x fewer':>7} "
        f"{'codec %':>7} " + " ".join(f"{k:>9}" for k in LINKS)
    )
    for label, m in mean.items():
        ratio = base["halo_bytes"] / m["halo_bytes"]
        points = 100 * (base["test_acc"] - m["test_acc"])
        overhead = m["codec_s"] / base["step_s"]
        proj = {k: projected(base["compute_s"], m, bw) for k, bw in LINKS.items()}
        print(
            f"{label:>8} {100 * m['test_acc']:7.2f} {points:6.2f} {m['halo_bytes'] / 1e6:8.2f} "
            f"{ratio:7.2f} {100 * overhead:7.2f} " + " ".join(f"{v:9.3f}" for v in proj.values())
        )
        what = f"compress-{name}"
        csv.write(what, label, "test_acc", "%", "mean", 100 * m["test_acc"], ranks)
        csv.write(what, label, "halo_bytes_per_step", "B", "mean", m["halo_bytes"], ranks)
        csv.write(what, label, "bytes_ratio_vs_fp32", "x", "mean", ratio, ranks)
        csv.write(what, label, "codec_overhead", "fraction_of_fp32_step", "mean", overhead, ranks)
        csv.write(what, label, "step_s", "s", "mean", m["step_s"], ranks)
        for r in by[label]:
            csv.write(what, label, "test_acc", "%", f"seed{r['seed']}", 100 * r["test_acc"], ranks)
        for link, t in proj.items():
            csv.write(what, label, "projected_epoch_s", "s", link, t, ranks)
        kind = label.split("+")[0]
        if label in TARGET_RATIO:
            ok = ratio >= TARGET_RATIO[label]
            verdicts.append(
                f"{name}: {label} bytes {ratio:.2f}x fewer (target >= "
                f"{TARGET_RATIO[label]}x): {'met' if ok else 'MISSED'}"
            )
        if kind in TARGET_POINTS:
            ok = points <= TARGET_POINTS[kind]
            verdicts.append(
                f"{name}: {label} accuracy {points:+.2f} points below fp32 (target "
                f"<= {TARGET_POINTS[kind]}): {'met' if ok else 'MISSED'}"
            )
        if label != "fp32":
            ok = overhead <= 0.10
            verdicts.append(
                f"{name}: {label} codec overhead {100 * overhead:.1f}% of the fp32 "
                f"step (target <= 10%): {'met' if ok else 'MISSED'}"
            )
    return verdicts


def projected(compute_fp32: float, m: dict, bytes_per_s: float) -> float:
    """Link model v1 (bench/link_model.py), one rank a node, for a codec's measurements ``m``
    (``codec_s``, ``max_rank_bytes``, ``step_s``, ``compute_s``) at ``bytes_per_s``."""
    run = LinkRun(
        compute_s=compute_fp32,
        codec_s=m["codec_s"],
        max_rank_bytes=m["max_rank_bytes"],
        node_bytes=m["max_rank_bytes"],
        exchanges=0,
        blocked_s=m["step_s"] - m["compute_s"],
    )
    return projected_epoch_s(run, bytes_per_s * 8, model="v1")


def plot(all_runs: dict[str, list[dict]], out: Path) -> list[Path]:
    """Accuracy against bytes per step, and projected epoch time per link (one PNG each, one
    panel per dataset)."""
    accuracy, links = [], []
    for name, runs in all_runs.items():
        by: dict[str, list[dict]] = {}
        for r in runs:
            by.setdefault(r["label"], []).append(r)
        compute = statistics.mean(r["compute_s"] for r in by["fp32"])
        points, bars = [], []
        for label, rs in by.items():
            mb = statistics.mean(r["halo_bytes"] for r in rs) / 1e6
            acc = [100 * r["test_acc"] for r in rs]
            sd = statistics.pstdev(acc)
            points.append(
                Series(label, [mb], [statistics.mean(acc)], "o", None, yerr=[sd], annotate=True)
            )
            keys = ("codec_s", "max_rank_bytes", "step_s", "compute_s")
            mean = {k: statistics.mean(r[k] for r in rs) for k in keys}
            bars.append(Bars(label, [projected(compute, mean, bw) for bw in LINKS.values()]))
        accuracy.append(
            LinePanel(
                name,
                points,
                xlabel="halo MB per training step (all ranks)",
                ylabel="test accuracy % (mean ± sd of seeds)",
                logx=True,
                legend=False,
            )
        )
        links.append(
            BarPanel(name, list(LINKS), bars, ylabel="projected epoch s (link model v1)", logy=True)
        )
    return [
        save_figure(accuracy, out / "compress_accuracy.png", panel_size=(5.0, 4.0)),
        save_figure(links, out / "compress_links.png", panel_size=(5.0, 4.0)),
    ]


def main() -> None:
    """Parse arguments; run the worker (``--worker``) or the whole benchmark."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default="arxiv-synth,amazon-computers,coauthor-physics")
    ap.add_argument("--configs", default=",".join(c[0] for c in CONFIGS))
    ap.add_argument("--seeds", default="0,1,2", help="seeds (accuracy is their mean)")
    ap.add_argument("--epochs", default=DEFAULT_EPOCHS, help="epochs per dataset, name=N,...")
    ap.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--arxiv-root", default="/tmp/fg-data", help="root holding arxiv_synth")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--parts", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--worker-epochs", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--input-dropout", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--lr", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    import tempfile

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    csv = CSVWriter(out / "compress.csv")
    all_runs, verdicts = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.datasets.split(","):
            parts = prepare(name, Path(tmp), Path(a.arxiv_root), a.ranks, out / "parts")
            all_runs[name] = run_dataset(name, parts, a, out)
            verdicts += summarise(name, all_runs[name], csv, a.ranks)
    paths = plot(all_runs, out)
    print("\nTargets:\n  " + "\n  ".join(verdicts))
    print(f"\nwrote {csv.path}, {', '.join(str(p) for p in paths)}")
    print(f"reproduce: {command_line()}")


if __name__ == "__main__":
    main()
