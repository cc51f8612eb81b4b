"""Per-epoch output of the trainer (JSONL record and console line) and the fault-injection hook."""

from __future__ import annotations

import json
import os
from typing import Any

from fullgraph.errors import ConfigError


def injected_failure_epoch(rank: int) -> int | None:
    """Epoch at which ``FULLGRAPH_FAIL_AT=rank:epoch`` asks this rank to raise, if any.

    Raises:
        ConfigError: the variable is set but not of the form ``rank:epoch`` (two integers).
    """
    spec = os.environ.get("FULLGRAPH_FAIL_AT")
    if not spec:
        return None
    r, _, e = spec.partition(":")
    if not (r.strip().isdigit() and e.strip().isdigit()):
        raise ConfigError(f"FULLGRAPH_FAIL_AT={spec!r} must be RANK:EPOCH (two integers)")
    return int(e) if int(r) == rank else None


def write_epoch(rec: dict[str, Any], log: Any | None, quiet: bool) -> None:
    """Append ``rec`` to the JSONL ``log`` (flushed) and print its one-line summary."""
    if log is not None:
        log.write(json.dumps(rec) + "\n")
        log.flush()
    if quiet:
        return
    accs = ""
    if "val_acc" in rec:
        accs = (
            f" | train {rec['train_acc']:.4f} val {rec['val_acc']:.4f} test {rec['test_acc']:.4f}"
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
