"""Compressed halos measured over real links: P=4 across namespaces, against the link model.

docs/compression.md projected the epoch time of each halo codec on a link of bandwidth B from
a one-node run (:func:`bench.link_model.projected_epoch_s`, the ``model0`` figure here). This
benchmark measures it: arxiv-synth in 4 METIS parts, GCN 3 layers hidden 256 (the recipe of
``bench/compress.py``), 4 ranks x 1 thread, ``--transport mpi``, laid out as 2 nodes x 2 ranks
and 4 nodes x 1 rank of ``scripts/netns-cluster.sh``, links shaped to 1, 10 and 25 Gbit/s,
launched with mpirun + ``scripts/netns-exec.sh`` as on a cluster. Per layout, link and codec
(fp32, bf16, int8, int4, int2), interleaved within one launch (codec after codec, overlap on
then off, repeated), the median over the repetitions of:

- ``epoch_s``: a training step (forward, backward, gradient all-reduce, Adam), max over ranks;
- ``exchange_s``: the halo exchanges' blocked time with the overlap switched off (each
  exchange completes before anything else runs): what the exchanges cost;
- ``wait_s``: the same with the overlap on; ``hidden`` = 1 - wait_s / exchange_s, the share
  of the exchange the inner aggregation hides;
- ``model0_s`` / ``model_s``: the projections (:mod:`bench.link_model`) of the old model and of the
  corrected one from the one-node run (4 ranks in one namespace, shared memory) and the link
  rate measured between two nodes (a TCP stream, ``link_gbps`` rows).

Writes ``OUT/multinode_compress.csv`` (long format, bench/common.py) and
``OUT/multinode_compress.png``; prints the table with the model's error (measured / projected
- 1) and flags errors above 20%.

Usage (root; about 15 minutes here for arxiv-synth)::

    python -m bench.multinode_compress [--parts /tmp/fg-data/parts/arxiv-4] [--reps 3]
        [--rates 1gbit,10gbit,25gbit] [--layouts 2x2,4x1] [--codecs fp32,int8,...]
        [--one-node both|before] [--out bench/results]

At products size (a step takes most of a minute on this 2-core machine) a subset fits in half an
hour: ``--parts /tmp/fg-data/parts/products-4 --reps 1 --rates 1gbit,10gbit --layouts 2x2
--codecs fp32,int8,int2 --one-node before``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.child import bench_command, child_env, run_checked
from bench.common import CSVWriter, command_line, tests_module
from bench.link_model import LinkRun, fit_report, projected_epoch_s, projected_exchange_s
from bench.plot import BarPanel, Bars, Marks, save_figure

#: The namespace cluster of the tests (tests/netns_cluster.py).
_netns = tests_module("netns_cluster")
NetnsCluster, cannot_make_namespaces = _netns.NetnsCluster, _netns.cannot_make_namespaces

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: (label, forward codec, backward codec)
CODECS = [
    ("fp32", "none", "none"),
    ("bf16", "bf16", "bf16"),
    ("int8", "int8", "int8"),
    ("int4", "int4", "int4"),
    ("int2", "int2", "int2"),
]
RATE_BITS = {"1gbit": 1e9, "10gbit": 10e9, "25gbit": 25e9}


# -- worker: one rank ---------------------------------------------------------------------
def worker(a: argparse.Namespace) -> None:
    """Every codec x overlap, interleaved, ``reps + 1`` times; rank 0 writes the medians."""
    import numpy as np
    import torch

    from fullgraph.distributed.compression import HaloCompression
    from fullgraph.distributed.launch import detect_launch
    from fullgraph.partition import load_partition
    from fullgraph.run.rank_start import start_rank
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    comm, _ = start_rank("bench", detect_launch(), "mpi", 600, 1)  # as `fullgraph train`
    part = load_partition(a.parts, comm.rank, mmap=False)
    cfg = TrainConfig(
        model="gcn",
        layers=3,
        hidden=256,
        dropout=0.5,
        input_dropout=0.0,
        lr=0.01,
        epochs=a.reps + 1,
        seed=0,
    )
    tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
    del part  # as `fullgraph train` does: the trainer holds what it trains on
    plans = tr.ctx.plans()  # the whole plan and the pruned layers' ones
    codecs = {
        label: None if fwd == "none" else HaloCompression(fwd, bwd, seed=0, rank=comm.rank)
        for label, fwd, bwd in CODECS
        if label in a.codecs.split(",")
    }
    # Bytes this rank sends to each peer (every all-to-all: halo rows and the gradient sums).
    to_peer, calls = np.zeros(comm.size), [0]
    send_impl = comm._alltoallv

    def counting(send, recv, send_rows, recv_rows):  # type: ignore[no-untyped-def]
        width = int(np.prod(send.shape[1:])) if send.dim() > 1 else 1
        to_peer[:] += np.asarray(send_rows) * width * send.element_size()
        calls[0] += 1
        return send_impl(send, recv, send_rows, recv_rows)

    comm._alltoallv = counting  # type: ignore[method-assign]
    samples: dict[tuple[str, bool], list[dict]] = {}
    for rep in range(a.reps + 1):
        for label in codecs:
            for overlap in (True, False):
                for plan in plans:
                    plan.compression, plan.overlap = codecs[label], overlap
                comm.barrier()
                to_peer[:], calls[0] = 0, 0
                step = tr.train_step(rep + 1)
                exchanges = calls[0]
                local = [step.seconds, step.comm_s, step.reduce_s, step.codec_s]
                maxes = comm.allreduce_(torch.tensor(local, dtype=torch.float64), "max")
                matrix = comm.allgather_object(to_peer.tolist())
                if rep > 0:  # the first round pays for warm-up
                    samples.setdefault((label, overlap), []).append(
                        {
                            "step_s": float(maxes[0]),
                            "halo_wait_s": float(maxes[1]),
                            "reduce_s": float(maxes[2]),
                            "codec_s": float(maxes[3]),
                            "exchanges": exchanges,
                            "peer_bytes": matrix,
                        }
                    )
    if comm.rank == 0:
        out = []
        for (label, overlap), rows in samples.items():
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "peer_bytes"}
            med.update(label=label, overlap=overlap, peer_bytes=rows[-1]["peer_bytes"])
            med["samples"] = [r["step_s"] for r in rows]
            out.append(med)
        Path(a.result).write_text(json.dumps(out))
    comm.close()


# -- driver -------------------------------------------------------------------------------
def link_gbps(cluster: NetnsCluster, megabytes: float = 200.0) -> tuple[float, float]:
    """TCP throughput (Gbit/s, one stream) from node 1 to node 2, and the round trip (ms)."""
    code = r"""
