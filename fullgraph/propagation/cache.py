"""Precomputed hops kept with their partition, checksummed, for later runs (and ``predict``).

Layout, under the partition directory (``fullgraph partition --force`` replaces it with the
partition; another partition has another ``meta.json`` hash, so never these)::

    <parts>/precompute/<name>/part-<r>.npy   float32 [num_inner, width]: rank r's hop rows
    <parts>/precompute/<name>/hops.json      the key, and every part file's bytes and sha256

``<name>`` is ``<propagation>-k<K>-<keep>-<digest>``: the digest is the SHA-256 of the key
(:class:`HopKey`: the partition's ``meta.json`` hash, the propagation, ``K``, ``alpha``,
``normalize_features``, what is kept, the dtype), so a run with another key reads and writes
another directory. Every rank writes its own part file atomically (a temporary sibling,
fsync, rename); rank 0 writes ``hops.json`` last, once every rank's file is in place, so an
entry without it is unfinished and simply computed again. An entry whose ``hops.json`` names a
file that is missing, of another size or (unless ``verify`` is off) another checksum is
damaged: it is refused with one line, and recomputed only with ``--force``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fullgraph.atomic import atomic_write_json
from fullgraph.errors import ConfigError, one_line
from fullgraph.partition.format import sha256_file
from fullgraph.partition.npy_files import npy_header

# a partition's own folder (--force keeps it ours)
from fullgraph.partition.output_kind import PRECOMPUTE_DIR
from fullgraph.renames import fsync_dir, remove_stale, temporary_name

#: The manifest of one entry.
MANIFEST = "hops.json"
FORMAT = "fullgraph-hops"
VERSION = 1
#: Rows written at a time (and hashed) when a part file is stored.
WRITE_ROWS = 1 << 16


@dataclass(frozen=True)
class HopKey:
    """What the hops of one entry depend on (all of it).

    Attributes:
        meta_hash: the partition's identity (SHA-256 of its ``meta.json``).
        propagation: ``gcn``, ``mean``, ``sym`` or ``ppr``.
        hops: ``K``.
        alpha: ``ppr``'s teleport probability (``None`` for the others).
        normalize_features: the features were row-normalised before the hops.
        keep: ``all`` (``[X, A X, ..., A^K X]`` side by side) or ``last`` (``A^K X``).
        dtype: the stored dtype.
    """

    meta_hash: str
    propagation: str
    hops: int
    alpha: float | None
    normalize_features: bool
    keep: str
    dtype: str = "float32"

    def digest(self) -> str:
        """SHA-256 of the key's canonical JSON."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    @property
    def name(self) -> str:
        """The entry's directory name: readable, then the digest's first 16 digits."""
        return f"{self.propagation}-k{self.hops}-{self.keep}-{self.digest()[:16]}"


def part_name(rank: int) -> str:
    """The file of rank ``rank``'s hop rows in an entry."""
    return f"part-{rank}.npy"


