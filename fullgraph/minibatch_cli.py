"""``fullgraph minibatch``: the neighbour-sampling GraphSAGE baseline, data-parallel over ranks.

``mpirun -n P fullgraph minibatch --dataset NAME --root DIR --fanouts 15,10,5 --batch-size B``
loads the whole graph on every rank, trains with sampled blocks and prints the same per-epoch
line (and writes the same JSON fields) as ``fullgraph train``.
"""

from __future__ import annotations

import argparse

from fullgraph.errors import ConfigError


def parse_fanouts(text: str) -> list[int]:
    """``"15,10,5"`` -> ``[15, 10, 5]`` (``-1`` takes all neighbours).

    Raises:
        ConfigError: an entry is not an integer, is 0 or is below -1.
    """
    try:
        fanouts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--fanouts must be comma-separated integers, got {text!r}") from None
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise ConfigError(f"--fanouts needs positive counts (or -1 for all), got {text!r}")
    return fanouts


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``minibatch`` subcommand to the ``fullgraph`` parser."""
    p = subparsers.add_parser(
        "minibatch",
        help="train GraphSAGE with neighbour sampling (the mini-batch baseline)",
        description=(
            "Mini-batch GraphSAGE (mean) with uniform neighbour sampling without replacement, "
            "data-parallel over the ranks of an MPI job (graph replicated per rank, gradients "
            "all-reduced). Evaluation is layer-wise full-graph inference. Example: "
            "mpirun -n 2 fullgraph minibatch --dataset cora --root data --fanouts 15,10,5"
        ),
    )
    p.add_argument("--dataset", required=True, help="dataset name, as `fullgraph data` knows it")
    p.add_argument("--root", required=True, help="dataset root directory (<root>/<name>/raw)")
    p.add_argument(
        "--fanouts",
        default="15,10,5",
        help="neighbours sampled per node at hop 1,2,...; one hop per layer (default 15,10,5)",
    )
    p.add_argument("--batch-size", type=int, default=1024, help="global seeds per step")
    p.add_argument("--hidden", type=int, default=256, help="hidden width (default 256)")
    p.add_argument("--lr", type=float, default=0.003, help="Adam learning rate (default 0.003)")
    p.add_argument(
        "--weight-decay", type=float, default=0.0, help="Adam weight decay on all parameters"
    )
    p.add_argument("--dropout", type=float, default=0.5, help="dropout before hidden layers")
    p.add_argument(
        "--input-dropout",
        type=float,
        default=None,
        help="dropout of the input features (default --dropout)",
    )
    p.add_argument("--epochs", type=int, default=20, help="passes over the training nodes")
    p.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, batches and sampling")
    p.add_argument(
        "--transport",
        choices=("auto", "local", "mpi", "gloo"),
        default="auto",
        help="gradient all-reduce transport (auto: mpi under an MPI launcher, else local)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any collective may wait")
    p.add_argument(
        "--threads", type=int, default=None, help="compute threads per rank (default cores/ranks)"
    )
    p.add_argument("--log-json", default=None, help="write one JSON line per epoch here (rank 0)")
    p.add_argument(
        "--force", action="store_true", help="replace the log of an earlier run at --log-json"
    )
    p.add_argument("--quiet", action="store_true", help="no per-epoch line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Handler of ``fullgraph minibatch``: set up threads, communicator and data; train.

    Failure policy as ``fullgraph train``: option errors before the communicator exists, alike
    on every rank; the dataset and rank 0's outputs agreed on by all ranks; anything else on one
    rank aborts the job with that rank's error.
    """
    import numba
    import torch

    from fullgraph.comm import create_communicator
    from fullgraph.errors import FullgraphError, mark_replicated
    from fullgraph.faults import agree, run_on_every_rank
    from fullgraph.launch import default_threads, detect_launch
    from fullgraph.minibatch import MinibatchConfig
    from fullgraph.option_checks import check_number, check_path, check_timeout
    from fullgraph.resources import release_freed_memory

    info = detect_launch()
    try:
        config = MinibatchConfig(
            fanouts=parse_fanouts(args.fanouts),
            batch_size=args.batch_size,
            hidden=args.hidden,
            dropout=args.dropout,
            input_dropout=args.input_dropout,
            lr=args.lr,
            weight_decay=args.weight_decay,
            epochs=args.epochs,
            seed=args.seed,
            eval_every=args.eval_every,
            quiet=args.quiet,
        )
        check_number("--threads", args.threads, low=1, integer=True, optional=True)
        check_timeout("--timeout", args.timeout)
        for option in ("dataset", "root", "log_json"):
            check_path(f"--{option.replace('_', '-')}", getattr(args, option))
    except FullgraphError as exc:
        raise mark_replicated(exc) from None
    threads = args.threads if args.threads is not None else default_threads(info)
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    release_freed_memory()
    transport = args.transport
    if transport == "auto":
        transport = "mpi" if info.under_mpi else "local"
    comm = create_communicator(transport, info, timeout_s=args.timeout)
    final = run_on_every_rank(
        comm, "minibatch", lambda: _train(args, config, comm, info, threads, agree)
    )
    if comm.rank == 0 and not args.quiet:
        print(
            f"final | best val {final['best_val_acc']:.4f} (epoch {final['best_epoch']}) "
            f"| test {final['test_acc']:.4f} | median epoch {final['median_epoch_s'] * 1e3:.1f} ms "
            f"| {comm.size} rank(s), {threads} thread(s) each",
            flush=True,
        )
    return 0


def _train(args, config, comm, info, threads: int, agree) -> dict:
    """Outputs checked, dataset loaded (both agreed by all ranks), then the epochs."""
    from fullgraph.datasets import load, require_features
    from fullgraph.errors import DataError
    from fullgraph.minibatch import MinibatchTrainer
    from fullgraph.run_outputs import RunOutputs

    outputs = RunOutputs(comm.rank, args.log_json, force=args.force)
    started = False
    try:
        agree(comm, outputs.open)

        def load_graph():
            graph = load(args.dataset, args.root)  # the default split, as `fullgraph train`
            require_features(graph)
            if not graph.train_mask.any():
                raise DataError(f"{graph.name}: graph has no training nodes")
            return graph

        graph = agree(comm, load_graph)
        trainer = MinibatchTrainer(graph, comm, config)
        resolved = {
            "config": config.to_dict(),
            "data": args.dataset,
            "transport": comm.transport,
            "ranks": comm.size,
            "threads_per_rank": threads,
            "launch": info.to_dict(),
        }
        log = outputs.start(resolved)
        started = True
        return trainer.fit(log)
    finally:
        outputs.close(discard=not started)