import socket, sys, time
mode, host, n = sys.argv[1], sys.argv[2], int(float(sys.argv[3]))
if mode == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5299)); s.listen(1); print("ready", flush=True)
    c, _ = s.accept(); buf = bytearray(1 << 20); got = 0
    for _ in range(200):
        c.recv_into(buf, 1); c.sendall(b"x")
    t0 = None
    while got < n:
        k = c.recv_into(buf)
        if not k: break
        t0 = t0 or time.perf_counter(); got += k
    dt = time.perf_counter() - t0; c.sendall(b"%f" % dt); c.close()
else:
    c = socket.create_connection((host, 5299))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    for _ in range(200):
        c.sendall(b"x"); c.recv(1)
    rtt = (time.perf_counter() - t0) / 200
    data = b"x" * (1 << 20); sent = 0
    while sent < n:
        c.sendall(data); sent += len(data)
    dt = float(c.recv(64)); print(n * 8 / dt / 1e9, rtt * 1e3)
"""
    n = str(megabytes * 1e6)
    server = subprocess.Popen(
        ["ip", "netns", "exec", cluster.node(1), sys.executable, "-c", code, "server", "-", n],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    client = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            cluster.node(0),
            sys.executable,
            "-c",
            code,
            "client",
            cluster.node(1),
            n,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    server.wait(timeout=60)
    gbps, rtt_ms = (float(v) for v in client.stdout.split())
    return gbps, rtt_ms


def rss_sampler(pattern: str, stop: threading.Event, peak: list[float]) -> None:
    """Sum of RSS (GiB) over processes whose command line contains ``pattern``, its peak."""
    while not stop.wait(1.0):
        total = 0
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if pattern.encode() not in (d / "cmdline").read_bytes():
                    continue
                for line in (d / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                continue
        peak[0] = max(peak[0], total / 2**20)


def launch(cmd: list[str], result: Path, what: str) -> list[dict]:
    """Run one benchmark launch; its worker's results."""
    env = child_env({"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"})
    stop, peak = threading.Event(), [0.0]
    sampler = threading.Thread(target=rss_sampler, args=(str(result), stop, peak), daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    try:
        run_checked(cmd, env=env)
    finally:
        stop.set()
    print(
        f"{what}: {time.perf_counter() - t0:.0f} s, peak RSS over ranks {peak[0]:.1f} GiB",
        flush=True,
    )
    return json.loads(result.read_text())


def worker_argv(a: argparse.Namespace, result: Path) -> list[str]:
    return bench_command(
        "multinode_compress",
        "--worker",
        "--parts",
        a.parts,
        "--reps",
        str(a.reps),
        "--codecs",
        a.codecs,
        "--result",
        str(result),
    )


def main() -> None:
    """Parse arguments; run the worker (``--worker``) or the whole benchmark."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="/tmp/fg-data/parts/arxiv-4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rates", default="1gbit,10gbit,25gbit")
    ap.add_argument("--layouts", default="2x2,4x1")
    ap.add_argument("--codecs", default=",".join(c[0] for c in CODECS))
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument(
        "--one-node",
        choices=("both", "before"),
        default="both",
        help="one-node reference runs before and after the cluster runs (their mean), or "
        "before only (products size: each launch takes minutes)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument(
        "--summarise-only",
        action="store_true",
        help="rebuild the CSV, table and chart from the JSON results in --out",
    )
    a = ap.parse_args()
    chosen_codecs(a.codecs)
    if a.worker:
        worker(a)
        return
    if a.summarise_only:
        report(Path(a.out), a)
        return
    reason = cannot_make_namespaces()
    if reason:
        raise SystemExit(f"multinode_compress: cannot build the cluster: {reason}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {}
    link: dict[str, tuple[float, float]] = {}

    # The one-node run, what the projections start from: before and after the cluster runs
    # (their mean), so that a slow spell of this shared machine does not bias the model.
    def one_node(when: str) -> list[dict]:
        result = out / f"multinode-one-node-{when}.json"
        cmd = [str(BIN / "mpirun"), "-n", "4", *worker_argv(a, result)]
        return launch(cmd, result, f"one node, 4 ranks (shared memory), {when}")

    one_node("before")
    for layout in a.layouts.split(","):
        nodes, per_node = (int(v) for v in layout.split("x"))
        with NetnsCluster(nodes, rate=a.rates.split(",")[0]) as cluster:
            for rate in a.rates.split(","):
                cluster.rate = rate
                cluster.up()  # re-shapes every link
                if rate not in link:  # the best of three streams: the link, not a busy spell
                    link[rate] = max((link_gbps(cluster) for _ in range(3)), key=lambda t: t[0])
                    print(
                        f"link {rate}: {link[rate][0]:.2f} Gbit/s measured, round trip "
                        f"{link[rate][1]:.3f} ms",
                        flush=True,
                    )
                result = out / f"multinode-{layout}-{rate}.json"
                cmd = cluster.mpirun(nodes * per_node, per_node, worker_argv(a, result))
                runs[f"{layout}/{rate}"] = launch(cmd, result, f"{layout} at {rate}")
    if a.one_node == "both":
        one_node("after")
    (out / "multinode-links.json").write_text(json.dumps(link))
    report(out, a)


def report(out: Path, a: argparse.Namespace) -> None:
    """The CSV (rewritten), table and chart from the JSON results in ``out``."""
    link = {k: tuple(v) for k, v in json.loads((out / "multinode-links.json").read_text()).items()}
    load = lambda name: json.loads((out / f"multinode-{name}.json").read_text())  # noqa: E731
    before = load("one-node-before")
    after = load("one-node-after") if a.one_node == "both" else before
    runs = {"one-node": mean_runs(before, after)}
    for layout in a.layouts.split(","):
        for rate in a.rates.split(","):
            runs[f"{layout}/{rate}"] = load(f"{layout}-{rate}")
    (out / "multinode_compress.csv").unlink(missing_ok=True)
    csv = CSVWriter(out / "multinode_compress.csv")
    table = summarise(runs, link, csv, a)
    png = plot(table, out / "multinode_compress.png", dataset_of(a.parts))
    print(f"\nwrote {csv.path}, {png}\nreproduce: {command_line()}")


def mean_runs(a: list[dict], b: list[dict]) -> list[dict]:
    """The mean of two one-node runs' medians (times; bytes are the same)."""
    other = by_key(b)
    out = []
    for r in a:
        s = other[(r["label"], r["overlap"])]
        out.append(
            {
                **r,
                **{k: (r[k] + s[k]) / 2 for k in ("step_s", "halo_wait_s", "reduce_s", "codec_s")},
            }
        )
    return out


def by_key(rows: list[dict]) -> dict[tuple[str, bool], dict]:
    return {(r["label"], r["overlap"]): r for r in rows}


def chosen_codecs(codecs: str) -> list[str]:
    """The labels of ``--codecs`` in :data:`CODECS` order (unknown ones refused)."""
    wanted = [c for c in codecs.split(",") if c]
    known = [label for label, _, _ in CODECS]
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise SystemExit(f"unknown codec(s) {unknown}; known: {', '.join(known)}")
    return [label for label in known if label in wanted]


def summarise(
    runs: dict[str, list[dict]],
    link: dict[str, tuple[float, float]],
    csv: CSVWriter,
    a: argparse.Namespace,
) -> list[dict]:
    """The measured table beside both models; CSV rows; returns the table."""
    one = by_key(runs["one-node"])
    table = []
    for rate, (gbps, rtt) in link.items():
        csv.write("multinode-link", "tcp-stream", "throughput", "Gbit/s", rate, gbps, 2)
        csv.write("multinode-link", "tcp-stream", "round_trip", "ms", rate, rtt, 2)
    print(
        f"\n{'layout':>6} {'link':>7} {'codec':>5} {'epoch s':>8} {'exch s':>7} "
        f"{'hidden':>6} {'model0':>7} {'err0':>6} {'model':>7} {'err':>6} {'blocked':>7} "
        f"{'x0':>6} {'xerr0':>6} {'x1':>6} {'xerr':>6}"
    )
    for key, rows in runs.items():
        if key == "one-node":
            continue
        layout, rate = key.split("/")
        nodes, per_node = (int(v) for v in layout.split("x"))
        got = by_key(rows)
        for label in chosen_codecs(a.codecs):
            on, off = got[(label, True)], got[(label, False)]
            base = LinkRun.from_worker(
                one[("fp32", True)], one[(label, True)], per_node, one[(label, False)]
            )
            measured_bits, rtt_s = link[rate][0] * 1e9, link[rate][1] / 1e3
            m0 = projected_epoch_s(base, RATE_BITS[rate], model="v0")
            m1 = projected_epoch_s(base, measured_bits, model="v1", rtt_s=rtt_s)
            x0 = projected_exchange_s(base, RATE_BITS[rate], model="v0")
            x1 = projected_exchange_s(base, measured_bits, model="v1", rtt_s=rtt_s)
            exchange, wait = off["halo_wait_s"], on["halo_wait_s"]
            blocked = off["halo_wait_s"] + off["reduce_s"]
            row = {
                "layout": layout,
                "rate": rate,
                "codec": label,
                "epoch_s": on["step_s"],
                "epoch_no_overlap_s": off["step_s"],
                "exchange_s": exchange,
                "wait_s": wait,
                "hidden": max(0.0, 1.0 - wait / exchange) if exchange > 0 else 0.0,
                "model0_s": m0,
                "model_s": m1,
                "codec_s": on["codec_s"],
                "inter_node_bytes": base.node_bytes,
                "blocked_s": blocked,
                "model0_blocked_s": x0,
                "model_blocked_s": x1,
            }
            row["err0"], row["err"] = row["epoch_s"] / m0 - 1, row["epoch_s"] / m1 - 1
            row["xerr0"], row["xerr"] = blocked / x0 - 1, blocked / x1 - 1
            table.append(row)
            what = f"multinode-{layout}"
            for metric, unit in (
                ("epoch_s", "s"),
                ("exchange_s", "s"),
                ("wait_s", "s"),
                ("hidden", "fraction"),
                ("model0_s", "s"),
                ("model_s", "s"),
                ("err0", "fraction"),
                ("err", "fraction"),
                ("epoch_no_overlap_s", "s"),
                ("blocked_s", "s"),
                ("model0_blocked_s", "s"),
                ("model_blocked_s", "s"),
                ("xerr0", "fraction"),
                ("xerr", "fraction"),
                ("inter_node_bytes", "B"),
            ):
                csv.write(what, label, metric, unit, rate, row[metric], 4)
            flag = lambda e: f"{100 * e:+5.0f}%" + ("*" if abs(e) > 0.2 else " ")  # noqa: E731
            print(
                f"{layout:>6} {rate:>7} {label:>5} {row['epoch_s']:8.3f} {exchange:7.3f} "
                f"{100 * row['hidden']:5.0f}% {m0:7.3f} {flag(row['err0'])} {m1:7.3f} "
                f"{flag(row['err'])} {blocked:7.3f} {x0:6.3f} {flag(row['xerr0'])} {x1:6.3f} "
                f"{flag(row['xerr'])}"
            )
    for line in fit_report(table):
        print(line)
    return table


def dataset_of(parts: str) -> str:
    """The dataset a partition directory holds (its ``meta.json``), for titles."""
    try:
        return str(json.loads((Path(parts) / "meta.json").read_text())["dataset"])
    except (OSError, ValueError, KeyError):
        return Path(parts).name


def plot(table: list[dict], path: Path, dataset: str = "arxiv-synth") -> Path:
    """Top: epoch time per codec and link, one panel per layout; bottom: the time blocked in
    exchanges with the overlap off. Bars measured, ``o`` model v1, ``x`` the old model."""
    layouts = sorted({r["layout"] for r in table})
    rates = list(dict.fromkeys(r["rate"] for r in table))
    labels = list(dict.fromkeys(r["codec"] for r in table))
    rows = (
        ("epoch_s", "model_s", "model0_s", "epoch s"),
        (
            "blocked_s",
            "model_blocked_s",
            "model0_blocked_s",
            "blocked in exchanges, overlap off, s",
        ),
    )
    panels = []
    for measured, model, old, ylabel in rows:
        for layout in layouts:
            cell = {(r["rate"], r["codec"]): r for r in table if r["layout"] == layout}
            bars = []
            for label in labels:
                mine = [cell[(rt, label)] for rt in rates]
                marks = [
                    Marks([r[old] for r in mine], "x", color="k", size=5),
                    Marks([r[model] for r in mine], "o", hollow=True),
                ]
                bars.append(Bars(label, [r[measured] for r in mine], marks))
            panels.append(
                BarPanel(
                    f"{dataset} P=4 as {layout} (nodes x ranks), mpi, 1 thread/rank",
                    rates,
                    bars,
                    ylabel=f"{ylabel} (bars measured, o model, x old)",
                    logy=measured == "blocked_s",
                )
            )
    return save_figure(panels, path, ncols=len(layouts), panel_size=(7.0, 4.5))


if __name__ == "__main__":
    main()
