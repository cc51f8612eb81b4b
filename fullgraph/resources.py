"""Wall time and peak memory of named stages, for reports and logs."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    ``VmHWM`` of ``/proc/self/status`` where there is one: ``getrusage``'s ``ru_maxrss`` keeps
    the high-water mark of the image before ``exec`` (a process started by a 3 GiB parent
    reports at least 3 GiB), ``VmHWM`` belongs to this program's own address space.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return ru / (1024 * 1024) if sys.platform == "darwin" else ru / 1024


def file_backed_rss_bytes() -> int:
    """The file-backed part of this process's resident set now, bytes (``RssFile`` of
    ``/proc/self/status``: the shared libraries' pages where no data file is mapped; every
    process on a node that maps the same library shares one copy of them in the page cache).
    0 where the kernel does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def current_rss_mb() -> float:
    """Current resident set size of this process, in MiB."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / (1024 * 1024)
    except OSError:
        return peak_rss_mb()


def _meminfo_total() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _cgroup_limits(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> list[int]:
    """The memory limits of this process's cgroup and its ancestors, bytes (v2 ``memory.max``,
    v1 ``memory.limit_in_bytes``; "no limit" left out)."""
    limits: list[int] = []
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return limits
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: one hierarchy
            base, name = Path(root), "memory.max"
        elif "memory" in controllers.split(","):
            base, name = Path(root) / "memory", "memory.limit_in_bytes"
        else:
            continue
        d = base / path.lstrip("/")
        while True:
            with contextlib.suppress(OSError, ValueError):
                text = (d / name).read_text().strip()
                if text != "max" and int(text) < 1 << 60:  # v1 says "none" with ~2**63
                    limits.append(int(text))
            if d == base or base not in d.parents:
                break
            d = d.parent
    return limits


def node_memory_bytes() -> int:
    """The memory this process's machine offers it, bytes: ``MemTotal`` of ``/proc/meminfo``,
    or its control group's limit when lower (a container or a batch job's allocation)."""
    return min([_meminfo_total(), *_cgroup_limits()])


def process_defaults() -> None:
    """The environment defaults of every training process (the user's own settings win).

    - ``OMP_WAIT_POLICY=PASSIVE``: torch's and numba's OpenMP pools would otherwise busy-wait
      against each other (and against other ranks and other jobs on the node) between parallel
      regions. GNU OpenMP reads it once, when the library is loaded: call this before torch or
      numba is imported (``fullgraph.cli.main`` does; later it has no effect on the wait policy).
    - ``THP_MEM_ALLOC_ENABLE=1``: torch's large CPU allocations 2 MB-aligned and backed by
      huge pages, so a fresh activation-sized tensor costs one page fault per 2 MB, not per
      4 kB (~25% off an arxiv-sized epoch here).
    - ``TORCH_CPP_LOG_LEVEL=ERROR``: torch's C++ warnings (c10d's reverse look-ups of peers,
      each retry of a store connection) would bury the one line that names a failure; read
      when torch loads; ``TORCH_CPP_LOG_LEVEL=INFO`` shows them.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


#: ``M_MMAP_THRESHOLD``, glibc's ``mallopt`` parameter number (``malloc.h``).
_M_MMAP_THRESHOLD = -3


