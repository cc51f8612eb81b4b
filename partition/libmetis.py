"""METIS from a shared ``libmetis`` (e.g. Debian's ``libmetis5``, 32-bit indices) through ctypes.

pymetis bundles a METIS built with 64-bit ``idx_t``: on a products-size graph its coarsening
hierarchy alone takes 7.6 GB. The same algorithm with 32-bit indices holds half of that, which is
what ``fullgraph partition`` uses when such a library is present (see :func:`find_libmetis`).
The index width of a library is not part of METIS's API, so :func:`load_libmetis` measures it:
``METIS_SetDefaultOptions`` fills ``METIS_NOPTIONS`` ``idx_t`` values with -1, and the number
of bytes it wrote tells the width.

``make install`` unpacks Debian's ``libmetis5`` into ``.venv/lib`` (``apt-get download``, no
root needed) where apt is available; ``FULLGRAPH_LIBMETIS=/path/libmetis.so`` picks another one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fullgraph.errors import ConfigError, PartitionError

#: Environment variable naming a libmetis to use (``off`` disables the search).
ENV_VAR = "FULLGRAPH_LIBMETIS"

_NOPTIONS = 40  # METIS_NOPTIONS in metis.h 5.x
_OPTION_SEED = 8  # METIS_OPTION_SEED
_OPTION_NUMBERING = 17  # METIS_OPTION_NUMBERING
_STATUS = {-2: "erroneous input", -3: "out of memory", -4: "error"}  # rstatus_et


@dataclass(frozen=True)
class LibMetis:
    """A loaded METIS shared library and the integer type of its ``idx_t``."""

    path: str
    lib: ctypes.CDLL
    idx: type[np.signedinteger]

    @property
    def bits(self) -> int:
        """Width of ``idx_t`` in bits (32 or 64)."""
        return int(np.dtype(self.idx).itemsize * 8)

    def describe(self) -> str:
        """One line naming the library: ``libmetis (32-bit idx_t) PATH``."""
        return f"libmetis ({self.bits}-bit idx_t) {self.path}"


def _candidates() -> list[str]:
    """Where to look for libmetis, in order: ``$FULLGRAPH_LIBMETIS``, the venv, the system."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return [] if env.lower() == "off" else [env]
    found = [str(p) for p in sorted(Path(sys.prefix, "lib").glob("libmetis.so*"))]
    system = ctypes.util.find_library("metis")
    return found + ([system] if system else [])


def load_libmetis(path: str) -> LibMetis:
    """Load the METIS library at ``path`` and measure its index width.

    Raises:
        PartitionError: the file cannot be loaded, lacks the METIS 5 entry points, or its
            ``idx_t`` is neither 32 nor 64 bits.
    """
    try:
        lib = ctypes.CDLL(path)
        funcs = (lib.METIS_SetDefaultOptions, lib.METIS_PartGraphKway, lib.METIS_PartGraphRecursive)
    except (OSError, AttributeError) as exc:
        raise PartitionError(f"{path} is not a usable METIS 5 library: {exc}") from exc
    for func in funcs:
        func.restype = ctypes.c_int
    probe = np.zeros(2 * _NOPTIONS, dtype=np.int32)  # room for 40 64-bit values
    lib.METIS_SetDefaultOptions(probe.ctypes.data_as(ctypes.c_void_p))
    if (probe[:_NOPTIONS] == -1).all() and (probe[_NOPTIONS:] == 0).all():
        idx: type[np.signedinteger] = np.int32
    elif (probe == -1).all():
        idx = np.int64
    else:
        raise PartitionError(f"{path}: cannot tell the width of METIS's idx_t")
    return LibMetis(path=path, lib=lib, idx=idx)


