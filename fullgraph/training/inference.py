"""Full-graph inference with a trained model: what ``fullgraph predict`` does on one rank.

:class:`Predictor` runs the model of a model file (:mod:`fullgraph.training.model_file`) over
every node of this rank's part, layer by layer with the halo exchange, as the trainer's
evaluation does: no autograd, evaluation mode (BatchNorm's running statistics, no dropout),
float32 exchanges, on the context :func:`~fullgraph.training.assembly.assemble_rank` builds
from the model's own configuration (its ``normalize_features`` applies as in training). The
model does not depend on the partition: a model trained at one rank count predicts at any.

The outputs are ``.npy`` files in GLOBAL node order that nobody gathers: rank 0 creates them
at their full size (:func:`create_files`, ``np.lib.format.open_memmap``) in the temporary
directory of the output, then every rank writes its own rows at their global ids
(:class:`RowWriter`), a window of the file at a time, so that a rank never maps more than
:data:`WRITE_WINDOW_BYTES` of a file and no rank holds another's rows.

``--nodes`` (:mod:`~fullgraph.training.node_selection`) writes some nodes only: the files
then hold ``m`` rows, every rank writing its selected rows at their positions in the selection
(the others skipped), and ``node_ids.npy`` says which node each row is.

Files (:func:`output_files`; ``N`` is ``m`` under ``--nodes``):

- ``predictions.npy``: int64 ``[N]``, the class of every node (the argmax of its logits);
- ``probabilities.npy``: float32 ``[N, C]``, the softmax of the logits, or ``logits.npy``
  (the logits themselves, ``logits=True``);
- ``embeddings-<k>.npy``: float32 ``[N, d_k]`` for every requested ``k`` in ``1 .. L-1``:
  the output of layer ``k`` as layer ``k + 1`` receives it, after the residual connection,
  the normalisation and the ReLU (no dropout in evaluation).

A directory holding them and ``predict.json`` is :data:`PREDICTION` output.
"""

from __future__ import annotations

import errno
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import ConfigError, DataError, OutputError
from fullgraph.partition import Partition
from fullgraph.precision import Precision
from fullgraph.propagation.cache import HopCache
from fullgraph.run.metrics import split_metrics
from fullgraph.run.prediction_dir import (  # noqa: F401  (the format, re-exported)
    FORMAT,
    LOGITS,
    PREDICTION,
    PREDICTIONS,
    PROBABILITIES,
    SUMMARY,
    VERSION,
    WRITE_WINDOW_BYTES,
    embeddings_name,
)
from fullgraph.training.assembly import assemble_rank
from fullgraph.training.config import TrainConfig
from fullgraph.training.model_file import ModelFile
from fullgraph.training.node_selection import NodeRows


def parse_layers(text: str) -> list[int]:
    """``"1,2"`` -> ``[1, 2]`` (sorted, without repeats); ``""`` -> ``[]``.

    Raises:
        ConfigError: an entry is not an integer.
    """
    try:
        layers = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(
            f"--embeddings must be comma-separated layer numbers, got {text!r}"
        ) from None
    return sorted(set(layers))


def check_embeddings(layers: Sequence[int], num_layers: int) -> None:
    """Refuse embedding layers outside ``1 .. num_layers - 1`` (one line).

    Raises:
        ConfigError: a layer is 0, negative, or the last layer or beyond (its output is the
            logits, written anyway).
    """
    bad = [k for k in layers if not 1 <= k <= num_layers - 1]
    if not bad:
        return
    if num_layers == 1:
        raise ConfigError(
            f"--embeddings {bad[0]}: the model has 1 layer, whose output is the logits; it has "
            f"no embeddings to write"
        )
    raise ConfigError(
        f"--embeddings {bad[0]}: the model has {num_layers} layers; layer k's embeddings exist "
        f"for k in 1..{num_layers - 1} (layer {num_layers}'s output is the logits)"
    )


def check_widths(model: ModelFile, num_features: int, num_classes: int, data: str) -> None:
    """Refuse data whose feature or class count is not the model's (one line, both numbers).

    Args:
        model: the model file.
        num_features: the data's input width.
        num_classes: the data's class count.
        data: how the command line names the data (``--parts DIR``).

    Raises:
        ConfigError: the counts differ.
    """
    if (model.num_features, model.num_classes) == (num_features, num_classes):
        return
    raise ConfigError(
        f"--model {model.path} was trained on {model.num_features} features and "
        f"{model.num_classes} classes, but {data} has {num_features} features and "
        f"{num_classes} classes"
    )


