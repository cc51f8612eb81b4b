"""``fullgraph predict``: a trained model over every node, written in global node order.

``mpirun -n P fullgraph predict --parts DIR --model FILE --out OUT`` (one process:
``--dataset NAME --root DIR`` or ``--synthetic PRESET``, as ``fullgraph train``). Every rank
loads its part, assembles it as the model's own configuration says
(:func:`~fullgraph.training.assembly.assemble_rank`) and runs the model layer by layer with the
halo exchange, without autograd and in evaluation mode
(:class:`~fullgraph.training.inference.Predictor`). Rank 0 creates the output files at full
size in a temporary sibling of ``OUT``; every rank writes its own rows at their global ids;
after a barrier rank 0 writes ``predict.json`` and renames the directory into place. The model
does not depend on the partition: any part count, or one process, predicts the same values.
With ``--correct-smooth`` the logits go through Correct & Smooth
(:mod:`fullgraph.propagation.correct_smooth`, exact at any part count) and the files hold the
smoothed predictions and class scores. ``--nodes`` writes some nodes only (the labelled, some
splits, a file's ids: :mod:`~fullgraph.training.node_selection`), the only choice on a
receptive-field cut. docs/predict.md describes the files.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fullgraph.atomic import Place, check_apart
from fullgraph.commands.predict_link import check_link_request
from fullgraph.commands.predict_record import (
    PROBABILITIES_SMOOTHED,
    check_visible,
    command_line,
    describe_smoothing,
    writing_note,
)
from fullgraph.config import Config, check_path, option
from fullgraph.errors import ConfigError
from fullgraph.partition import PartitionDir
from fullgraph.precision import FLOAT32, precision_option
from fullgraph.propagation.correct_smooth import CorrectSmoothOptions
from fullgraph.run.command import Command, Job
from fullgraph.run.nesting import check_not_inside_output
from fullgraph.run.options import RunOptions, RuntimeOptions, add_options
from fullgraph.training.config import TrainData
from fullgraph.training.inference import check_embeddings, check_widths, parse_layers
from fullgraph.training.model_file import ModelFile
from fullgraph.training.node_selection import NodeRequest, check_request, parse_nodes

if TYPE_CHECKING:
    from fullgraph.memory.shapes import GraphShape
    from fullgraph.training.inference import Predictor


@dataclass
class PredictData(TrainData):
    """What ``fullgraph predict`` runs on: parts (P ranks) or a whole graph (one process)."""

    parts: str | None = option(
        None,
        "partition directory written by `fullgraph partition` (any part count: the model does "
        "not depend on the partition it was trained on)",
    )
    dataset: str | None = option(None, "dataset name, predicted whole in one process")
    synthetic: str | None = option(
        None,
        "predict on a generated graph (tiny, arxiv, ...; generated with the model's seed)",
        metavar="PRESET",
    )


def _check_layers(option_name: str, value: list[int]) -> None:
    if not isinstance(value, list) or not all(isinstance(k, int) for k in value):
        raise ConfigError(f"{option_name} must be a list of layer numbers, got {value!r}")


@dataclass
class PredictOptions(Config):
    """``fullgraph predict``'s own options: the model file, the outputs, what is written."""

    model: str | None = option(
        None,
        "the model file `fullgraph train` wrote (--save-model)",
        metavar="FILE",
        required=True,
    )
    out: str | None = option(
        None,
        "output directory, written atomically: predictions.npy, probabilities.npy (or "
        "logits.npy), embeddings-K.npy, predict.json",
        metavar="DIR",
        required=True,
    )
    logits: bool = option(
        False, "write logits.npy (the raw logits) instead of probabilities.npy (their softmax)"
    )
    embeddings: list[int] = option(
        [],
        "also write embeddings-K.npy for these layers: the output of layer K (1-based) as layer "
        "K+1 receives it, after its residual, normalisation and ReLU; K in 1..L-1 (default: "
        "none)",
        parse=parse_layers,
        check=_check_layers,
        metavar="K[,K...]",
    )
    pairs: str | None = option(
        None,
        "a link model (--task link): the node pairs to score, a .npy of ints [m, 2] or a text "
        "file of two node ids per line; writes scores.npy (logits) and probabilities.npy",
        metavar="FILE",
    )
    nodes: str = option(
        "all",
        "which nodes' rows the files hold: all (in global id order), labelled (the train, val "
        "and test nodes), splits (train,val: their nodes in ascending id) or a file of node ids "
        "(.npy of ints [m], or one id per line: in its order); ids are the whole graph's (a "
        "receptive-field cut's node_ids). Other than all: node_ids.npy names each row's node. "
        "A partition cut by --cut-hops predicts its labelled nodes only",
        metavar="SPEC",
    )
    force: bool = option(
        False, "replace an existing --out (only a directory `fullgraph predict` wrote)"
    )
    quiet: bool = option(False, "no start line and no per-layer lines")
    precision: str | None = precision_option(None, "; default: the model's")

    def check(self) -> None:
        """``--model`` and ``--out`` given, not empty."""
        check_path("--model", self.model)
        check_path("--out", self.out)
        if not self.model:
            raise ConfigError("--model FILE is required (a model file `fullgraph train` wrote)")
        if not self.out:
            raise ConfigError("--out DIR is required (the directory the predictions go to)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``predict`` subcommand."""
    p = subparsers.add_parser(
        "predict",
        help="predict every node with a trained model (mpirun -n P for P ranks)",
        description=(
            "Full-graph inference with a model file `fullgraph train` wrote: every node's "
            "class, probabilities (or logits) and, on request, hidden-layer embeddings, written "
            "in global node order as memory-mappable .npy files plus predict.json. "
            "Distributed: `mpirun -n P fullgraph predict --parts DIR --model FILE --out OUT` "
            "(any P: the model does not depend on the partition). One process: "
            "`fullgraph predict --dataset NAME --root DATA --model FILE --out OUT`."
        ),
    )
    add_options(
        p,
        ("data (one of)", PredictData, ()),
        ("prediction", PredictOptions, ()),
        ("correct and smooth", CorrectSmoothOptions, ()),
        ("runtime", RuntimeOptions, ()),
    )
    p.set_defaults(func=PredictCommand.main)


class PredictCommand(Command):
    """``fullgraph predict`` on this rank.

    Attributes:
        data: what the run predicts (parts or a whole graph).
        options: the model file, the outputs and what is written.
        parts: the partition directory, its ``meta.json`` read once (``--parts``), or ``None``.
        model_file: the model file, read and checked (in :meth:`check`).
    """

    name = "predict"

    def configure(self) -> None:
        """The runtime options, the data and the prediction's own options."""
        self.runtime = RuntimeOptions.from_args(self.args)
        self.data = PredictData.from_args(self.args)
        self.options = PredictOptions.from_args(self.args)
        self.cs = CorrectSmoothOptions.from_args(self.args)
        self.io = RunOptions(force=self.options.force, quiet=self.options.quiet)
        self.parts: PartitionDir | None = None
        self.model_file: ModelFile | None = None
        self.precision = FLOAT32  # resolved in check(): --precision, else the model's
        self.nodes = NodeRequest()  # --nodes, read in check()

    def check(self) -> None:
        """The rank count against the part count; the output apart from the inputs; the model
        file read whole (checksum), the embedding layers against its depth, its widths against
        the partition's."""
        from fullgraph.training.model_file import load_model_file

        size, opts = self.launch.size, self.options
        if self.cs.correct_smooth and opts.logits:
            raise ConfigError(
                "--logits writes the model's raw logits, --correct-smooth its smoothed class "
                "scores (as probabilities.npy): give one of them"
            )
        if self.data.parts:
            self.parts = PartitionDir.open(self.data.parts)
            self.parts.check_ranks(
                size,
                f"run `{self.launch.relaunch(self.parts.num_parts)}` (or predict with a "
                f"partition of {size} parts: the model does not depend on the partition)",
            )
        elif size > 1:
            raise ConfigError(
                f"{size} ranks need --parts (a whole graph is predicted in one process)"
            )
        check_apart([Place(Path(opts.out), f"--out {opts.out}", whole=True)], self._inputs())
        check_not_inside_output(opts.out, f"--out {opts.out}")  # another command's output
        self.model_file = mf = load_model_file(opts.model)
        # the model's precision unless --precision says otherwise; where this device has no
        # bfloat16, a bf16-mixed model runs in float32 (with a line) unless asked for bf16
        from fullgraph.precision import bf16_unsupported

        bf16 = mf.config.precision == "bf16-mixed" and bf16_unsupported(self.device) is None
        model_precision = "bf16-mixed" if bf16 else "32"
        self.precision = self.resolve_precision(opts.precision or model_precision)
        check_embeddings(opts.embeddings, mf.config.layers)
        self.nodes = parse_nodes(opts.nodes)
        if mf.config.task == "link" or opts.pairs:
            check_link_request(mf, opts.pairs, opts.embeddings, opts.logits, self.cs.correct_smooth)
            check_request(self.nodes, None, self._named(), link=True)
            if self.parts is not None and int(self.parts.meta["num_features"]) != mf.num_features:
                check_widths(mf, int(self.parts.meta["num_features"]), mf.num_classes, "--parts")
            return
        if self.parts is not None:
            meta = self.parts.meta
            check_widths(
                mf,
                int(meta["num_features"]),
                int(meta["num_classes"]),
                f"--parts {self.data.parts}",
            )
        meta = self.parts.meta if self.parts is not None else None
        check_request(self.nodes, meta, self._named())

    def _inputs(self) -> list[Place]:
        """What the run reads: its partition or dataset, and the model file."""
        model = Place(Path(self.options.model), f"--model {self.options.model}", "the model file")
        return [*self.data.inputs(self.parts), model]

    def _memory_check(self, shape: GraphShape, ranks_per_node: int) -> list[str]:
        """Rank 0: predict's peak from the sizes (this process's resident memory as the floor,
        no probe) against this machine's memory, as ``--memory-check`` says.

        Returns:
            ``warning:`` lines (``--memory-check warn``).

        Raises:
            ConfigError: ``refuse`` and a node would not fit.
        """
        from fullgraph.memory.plan import StartupPlan

        assert self.model_file is not None
        plan = StartupPlan(
            self.model_file.config, self.runtime.memory_check, ranks_per_node, mode="predict"
        )
        plan.check_sizes(shape)
        return [line for line in plan.report(shape) if line.startswith("warning:")]

    def run(self, job: Job) -> dict[str, Any]:
        """Output checked, memory plan, the part, the predictor, the files, ``predict.json``."""
        from fullgraph.atomic import atomic_dir, atomic_write_json, check_output
        from fullgraph.memory.model import GraphShape
        from fullgraph.resources import peak_rss_mb
        from fullgraph.run.prediction_dir import NODE_IDS
        from fullgraph.training.inference import PREDICTION, Predictor, create_files
        from fullgraph.training.node_selection import (
            select_rows,
            selection_record,
            write_node_ids,
        )
        from fullgraph.watchdog import phase

        comm, opts, mf = job.comm, self.options, self.model_file
        assert mf is not None and opts.out is not None
        if mf.config.task == "link":
            from fullgraph.commands.predict_link import run_link

            return run_link(self, job)
        out, first = Path(opts.out), comm.rank == 0
        job.agree(
            lambda: (
                check_output(out, "--out", kind="dir", exist_ok=opts.force, ours=PREDICTION)
                if first
                else None
            )
        )
        warnings: list[str] = []
        if self.parts is not None:
            meta = self.parts.meta
            warnings = job.agree(
                lambda: (
                    self._memory_check(GraphShape.from_meta(meta), job.info.local_size)
                    if first
                    else []
                )
            )
        with phase("part loading"):
            part = job.agree(lambda: self.data.load_part(self.parts, comm.rank, mf.config.seed))
        with phase("node selection"):  # --nodes: this rank's output rows (a collective)
            selected = select_rows(self.nodes, part, comm, self._named())
        if mf.config.edge_weight:
            from fullgraph.training.assembly import check_edge_weights

            wanted_by = f"--model {mf.path} was trained with --edge-weight"
            job.agree(lambda p=part: check_edge_weights(p, wanted_by, self.data))
        if self.parts is None:  # one process: the sizes are known once the graph is loaded
            check_widths(mf, int(part.num_features), int(part.num_classes), self._named())
            warnings = self._memory_check(GraphShape.from_part(part, self.data.label), 1)
        for line in warnings:
            print(f"fullgraph predict: {line}", file=sys.stderr, flush=True)
        from fullgraph.propagation.cache import HopCache

        hop_cache = HopCache.of_run(  # sgc's and sign's hops: those training kept, if any
            self.parts.root if self.parts is not None else None,
            force=opts.force,
            verify=not self.data.no_verify,
            quiet=opts.quiet,
        )
        with phase("model set-up"):
            predictor = Predictor(
                part, comm, mf, job.device, self.precision, hop_cache=hop_cache, rows=selected
            )
        if selected is not None:  # the writer holds its row order
            selected.rows = selected.rows[:0]
        smoother = None
        params = self.cs.correct_smooth_params()
        if params is not None:
            from fullgraph.propagation.correct_smooth import CorrectSmooth

            plan, blocks = predictor.ctx.plan, predictor.ctx.blocks
            with phase("correct & smooth set-up"):
                smoother = job.agree(
                    lambda p=part: CorrectSmooth.of_part(p, plan, params, job.device, blocks)
                )
        del part  # the predictor holds what it runs on
        files = predictor.files(opts.embeddings, opts.logits)
        if selected is not None:
            files[NODE_IDS] = ((selected.count,), "int64")
        quiet = opts.quiet
        cfg = mf.config
        if first and not quiet:
            print(
                f"fullgraph predict: {mf.path} (model {cfg.model} L={cfg.layers} "
                f"H={cfg.hidden}, sha256 {mf.sha256[:12]}) over {predictor.num_nodes} nodes of "
                f"{self.data.label}{writing_note(selected, opts.nodes)}, {comm.size} rank(s), "
                f"transport {comm.transport}, "
                f"{job.threads} thread(s)/rank",
                flush=True,
            )
            if params is not None:
                print(f"correct & smooth: {describe_smoothing(params.to_dict())}", flush=True)
            elif cfg.correct_smooth:
                print(
                    f"fullgraph predict: note: {mf.path} was picked by its Correct & Smooth "
                    f"validation score (trained with --correct-smooth); these are the model's "
                    f"own predictions (add --correct-smooth and its parameters for the "
                    f"smoothed ones)",
                    file=sys.stderr,
                    flush=True,
                )

        def progress(k: int, layers: int, seconds: float) -> None:
            if first and not quiet:
                wrote = " (embeddings written)" if k in opts.embeddings else ""
                print(f"layer {k}/{layers}: {seconds:.2f} s{wrote}", flush=True)

        with contextlib.ExitStack() as stack:

            def begin() -> str:
                """Rank 0: the temporary directory (removed on failure), the files in it."""
                if not first:
                    return ""
                tmp = stack.enter_context(
                    atomic_dir(out, force=opts.force, ours=PREDICTION, option="--out")
                )
                create_files(tmp, files, out)
                if selected is not None and selected.node_ids is not None:
                    write_node_ids(tmp / NODE_IDS, selected.node_ids)
                    selected.node_ids = None
                return str(tmp)

            where = Path(comm.allgather_object(job.agree(begin))[0])
            job.agree(lambda: check_visible(where, out))
            t0 = time.perf_counter()
            result = predictor.run(where, opts.embeddings, opts.logits, progress, smoother)
            if smoother is not None and first and not quiet:
                took = smoother.seconds
                print(
                    f"correct & smooth: correction {took['correct_s']:.2f} s, smoothing "
                    f"{took['smooth_s']:.2f} s",
                    flush=True,
                )
            mine = {
                "seconds": time.perf_counter() - t0,
                "layer_seconds": result["layer_seconds"],
                "write_s": result["write_s"],
                "peak_rss_mb": peak_rss_mb(),
            }
            ranks = comm.allgather_object(mine)  # also the barrier: every rank's rows are synced
            record = self._record(job, predictor, files, result["summary"], ranks)
            meta = self.parts.meta if self.parts is not None else None
            record["nodes"] = selection_record(self.nodes, selected, predictor.num_nodes, meta)
            if smoother is not None:
                record["correct_smooth"] = {
                    **smoother.params.to_dict(),
                    **{k: round(v, 4) for k, v in smoother.seconds.items()},
                    "base_summary": result["base_summary"],
                    "probabilities": PROBABILITIES_SMOOTHED,
                }
            if first:
                atomic_write_json(where / "predict.json", record)
        if first:
            summary = ", ".join(f"{k} {v:.4f}" for k, v in result["summary"].items())
            if smoother is not None:
                base = ", ".join(f"{k} {v:.4f}" for k, v in result["base_summary"].items())
                summary = f"after Correct & Smooth: {summary}; the model alone: {base}"
            peak = max(r["peak_rss_mb"] for r in ranks)
            print(
                f"predicted {predictor.num_rows} nodes in {record['seconds']:.2f} s ({summary}); "
                f"peak RSS {peak:.0f} MiB (largest rank); written to {out}",
                flush=True,
            )
        return record

    def _named(self) -> str:
        """How the command line names the data (for messages)."""
        if self.data.parts:
            return f"--parts {self.data.parts}"
        if self.data.dataset:
            return f"--dataset {self.data.dataset} --root {self.data.root}"
        return f"--synthetic {self.data.synthetic}"

    def _record(
        self,
        job: Job,
        predictor: Predictor,
        files: dict[str, tuple[tuple[int, ...], str]],
        summary: dict[str, float],
        ranks: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """``predict.json``: the model (path, sha256), the data, the command, the files and
        their shapes, the summary, time and memory per rank."""
        mf, data, opts = self.model_file, self.data, self.options
        num_nodes, metric, size = predictor.num_nodes, predictor.metric, job.comm.size
        assert mf is not None
        layers = len(ranks[0]["layer_seconds"])
        return {
            "format": "fullgraph-predict",
            "version": 1,
            "model": {
                "path": str(Path(mf.path).resolve()),
                "sha256": mf.sha256,
                "config": mf.config.to_dict(),
                "epoch": mf.info.get("epoch"),
                "trained_on": mf.info.get("data"),
            },
            "data": {
                "parts": str(self.parts.root.resolve()) if self.parts is not None else None,
                "partition_meta_sha256": self.parts.meta_hash if self.parts is not None else None,
                "dataset": data.dataset,
                "root": str(Path(data.root).resolve()) if data.root else None,
                "split": self.parts.meta.get("split") if self.parts is not None else data.split,
                "synthetic": data.synthetic,
                "num_nodes": num_nodes,
            },
            "command": command_line(size, data, opts, self.cs, self.runtime),
            "ranks": size,
            "transport": job.comm.transport,
            "device": job.device,
            "precision": self.precision.name,
            "files": {
                name: {"shape": list(shape), "dtype": dtype}
                for name, (shape, dtype) in files.items()
            },
            "embeddings": {
                str(k): f"output of layer {k} as layer {k + 1} receives it" for k in opts.embeddings
            },
            "metric": metric,
            "summary": summary,
            "seconds": max(r["seconds"] for r in ranks),
            "layer_seconds": [max(r["layer_seconds"][i] for r in ranks) for i in range(layers)],
            "write_s": max(r["write_s"] for r in ranks),
            "peak_rss_mb": [round(r["peak_rss_mb"], 1) for r in ranks],
        }