@functools.cache
def find_libmetis() -> LibMetis | None:
    """The first loadable libmetis of :func:`_candidates`, or ``None`` (then pymetis is used).

    Raises:
        PartitionError: ``$FULLGRAPH_LIBMETIS`` names a library that cannot be used (an explicit
            choice is not silently replaced).
    """
    explicit = bool(os.environ.get(ENV_VAR, "").strip())
    for path in _candidates():
        try:
            return load_libmetis(path)
        except PartitionError:
            if explicit:
                raise
    return None


def require_libmetis() -> LibMetis:
    """:func:`find_libmetis`, or a :class:`ConfigError` saying how to get a library (for
    ``--metis libmetis``)."""
    lib = find_libmetis()
    if lib is None:
        raise ConfigError(
            "--metis libmetis: no METIS shared library found (install Debian's libmetis5, run "
            f"`make install`, or set {ENV_VAR}=/path/to/libmetis.so)"
        )
    return lib


def fits(lib: LibMetis, num_entries: int, weight_sums: list[int]) -> bool:
    """True if ``lib``'s ``idx_t`` holds the adjacency's length and every constraint's total."""
    limit = np.iinfo(lib.idx).max
    return num_entries <= limit and all(s <= limit for s in weight_sums)


def as_idx(array: np.ndarray, idx: type[np.signedinteger]) -> np.ndarray:
    """``array`` as a C-contiguous ``idx``-typed array (no copy if it already is one)."""
    return np.ascontiguousarray(array, dtype=idx)


def part_graph(
    lib: LibMetis,
    num_parts: int,
    xadj: np.ndarray,
    adjncy: np.ndarray,
    vweights: np.ndarray,
    ncon: int,
    seed: int,
    recursive: bool,
) -> np.ndarray:
    """``METIS_PartGraphKway`` (or ``Recursive``) with default options but ``seed``.

    Args:
        lib: from :func:`find_libmetis` / :func:`load_libmetis`.
        num_parts: number of parts, >= 2.
        xadj, adjncy: symmetric CSR without self-loops, already of type ``lib.idx``.
        vweights: ``[num_nodes * ncon]`` vertex weights, node-major, of type ``lib.idx``.
        ncon: number of balance constraints.
        seed: METIS's random seed.
        recursive: recursive bisection instead of k-way.

    Returns:
        int64 [num_nodes] part of every node.

    Raises:
        PartitionError: METIS returned an error status.
    """
    n = xadj.shape[0] - 1
    for name, arr in (("xadj", xadj), ("adjncy", adjncy), ("vweights", vweights)):
        if arr.dtype != lib.idx or not arr.flags.c_contiguous:
            raise PartitionError(f"{name} must be C-contiguous {np.dtype(lib.idx)}")
    ctype = ctypes.c_int32 if lib.bits == 32 else ctypes.c_int64
    nvtxs, nc, nparts, edgecut = ctype(n), ctype(ncon), ctype(num_parts), ctype(0)
    options = np.empty(_NOPTIONS, dtype=lib.idx)
    lib.lib.METIS_SetDefaultOptions(options.ctypes.data_as(ctypes.c_void_p))
    options[_OPTION_SEED] = seed
    options[_OPTION_NUMBERING] = 0
    part = np.empty(n, dtype=lib.idx)
    func = lib.lib.METIS_PartGraphRecursive if recursive else lib.lib.METIS_PartGraphKway

    def ptr(a: np.ndarray) -> ctypes.c_void_p:
        return a.ctypes.data_as(ctypes.c_void_p)

    status = func(
        ctypes.byref(nvtxs),
        ctypes.byref(nc),
        ptr(xadj),
        ptr(adjncy),
        ptr(vweights),
        None,  # vsize
        None,  # adjwgt: unit edge weights
        ctypes.byref(nparts),
        None,  # tpwgts: equal parts
        None,  # ubvec: METIS's default imbalance
        ptr(options),
        ctypes.byref(edgecut),
        ptr(part),
    )
    if status != 1:
        raise PartitionError(f"{lib.describe()} returned {_STATUS.get(status, status)}")
    return part.astype(np.int64)