def inference_config(config: TrainConfig) -> TrainConfig:
    """The model's configuration as inference assembles it: no receptive-field pruning (every
    node is predicted) and no halo compression (evaluation exchanges float32 rows)."""
    return replace(
        config, prune="off", compress_fwd="none", compress_bwd="none", error_feedback=False
    )


def output_files(
    num_nodes: int, dims: Sequence[int], embeddings: Sequence[int], logits: bool
) -> dict[str, tuple[tuple[int, ...], str]]:
    """The output files: name -> (shape, dtype name), in the order they are written.

    Args:
        num_nodes: ``N``, the graph's nodes.
        dims: the model's widths ``[F, d_1, ..., d_L]`` (:attr:`GNN.dims`).
        embeddings: the layers whose embeddings are written.
        logits: write the logits instead of the probabilities.
    """
    files: dict[str, tuple[tuple[int, ...], str]] = {}
    for k in embeddings:
        files[embeddings_name(k)] = ((num_nodes, int(dims[k])), "float32")
    files[PREDICTIONS] = ((num_nodes,), "int64")
    files[LOGITS if logits else PROBABILITIES] = ((num_nodes, int(dims[-1])), "float32")
    return files


def _size(n: int) -> str:
    """``n`` bytes for a message: ``12.5 MiB``, ``40 KiB``."""
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{max(1, round(n / 1024))} KiB"


def files_bytes(files: dict[str, tuple[tuple[int, ...], str]]) -> int:
    """The bytes the output files take on disk: their rows, and a header page each."""
    rows = sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in files.values())
    return rows + 4096 * len(files)


def _no_room(target: Path, directory: Path, needed: int) -> OutputError:
    st = os.statvfs(directory)
    return OutputError(
        f"--out {target}: no space left on device writing the predictions: they need "
        f"{_size(needed)}, {_size(st.f_bavail * st.f_frsize)} free there; nothing was written "
        f"(free some space or choose another --out)"
    )


