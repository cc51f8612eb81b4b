"""``fullgraph verify``: check a partition directory's invariants (and against its source)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``verify`` subcommand to the top-level parser."""
    from fullgraph.cli import summary

    parser = subparsers.add_parser(
        "verify",
        help=summary("verify"),
        description=(
            "Check every invariant of a partition directory written by `fullgraph partition`: "
            "file checksums; every node owned once; every incoming edge stored once; halo rows "
            "grouped by owner; send and receive maps symmetric. With --root (and optionally "
            "--dataset) the source graph is loaded and edges, degrees, features, labels and "
            "masks are compared with it. Exits 2 with the first problem found."
        ),
    )
    parser.add_argument(
        "dir", type=Path, metavar="DIR", help="partition directory (or its meta.json)"
    )
    parser.add_argument(
        "--dataset",
        help="source dataset name (default: the one recorded in DIR/meta.json; needs --root)",
    )
    parser.add_argument(
        "--root", type=Path, help="dataset root directory; compare the parts with the source"
    )
    parser.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    from fullgraph.errors import ConfigError
    from fullgraph.partition.format import read_meta
    from fullgraph.partition.verify import verify_partitions

    meta, _ = read_meta(args.dir)
    graph = link = None
    if args.dataset is not None and args.root is None:
        raise ConfigError("--dataset needs --root (the dataset root directory)")
    if args.root is not None:
        from fullgraph.datasets import load

        graph = load(args.dataset or meta["dataset"], args.root, mmap=True)  # read in place
        if "link" in meta:
            from fullgraph.partition.link_parts import dataset_link_split

            link = dataset_link_split(args.dataset or meta["dataset"], args.root)
    summary = verify_partitions(args.dir, graph, link)
    source = f"against {graph.name}" if graph is not None else "internal consistency only"
    print(
        f"OK {args.dir}: {summary['num_parts']} parts, {summary['num_nodes']:,} nodes each owned "
        f"once, {summary['num_edges']:,} edges each stored once, "
        f"{summary['total_halo_rows']:,} halo rows with symmetric send/receive maps, "
        f"{summary['files_checked']} checksums match ({source})"
    )
    if "cut" in meta:
        from fullgraph.partition.receptive_cut import describe_cut

        how = "made again from the graph and equal" if graph is not None else "its ids and blocks"
        print(f"OK {describe_cut(meta['cut'])} ({how})")
    if summary["link"] is not None:
        c, k = summary["link"]["counts"], summary["link"]["num_negatives_per_edge"]
        neg = {
            s: f"{k} negatives each" if k else f"{c[s + '_neg']:,} negatives"
            for s in ("valid", "test")
        }
        print(
            f"OK link split {summary['link']['name']}: {c['train']:,} train, {c['valid']:,} "
            f"valid ({neg['valid']}), {c['test']:,} test ({neg['test']}) each stored once at "
            f"its source's owner; no held-out edge in the message-passing graph"
            + ("" if link is None else f" (the dataset's split, {args.root})")
        )
    return 0
