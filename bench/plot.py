"""Every chart of the benchmarks: a few presets, and any long-format benchmark CSV as charts.

Presets (data in, one PNG out; matplotlib is imported only when a figure is saved):

- :class:`LinePanel`: a metric against x, one :class:`Series` per provider, method or config
  (lines, or points with error bars and their labels written beside them), reference lines,
  log axes (``logy=None``: log when the positive values span more than :data:`LOG_SPAN`);
- :class:`BarPanel`: one value per category for every :class:`Bars` series, grouped side by
  side, stacked or overlaid, each series with optional :class:`Marks` drawn on its bars (a
  model's projection beside the measured bar), log y;
- :func:`save_figure`: panels in a grid (row by row), a title, one PNG.

:func:`plot_csv` draws a CSV of ``bench/common.py``'s long format: one chart per (what, metric),
x on the x-axis, one line per provider (dashed for bounds and rooflines), y on a log axis when
it spans more than a factor of 20. Rows of the latest git revision in the file are used unless
``--all-revisions``.

    python -m bench.plot bench/results/kernels.csv [--out-dir bench/results/plots]
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``logy=None`` draws y on a log axis when max / min of the positive values exceeds this.
LOG_SPAN = 20.0
#: Bar layouts of a :class:`BarPanel`.
BAR_LAYOUTS = ("group", "stack", "overlay")


@dataclass
class Series:
    """One line (or set of points) of a :class:`LinePanel`.

    Attributes:
        label: legend entry (and the text beside every point with ``annotate``).
        x, y: the points, in drawing order (x numbers, or strings for categories).
        style: matplotlib format: ``"-"``, ``"--"``, ``"-."``, ``":"``, or ``"o"`` for points
            without a line (then ``marker=None``).
        marker: marker of every point (``None``: only what ``style`` draws).
        yerr: error bar half-heights, one per point.
        annotate: write ``label`` beside every point (points labelled in place of a legend).
    """

    label: str
    x: Sequence[Any]
    y: Sequence[float]
    style: str = "-"
    marker: str | None = "o"
    yerr: Sequence[float] | None = None
    annotate: bool = False


@dataclass
class LinePanel:
    """A metric against x, one :class:`Series` each; ``hlines``: ``(y, label)`` references."""

    title: str
    series: list[Series]
    xlabel: str = ""
    ylabel: str = ""
    logx: bool = False
    logy: bool | None = False
    xticks: Sequence[Any] | None = None
    hlines: Sequence[tuple[float, str]] = ()
    legend: bool = True

    def draw(self, ax: Any) -> None:
        """Draw on matplotlib axes ``ax``."""
        for s in self.series:
            marker = {} if s.marker is None else {"marker": s.marker}
            if s.yerr is not None:
                ax.errorbar(s.x, s.y, yerr=s.yerr, fmt=s.style, capsize=3, label=s.label, **marker)
            else:
                ax.plot(s.x, s.y, s.style, label=s.label, **marker)
            if s.annotate:
                for x, y in zip(s.x, s.y, strict=True):
                    ax.annotate(
                        s.label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8
                    )
        for y, label in self.hlines:
            ax.axhline(y, color="grey", lw=0.8, ls=":", label=label)
        values = [v for s in self.series for v in s.y]
        if self.logx:
            ax.set_xscale("log")
        if self.logy or (self.logy is None and spans(values, LOG_SPAN)):
            ax.set_yscale("log")
        if self.xticks is not None:
            ax.set_xticks(list(self.xticks))
        _finish(ax, self.title, self.xlabel, self.ylabel, self.legend)


@dataclass
class Marks:
    """Markers on a :class:`Bars` series' bars, one value per category (``None``: no mark)."""

    values: Sequence[float | None]
    marker: str
    color: str | None = None  # None: the colour of the bars they belong to
    size: float = 6.0
    hollow: bool = False


@dataclass
class Bars:
    """One bar per category of a :class:`BarPanel`, with optional :class:`Marks` on them."""

    label: str
    values: Sequence[float]
    marks: Sequence[Marks] = ()


