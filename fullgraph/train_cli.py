"""``fullgraph train``: full-batch training, one process or ``mpirun -n P`` ranks.

With ``--parts DIR`` every rank loads its own part (the rank count must equal the part count);
with ``--dataset NAME --root DIR`` (or ``--synthetic PRESET``) one process trains on the whole
graph, the reference every distributed run matches.
"""

from __future__ import annotations

import argparse
import os


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train GCN / GraphSAGE full-batch (mpirun -n P for P ranks)",
        description=(
            "Full-batch GNN training with the exact full-graph gradient. Distributed: "
            "`mpirun -n P fullgraph train --parts DIR ...` (P = parts). One process: "
            "`fullgraph train --dataset cora --root DATA ...`."
        ),
    )
    src = p.add_argument_group("data (one of)")
    src.add_argument("--parts", help="partition directory written by `fullgraph partition`")
    src.add_argument("--dataset", help="dataset name, trained whole in one process")
    src.add_argument("--root", help="dataset root directory for --dataset")
    src.add_argument("--synthetic", metavar="PRESET", help="train on a generated graph (tiny...)")
    m = p.add_argument_group("model and optimiser")
    m.add_argument("--model", choices=("gcn", "sage"), default="gcn", help="architecture")
    m.add_argument("--layers", type=int, default=2, help="number of layers (default 2)")
    m.add_argument("--hidden", type=int, default=16, help="hidden width (default 16)")
    m.add_argument("--dropout", type=float, default=0.5, help="dropout before hidden layers")
    m.add_argument(
        "--input-dropout", type=float, default=None, help="dropout of the input (default --dropout)"
    )
    m.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    m.add_argument("--weight-decay", type=float, default=5e-4, help="L2 penalty (default 5e-4)")
    m.add_argument(
        "--weight-decay-scope",
        choices=("first", "all"),
        default="first",
        help="apply weight decay to the first layer only (PyG/Kipf GCN, default) or all layers",
    )
    m.add_argument("--epochs", type=int, default=200, help="epochs (default 200)")
    m.add_argument("--seed", type=int, default=0, help="seed of initial weights and dropout")
    m.add_argument(
        "--normalize-features",
        action="store_true",
        help="row-normalise features as PyG's NormalizeFeatures (standard for Planetoid)",
    )
    m.add_argument(
        "--precompute-first",
        choices=("auto", "on", "off"),
        default="auto",
        help="aggregate the input features once (exact; auto = when input dropout is 0)",
    )
    m.add_argument(
        "--exchange-buffer-mb",
        type=float,
        default=256.0,
        metavar="MB",
        help="largest halo send/receive buffer; a wider uncompressed exchange goes in slices "
        "of every peer's rows, at most two in flight (less memory, some time per slice; "
        "default 256)",
    )
    c = p.add_argument_group("halo compression (training exchanges; evaluation sends float32)")
    codecs = ("none", "fp16", "bf16", "int8", "int4", "int2")  # fullgraph.compression.CODECS
    c.add_argument(
        "--compress-fwd",
        choices=codecs,
        default="none",
        help="codec of forward halo activations: fp16/bf16 casts, intN = per-row min/scale "
        "with stochastic rounding, packed (default none = float32)",
    )
    c.add_argument(
        "--compress-bwd",
        choices=codecs,
        default="none",
        help="codec of backward halo gradients (same choices; default none)",
    )
    c.add_argument(
        "--error-feedback",
        action="store_true",
        help="add each sent row's last quantization residual before quantizing it again",
    )
    r = p.add_argument_group("runtime")
    r.add_argument(
        "--transport",
        choices=("auto", "local", "mpi", "gloo", "nccl"),
        default="auto",
        help="halo/all-reduce transport (auto: mpi with several ranks, else local)",
    )
    r.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where tensors live (auto: cuda with --transport nccl, else cpu)",
    )
    r.add_argument(
        "--threads", type=int, default=None, help="threads per rank (default cores/ranks)"
    )
    r.add_argument("--timeout", type=float, default=300.0, help="seconds any collective may wait")
    r.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs")
    r.add_argument("--log-json", help="write one JSON object per epoch (and a final one) here")
    r.add_argument("--checkpoint", help="checkpoint directory (config.json is saved there too)")
    r.add_argument("--checkpoint-every", type=int, default=10, help="epochs between checkpoints")
    r.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    r.add_argument(
        "--force",
        action="store_true",
        help="start over where --checkpoint or --log-json hold an earlier run's result "
        "(the old checkpoint is replaced at this run's first checkpoint)",
    )
    r.add_argument("--no-verify", action="store_true", help="skip part checksum verification")
    r.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    p.set_defaults(func=run_train)


