"""Whether reading an OGB-layout dataset whole into memory fits this machine, from its sizes.

:func:`~fullgraph.datasets.ogb.read_ogb` parses every raw file into memory (the edges, their
CSR, the features in blocks and then as one array). :func:`check_in_memory_read` estimates
that peak from the counts of ``num-node-list.csv.gz`` / ``num-edge-list.csv.gz`` and the width
of the first feature line, once the labels confirmed the node count and before the edges and
features are read, and refuses a read that cannot fit with one line naming the out-of-core
conversion (``fullgraph data ingest``, which writes the ``npy`` layout the readers map). The
estimate is an upper one: on products-synth at full size (2.45M nodes, 61.9M edge lines, 100
features) the parse peaked at 3,047 MiB of anonymous memory against 3,758 MiB estimated
(docs/datasets.md).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from fullgraph.errors import ConfigError
from fullgraph.resources import node_memory_bytes

__all__ = ["EDGE_LINE_BYTES", "FEATURE_BYTES", "check_in_memory_read", "in_memory_bytes"]

#: Bytes per line of ``edge.csv.gz`` while it is parsed and turned into a symmetric CSR (the
#: int64 pairs, their copies, both directions, the sort).
EDGE_LINE_BYTES = 32
#: Bytes per feature value: the float32 blocks and the array they are joined into.
FEATURE_BYTES = 8


def feature_width(path: Path) -> int:
    """The number of comma-separated values on the first line of ``path`` (``.gz`` or plain),
    0 when it is missing, empty or unreadable (the reader's own checks name those)."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            line = f.readline()
    except (OSError, EOFError, zlib.error, UnicodeDecodeError):
        return 0
    return line.count(",") + 1 if line.strip() else 0


def in_memory_bytes(num_nodes: int, num_edges: int, num_features: int) -> int:
    """An upper estimate of the in-memory parse's peak, bytes (besides the process)."""
    return EDGE_LINE_BYTES * num_edges + FEATURE_BYTES * num_nodes * num_features


def check_in_memory_read(d: Path, name: str, num_nodes: int, num_edges: int) -> None:
    """Refuse, before the large files are read, an in-memory read of the dataset in ``d``
    that would not fit this machine's memory.

    Raises:
        ConfigError: one line: the estimate, the machine's memory and the out-of-core
            command that converts the dataset once.
    """
    width = feature_width(d / "raw" / "node-feat.csv.gz")
    need = in_memory_bytes(num_nodes, num_edges, width)
    have = node_memory_bytes()
    if need <= have:
        return
    raise ConfigError(
        f"{name}: reading it whole into memory takes about {need / 2**30:,.1f} GiB "
        f"({num_nodes:,} nodes, {num_edges:,} edges, {width} features), more than this "
        f"machine's {have / 2**30:,.1f} GiB; convert it once, out of core, with `fullgraph "
        f"data ingest --dataset {name} --root {d.parent} --out-root DIR` and read {name}-npy "
        f"from DIR (docs/datasets.md)"
    )
