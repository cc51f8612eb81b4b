"""Per-epoch output of the trainers: the JSON-lines record and the console line.

The line's time split is the slowest rank's own (:meth:`fullgraph.run.epochs.EpochLoop.
epoch_record`), so its parts add up to the epoch time it follows.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from fullgraph.errors import no_room
from fullgraph.metrics import METRICS


def append_record(rec: dict[str, Any], log: TextIO) -> None:
    """Append ``rec`` to the open JSON-lines ``log`` as one line, flushed.

    Raises:
        OutputError: the disk is full (one line naming the log; the records written before
            stay, the last line may be cut short).
    """
    try:
        log.write(json.dumps(rec) + "\n")
        log.flush()
    except OSError as exc:
        full = no_room(exc, getattr(log, "name", "--log-json"), "the records before are kept")
        if full is None:
            raise
        raise full from None


def write_epoch(rec: dict[str, Any], log: TextIO | None, quiet: bool) -> None:
    """Append ``rec`` to the JSONL ``log`` (flushed) and print its one-line summary."""
    if log is not None:
        append_record(rec, log)
    if quiet:
        return
    accs = ""
    for metric in METRICS:
        if f"val_{metric}" in rec:
            name = "" if metric == "acc" else f" {metric}"  # accuracy: the line as it always was
            accs = (
                f" |{name} train {rec[f'train_{metric}']:.4f} val {rec[f'val_{metric}']:.4f} "
                f"test {rec[f'test_{metric}']:.4f}"
            )
            if f"base_val_{metric}" in rec:  # Correct & Smooth's scores, then the model's own
                accs += (
                    f" (C&S; model alone val {rec[f'base_val_{metric}']:.4f} test "
                    f"{rec[f'base_test_{metric}']:.4f})"
                )
    if not accs:  # link prediction: its metrics (hits@K, mrr, auc and ap), no train split
        names = [k[4:] for k in rec if k.startswith("val_") and f"test_{k[4:]}" in rec]
        accs = "".join(
            f" | {m} val {rec[f'val_{m}']:.4f} test {rec[f'test_{m}']:.4f}" for m in names
        )
    print(
        f"epoch {rec['epoch']:4d} | loss {rec['loss']:.4f}{accs} | {split_text(rec)} | "
        f"{rec['comm_bytes'] / 1e6:.3f} MB | peak {rec['peak_rss_mb']:.0f} MB",
        flush=True,
    )


def split_text(rec: dict[str, Any]) -> str:
    """The epoch time and the slowest rank's split of it, which adds up to it, in ms
    (``17.5 ms (slowest rank 1: compute 8.0, comm 6.0, reduce 3.5)``); the process's first
    epoch says it carries the start-up."""

    def ms(key: str) -> str:
        return f"{rec[f'slowest_{key}'] * 1e3:.1f}"

    # full-batch epochs exchange halos; mini-batch epochs sample instead
    moved = f"sample {ms('sample_s')}" if "slowest_sample_s" in rec else f"comm {ms('comm_s')}"
    codec = ""
    if rec.get("compress_fwd", "none") != "none" or rec.get("compress_bwd", "none") != "none":
        codec = f" incl. codec {ms('codec_s')}"
    startup = " with start-up" if rec.get("startup") else ""
    return (
        f"{rec['epoch_s'] * 1e3:.1f} ms{startup} (slowest rank {rec['slowest_rank']}: compute "
        f"{ms('compute_s')}{codec}, {moved}, reduce {ms('reduce_s')})"
    )
