"""``fullgraph partition``: split a dataset into per-rank parts on disk."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fullgraph.partition.receptive_cut import CutSpec


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``partition`` subcommand to the top-level parser."""
    from fullgraph.cli import summary

    parser = subparsers.add_parser(
        "partition",
        help=summary("partition"),
        description=(
            "Load a dataset (--dataset and --root, or a user's own PyG graph: --pyg FILE), "
            "assign every node an owner rank and write OUT/meta.json plus "
            "OUT/part-<r>/*.npy (inner nodes, halo nodes, local CSR of incoming edges, "
            "features, labels, masks, send/receive maps). Writes to a temporary directory and "
            "renames it at the end; prints the partition report (time and peak memory per "
            "stage, edge cut, halo rows, imbalance). A link-prediction dataset is partitioned "
            "on its message-passing graph and every part carries the supervision edges its "
            "nodes anchor (a split whose held-out edges are still in the graph is refused)."
        ),
    )
    parser.add_argument("--dataset", help="dataset name, e.g. arxiv-synth, cora (with --root)")
    parser.add_argument("--root", type=Path, help="dataset root directory (with --dataset)")
    parser.add_argument(
        "--pyg",
        type=Path,
        metavar="FILE",
        help="instead of --dataset: a torch.save'd PyG Data (edge_index or T.ToSparseTensor's "
        "adj_t, y, masks) or a saved PyG InMemoryDataset (its directory or processed file); "
        "what fullgraph.pyg.load_part(DATA) would partition on every rank, written once",
    )
    parser.add_argument(
        "--parts", required=True, type=int, metavar="P", help="number of parts (1 <= P <= nodes)"
    )
    parser.add_argument(
        "--method",
        choices=["metis", "kaminpar", "random", "contiguous"],
        default="metis",
        help="metis: multi-constraint METIS balancing nodes, training nodes and edges "
        "(default; see --assign); kaminpar: k-way KaMinPar balancing nodes only (for graphs "
        "too large for METIS); random: seeded round-robin; contiguous: equal ranges of node "
        "ids (these three have no blocks: training on them is not bit-identical across rank "
        "counts)",
    )
    parser.add_argument(
        "--assign",
        choices=["blocks", "kway"],
        help="with --method metis: blocks (default) cuts the graph into fixed node blocks "
        "(METIS, about --block-size nodes each, the same blocks for every P) and gives every "
        "part a contiguous run of whole blocks: the partition on which training is "
        "bit-identical to one process at any rank count; kway: k-way METIS into P parts "
        "directly (today's partition, a few percent fewer halo rows on some graphs, no such "
        "contract: results match one process to float rounding only)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        metavar="B",
        help="with --assign blocks: target nodes per block (default N // 256 within "
        "[min(64, N // 32), 4096]: at least 256 blocks from 16,384 nodes, blocks of 64 (at "
        "least 32 blocks) below, at most 4096 nodes a block); P may not exceed the blocks",
    )
    parser.add_argument(
        "--metis",
        choices=["auto", "libmetis", "pymetis"],
        default="auto",
        help="METIS library: auto (default) takes a 32-bit libmetis when one is installed "
        "(Debian's libmetis5, put into .venv/lib by `make install`; half the memory of "
        "pymetis' 64-bit METIS), else pymetis",
    )
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="partition directory to create (never the dataset's directory or its root)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of METIS / random (default 0)")
    parser.add_argument(
        "--split",
        type=int,
        metavar="K",
        help="which of the dataset's fixed splits the parts hold (tolokers: 0-9; default 0); "
        "recorded in meta.json",
    )
    parser.add_argument(
        "--cut-hops",
        type=int,
        metavar="L",
        help="the exact receptive-field cut: keep only the nodes within L hops (along incoming "
        "edges) of the --cut-splits nodes and the edges between them, with their whole-graph "
        "degrees and ids, so that an L-layer model trains and evaluates those nodes exactly as "
        "on the whole graph (bit for bit with --assign blocks); L = the model's layers; "
        "recorded in meta.json (cut); predict then answers for those nodes only",
    )
    parser.add_argument(
        "--cut-splits",
        metavar="S[,S...]",
        help="with --cut-hops: the splits whose nodes the cut keeps the receptive field of "
        "(train, val, test; default all three)",
    )
    parser.add_argument(
        "--memory-check",
        choices=["refuse", "warn", "off"],
        default="refuse",
        help="when the predicted peak (`fullgraph plan partition`) exceeds this machine's "
        "memory: refuse before any work (default), warn and run, or do not check",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --out if it is a partition fullgraph wrote (anything else "
        "there is refused and left as it is)",
    )
    parser.set_defaults(func=_partition)


def _partition(args: argparse.Namespace) -> int:
    from fullgraph.atomic import Place, check_apart, check_output
    from fullgraph.commands.data import setup_logging
    from fullgraph.datasets import load
    from fullgraph.datasets.paths import dataset_inputs
    from fullgraph.partition.assign import check_num_parts, resolve_assign
    from fullgraph.partition.build import partition_graph
    from fullgraph.partition.link_parts import dataset_link_split
    from fullgraph.partition.output_kind import PARTITION
    from fullgraph.partition.report import format_report

    setup_logging()  # progress to stdout: a failure's stderr is its one error line
    _check_source(args)
    if args.parts < 1:
        check_num_parts(args.parts, 1)
    resolve_assign(args.method, args.assign, args.block_size)  # before the graph is read
    cut = _cut(args)
    # --out is replaced as a whole: never the dataset read, its root, or a folder holding them;
    # an existing --out only if it is a partition fullgraph wrote
    out = Place(args.out, f"--out {args.out}", whole=True)
    if args.pyg is not None:
        inputs = [Place(args.pyg, f"--pyg {args.pyg}", "the PyG data")]
    else:
        inputs = dataset_inputs(args.dataset, args.root)
    check_apart([out], inputs)
    check_output(args.out, "--out", kind="dir", exist_ok=args.force, ours=PARTITION)
    if args.method == "metis" and args.metis == "libmetis":  # before the graph is read
        from fullgraph.partition.libmetis import require_libmetis

        require_libmetis()
    from fullgraph.commands.plan_partition import check_partition_memory, rss_bytes

    floor = rss_bytes()  # before the graph: what the plan's stages add to
    if args.pyg is not None:
        from fullgraph.datasets.pyg_input import read_saved

        graph = read_saved(args.pyg)
    else:  # read in place: parts are built one by one
        graph = load(args.dataset, args.root, mmap=True, split=args.split)
    warning = check_partition_memory(
        graph, args.parts, args.method, args.metis, args.memory_check, floor
    )
    if warning is not None:
        print(f"fullgraph partition: {warning}", file=sys.stderr, flush=True)
    # a link dataset's supervision edges; partition_graph refuses a leak before any work
    link = None if args.pyg is not None else dataset_link_split(args.dataset, args.root)
    # Raises (nothing printed as success) when --out appears meanwhile without --force, and
    # lets SIGTERM / Ctrl-C through so that the temporary directory is removed.
    meta = partition_graph(
        graph,
        args.parts,
        args.out,
        method=args.method,
        seed=args.seed,
        force=args.force,
        metis=args.metis,
        assign=args.assign,
        block_size=args.block_size,
        link=link,
        cut=cut,
    )
    print(format_report(meta))
    if link is not None:
        print(_link_report(meta))
    print(
        f"wrote {args.out} ({meta['num_parts']} parts); check it with `fullgraph verify {args.out}`"
    )
    return 0


def _cut(args: argparse.Namespace) -> CutSpec | None:
    """``--cut-hops`` / ``--cut-splits`` checked (one line each), or ``None`` without a cut."""
    from fullgraph.errors import ConfigError
    from fullgraph.partition.receptive_cut import check_cut

    if args.cut_hops is None:
        if args.cut_splits is not None:
            raise ConfigError("--cut-splits needs --cut-hops L (the hops of the cut)")
        return None
    return check_cut(args.cut_hops, args.cut_splits)


def _check_source(args: argparse.Namespace) -> None:
    """One graph to read: ``--dataset`` with ``--root``, or ``--pyg`` alone.

    Raises:
        ConfigError: neither or both, ``--dataset`` without ``--root`` (or the reverse), or
            ``--split`` with ``--pyg`` (the file's masks are the split).
    """
    from fullgraph.errors import ConfigError

    if args.pyg is not None:
        given = [o for o, v in (("--dataset", args.dataset), ("--root", args.root)) if v]
        if given:
            raise ConfigError(
                f"--pyg reads the graph from {args.pyg}: leave out {' and '.join(given)}"
            )
        if args.split is not None:
            raise ConfigError(f"--split picks a dataset's fixed split; {args.pyg} has its masks")
        return
    if args.dataset is None and args.root is None:
        raise ConfigError("give the graph: --dataset NAME --root DIR, or --pyg FILE")
    if args.dataset is None or args.root is None:
        missing = "--root DIR" if args.root is None else "--dataset NAME"
        raise ConfigError(f"{missing} is needed too (or --pyg FILE instead of both)")


def _link_report(meta: dict) -> str:
    """The supervision edges the parts carry: per split the total and each part's share."""
    info = meta["link"]
    k = info["num_negatives_per_edge"]
    layout = f"; *_neg: rows of {k} negative targets" if k else ""
    lines = [
        f"link split {info['name']} ({info['metric']}), edges stored at their source's "
        f"owner{layout}:"
    ]
    for key in ("train", "valid", "valid_neg", "test", "test_neg"):
        per_part = " / ".join(f"{q['link'][key]:,}" for q in meta["parts"])
        lines.append(f"  {key:<9} {info['counts'][key]:>12,}   per part: {per_part}")
    return "\n".join(lines)