def _refusal(path: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{path}: {why}; the precomputed hops are refused (run again with --force to "
        f"recompute them)"
    )


@dataclass(frozen=True)
class HopCache:
    """Where a run's precomputed hops are kept: ``<parts>/precompute``, or nowhere.

    Attributes:
        directory: ``<parts>/precompute``, or ``None``: no cache (a whole graph from
            ``--dataset`` or ``--synthetic``: the hops are computed every run).
        force: recompute and replace an entry even when it is whole (and a damaged one).
        verify: check every part file's SHA-256 before reading it (``--no-verify``: sizes
            only).
        quiet: no lines (the per-hop progress and where the hops came from).
    """

    directory: Path | None = None
    force: bool = False
    verify: bool = True
    quiet: bool = False

    @classmethod
    def of_run(
        cls, parts: str | os.PathLike[str] | None, *, force: bool, verify: bool, quiet: bool
    ) -> HopCache:
        """The cache of a run on the partition directory ``parts`` (``None``: a whole graph,
        nothing kept)."""
        directory = Path(parts) / PRECOMPUTE_DIR if parts is not None else None
        return cls(directory, force=force, verify=verify, quiet=quiet)

    def entry(self, key: HopKey) -> Path:
        """The directory of ``key``'s entry."""
        if self.directory is None:
            raise ValueError("HopCache.entry: this cache keeps nothing")
        return self.directory / key.name

    def lookup(self, key: HopKey, rank: int) -> bool:
        """Whether rank ``rank``'s hops of ``key`` are stored whole (no collective).

        Returns:
            ``True``: stored and checked; ``False``: nothing stored, an unfinished entry, or
            ``force`` (recompute).

        Raises:
            ConfigError: a damaged entry (one line naming the file and the fix: ``--force``).
        """
        if self.directory is None or self.force:
            return False
        entry = self.entry(key)
        manifest = entry / MANIFEST
        if not manifest.exists():
            return False
        try:
            record = json.loads(manifest.read_bytes())
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise _refusal(manifest, f"unreadable ({one_line(exc)})") from None
        if not (isinstance(record, dict) and record.get("format") == FORMAT):
            raise _refusal(manifest, f"not a {FORMAT} manifest")
        if record.get("key") != asdict(key):
            raise _refusal(manifest, "records another key than its directory name says")
        files = record.get("parts")
        info = files.get(part_name(rank)) if isinstance(files, dict) else None
        path = entry / part_name(rank)
        if not isinstance(info, dict):
            raise _refusal(manifest, f"lists no {part_name(rank)}")
        if not path.is_file():
            raise _refusal(path, "is missing")
        size = path.stat().st_size
        if size != info.get("bytes"):
            raise _refusal(
                path, f"has {size} bytes, {MANIFEST} records {info.get('bytes')} (truncated?)"
            )
        if self.verify and sha256_file(path) != info.get("sha256"):
            raise _refusal(path, "fails its sha256 checksum (corrupted or modified)")
        return True

    def load(self, key: HopKey, rank: int, out: torch.Tensor) -> None:
        """Read rank ``rank``'s stored hops of ``key`` into ``out`` (CPU, float32, the
        stored shape), after :meth:`lookup` said they are whole.

        Raises:
            ConfigError: the file holds another shape or dtype than ``out`` (one line).
        """
        path = self.entry(key) / part_name(rank)
        fmt = np.lib.format
        # read() into ``out``, not a memory map: a map's pages would count as this rank's
        # resident memory beside ``out`` (twice the hops) until it is closed
        try:
            with open(path, "rb") as f:
                major, _ = fmt.read_magic(f)
                read_header = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
                shape, fortran, dtype = read_header(f)
                if dtype != np.float32 or fortran or tuple(shape) != tuple(out.shape):
                    raise _refusal(
                        path, f"holds {dtype} {list(shape)}, expected float32 {list(out.shape)}"
                    )
                data = memoryview(out.numpy()).cast("B")
                step = WRITE_ROWS * max(1, out.shape[1]) * 4
                for lo in range(0, len(data), step):
                    if f.readinto(data[lo : lo + step]) != min(step, len(data) - lo):
                        raise _refusal(path, "ends before its rows do (truncated)")
        except (OSError, ValueError, EOFError) as exc:
            raise _refusal(path, f"not a readable .npy file ({one_line(exc)})") from None

    def store(self, key: HopKey, rank: int, rows: torch.Tensor) -> dict[str, Any]:
        """Write rank ``rank``'s hop rows of ``key`` atomically (no collective).

        Returns:
            ``{"ok": True, "bytes", "sha256", "shape", "dtype"}``, or ``{"ok": False,
            "reason"}`` when the entry cannot be written (a read-only partition directory, a
            full disk): the run goes on without caching.
        """
        entry = self.entry(key)
        path = entry / part_name(rank)
        data = rows.detach().to("cpu", torch.float32).contiguous().numpy()
        header = npy_header(tuple(data.shape), np.dtype(np.float32))
        digest = hashlib.sha256(header)
        tmp = temporary_name(path)
        try:
            entry.mkdir(parents=True, exist_ok=True)
            remove_stale(path)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                for lo in range(0, data.shape[0], WRITE_ROWS):
                    chunk = np.ascontiguousarray(data[lo : lo + WRITE_ROWS]).view(np.uint8)
                    f.write(chunk.reshape(-1))
                    digest.update(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(entry)
        except OSError as exc:
            if tmp.exists():
                tmp.unlink()
            return {"ok": False, "reason": one_line(exc)}
        return {
            "ok": True,
            "bytes": path.stat().st_size,
            "sha256": digest.hexdigest(),
            "shape": list(data.shape),
            "dtype": "float32",
        }

    def finish(self, key: HopKey, stored: list[dict[str, Any]], info: dict[str, Any]) -> None:
        """Rank 0, once every rank stored its file: write the entry's ``hops.json``.

        Args:
            key: the entry's key.
            stored: every rank's :meth:`store` result, in rank order (all ``ok``).
            info: what the manifest records besides (the hops' seconds and bytes).
        """
        parts = {
            part_name(r): {k: v for k, v in s.items() if k != "ok"} for r, s in enumerate(stored)
        }
        record = {"format": FORMAT, "version": VERSION, "key": asdict(key), "parts": parts, **info}
        atomic_write_json(self.entry(key) / MANIFEST, record)