@dataclass
class BarPanel:
    """One value per category for every :class:`Bars` series.

    ``layout``: ``group`` (the series side by side in every category), ``stack`` (each on top
    of the ones before) or ``overlay`` (all from zero at the same place, drawn in order: a
    later, smaller bar shows as the lower part of an earlier one). ``rotate``: degrees of the
    category labels.
    """

    title: str
    categories: Sequence[str]
    bars: list[Bars]
    ylabel: str = ""
    xlabel: str = ""
    layout: str = "group"
    logy: bool = False
    legend: bool = True
    rotate: float = 0.0

    def draw(self, ax: Any) -> None:
        """Draw on matplotlib axes ``ax``."""
        if self.layout not in BAR_LAYOUTS:
            raise ValueError(f"layout {self.layout!r}: one of {BAR_LAYOUTS}")
        slots = range(len(self.categories))
        grouped = self.layout == "group" and len(self.bars) > 1
        width = 0.8 / len(self.bars) if grouped else 0.8
        bottom = [0.0] * len(self.categories)
        for i, b in enumerate(self.bars):
            xs = [j + i * width for j in slots] if grouped else list(slots)
            kw = {"bottom": list(bottom)} if self.layout == "stack" else {}
            drawn = ax.bar(xs, list(b.values), width, label=b.label, **kw)
            if self.layout == "stack":
                bottom = [lo + v for lo, v in zip(bottom, b.values, strict=True)]
            color = drawn.patches[0].get_facecolor() if drawn.patches else None
            for m in b.marks:
                points = [(x, v) for x, v in zip(xs, m.values, strict=True) if v is not None]
                ax.plot(
                    [x for x, _ in points],
                    [v for _, v in points],
                    m.marker,
                    color=m.color or color,
                    ms=m.size,
                    mfc="none" if m.hollow else None,
                )
        centre = width * (len(self.bars) - 1) / 2 if grouped else 0.0
        ax.set_xticks([j + centre for j in slots], list(self.categories))
        if self.rotate:
            ax.tick_params(axis="x", rotation=self.rotate)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
                label.set_rotation_mode("anchor")
        if self.logy:
            ax.set_yscale("log")
        _finish(ax, self.title, self.xlabel, self.ylabel, self.legend)


def _finish(ax: Any, title: str, xlabel: str, ylabel: str, legend: bool) -> None:
    if title:
        ax.set_title(title, fontsize=10)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=9)
    ax.grid(True, alpha=0.3)
    if legend and ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8)


def spans(values: Sequence[float], factor: float) -> bool:
    """Whether the positive finite ``values`` span more than ``factor`` (max / min)."""
    pos = [v for v in values if v > 0 and math.isfinite(v)]
    return bool(pos) and max(pos) / min(pos) > factor


def save_figure(
    panels: Sequence[LinePanel | BarPanel],
    path: str | Path,
    *,
    ncols: int | None = None,
    panel_size: tuple[float, float] = (7.0, 4.5),
    title: str | None = None,
    dpi: int = 110,
) -> Path:
    """Draw ``panels`` row by row, ``ncols`` to a row (default: all in one), into PNG ``path``.

    Args:
        panels: what to draw, in order.
        path: the PNG written (its directory is made).
        ncols: panels per row.
        panel_size: inches (width, height) of one panel.
        title: the figure's title above all panels.
        dpi: resolution.

    Returns:
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = ncols or len(panels)
    nrows = math.ceil(len(panels) / ncols)
    w, h = panel_size
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        panel.draw(ax)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _num(v: str) -> float | str:
    try:
        return float(v)
    except ValueError:
        return v


def csv_panels(rows: list[dict[str, str]]) -> dict[tuple[str, str], LinePanel]:
    """One :class:`LinePanel` per (what, metric) of long-format ``rows``."""
    groups: dict = defaultdict(lambda: defaultdict(dict))
    units: dict[tuple[str, str], str] = {}
    for r in rows:
        key = (r["what"], r["metric"])
        groups[key][r["provider"]][_num(r["x"])] = float(r["y"])
        units[key] = r["unit"]
    panels = {}
    for (what, metric), by_provider in sorted(groups.items()):
        series = []
        for provider, points in sorted(by_provider.items()):
            xs = sorted(points, key=lambda v: (isinstance(v, str), v))
            bound = "bound" in provider or "roofline" in provider
            series.append(
                Series(provider, xs, [points[x] for x in xs], style="--" if bound else "-")
            )
        panels[(what, metric)] = LinePanel(
            f"{what}: {metric}",
            series,
            xlabel="x",
            ylabel=f"{metric} [{units[(what, metric)]}]",
            logy=None,
        )
    return panels


def plot_csv(path: Path, out_dir: Path, all_revisions: bool = False) -> list[Path]:
    """Write one PNG per (what, metric) of the CSV at ``path``; return the files written."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    if not all_revisions:
        last = rows[-1]["git_rev"]
        rows = [r for r in rows if r["git_rev"] == last]
    written = []
    for (what, metric), panel in csv_panels(rows).items():
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{what}__{metric}") + ".png"
        written.append(save_figure([panel], out_dir / name))
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Plot long-format benchmark CSV files as PNG charts.")
    p.add_argument("csv", type=Path, nargs="+", help="CSV files written by the benchmarks")
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
