"""``fullgraph data``: generate synthetic datasets, split a graph's edges for link prediction,
and describe datasets on disk."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from fullgraph.resources import peak_rss_mb


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``data`` subcommand (``synth``, ``linksplit``, ``ingest``, ``info``)."""
    from fullgraph.cli import summary

    parser = subparsers.add_parser(
        "data",
        help=summary("data"),
        description=(
            "Datasets live in <root>/<name with - as _>/. `synth` writes a synthetic graph "
            "there in OGB layout; `linksplit` splits a dataset's edges for link prediction "
            "(OGB's linkprop layout); `info` loads any known dataset and prints its sizes."
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
        choices=["tiny", "arxiv", "products", "papers", "arxiv-stress", "products-stress"]
        + ["collab", "citation2"],
        default="tiny",
        help="tiny (3,000 nodes); arxiv (169,343 nodes, 1.17M edges) and products (2,449,029 "
        "nodes, 61.9M edges): sized like the OGB graphs, with their METIS halo volume "
        "(communities on a ring, cross-community edges mostly to nearby ones); papers "
        "(111,059,956 nodes, 1.62B edges, 128 features, 172 classes, 1.4%% labelled and "
        "clustered, the rest y = -1: ogbn-papers100M's sizes; use --scale and --format npy); "
        "arxiv-stress, "
        "products-stress: same sizes, cross-community edges to random nodes (about 4x the "
        "real halo on products: a worst case); link prediction, in OGB's linkprop layout: "
        "collab (235,868 nodes, 1.29M edges, 128 features, held-out edges and 100,000 "
        "negative pairs as ogbl-collab, hits@50) and citation2 (2,927,963 nodes, 30.6M edges, "
        "86,596 valid / test edges with 1,000 negatives each, mrr); default tiny",
    )
    synth.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply the nodes and edges (link presets: also the held-out edges and negative "
        "pairs) by this, in (0, 1] (e.g. --preset papers --scale 0.125; default 1)",
    )
    synth.add_argument(
        "--format",
        choices=["csv", "npy"],
        default="csv",
        help="csv: OGB's layout (raw/*.csv.gz, generated in memory); npy: arrays/*.npy, "
        "generated and written chunk by chunk with memory that does not grow with the edges "
        "or features (node presets; for papers-size graphs); default csv",
    )
    synth.add_argument(
        "--feature-dtype",
        choices=["float32", "float16"],
        default="float32",
        help="--format npy: features on disk as float32 or float16 (half the file; readers "
        "widen to float32 per part or block); default float32",
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

    add_linksplit(sub)
    from fullgraph.commands.data_ingest import add_ingest

    add_ingest(sub, setup_logging, _report)

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


def check_synth_fits(preset: str, edge_dim: int, edge_weight: bool, scale: float = 1.0) -> None:
    """Refuse, before anything is drawn, edge values that cannot fit in this machine's memory.

    Raises:
        ConfigError: naming the size needed, the memory there is and the largest
            ``--edge-dim`` that fits.
    """
    from fullgraph.datasets.synthetic import EDGE_FEATURE_DRAW_BYTES, PRESETS, scaled
    from fullgraph.datasets.synthetic_link import LINK_PRESETS, link_preset_edges
    from fullgraph.errors import ConfigError
    from fullgraph.resources import node_memory_bytes

    if preset in LINK_PRESETS:
        edges = link_preset_edges(preset, scale)
    else:
        edges = scaled(PRESETS[preset], scale).num_edges
    need = edges * (EDGE_FEATURE_DRAW_BYTES * int(edge_dim) + (32 if edge_weight else 0))
    have = node_memory_bytes()
    if need <= have:
        return
    widest = max(0, (have // edges - (32 if edge_weight else 0)) // EDGE_FEATURE_DRAW_BYTES)
    raise ConfigError(
        f"--edge-dim {edge_dim}: drawing {edge_dim:,} features for each of the {edges:,} edges "
        f"of --preset {preset} takes about {need / 2**30:,.1f} GiB, but this machine offers "
        f"{have / 2**30:,.1f} GiB; ask for --edge-dim {widest:,} or less (or a smaller --preset)"
    )


#: Peak bytes of the in-memory generator and OGB writer per undirected edge and per feature
#: value (products: 3.94 GiB for 61.9M edges and 245M float32 values, docs/datasets.md).
_CSV_EDGE_BYTES = 52
_CSV_FEATURE_BYTES = 4


def check_synth_memory(preset: str, scale: float, fmt: str, feature_dtype: str) -> None:
    """Refuse, before anything is drawn, a synthetic graph whose generation cannot fit here.

    Raises:
        ConfigError: one line with the size needed, the memory there is and the fix (``--format
            npy``, a smaller ``--scale``).
    """
    from fullgraph.datasets.synthetic import resolve
    from fullgraph.datasets.synthetic_chunked import CHUNK_STATE_BYTES, NODE_STATE_BYTES
    from fullgraph.errors import ConfigError
    from fullgraph.resources import node_memory_bytes

    cfg = resolve(preset, scale=scale)
    if fmt == "npy":
        need = NODE_STATE_BYTES * cfg.num_nodes + CHUNK_STATE_BYTES
        fix = "a smaller --scale"
    else:
        values = cfg.num_nodes * cfg.num_features
        need = _CSV_EDGE_BYTES * cfg.num_edges + _CSV_FEATURE_BYTES * values
        fix = "--format npy (chunked) or a smaller --scale"
    have = node_memory_bytes()
    if need > have:
        raise ConfigError(
            f"--preset {preset} --scale {scale:g} --format {fmt}: generating "
            f"{cfg.num_nodes:,} nodes and {cfg.num_edges:,} edges takes about "
            f"{need / 2**30:,.1f} GiB, but this machine offers {have / 2**30:,.1f} GiB; use {fix}"
        )


def _synth(args: argparse.Namespace) -> int:
    from fullgraph.atomic import check_output
    from fullgraph.datasets.ogb_link_writer import LINK_DATASET
    from fullgraph.datasets.ogb_writer import DATASET
    from fullgraph.datasets.paths import dataset_dir
    from fullgraph.datasets.synthetic import generate, with_edge_values, write_ogb
    from fullgraph.datasets.synthetic_link import LINK_PRESETS
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
        ours=LINK_DATASET if args.preset in LINK_PRESETS else DATASET,
        advice="choose another --name or --root, or remove it yourself",
    )
    if args.preset in LINK_PRESETS or args.format == "csv":
        if args.feature_dtype != "float32":
            raise ConfigError("--feature-dtype float16 needs --format npy")
    elif args.edge_weight or args.edge_dim:
        raise ConfigError("--format npy writes no edge values; drop --edge-weight / --edge-dim")
    check_synth_fits(args.preset, args.edge_dim, args.edge_weight, args.scale)
    if args.preset in LINK_PRESETS:
        if args.format != "csv":
            raise ConfigError(f"--format npy applies to node presets, not {args.preset}")
        return _synth_link(args)
    check_synth_memory(args.preset, args.scale, args.format, args.feature_dtype)
    timer = StageTimer()
    if args.format == "npy":
        from fullgraph.datasets.synthetic_chunked import write_synthetic

        with timer.stage("generate and write"):
            path = write_synthetic(
                args.preset,
                args.root,
                args.name,
                seed=args.seed,
                scale=args.scale,
                feature_dtype=args.feature_dtype,
                force=args.force,
            )
        _report(path, timer)
        return 0
    with timer.stage("generate"):
        graph = generate(args.preset, seed=args.seed, scale=args.scale)
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
    _report(path, timer)
    return 0


def _report(path: Path, timer: object) -> None:
    """The stages' times and memory, the dataset's size on disk and the peak RSS."""
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    for stage, rec in timer.as_dict().items():
        print(f"  {stage}: {rec['seconds']:.1f} s, peak RSS {rec['peak_rss_mb']:.0f} MiB")
    print(f"wrote {path} ({size / 2**20:.1f} MiB); peak RSS {peak_rss_mb():.0f} MiB")


def _describe_split(graph: object, split: object) -> None:
    neg = {s: "x".join(map(str, split.negatives[s].shape)) for s in ("valid", "test")}
    print(
        f"split {graph.name}: {len(split.edges['train']):,} train / "
        f"{len(split.edges['valid']):,} valid / {len(split.edges['test']):,} test edges, "
        f"negatives valid {neg['valid']} test {neg['test']}"
        f"{' (per edge)' if split.per_edge_negatives else ''}, metric {split.metric}; "
        f"message-passing graph {graph.num_edges // 2:,} undirected edges"
    )


def _synth_link(args: argparse.Namespace) -> int:
    from fullgraph.datasets.ogb_link_writer import write_ogb_link
    from fullgraph.datasets.synthetic_link import generate_link
    from fullgraph.resources import StageTimer

    timer = StageTimer()
    with timer.stage("generate and split"):
        graph, split = generate_link(
            args.preset,
            seed=args.seed,
            scale=args.scale,
            edge_weight=args.edge_weight,
            edge_dim=args.edge_dim,
            name=args.name,
        )
    _describe_split(graph, split)
    with timer.stage("write"):
        path = write_ogb_link(graph, split, args.root, args.name, force=args.force)
    _report(path, timer)
    return 0


def _count_or_fraction(text: str) -> float:
    """``--val`` / ``--test``: an integer is a count of edges, anything else a fraction."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither a count nor a fraction"
            ) from None


def add_linksplit(sub: argparse._SubParsersAction) -> None:
    """Add ``data linksplit`` (a seeded link split of any dataset, written in OGB's layout)."""
    split = sub.add_parser(
        "linksplit",
        help="split a dataset's edges into train/valid/test with fixed negatives (OGB layout)",
        description=(
            "Load any dataset `fullgraph.datasets.load` reads, hold out a seeded random share "
            "of its undirected edges for validation and test (removed from the message-passing "
            "graph in both directions, PyG RandomLinkSplit's conventions), draw fixed negatives "
            "among the non-edges of the whole graph, and write the result in OGB's linkprop "
            "layout at <out>/<name with - as _>/, read back by `load(NAME, OUT)` and "
            "`load_link_split(NAME, OUT)`. Node features and labels are carried over."
        ),
    )
    split.add_argument("--dataset", required=True, help="the dataset to split, e.g. cora")
    split.add_argument("--root", required=True, type=Path, help="its dataset root directory")
    split.add_argument("--out", required=True, type=Path, help="dataset root to write into")
    split.add_argument("--name", required=True, help="the new dataset's name, e.g. cora-link")
    split.add_argument(
        "--val",
        type=_count_or_fraction,
        default=0.05,
        help="validation edges: a fraction of the undirected edges or a count (default 0.05)",
    )
    split.add_argument(
        "--test",
        type=_count_or_fraction,
        default=0.1,
        help="test edges: a fraction or a count (default 0.1)",
    )
    split.add_argument(
        "--neg-ratio",
        type=float,
        default=None,
        help="negative pairs per held-out positive (default 1)",
    )
    split.add_argument(
        "--neg-per-edge",
        type=int,
        default=0,
        metavar="K",
        help="instead of pairs: K negative targets per positive's source, as ogbl-citation2",
    )
    split.add_argument(
        "--metric",
        default="",
        help="the split's metric: auc (default with pairs), mrr (default per edge), hits@K",
    )
    split.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    split.add_argument(
        "--force",
        action="store_true",
        help="replace an existing dataset directory if `data linksplit` or `data synth "
        "--preset collab|citation2` wrote it (anything else there is refused)",
    )
    split.set_defaults(func=_linksplit)


def _check_metric(metric: str) -> None:
    from fullgraph.errors import ConfigError

    k = metric.removeprefix("hits@")
    if metric in ("", "auc", "mrr") or (metric.startswith("hits@") and k.isdigit() and int(k)):
        return
    raise ConfigError(f"--metric {metric}: give auc, mrr or hits@K (K a positive integer)")


def _linksplit(args: argparse.Namespace) -> int:
    from fullgraph.atomic import Place, check_apart, check_output
    from fullgraph.datasets.link_split import split_edges
    from fullgraph.datasets.ogb_link_writer import LINK_DATASET, write_ogb_link
    from fullgraph.datasets.paths import dataset_dir, dataset_inputs
    from fullgraph.datasets.registry import load
    from fullgraph.errors import ConfigError
    from fullgraph.resources import StageTimer

    setup_logging()
    if args.neg_per_edge < 0:
        raise ConfigError(f"--neg-per-edge must be at least 0, got {args.neg_per_edge}")
    if args.neg_per_edge and args.neg_ratio is not None:
        raise ConfigError("--neg-ratio and --neg-per-edge: give one (pairs or per-edge targets)")
    ratio = 1.0 if args.neg_ratio is None else args.neg_ratio
    if not ratio > 0:
        raise ConfigError(f"--neg-ratio must be positive, got {ratio}")
    _check_metric(args.metric)
    target = dataset_dir(args.out, args.name)
    if os.path.lexists(args.out) and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file; give a dataset root directory")
    named = f"--out {args.out} --name {args.name}"
    check_apart([Place(target, named, whole=True)], dataset_inputs(args.dataset, args.root))
    check_output(
        target,
        "--name",
        kind="dir",
        exist_ok=args.force,
        ours=LINK_DATASET,
        advice="choose another --name or --out, or remove it yourself",
    )
    timer = StageTimer()
    with timer.stage("load"):
        graph = load(args.dataset, args.root)
    with timer.stage("split"):
        graph, split = split_edges(
            graph,
            val=args.val,
            test=args.test,
            seed=args.seed,
            neg_ratio=ratio,
            neg_per_edge=args.neg_per_edge,
            metric=args.metric,
            name=args.name,
        )
    _describe_split(graph, split)
    source = {
        "dataset": args.dataset,
        "split": {"val": args.val, "test": args.test, "seed": args.seed},
        "negatives": {"ratio": ratio, "per_edge": args.neg_per_edge},
        "graph": graph.meta,
    }
    with timer.stage("write"):
        path = write_ogb_link(graph, split, args.out, args.name, force=args.force, source=source)
    _report(path, timer)
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
    if g.meta.get("link"):
        from fullgraph.datasets.ogb_link import load_link_split

        split = load_link_split(args.dataset, args.root)
        neg = {s: "x".join(map(str, split.negatives[s].shape)) for s in ("valid", "test")}
        print(
            f"link split   train {len(split.edges['train']):,} / valid "
            f"{len(split.edges['valid']):,} / test {len(split.edges['test']):,} edges, negatives "
            f"{neg['valid']} / {neg['test']}, metric {split.metric}"
        )
    if g.meta.get("missing"):
        print(f"missing      {', '.join(g.meta['missing'])}")
    print(f"load time    {seconds:.2f} s, peak RSS {peak_rss_mb():.0f} MiB")
    return 0
