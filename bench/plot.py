"""Turn any long-format benchmark CSV (see `bench/common.py`) into PNG charts.

One chart per (what, metric): x on the x-axis, one line per provider, y on a log axis when it
spans more than a factor of 20. Rows of the latest git revision in the file are used unless
``--all-revisions``.

    python bench/plot.py bench/results/kernels.csv [--out-dir bench/results/plots]
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from pathlib import Path


def _num(v: str) -> float | str:
    try:
        return float(v)
    except ValueError:
        return v


def plot_csv(path: Path, out_dir: Path, all_revisions: bool = False) -> list[Path]:
    """Write one PNG per (what, metric) of the CSV at ``path``; return the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    if not all_revisions:
        last = rows[-1]["git_rev"]
        rows = [r for r in rows if r["git_rev"] == last]
    groups: dict = defaultdict(lambda: defaultdict(dict))
    units = {}
    for r in rows:
        key = (r["what"], r["metric"])
        groups[key][r["provider"]][_num(r["x"])] = float(r["y"])
        units[key] = r["unit"]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (what, metric), series in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        values = []
        for provider, points in sorted(series.items()):
            xs = sorted(points, key=lambda v: (isinstance(v, str), v))
            ys = [points[x] for x in xs]
            values += ys
            style = "--" if "bound" in provider or "roofline" in provider else "-"
            ax.plot(
                [str(x) if isinstance(x, str) else x for x in xs],
                ys,
                style,
                marker="o",
                label=provider,
            )
        pos = [v for v in values if v > 0]
        if pos and max(pos) / min(pos) > 20:
            ax.set_yscale("log")
        ax.set_title(f"{what}: {metric}")
        ax.set_xlabel("x")
        ax.set_ylabel(f"{metric} [{units[(what, metric)]}]")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{what}__{metric}") + ".png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(out_dir / name)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Plot long-format benchmark CSV files as PNG charts.")
    p.add_argument("csv", type=Path, nargs="+", help="CSV files written by bench/*.py")
    p.add_argument("--out-dir", type=Path, default=None, help="default: <csv dir>/plots")
    p.add_argument("--all-revisions", action="store_true", help="keep rows of every revision")
    args = p.parse_args(argv)
    for path in args.csv:
        if not path.is_file():
            print(f"plot: error: no such file {path}", file=sys.stderr)
            return 2
        files = plot_csv(path, args.out_dir or path.parent / "plots", args.all_revisions)
        print(f"{path}: {len(files)} charts in {args.out_dir or path.parent / 'plots'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
