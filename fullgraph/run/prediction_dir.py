"""The directory ``fullgraph predict --out`` writes, as a format: its file names and the
output kind that tells it from anyone else's directory (:data:`PREDICTION`)."""

from __future__ import annotations

import re
from pathlib import Path

from fullgraph.atomic import OutputKind, holds, is_plain_file, read_marker

#: ``predict.json``'s ``format`` and ``version``.
FORMAT = "fullgraph-predict"
VERSION = 1
#: The summary file of a prediction directory.
SUMMARY = "predict.json"
PREDICTIONS = "predictions.npy"
PROBABILITIES = "probabilities.npy"
LOGITS = "logits.npy"
#: A link model's pair scores (its probabilities are ``probabilities.npy``).
SCORES = "scores.npy"
#: ``--nodes``' selection: the node of every row of the other files.
NODE_IDS = "node_ids.npy"
_EMBEDDINGS = re.compile(r"embeddings-([1-9][0-9]*)\.npy")
#: The most bytes of one output file a rank maps at a time while it writes its rows.
WRITE_WINDOW_BYTES = 16 << 20


def embeddings_name(layer: int) -> str:
    """The file of layer ``layer``'s embeddings (``embeddings-2.npy``)."""
    return f"embeddings-{layer}.npy"


def _not_a_prediction(path: Path) -> str | None:
    """``None`` when ``path`` is a directory ``fullgraph predict`` wrote (or an empty one),
    else what makes it someone else's.

    Ours: a ``predict.json`` of :data:`FORMAT` and, beside it, only the output files
    (``predictions.npy``, ``probabilities.npy``, ``logits.npy``, ``scores.npy``,
    ``node_ids.npy``, ``embeddings-<k>.npy``), each a plain file.
    """
    if not path.is_dir():
        return "it is a file" if path.is_file() else "it is not a directory"
    marker = read_marker(path / SUMMARY)
    ours = isinstance(marker, dict) and marker.get("format") == FORMAT
    entries = sorted(path.iterdir())
    names = {SUMMARY, PREDICTIONS, PROBABILITIES, LOGITS, SCORES, NODE_IDS}
    unexpected = [
        e
        for e in entries
        if not ((e.name in names or _EMBEDDINGS.fullmatch(e.name)) and is_plain_file(e))
    ]
    reason = holds(path, unexpected)
    if reason is None and entries and not ours:
        reason = f"it has no {SUMMARY} of `fullgraph predict`"
    return reason


#: ``fullgraph predict --out``: replaced (with ``--force``) only when ``predict`` wrote it.
PREDICTION = OutputKind("a prediction", _not_a_prediction)
