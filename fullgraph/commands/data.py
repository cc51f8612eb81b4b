"""``fullgraph data``: generate synthetic datasets and describe datasets on disk."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from fullgraph.resources import peak_rss_mb


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``data`` subcommand (``synth``, ``info``) to the top-level parser."""
    from fullgraph.cli import summary

    parser = subparsers.add_parser(
        "data",
        help=summary("data"),
        description=(
            "Datasets live in <root>/<name with - as _>/. `synth` writes a synthetic graph "
            "there in OGB layout; `info` loads any known dataset and prints its sizes."
        ),
    )
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True

    synth = sub.add_parser(
        "synth",
        help="generate a degree-corrected SBM graph and write it in OGB layout",
        description=(
            "Generate a synthetic node-classification graph (degree-corrected stochastic block "
            "model, power-law degrees, class-correlated features; see docs/datasets.md) and "
            "write it to <root>/<name with - as _>/ so that `load(NAME, ROOT)` finds it."
        ),
    )
    synth.add_argument(
        "--preset",
        choices=["tiny", "arxiv", "products", "arxiv-stress", "products-stress"],
        default="tiny",
        help="tiny (3,000 nodes); arxiv (169,343 nodes, 1.17M edges) and products (2,449,029 "
        "nodes, 61.9M edges): sized like the OGB graphs, with their METIS halo volume "
        "(communities on a ring, cross-community edges mostly to nearby ones); arxiv-stress, "
        "products-stress: same sizes, cross-community edges to random nodes (about 4x the "
        "real halo on products: a worst case); default tiny",
    )
    synth.add_argument("--name", required=True, help="dataset name, e.g. arxiv-synth")
    synth.add_argument("--root", required=True, type=Path, help="dataset root directory")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.add_argument(
        "--edge-weight",
        action="store_true",
        help="also draw a weight per edge, uniform in [0.5, 2] on a 1/64 grid, the same both ways "
        "(written to raw/edge_weight.csv.gz)",
    )
    synth.add_argument(
        "--edge-dim",
        type=int,
        default=0,
        metavar="F",
        help="also draw an F-wide feature row per edge, the same both ways "
        "(raw/edge_feat.csv.gz; default 0: none)",
    )
    synth.add_argument(
        "--force",
        action="store_true",
        help="replace an existing dataset directory if `data synth` wrote it (anything else "
        "there is refused and left as it is)",
    )
    synth.set_defaults(func=_synth)

    info = sub.add_parser(
        "info",
        help="load a dataset and print its sizes, split and load time",
        description="Load a dataset (any name `fullgraph.datasets.load` knows) and describe it.",
    )
    info.add_argument("--dataset", required=True, help="dataset name, e.g. cora, ogbn-arxiv")
    info.add_argument("--root", required=True, type=Path, help="dataset root directory")
    info.add_argument(
        "--directed", action="store_true", help="do not symmetrise (keep edges as stored)"
    )
    info.set_defaults(func=_info)


def setup_logging() -> None:
    """Progress messages (INFO) to stdout, warnings and errors to stderr.

    A command that fails on bad input then leaves exactly one line on stderr: its error.
    Does nothing when logging is configured already (as :func:`logging.basicConfig`).
    """
    progress = logging.StreamHandler(sys.stdout)
    progress.addFilter(lambda record: record.levelno < logging.WARNING)
    problems = logging.StreamHandler(sys.stderr)
    problems.setLevel(logging.WARNING)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        handlers=[progress, problems],
    )


