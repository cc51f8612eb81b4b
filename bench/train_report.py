"""Figures (a)-(f) of ``bench/train.py``: printed against their targets, CSV rows and a PNG."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from bench.common import CSVWriter
from bench.plot import BarPanel, Bars, save_figure


def _line(label: str, value: float, target: str, met: bool, unit: str = "") -> str:
    return f"  {label:<58} {value:10.3f}{unit}  target {target:<8} {'MET' if met else 'MISSED'}"


def report(runs: dict[str, dict], a: argparse.Namespace, formula: Callable) -> None:
    """Print every figure with its target, append CSV rows, draw ``train.png``."""
    out = Path(a.out)
    csv = CSVWriter(out / "train.csv")
    what = f"train-{a.dataset}-gcn3x256"
    for name, r in runs.items():
        ranks = int(r["ranks"])
        csv.write(what, name, "epoch_s", "s", a.dataset, r["step_s"], ranks)
        csv.write(what, name, "peak_rss_mb", "MiB", a.dataset, r["peak_rss_mb"], ranks)
        csv.write(what, name, "base_rss_mb", "MiB", a.dataset, r["base_rss_mb"], ranks)
        for key in ("comm_s", "reduce_s", "exchange_s", "halo_bytes"):
            if key in r:
                unit = "B" if key == "halo_bytes" else "s"
                csv.write(what, name, key, unit, a.dataset, r[key], ranks)
    p1, pyg, p2, gloo = runs["p1"], runs["pyg"], runs["p2_mpi"], runs["p2_gloo"]
    nov, p4 = runs["p2_mpi_nooverlap"], runs["p4_mpi"]
    lines = ["figures (ratios measured in this run; 1 thread per rank):"]
    ratio_a = p1["step_s"] / pyg["step_s"]
    lines.append(_line("(a) ours 1 process / PyG epoch time", ratio_a, "<= 0.5", ratio_a <= 0.5))
    ratio_a2 = runs["p1_noprecompute"]["step_s"] / pyg["step_s"]
    lines.append(_line("    same without the precomputed first layer", ratio_a2, "-", True))
    speed = p1["step_s"] / p2["step_s"]
    lines.append(_line("(b) speed-up P=2 (1 thread each) over P=1", speed, ">= 1.6", speed >= 1.6))
    ex = gloo["exchange_s"] / p2["exchange_s"]
    lines.append(
        _line("(c) gloo / mpi exchange time, same bytes (hidden 256)", ex, ">= 2", ex >= 2)
    )
    for name in ("p2_mpi", "p4_mpi"):
        r = runs[name]
        pred = formula(r["dims"], r["halo_rows"], r["precomputed"])
        ok = abs(r["halo_bytes"] - pred) < 0.5
        csv.write(what, name, "halo_bytes_predicted", "B", a.dataset, pred, int(r["ranks"]))
        lines.append(
            _line(
                f"(d) {name}: measured / predicted halo bytes per step "
                f"({r['halo_bytes'] / 1e6:.1f} MB)",
                r["halo_bytes"] / pred,
                "== 1",
                ok,
            )
        )
    mem = p4["peak_rss_mb"] / p1["peak_rss_mb"]
    lines.append(
        _line(
            f"(e) peak RSS per rank P=4 / one process ({p4['peak_rss_mb']:.0f} / "
            f"{p1['peak_rss_mb']:.0f} MiB)",
            mem,
            "<= 0.4",
            mem <= 0.4,
        )
    )
    f1, f4 = runs["floor_p1"]["peak_rss_mb"], runs["floor_p4_mpi"]["peak_rss_mb"]
    net = (p4["peak_rss_mb"] - f4) / (p1["peak_rss_mb"] - f1)
    lines.append(
        _line(
            f"    same, net of the runtime floor ({f4:.0f} / {f1:.0f} MiB on 3,000 nodes)",
            net,
            "<= 0.4",
            net <= 0.4,
        )
    )
    if "scaled_p1" in runs:
        s1, s4 = runs["scaled_p1"]["peak_rss_mb"], runs["scaled_p4_mpi"]["peak_rss_mb"]
        lines.append(
            _line(
                f"    same on the {a.scale_check}x graph ({s4:.0f} / {s1:.0f} MiB)",
                s4 / s1,
                "<= 0.4",
                s4 / s1 <= 0.4,
            )
        )
        lines.append(
            _line(
                f"    {a.scale_check}x graph, net of the runtime floor",
                (s4 - f4) / (s1 - f1),
                "<= 0.4",
                (s4 - f4) / (s1 - f1) <= 0.4,
            )
        )
        sliced = runs["scaled_p4_mpi_sliced"]
        lines.append(
            _line(
                f"    {a.scale_check}x graph, exchanges in 16 MiB slices "
                f"({sliced['peak_rss_mb']:.0f} MiB, step x"
                f"{sliced['step_s'] / runs['scaled_p4_mpi']['step_s']:.2f})",
                sliced["peak_rss_mb"] / s1,
                "<= 0.4",
                sliced["peak_rss_mb"] / s1 <= 0.4,
            )
        )
    for name in ("p2_mpi", "p2_gloo", "p4_mpi"):
        r = runs[name]
        frac = (r["comm_s"] + r["reduce_s"]) / r["step_s"]
        lines.append(
            _line(f"(f) {name}: share of step waiting in halo + all-reduce", frac, "-", True)
        )
    hidden = nov["step_s"] - p2["step_s"]
    lines.append(
        _line(
            "(f) overlap hides (P=2 mpi, step without - with overlap)",
            hidden * 1e3,
            "-",
            True,
            " ms",
        )
    )
    print("\n".join(lines))
    print(f"CSV: {out / 'train.csv'}   plot: {out / 'train.png'}")
    print(
        "reproduce: python -m bench.train " + f"--root {a.root} --dataset {a.dataset} "
        f"--epochs {a.epochs}"
    )
    _plot(runs, out / "train.png")


def _plot(runs: dict[str, dict], path: Path) -> None:
    """Per run: step time (compute + waiting), one halo exchange, peak RSS; one PNG."""
    names = list(runs)
    step = [runs[n]["step_s"] for n in names]
    comm = [runs[n].get("comm_s", 0.0) + runs[n].get("reduce_s", 0.0) for n in names]
    compute = [s - c for s, c in zip(step, comm, strict=True)]
    ex = [n for n in names if "exchange_s" in runs[n] and runs[n]["ranks"] > 1]
    panels = [
        BarPanel(
            "",
            names,
            [Bars("compute", compute), Bars("halo + all-reduce wait", comm)],
            ylabel="epoch (train step) time, s",
            layout="stack",
            rotate=50,
        ),
        BarPanel(
            "",
            ex,
            [Bars("exchange", [runs[n]["exchange_s"] * 1e3 for n in ex])],
            ylabel="one halo exchange (hidden 256), ms",
            legend=False,
            rotate=50,
        ),
        BarPanel(
            "",
            names,
            [
                Bars("peak", [runs[n]["peak_rss_mb"] for n in names]),
                Bars("after imports", [runs[n]["base_rss_mb"] for n in names]),
            ],
            ylabel="peak RSS per rank, MiB",
            layout="overlay",
            rotate=50,
        ),
    ]
    title = "fullgraph trainer: 3-layer GCN, hidden 256, arxiv-like synthetic graph"
    save_figure(panels, path, panel_size=(17 / 3, 5.5), title=title, dpi=120)