def _check_args(args: argparse.Namespace) -> None:
    """The options that are not part of the run's config, before any work (alike on every
    rank); :class:`~fullgraph.train_config.TrainConfig` checks the rest."""
    from fullgraph.errors import ConfigError
    from fullgraph.option_checks import check_number, check_path, check_timeout

    sources = [s for s in ("parts", "dataset", "synthetic") if getattr(args, s) is not None]
    if len(sources) != 1:
        raise ConfigError("give exactly one of --parts, --dataset (with --root), --synthetic")
    if args.dataset and not args.root:
        raise ConfigError("--dataset needs --root (the dataset root directory)")
    check_number("--threads", args.threads, low=1, integer=True, optional=True)
    check_timeout("--timeout", args.timeout)
    for option in ("parts", "dataset", "root", "log_json", "checkpoint"):
        check_path(f"--{option.replace('_', '-')}", getattr(args, option))


def _check_device(device: str, transport: str) -> None:
    """The device exists and the transport can move its tensors."""
    import torch

    from fullgraph.errors import ConfigError

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}, but torch {torch.__version__} sees no CUDA device")
    if transport == "mpi" and device != "cpu":
        raise ConfigError("transport mpi exchanges host buffers: use --device cpu (or nccl)")


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    try:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    except ImportError:
        pass


def _load_part(args: argparse.Namespace, rank: int):
    if args.parts:
        from fullgraph.partition.load import load_partition

        return load_partition(args.parts, rank, mmap=False, verify_checksums=not args.no_verify)
    from fullgraph.local_graph import whole_graph_part

    if args.synthetic:
        from fullgraph.datasets.synthetic import generate

        return whole_graph_part(generate(args.synthetic, seed=args.seed))
    from fullgraph.datasets import load

    return whole_graph_part(load(args.dataset, args.root))


def _config(args: argparse.Namespace, transport: str):
    """The run's :class:`~fullgraph.train_config.TrainConfig` (validated) from the options."""
    from fullgraph.train_config import TrainConfig

    device = args.device if args.device != "auto" else ("cuda" if transport == "nccl" else "cpu")
    return TrainConfig(
        model=args.model,
        layers=args.layers,
        hidden=args.hidden,
        dropout=args.dropout,
        input_dropout=args.input_dropout,
        lr=args.lr,
        weight_decay=args.weight_decay,
        weight_decay_scope=args.weight_decay_scope,
        epochs=args.epochs,
        seed=args.seed,
        precompute_first=args.precompute_first,
        normalize_features=args.normalize_features,
        eval_every=args.eval_every,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        force=args.force,
        log_json=args.log_json,
        quiet=args.quiet,
        device=device,
        compress_fwd=args.compress_fwd,
        compress_bwd=args.compress_bwd,
        error_feedback=args.error_feedback,
        exchange_buffer_mb=args.exchange_buffer_mb,
    )