def check_synth_fits(preset: str, edge_dim: int, edge_weight: bool) -> None:
    """Refuse, before anything is drawn, edge values that cannot fit in this machine's memory.

    Raises:
        ConfigError: naming the size needed, the memory there is and the largest
            ``--edge-dim`` that fits.
    """
    from fullgraph.datasets.synthetic import (
        EDGE_FEATURE_DRAW_BYTES,
        PRESETS,
        edge_values_bytes,
    )
    from fullgraph.errors import ConfigError
    from fullgraph.resources import node_memory_bytes

    need, have = edge_values_bytes(preset, edge_dim, edge_weight), node_memory_bytes()
    if need <= have:
        return
    edges = PRESETS[preset].num_edges
    widest = max(0, (have // edges - (32 if edge_weight else 0)) // EDGE_FEATURE_DRAW_BYTES)
    raise ConfigError(
        f"--edge-dim {edge_dim}: drawing {edge_dim:,} features for each of the {edges:,} edges "
        f"of --preset {preset} takes about {need / 2**30:,.1f} GiB, but this machine offers "
        f"{have / 2**30:,.1f} GiB; ask for --edge-dim {widest:,} or less (or a smaller --preset)"
    )


def _synth(args: argparse.Namespace) -> int:
    from fullgraph.atomic import check_output
    from fullgraph.datasets.ogb_writer import DATASET
    from fullgraph.datasets.paths import dataset_dir
    from fullgraph.datasets.synthetic import generate, with_edge_values, write_ogb
    from fullgraph.errors import ConfigError
    from fullgraph.resources import StageTimer

    setup_logging()
    if args.edge_dim < 0:
        raise ConfigError(f"--edge-dim must be at least 0, got {args.edge_dim}")
    target = dataset_dir(args.root, args.name)  # DataError for a name that is a path
    if os.path.lexists(args.root) and not args.root.is_dir():
        raise ConfigError(f"--root {args.root} is a file; give the dataset root directory")
    # an existing directory is replaced (--force) only if `data synth` wrote it
    check_output(
        target,
        "dataset directory",
        kind="dir",
        exist_ok=args.force,
        ours=DATASET,
        advice="choose another --name or --root, or remove it yourself",
    )
    check_synth_fits(args.preset, args.edge_dim, args.edge_weight)
    timer = StageTimer()
    with timer.stage("generate"):
        graph = generate(args.preset, seed=args.seed)
        if args.edge_weight or args.edge_dim:
            graph = with_edge_values(
                graph, edge_weight=args.edge_weight, edge_dim=args.edge_dim, seed=args.seed
            )
    print(
        f"generated {args.preset}: {graph.num_nodes:,} nodes, {graph.num_edges // 2:,} "
        f"undirected edges, {graph.num_features} features, {graph.num_classes} classes"
    )
    with timer.stage("write"):
        path = write_ogb(graph, args.root, args.name, force=args.force)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    for stage, rec in timer.as_dict().items():
        print(f"  {stage}: {rec['seconds']:.1f} s, peak RSS {rec['peak_rss_mb']:.0f} MiB")
    print(f"wrote {path} ({size / 2**20:.1f} MiB); peak RSS {peak_rss_mb():.0f} MiB")
    return 0


def _info(args: argparse.Namespace) -> int:
    from fullgraph.datasets.registry import load

    setup_logging()
    t0 = time.perf_counter()
    g = load(args.dataset, args.root, symmetric=not args.directed)
    seconds = time.perf_counter() - t0
    deg = g.in_degree()
    labelled = int((g.y >= 0).sum())
    print(f"dataset      {g.name}")
    print(f"nodes        {g.num_nodes:,}")
    print(f"edges        {g.num_edges:,} directed (CSR entries)")
    print(
        f"degree       mean {deg.mean():.2f}, max {int(deg.max())}, isolated "
        f"{int((deg == 0).sum()):,}"
    )
    feats = str(g.num_features) if g.x is not None else "none on disk"
    print(f"features     {feats}")
    if g.edge_weight is not None or g.edge_attr is not None:
        parts = ["weights"] if g.edge_weight is not None else []
        parts += [f"{g.edge_dim} features"] if g.edge_attr is not None else []
        print(f"edge values  {', '.join(parts)} per edge")
    print(f"classes      {g.num_classes} ({labelled:,} labelled nodes)")
    print(
        f"split        train {int(g.train_mask.sum()):,} / val {int(g.val_mask.sum()):,} / "
        f"test {int(g.test_mask.sum()):,}"
    )
    if g.meta.get("missing"):
        print(f"missing      {', '.join(g.meta['missing'])}")
    print(f"load time    {seconds:.2f} s, peak RSS {peak_rss_mb():.0f} MiB")
    return 0
