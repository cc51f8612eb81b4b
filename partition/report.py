"""The partition report: communication volume, balance, time and memory, as data and as text."""

from __future__ import annotations

import numpy as np

from fullgraph.resources import StageTimer, peak_rss_mb


def _imbalance(counts: list[int]) -> float:
    """max / mean of per-part counts (1.0 when all are zero)."""
    arr = np.asarray(counts, dtype=np.float64)
    mean = arr.mean() if arr.size else 0.0
    return round(float(arr.max() / mean), 4) if mean > 0 else 1.0


def build_report(
    parts: list[dict], num_edges: int, edge_cut: int, timer: StageTimer, notes: list[str]
) -> dict:
    """Summarise a partitioning.

    Args:
        parts: per-part counts (``num_inner``, ``num_halo``, ``num_edges``, ``num_train``).
        num_edges: directed edges of the whole graph.
        edge_cut: directed edges whose endpoints have different owners.
        timer: the stages timed while partitioning.
        notes: fallbacks and other remarks made on the way.

    Returns:
        A JSON-ready dict: ``stages`` (seconds and peak RSS MiB each), ``total_seconds``,
        ``peak_rss_mb``, ``edge_cut``, ``edge_cut_fraction``, ``halo_rows_per_part``,
        ``rows_exchanged_per_layer`` (total halo rows: rows received per layer, each direction),
        ``imbalance`` (``nodes``, ``train``, ``edges``: max / mean over parts) and ``notes``.
    """
    stages = timer.as_dict()
    halo = [int(p["num_halo"]) for p in parts]
    return {
        "stages": stages,
        "total_seconds": round(sum(s["seconds"] for s in stages.values()), 4),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "edge_cut": int(edge_cut),
        "edge_cut_fraction": round(edge_cut / num_edges, 6) if num_edges else 0.0,
        "halo_rows_per_part": halo,
        "rows_exchanged_per_layer": int(sum(halo)),
        "imbalance": {
            "nodes": _imbalance([p["num_inner"] for p in parts]),
            "train": _imbalance([p["num_train"] for p in parts]),
            "edges": _imbalance([p["num_edges"] for p in parts]),
        },
        "notes": list(notes),
    }


def format_report(meta: dict) -> str:
    """Human-readable lines summarising ``meta["report"]`` of a written partition."""
    rep = meta["report"]
    imb = rep["imbalance"]
    lines = [
        f"partitioned {meta['dataset']} ({meta['num_nodes']:,} nodes, {meta['num_edges']:,} "
        f"edges) into {meta['num_parts']} parts with {meta['method']} (seed {meta['seed']}) "
        f"in {rep['total_seconds']:.2f} s, peak RSS {rep['peak_rss_mb']:.0f} MiB",
    ]
    if "num_blocks" in meta:
        lines.append(
            f"  blocks: {meta['num_blocks']:,} fixed blocks of about {meta['block_size']:,} nodes, "
            "every part a run of whole blocks (what bit-identical training at any P needs)"
        )
    for name, st in rep["stages"].items():
        lines.append(
            f"  stage {name:<12} {st['seconds']:9.3f} s   peak RSS {st['peak_rss_mb']:.0f} MiB"
        )
    lines += [
        f"  edge cut: {rep['edge_cut']:,} of {meta['num_edges']:,} directed edges "
        f"({100 * rep['edge_cut_fraction']:.2f}%)",
        f"  halo rows per part: {rep['halo_rows_per_part']}",
        f"  rows exchanged per layer (total halo rows): {rep['rows_exchanged_per_layer']:,}",
        f"  imbalance (max/mean): nodes {imb['nodes']:.3f}, train nodes {imb['train']:.3f}, "
        f"edges {imb['edges']:.3f}",
    ]
    lines += [f"  note: {note}" for note in rep["notes"]]
    return "\n".join(lines)