def create_files(
    directory: Path, files: dict[str, tuple[tuple[int, ...], str]], target: Path | None = None
) -> None:
    """Create every output file at its full size, its blocks allocated; rank 0 does this before
    any rank writes its rows.

    The rows are written through memory mappings, where a disk that fills is a ``SIGBUS``
    that kills the rank without a word: so the room is checked first and taken at once
    (``posix_fallocate``), and a disk without it fails here with one line.

    Args:
        directory: the temporary output directory.
        files: name -> (shape, dtype name), as :func:`output_files` gives.
        target: the ``--out`` the directory becomes (named in the message).

    Raises:
        OutputError: no room for the files on ``directory``'s file system.
    """
    target = target or directory
    needed = files_bytes(files)
    st = os.statvfs(directory)
    if needed > st.f_bavail * st.f_frsize:
        raise _no_room(target, directory, needed)
    try:
        for name, (shape, dtype) in files.items():
            mm = np.lib.format.open_memmap(directory / name, mode="w+", dtype=dtype, shape=shape)
            del mm
            if hasattr(os, "posix_fallocate"):
                fd = os.open(directory / name, os.O_RDWR)
                try:
                    os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
                finally:
                    os.close(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _no_room(target, directory, needed) from None
        raise


def _header(path: Path) -> tuple[int, tuple[int, ...], np.dtype]:
    """``(header bytes, shape, dtype)`` of the ``.npy`` file ``path``."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        return f.tell(), tuple(shape), np.dtype(dtype)


def window_rows(window_bytes: int, file_row_bytes: int, rows_row_bytes: int) -> int:
    """Rows of one write window: the file's bytes mapped and the source rows gathered for
    them stay within ``window_bytes`` (at least one row)."""
    return max(1, window_bytes // max(file_row_bytes, rows_row_bytes, 1))


def sync_files(paths: Sequence[Path]) -> None:
    """``fsync`` every file of ``paths`` (this rank's written pages reach the disk)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class RowWriter:
    """Writes this rank's rows into output files at their output rows.

    Every row of this rank goes to its output row (its global id when every node is written;
    its position in ``--nodes``' selection otherwise, :mod:`~fullgraph.training.
    node_selection`), or nowhere (-1). The rows are written in ascending output row, one window
    of the file (:data:`WRITE_WINDOW_BYTES`) mapped at a time and unmapped before the next, so
    the mapped pages never add more than a window to the rank's resident memory.

    Args:
        global_ids: int64 [num_inner], the output row of every row of this rank, or -1: the
            row is not written.
        num_nodes: ``N``, the rows of the files; every output row must lie in ``[0, N)``.
        device: where the rows come from.
        window_bytes: the most bytes of a file mapped at a time.

    Raises:
        DataError: an output row out of range.
    """

    def __init__(
        self,
        global_ids: np.ndarray,
        num_nodes: int,
        device: torch.device | str = "cpu",
        window_bytes: int = WRITE_WINDOW_BYTES,
    ) -> None:
        gids = np.asarray(global_ids, dtype=np.int64)
        if gids.size and (int(gids.min()) < -1 or int(gids.max()) >= num_nodes):
            raise DataError(f"a global node id lies outside [0, {num_nodes}): not this graph's")
        if gids.size and int(gids.min()) < 0:  # a selection: only the rows written, in order
            kept = np.flatnonzero(gids >= 0)
            order = kept[np.argsort(gids[kept], kind="stable")]
            del kept
        else:
            order = np.argsort(gids, kind="stable")
        self.ids = gids[order]
        self.order = torch.from_numpy(order).to(device)
        self.window = max(1, int(window_bytes))
        #: the files written, for :func:`sync_files`
        self.written: list[Path] = []

    def write(
        self,
        path: Path,
        rows: torch.Tensor,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """Write ``transform(rows)`` (row-wise; default the rows) at this rank's global ids.

        Args:
            path: an output file :func:`create_files` made.
            rows: [num_inner, ...] in this rank's row order.
            transform: a row-wise map applied a window's rows at a time (softmax, argmax).
        """
        header, shape, dtype = _header(path)
        row_shape = shape[1:]
        row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
        # a window bounds the file's bytes mapped and the rows gathered for it alike
        per_window = window_rows(
            self.window, row_bytes, rows.element_size() * math.prod(rows.shape[1:])
        )
        n = shape[0]
        starts = np.arange(0, n, per_window, dtype=np.int64)
        bounds = np.searchsorted(self.ids, np.append(starts, n))
        for w, start in enumerate(starts.tolist()):
            lo, hi = int(bounds[w]), int(bounds[w + 1])
            if lo == hi:
                continue
            chunk = rows[self.order[lo:hi]]
            if transform is not None:
                chunk = transform(chunk)
            data = chunk.detach().cpu().numpy().astype(dtype, copy=False)
            count = min(per_window, n - start)
            mm = np.memmap(
                path,
                dtype=dtype,
                mode="r+",
                offset=header + start * row_bytes,
                shape=(count, *row_shape),
            )
            mm[self.ids[lo:hi] - start] = data
            del mm, chunk, data  # unmapped: its pages leave this rank's resident memory
        if path not in self.written:
            self.written.append(path)


def model_metric(model: ModelFile, dataset: str | None, num_classes: int) -> str:
    """The metric the model was judged by (its file's ``metric``), else its configuration's
    resolved for this data (:func:`fullgraph.metrics.resolve_metric`)."""
    from fullgraph.metrics import METRICS, resolve_metric

    named = model.info.get("metric")
    if named in METRICS:
        return str(named)
    return resolve_metric(model.config.metric, dataset, num_classes)


class Predictor:
    """One rank's inference (every rank of the job builds one; a collective).

    Args:
        part: this rank's part (one process: the whole graph's).
        comm: the communicator.
        model: the model file.
        device: where tensors live.
        precision: the resolved policy, or ``None``: the model's.
        hop_cache: where SGC's and SIGN's precomputed hops are kept (``fullgraph predict``'s:
            the partition's); ``None``: computed, nothing kept.
        rows: ``--nodes``' output rows of this rank (:func:`~fullgraph.training.
            node_selection.select_rows`), or ``None``: every node, at its global id.

    Attributes:
        model: the trained :class:`~fullgraph.models.gnn.GNN`, in evaluation mode.
        data: ``x``, ``y`` and the ``train``/``val``/``test`` masks of this rank's rows.
        num_nodes: ``N``, the graph's nodes (the sum of every rank's rows).
        num_rows: the rows of every output file: ``N``, or the selection's ``m``.
    """

    def __init__(
        self,
        part: Partition,
        comm: Communicator,
        model: ModelFile,
        device: torch.device | str = "cpu",
        precision: Precision | None = None,
        hop_cache: HopCache | None = None,
        rows: NodeRows | None = None,
    ) -> None:
        self.comm, self.device, self.file = comm, torch.device(device), model
        config = inference_config(model.config)
        if precision is not None:  # else the model's (``fullgraph predict --precision``)
            config = replace(config, precision=precision.name)
        rank = assemble_rank(part, comm, config, self.device, precision, hop_cache=hop_cache)
        self.data, self.ctx = rank.data, rank.ctx
        self.model = model.build().to(self.device)
        #: the summary's metric (:func:`model_metric`)
        self.metric = model_metric(model, part.meta.get("dataset"), int(part.num_classes))
        #: a receptive-field cut's dropped splits: their masks are empty, left out of the summary
        self.dropped = tuple((part.meta.get("cut") or {}).get("dropped_splits", ()))
        inner = torch.tensor([float(part.num_inner)], dtype=torch.float64)
        self.num_nodes = int(comm.allreduce_(inner, "sum", tag="setup")[0])
        self.num_rows = self.num_nodes if rows is None else rows.count
        out = self.ctx.global_ids if rows is None else rows.rows
        self.writer = RowWriter(out, self.num_rows, self.device)

    def _kept(self, summary: dict[str, float]) -> dict[str, float]:
        """``summary`` without a cut's dropped splits (``val_acc`` of a cut to train)."""
        return {k: v for k, v in summary.items() if k.split("_", 1)[0] not in self.dropped}

    @property
    def num_layers(self) -> int:
        """The model's layers ``L``."""
        return self.model.num_layers

    def files(self, embeddings: Sequence[int], logits: bool) -> dict[str, Any]:
        """:func:`output_files` of this model and graph (``num_rows`` rows each)."""
        return output_files(self.num_rows, self.model.dims, embeddings, logits)

    @torch.no_grad()
    def run(
        self,
        directory: Path,
        embeddings: Sequence[int] = (),
        logits: bool = False,
        progress: Callable[[int, int, float], None] | None = None,
        smoother: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """The forward pass over every node; this rank's rows written into ``directory``.

        Args:
            directory: where rank 0 created the files (:func:`create_files`).
            embeddings: layers whose output is written (``1 .. L-1``).
            logits: write the logits instead of the probabilities.
            progress: called ``progress(k, L, seconds)`` after layer ``k`` (its embeddings
                written).
            smoother: Correct & Smooth (:class:`~fullgraph.propagation.correct_smooth.
                CorrectSmooth`, a collective) of the logits: its class scores are the
                predictions, ``probabilities.npy`` and the summary; ``base_summary`` the
                model's own.

        Returns:
            ``layer_seconds`` (this rank's, per layer, its embedding writes included),
            ``write_s`` (the predictions and probabilities or logits), ``summary`` (the
            metric on every split, over all ranks: :func:`~fullgraph.run.metrics.
            split_metrics`).
        """
        self.model.eval()
        wanted, seconds = set(embeddings), []
        clock = [time.perf_counter()]

        def on_layer(k: int, h: torch.Tensor) -> None:
            if k in wanted:
                self.writer.write(directory / embeddings_name(k), h)
            now = time.perf_counter()
            seconds.append(now - clock[0])
            if progress is not None:
                progress(k, self.num_layers, now - clock[0])
            clock[0] = time.perf_counter()

        out = self.model(self.data["x"], self.ctx, training=False, on_layer=on_layer)
        scores = None if smoother is None else smoother(out)
        t0 = time.perf_counter()
        chosen = out if scores is None else scores
        self.writer.write(directory / PREDICTIONS, chosen, lambda z: z.argmax(dim=1))
        if logits:
            self.writer.write(directory / LOGITS, out)
        elif scores is not None:
            self.writer.write(directory / PROBABILITIES, scores)
        else:
            self.writer.write(directory / PROBABILITIES, out, lambda z: torch.softmax(z, dim=1))
        sync_files(self.writer.written)
        write_s = time.perf_counter() - t0
        summary = self._kept(split_metrics(out, self.data["y"], self.data, self.comm, self.metric))
        result = {"layer_seconds": seconds, "write_s": write_s, "summary": summary}
        if scores is not None:
            from fullgraph.propagation.correct_smooth import smoothed_metrics

            result["base_summary"] = summary
            y = self.data["y"]
            result["summary"] = smoothed_metrics(scores, y, self.data, self.comm, self.metric)
        return result
