"""Peak memory of ``fullgraph data synth`` against the graph's size: chunked vs in memory.

Runs ``fullgraph data synth --preset P --scale S --format npy|csv`` in a child process for each
scale and reads the child's ``/proc/PID/status`` every 50 ms: the peak of ``RssAnon`` (its own
memory: what must fit) and of ``VmRSS`` (also the pages of the mapped files it writes, which
the kernel can drop at will), with ``VmHWM`` at the end. Wall time and bytes on disk too.
``--generate-only`` measures ``generate()`` in memory instead of a CSV write (the in-memory
path's peak without the CSV text).

Rows go to ``bench/results/synthetic_memory.csv`` (long format, ``bench/common.py``).

Usage::

    python -m bench.synthetic_memory --preset papers --scales 1/512 1/128 1/32
    python -m bench.synthetic_memory --preset papers --scales 1/128 --format csv --generate-only
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from bench.common import CSVWriter

RESULTS = Path(__file__).resolve().parent / "results"

_GENERATE = (
    "import sys; from fullgraph.datasets.synthetic import generate; "
    "g = generate(sys.argv[1], scale=float(sys.argv[2])); print(g.num_nodes, g.num_edges)"
)


def _status(pid: int) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/PID/status`` as bytes (empty once the process is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def run_sampled(cmd: list[str], interval: float = 0.05) -> dict[str, float]:
    """Run ``cmd``; its wall time and the peaks of its ``RssAnon``, ``VmRSS`` and ``VmHWM``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"RssAnon": 0, "VmRSS": 0, "VmHWM": 0}
    while proc.poll() is None:
        status = _status(proc.pid)
        for key in peak:
            peak[key] = max(peak[key], status.get(key, 0))
        time.sleep(interval)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.strip()[-500:]}")
    return {"seconds": time.perf_counter() - t0, **{k: v / 2**20 for k, v in peak.items()}}


def main() -> None:
    """Measure every scale named and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="papers", help="node preset (default papers)")
    parser.add_argument("--scales", nargs="+", default=["1/512", "1/128", "1/32"])
    parser.add_argument("--format", choices=["npy", "csv"], default="npy")
    parser.add_argument("--feature-dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument("--generate-only", action="store_true", help="generate() in memory only")
    parser.add_argument("--root", type=Path, help="where to write (default: a temporary dir)")
    parser.add_argument("--out", type=Path, default=RESULTS / "synthetic_memory.csv")
    args = parser.parse_args()
    out = CSVWriter(args.out)
    provider = "generate" if args.generate_only else f"synth-{args.format}-{args.feature_dtype}"
    for text in args.scales:
        scale = float(Fraction(text))
        root = Path(tempfile.mkdtemp(dir=args.root, prefix="synth-memory-"))
        try:
            if args.generate_only:
                cmd = [sys.executable, "-c", _GENERATE, args.preset, str(scale)]
            else:
                cmd = [sys.executable, "-m", "fullgraph.cli", "data", "synth"]
                cmd += ["--preset", args.preset, "--scale", str(scale), "--format", args.format]
                cmd += ["--name", "g", "--root", str(root)]
                if args.format == "npy":
                    cmd += ["--feature-dtype", args.feature_dtype]
            rec = run_sampled(cmd)
            disk = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2**20
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rec["disk_MiB"] = disk
        for metric, value in rec.items():
            unit = "s" if metric == "seconds" else "MiB"
            out.write("synthetic_memory", provider, metric, unit, text, value)
        print(
            f"{args.preset} {text:>6} {provider}: {rec['seconds']:.1f} s, peak RssAnon "
            f"{rec['RssAnon']:.0f} MiB, peak VmRSS {rec['VmRSS']:.0f} MiB, VmHWM "
            f"{rec['VmHWM']:.0f} MiB, on disk {disk:.0f} MiB",
            flush=True,
        )
    print(f"rows appended to {args.out}")


if __name__ == "__main__":
    main()
