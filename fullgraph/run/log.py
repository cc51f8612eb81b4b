"""Per-epoch output of the trainers: the JSON-lines record and the console line."""

from __future__ import annotations

import json
from typing import Any

from fullgraph.errors import no_room
from fullgraph.metrics import METRICS


def append_record(rec: dict[str, Any], log: Any) -> None:
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


def write_epoch(rec: dict[str, Any], log: Any | None, quiet: bool) -> None:
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
    codec = ""
    if rec.get("compress_fwd", "none") != "none" or rec.get("compress_bwd", "none") != "none":
        codec = f", codec {rec.get('codec_s', 0.0) * 1e3:.1f}"
    # full-batch epochs exchange halos; mini-batch epochs sample instead
    moved = (
        f"sample {rec['sample_s'] * 1e3:.1f}"
        if "sample_s" in rec
        else (f"comm {rec['comm_s'] * 1e3:.1f}")
    )
    print(
        f"epoch {rec['epoch']:4d} | loss {rec['loss']:.4f}{accs} | {rec['epoch_s'] * 1e3:.1f} ms "
        f"(compute {rec['compute_s'] * 1e3:.1f}, {moved}, "
        f"reduce {rec['reduce_s'] * 1e3:.1f}{codec}) | {rec['comm_bytes'] / 1e6:.3f} MB "
        f"| peak {rec['peak_rss_mb']:.0f} MB",
        flush=True,
    )
