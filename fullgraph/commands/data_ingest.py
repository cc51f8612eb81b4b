"""``fullgraph data ingest``: an OGB-layout dataset converted to the ``npy`` layout chunk by
chunk (:mod:`fullgraph.datasets.ogb_ingest`), for graphs whose CSV does not fit in memory."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path


def add_ingest(
    sub: argparse._SubParsersAction,
    setup_logging: Callable[[], None],
    report: Callable[[Path, object], None],
) -> None:
    """Add ``data ingest`` to the ``data`` subparsers.

    Args:
        sub: the ``data`` command's subparsers.
        setup_logging: the ``data`` command's logging set-up (progress to stdout).
        report: prints the stages' times and memory and the dataset's size.
    """
    from fullgraph.datasets.ogb_ingest import default_name

    ingest = sub.add_parser(
        "ingest",
        help="convert an OGB-layout dataset to the npy layout, chunk by chunk",
        description=(
            "Read an OGB node-property dataset (<root>/<name with - as _>/raw/*.csv.gz and "
            "split/) a block at a time and write the symmetrised graph without self loops, its "
            "features, labels and split in the npy layout (arrays/*.npy, memory-mappable) at "
            "<out-root>/<name>/, with memory that does not grow with the edges or the feature "
            "width (docs/datasets.md). `fullgraph partition --dataset NAME --root OUT_ROOT` "
            "reads the result. Datasets with edge weights or edge features are refused (the "
            "in-memory reader reads them)."
        ),
    )
    ingest.add_argument("--dataset", required=True, help="the OGB-layout dataset, e.g. ogbn-arxiv")
    ingest.add_argument("--root", required=True, type=Path, help="its dataset root directory")
    ingest.add_argument(
        "--out-root",
        type=Path,
        default=None,
        help="the dataset root to write into (default --root; give one when --root is a "
        "read-only shared copy)",
    )
    ingest.add_argument(
        "--name",
        default=None,
        help=f"the new dataset's name (default the dataset's with -npy: {default_name('NAME')})",
    )
    ingest.add_argument(
        "--feature-dtype",
        choices=["float32", "float16"],
        default="float32",
        help="features on disk as float32 or float16 (half the file; a value beyond "
        "+-65504 is refused); default float32",
    )
    ingest.add_argument(
        "--force",
        action="store_true",
        help="replace an existing dataset directory fullgraph wrote (anything else is refused)",
    )
    ingest.set_defaults(func=lambda args: _ingest(args, setup_logging, report))


def check_ingest_memory(num_nodes: int) -> None:
    """Refuse, before any work, an ingest of ``num_nodes`` nodes that cannot fit here.

    Raises:
        ConfigError: one line with the memory needed and the memory there is.
    """
    from fullgraph.datasets.ogb_ingest import CHUNK_BYTES, NODE_BYTES
    from fullgraph.errors import ConfigError
    from fullgraph.resources import node_memory_bytes

    need = NODE_BYTES * num_nodes + CHUNK_BYTES
    have = node_memory_bytes()
    if need > have:
        raise ConfigError(
            f"ingesting {num_nodes:,} nodes takes about {need / 2**30:,.1f} GiB, but this "
            f"machine offers {have / 2**30:,.1f} GiB; ingest on a larger machine"
        )


def _ingest(
    args: argparse.Namespace,
    setup_logging: Callable[[], None],
    report: Callable[[Path, object], None],
) -> int:
    from fullgraph.atomic import Place, check_apart, check_output
    from fullgraph.datasets.ogb_ingest import default_name, ingest_ogb, source_nodes
    from fullgraph.datasets.ogb_writer import DATASET
    from fullgraph.datasets.paths import dataset_dir, dataset_inputs
    from fullgraph.errors import ConfigError
    from fullgraph.resources import StageTimer

    setup_logging()
    name = args.name or default_name(args.dataset)
    out_root = args.root if args.out_root is None else args.out_root
    target = dataset_dir(out_root, name)  # DataError for a name that is a path
    _, nodes = source_nodes(args.root, args.dataset)  # refusals of the source, before any work
    if os.path.lexists(out_root) and not out_root.is_dir():
        raise ConfigError(f"--out-root {out_root} is a file; give a dataset root directory")
    if args.out_root is None and not os.access(args.root, os.W_OK):
        raise ConfigError(
            f"--root {args.root} cannot be written (a shared read-only copy?); give --out-root "
            f"a directory of your own"
        )
    named = f"--out-root {out_root} --name {name}"
    check_apart([Place(target, named, whole=True)], dataset_inputs(args.dataset, args.root))
    check_output(
        target,
        "--name",
        kind="dir",
        exist_ok=args.force,
        ours=DATASET,
        advice="choose another --name or --out-root, or remove it yourself",
    )
    check_ingest_memory(nodes)
    timer = StageTimer()
    with timer.stage("ingest"):
        path = ingest_ogb(
            args.root,
            args.dataset,
            out_root=out_root,
            out_name=name,
            feature_dtype=args.feature_dtype,
            force=args.force,
        )
    report(path, timer)
    return 0