def release_freed_memory(threshold_bytes: int = 4 << 20) -> bool:
    """Have glibc give blocks of ``threshold_bytes`` or more back to the system when freed.

    glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so later
    blocks up to that size come from the heap, which keeps them once freed: a training step's
    buffers of a few MiB then pile up there (170 MiB of a rank's 1.35 GiB peak, docs/train.md).
    A fixed threshold stops that. Process-wide; the training commands call it at start.

    Returns:
        ``True`` if set; ``False`` without glibc (nothing is changed then).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))
    except (OSError, AttributeError):
        return False


def drop_resident_pages(array: object) -> bool:
    """Unmap the resident pages of a read-only memory-mapped array from this process.

    The pages stay in the kernel's page cache (shared with every process mapping the file, and
    reclaimable), so the next read of them is a minor fault; they just stop counting in this
    process's resident set. For arrays that were read once (a validation pass) and are read
    again later only in part.

    Args:
        array: typically an ``np.memmap`` opened with mode ``"r"``.

    Returns:
        ``True`` if pages were dropped; ``False`` for anything else (in-memory arrays, writable
        or copy-on-write maps, platforms without ``madvise``), which is left as it is.
    """
    mm = getattr(array, "_mmap", None)
    if getattr(array, "mode", None) != "r" or mm is None or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    try:
        mm.madvise(mmap.MADV_DONTNEED)
    except (OSError, ValueError):  # closed map, or the kernel refused
        return False
    return True


#: ``FULLGRAPH_LIBRARY_PAGES=keep`` leaves :func:`drop_library_pages` a no-op.
LIBRARY_PAGES_ENV = "FULLGRAPH_LIBRARY_PAGES"


def clean_library_mappings(smaps: str) -> list[tuple[int, int, int]]:
    """The mappings of ``smaps`` (the text of ``/proc/PID/smaps``) that hold a shared library's
    clean pages only: private, not writable, of a ``.so`` file still on disk, resident, and
    without an anonymous page (a page the process wrote, such as a relocated one, would be
    lost by dropping it).

    Returns:
        ``(start, end, resident KiB)`` of each such mapping.
    """
    found: list[tuple[int, int, int]] = []
    current: list | None = None  # [start, end, ok, rss KiB, anonymous KiB]
    for line in smaps.splitlines():
        fields = line.split()
        if not fields:
            continue
        if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
            if current is not None and current[2] and current[3] and not current[4]:
                found.append((current[0], current[1], current[3]))
            start, _, end = fields[0].partition("-")
            perms = fields[1] if len(fields) > 1 else ""
            name = os.path.basename(fields[5]) if len(fields) == 6 else ""  # 7: "(deleted)"
            library = name.endswith(".so") or ".so." in name
            ok = library and perms[1:2] == "-" and perms[3:4] == "p"
            current = [int(start, 16), int(end, 16), ok, 0, 0]
        elif current is not None and fields[0] == "Rss:":
            current[3] = int(fields[1])
        elif current is not None and fields[0] == "Anonymous:":
            current[4] = int(fields[1])
    if current is not None and current[2] and current[3] and not current[4]:
        found.append((current[0], current[1], current[3]))
    return found


def drop_library_pages() -> float:
    """Unmap the shared libraries' clean resident pages from this process; returns the MiB.

    Importing torch, numba (LLVM), numpy and scipy maps a few hundred MiB of their libraries'
    code and read-only data, most of it touched once (static constructors, operator
    registration) and never again. Those pages are the page cache's, shared by every process
    that maps the library (every rank of a node) and reclaimable, yet each rank's resident set
    (and its peak, which the memory plan adds up per node) counts them: docs/scale.md, "the
    floor". Dropping them frees no memory of the machine; it stops the double count.
    ``MADV_DONTNEED`` on the mappings of :func:`clean_library_mappings` takes them out of this
    process's resident set; they stay in the page cache, and a page used again comes back with
    a minor fault. Nothing the process wrote is touched. Call it once start-up is done (the
    rank start-up does); ``FULLGRAPH_LIBRARY_PAGES=keep`` leaves everything mapped.

    Returns:
        MiB that were resident in the dropped mappings; 0 where nothing was done (no procfs,
        no glibc, the variable set).
    """
    if os.environ.get(LIBRARY_PAGES_ENV, "") == "keep":
        return 0.0
    try:
        with open("/proc/self/smaps") as f:
            mappings = clean_library_mappings(f.read())
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return 0.0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    for start, end, rss_kib in mappings:
        if libc.madvise(start, end - start, mmap.MADV_DONTNEED) == 0:  # locked maps refuse
            dropped += rss_kib
    return dropped / 1024


#: The libraries :func:`import_one_at_a_time` loads for a rank, in the order a rank's
#: command imports them: numba (with LLVM, numpy, scipy.sparse), then torch.
RANK_LIBRARIES = ("numba", "torch")


def import_one_at_a_time(modules: tuple[str, ...] = RANK_LIBRARIES) -> None:
    """Import ``modules`` in turn, each one's start-up pages dropped before the next loads
    (:func:`drop_library_pages`): the pages LLVM's static constructors touch and those of
    torch's operator registration are then never resident at once, and a rank's start-up
    peaks lower. Importing them again later costs nothing."""
    import importlib

    for name in modules:
        importlib.import_module(name)
        drop_library_pages()


@dataclass
class StageTimer:
    """Records wall time and peak RSS at the end of each named stage.

    Example:
        >>> timer = StageTimer()
        >>> with timer.stage("read"):
        ...     pass
        >>> timer.as_dict()["read"]["seconds"] >= 0
        True
    """

    stages: dict[str, dict[str, float]] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the body as stage ``name``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = {
                "seconds": round(time.perf_counter() - t0, 4),
                "peak_rss_mb": round(peak_rss_mb(), 1),
            }

    def as_dict(self) -> dict[str, dict[str, float]]:
        """The recorded stages, in order."""
        return dict(self.stages)
