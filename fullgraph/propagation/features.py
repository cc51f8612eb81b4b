"""The hop features a model reads (SGC's ``A^K X``, SIGN's ``[X, A X, ..., A^K X]``): read
from the partition's cache when stored whole, else computed on every rank and stored.

:func:`hop_features` is a collective: the ranks agree first on whether every rank's file is
stored whole (a damaged one on any rank refuses the run on all, with its one line), then all
read, or all compute (:func:`~fullgraph.propagation.hops.propagate_hops`) and store; rank 0
prints a line per hop (its time, the bytes every rank exchanged; the operator's build first,
as hop 0) and one saying where the hops came from or went. A partition directory that cannot
be written (read-only, full) is not an error: the hops are computed without caching, said in
one line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from fullgraph.distributed.faults import agree
from fullgraph.distributed.halo import HaloPlan, SplitOperator
from fullgraph.errors import OutputError, one_line
from fullgraph.partition import Partition
from fullgraph.propagation.cache import HopCache, HopKey
from fullgraph.propagation.hops import hop_width, propagate_hops
from fullgraph.propagation.operators import propagation_operator


@dataclass(frozen=True)
class HopSpec:
    """Which hops a model reads.

    Attributes:
        propagation: ``gcn``, ``mean``, ``sym`` or ``ppr`` (GCN's operator, diffused).
        hops: ``K``.
        alpha: ``ppr``'s teleport probability (``None`` for the others).
        keep: ``all`` (SIGN) or ``last`` (SGC).
    """

    propagation: str
    hops: int
    alpha: float | None
    keep: str

    @property
    def operator(self) -> str:
        """The operator the hops apply (``gcn`` for ``ppr``)."""
        return "gcn" if self.propagation == "ppr" else self.propagation

    def width(self, num_features: int) -> int:
        """Columns of the features for ``num_features`` inputs."""
        return hop_width(self.keep, self.hops, num_features)

    def key(self, meta_hash: str, normalize_features: bool) -> HopKey:
        """The cache key of these hops on a partition."""
        alpha = self.alpha if self.propagation == "ppr" else None
        return HopKey(meta_hash, self.propagation, self.hops, alpha, normalize_features, self.keep)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def hop_features(
    part: Partition,
    x: torch.Tensor,
    plan: HaloPlan,
    spec: HopSpec,
    *,
    cache: HopCache | None = None,
    normalize_features: bool = False,
) -> torch.Tensor:
    """The hop features of this rank's rows, float32 [n, ``spec.width(F)``], on ``x``'s device.

    Args:
        part: this rank's part (its operator is built only when the hops are computed).
        x: the inner rows' features as the model reads them (normalised already when
            ``normalize_features``), float32 [n, F].
        plan: the rank's halo plan.
        spec: which hops.
        cache: where hops are kept (``None``: computed, nothing printed).
        normalize_features: recorded in the cache key (the features were row-normalised).

    Raises:
        ConfigError: a damaged cache entry on any rank (unless ``cache.force``).
    """
    comm = plan.comm
    say = cache is not None and not cache.quiet and comm.rank == 0
    width = spec.width(int(x.shape[1]))
    caching = cache is not None and cache.directory is not None
    key = spec.key(part.partition_hash, normalize_features)
    if caching:
        assert cache is not None
        whole = agree(comm, lambda: cache.lookup(key, comm.rank))
        if all(comm.allgather_object(whole)):
            t0 = time.perf_counter()
            out = torch.empty((x.shape[0], width), dtype=torch.float32)
            agree(comm, lambda: cache.load(key, comm.rank, out))
            if say:
                print(
                    f"hops: read from {cache.entry(key)} ({spec.propagation}, K={spec.hops}, "
                    f"{time.perf_counter() - t0:.2f} s)",
                    flush=True,
                )
            return out.to(x.device)

    def progress(k: int, hops: int, seconds: float, nbytes: int) -> None:
        if say:
            print(
                f"hop {k}/{hops} ({spec.propagation}): {seconds:.2f} s, {_mb(nbytes)} exchanged",
                flush=True,
            )

    t0 = time.perf_counter()
    op = propagation_operator(part, spec.operator)
    if x.device.type != "cpu":
        halo = op.halo.to(x.device) if op.halo is not None else None
        op = SplitOperator(op.inner.to(x.device), halo)
    op.ordered(plan.global_ids)  # every row in ascending global id: built once, here
    if say:
        print(
            f"hop 0/{spec.hops} ({spec.propagation}): {spec.operator} operator built in "
            f"{time.perf_counter() - t0:.2f} s",
            flush=True,
        )
    out = torch.empty((x.shape[0], width), dtype=torch.float32, device=x.device)
    propagate_hops(
        x,
        op,
        plan,
        spec.hops,
        propagation=spec.propagation,
        alpha=spec.alpha,
        progress=progress,
        keep=spec.keep,
        out=out,
    )
    del op
    seconds = time.perf_counter() - t0
    if not caching:
        if say:
            print(f"hops: computed in {seconds:.2f} s, not cached (a whole graph)", flush=True)
        return out
    assert cache is not None
    stored = comm.allgather_object(cache.store(key, comm.rank, out))
    failed = [(r, s["reason"]) for r, s in enumerate(stored) if not s["ok"]]
    if comm.rank == 0 and not failed:
        try:
            cache.finish(key, stored, {"seconds": round(seconds, 3), "ranks": comm.size})
        except (OSError, OutputError) as exc:  # the part files stay: an unfinished entry
            failed = [(0, one_line(exc))]
    if say and failed:
        rank, why = failed[0]
        print(
            f"hops: computed in {seconds:.2f} s, not cached: rank {rank} cannot write "
            f"{cache.entry(key)} ({why})",
            flush=True,
        )
    elif say:
        print(f"hops: computed in {seconds:.2f} s, cached in {cache.entry(key)}", flush=True)
    return out