def run_train(args: argparse.Namespace) -> int:
    """Handler of ``fullgraph train``; returns the exit status.

    Failure policy: option errors are found before the communicator exists, alike on every
    rank; checks that can differ between ranks (this rank's part, rank 0's outputs, the
    checkpoint) are agreed on by all ranks, so bad input ends every rank with one line from
    rank 0; anything else on one rank aborts the job with that rank's error.
    """
    # torch's and numba's OpenMP pools would busy-wait against each other (and against other
    # ranks on the node) between parallel regions; must be set before either library loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Large activations: 2 MB-aligned, huge-page backed torch allocations (fewer page faults;
    # ~25% off an arxiv-sized epoch here).
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    from fullgraph.comm import create_communicator
    from fullgraph.errors import ConfigError, FullgraphError, mark_replicated
    from fullgraph.faults import run_on_every_rank
    from fullgraph.launch import default_threads, detect_launch
    from fullgraph.resources import release_freed_memory

    release_freed_memory()
    info = detect_launch()
    try:
        _check_args(args)
        transport = args.transport
        if transport == "auto":
            transport = "mpi" if info.size > 1 else "local"
        cfg = _config(args, transport)
        _check_device(cfg.device, transport)
        if args.parts:
            from fullgraph.partition.format import read_meta

            meta, _ = read_meta(args.parts)
            if int(meta["num_parts"]) != info.size:
                raise ConfigError(
                    f"{args.parts} has {meta['num_parts']} parts but {info.size} ranks were "
                    f"started; run `mpirun -n {meta['num_parts']}`"
                )
        elif info.size > 1:
            raise ConfigError(
                f"{info.size} ranks need --parts (the whole graph trains in one process)"
            )
    except (FullgraphError, FileExistsError, FileNotFoundError) as exc:
        raise mark_replicated(exc) from None
    threads = args.threads or default_threads(info)
    _set_threads(threads)
    comm = create_communicator(transport, info, args.timeout)
    return run_on_every_rank(comm, "train", lambda: _train(args, cfg, comm, info, threads))


def _train(args: argparse.Namespace, cfg, comm, info, threads: int) -> int:
    from fullgraph.checkpoint import CheckpointDir
    from fullgraph.faults import agree
    from fullgraph.run_outputs import RunOutputs
    from fullgraph.trainer import Trainer

    checkpoints = None
    if cfg.checkpoint:
        checkpoints = CheckpointDir(cfg.checkpoint, comm.rank, resume=cfg.resume, force=cfg.force)
    outputs = RunOutputs(comm.rank, cfg.log_json, checkpoints, resume=cfg.resume, force=cfg.force)
    started = False
    try:
        agree(comm, outputs.open)
        part = agree(comm, lambda: _load_part(args, comm.rank))
        trainer = Trainer(part, comm, cfg, checkpoints=checkpoints)
        if cfg.resume:
            agree(comm, trainer.resume)
        resolved = {
            "config": cfg.to_dict(),
            "data": args.parts or args.dataset or f"synthetic:{args.synthetic}",
            "partition_hash": part.partition_hash,
            "transport": comm.transport,
            "ranks": comm.size,
            "threads_per_rank": threads,
            "launch": info.to_dict(),
        }
        log = outputs.start(resolved, trainer.start_epoch)
        started = True
        if comm.rank == 0 and not cfg.quiet:
            print(
                f"fullgraph train: {comm.size} rank(s), transport {comm.transport}, "
                f"{threads} thread(s)/rank, model {cfg.model} L={cfg.layers} H={cfg.hidden}, "
                f"epochs {trainer.start_epoch}..{cfg.epochs}, halo compression "
                f"fwd {cfg.compress_fwd} bwd {cfg.compress_bwd}"
                f"{' + error feedback' if cfg.error_feedback else ''}",
                flush=True,
            )
        final = trainer.fit(log)
    finally:
        outputs.close(discard=not started)
    if comm.rank == 0:
        print(
            f"final: best val {final['best_val_acc']:.4f}, test at best val "
            f"{final['test_acc']:.4f}, median epoch {final['median_epoch_s'] * 1e3:.1f} ms",
            flush=True,
        )
    return 0
