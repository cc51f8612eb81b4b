"""``fullgraph predict`` of a link model: the scores of given node pairs.

The pairs come from a file (:func:`read_pairs`: ``.npy`` int ``[m, 2]``, or text with two
node ids per line); every rank reads it, scores the pairs anchored at its inner nodes with the
model's encoder (one full-graph forward with the halo exchange) and decoder, and rank 0
gathers the scores in the file's order. The files: ``scores.npy`` float32 ``[m]`` (the
decoder's logits) and ``probabilities.npy`` float32 ``[m]`` (their sigmoid), beside
``predict.json``. A pair's score does not depend on the part count (the decoder reads one
pair's rows alone, :mod:`fullgraph.models.link_decoder`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.pair_rows import NodeOwners
from fullgraph.errors import DataError
from fullgraph.models.link_decoder import LinkModel
from fullgraph.partition import Partition
from fullgraph.precision import Precision
from fullgraph.training.assembly import assemble_rank
from fullgraph.training.inference import inference_config
from fullgraph.training.link_pairs import score_pairs
from fullgraph.training.model_file import ModelFile


def read_pairs(path: str | Path, num_nodes: int) -> np.ndarray:
    """The node pairs of ``path``: a ``.npy`` of integers ``[m, 2]``, or a text file of two
    ids per line (separated by spaces, tabs or a comma; ``#`` starts a comment).

    Raises:
        DataError: unreadable, another shape, a non-integer, an id outside ``[0, num_nodes)``
            (one line naming the first bad pair and how many there are).
    """
    path = Path(path)
    try:
        if path.suffix == ".npy":
            raw = np.load(path, allow_pickle=False)
        else:
            lines = path.read_text().splitlines()
            rows = []
            for i, line in enumerate(lines):
                text = line.split("#", 1)[0].replace(",", " ").split()
                if not text:
                    continue
                if len(text) != 2:
                    raise DataError(f"{path}: line {i + 1} holds {len(text)} values, not a pair")
                try:
                    rows.append((int(text[0]), int(text[1])))
                except ValueError:
                    raise DataError(
                        f"{path}: line {i + 1} ({line.strip()!r}) is not two node ids"
                    ) from None
            raw = np.asarray(rows, dtype=np.int64).reshape(-1, 2)
    except (OSError, ValueError) as exc:
        raise DataError(f"--pairs {path}: cannot read it ({exc})") from None
    if raw.ndim != 2 or raw.shape[1] != 2 or not np.issubdtype(raw.dtype, np.integer):
        raise DataError(
            f"--pairs {path}: expected integer pairs [m, 2], got {raw.dtype} {raw.shape}"
        )
    pairs = raw.astype(np.int64)
    bad = np.flatnonzero((pairs < 0).any(axis=1) | (pairs >= num_nodes).any(axis=1))
    if len(bad):
        u, v = pairs[bad[0]]
        raise DataError(
            f"--pairs {path}: pair {int(bad[0])} ({u}, {v}) is out of range for {num_nodes} "
            f"nodes; {len(bad)} such pairs"
        )
    return pairs


class LinkScorer:
    """One rank's scoring of node pairs with a link model (a collective).

    Args:
        part: this rank's part.
        comm: the communicator.
        model: the model file (``task == "link"``).
        device: where tensors live.
        precision: the resolved policy, or ``None``: the model's.
    """

    def __init__(
        self,
        part: Partition,
        comm: Communicator,
        model: ModelFile,
        device: torch.device | str = "cpu",
        precision: Precision | None = None,
    ) -> None:
        self.comm, self.device = comm, torch.device(device)
        config = inference_config(model.config)
        if precision is not None:
            config = replace(config, precision=precision.name)
        rank = assemble_rank(part, comm, config, self.device, precision)
        self.data, self.ctx = rank.data, rank.ctx
        built = model.build().to(self.device)
        assert isinstance(built, LinkModel)
        self.model = built
        gids = np.asarray(part.global_ids[: part.num_inner], dtype=np.int64)
        rows = torch.tensor([float(part.num_inner)], dtype=torch.float64)
        self.num_nodes = int(comm.allreduce_(rows, "sum", tag="setup")[0])
        self.owners = NodeOwners(comm, gids, self.num_nodes)

    @torch.no_grad()
    def scores(self, pairs: np.ndarray) -> np.ndarray | None:
        """The logits of every pair of ``pairs`` (the whole list, the same on every rank) in
        its order: rank 0 gets them, the other ranks ``None``."""
        self.model.eval()
        h = self.model.encoder(self.data["x"], self.ctx, training=False)
        mine = np.flatnonzero(self.owners.owner[pairs[:, 0]] == self.comm.rank)
        got = score_pairs(
            self.comm,
            self.owners,
            self.model.decoder,
            h,
            pairs[mine],
            self.ctx.plan.row_dtype,
        )
        pieces = self.comm.allgather_object((mine, got.cpu().numpy()))
        if self.comm.rank != 0:
            return None
        out = np.empty(len(pairs), dtype=np.float32)
        for rows, values in pieces:
            out[rows] = values
        return out
