"""The per-rank floor: a training rank's resident memory before its part's data, stage by stage.

For every P of ``--ranks`` (default 2 and 4), on the ``tiny`` synthetic graph (3,000 nodes; its
data is about 1 MiB a rank, so what the ranks hold is the floor):

    mpirun -n P python -m bench.rank_floor --rank OUT -- train --parts DIR --model gcn
        --layers 2 --hidden 64 --epochs 2 --threads 1

runs ``fullgraph train`` inside each rank's process (``fullgraph.cli.main``), which notes its
resident memory (``/proc/self/status``: ``VmRSS`` and its parts ``RssAnon``, ``RssFile``,
``RssShmem``) at each stage of the start-up (:data:`STAGES`): the interpreter, the command's
imports, the rank start (MPI up, threads set), the part about to load (rank 0 has run the memory
probe by then), and the end of the epochs. With ``--breakdown`` it also counts each imported
module's own resident memory and its anonymous part (what they grew by while that module and
not one of its imports loaded, :class:`ImportMeter`), summed per top-level package; such a
run keeps the libraries' pages (``FULLGRAPH_LIBRARY_PAGES=keep``), as the start-up did before
it dropped them, or every import would re-touch pages an earlier one brought.

The anonymous part is the rank's own; the file part is shared libraries' pages, which every
rank on a node maps from one page cache (``RssFile`` counts them in each); the rank start-up
drops those only its start-up touched (:func:`fullgraph.resources.drop_library_pages`).

Prints one line per rank and stage and the plan's floor (``process floor`` of rank 0's memory
plan line); writes ``OUT/rank_floor.csv`` (long format, ``bench/common.py``). Usage:
``python -m bench.rank_floor [--ranks 2,4] [--breakdown] [--work DIR]``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.abc
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.child import bench_command, child_env, run_checked
from bench.common import CSVWriter, command_line, machine_name

ROOT = Path(__file__).resolve().parents[1]
#: ``fullgraph.resources.LIBRARY_PAGES_ENV`` (its ``keep`` leaves the libraries' pages mapped)
LIBRARY_PAGES_ENV = "FULLGRAPH_LIBRARY_PAGES"
#: The stages a rank notes, in order: (key, what it is).
STAGES = [
    ("interpreter", "python started, nothing of fullgraph imported"),
    ("imports", "the command's modules imported and its options checked"),
    ("rank start", "MPI up, threads set (the rank start-up)"),
    ("before part", "the part about to load (rank 0: after the memory probe)"),
    ("after epochs", "the epochs done (the tiny part held)"),
]
#: The ``/proc/self/status`` fields noted at each stage (kB there, MiB here): the resident
#: set, its anonymous, file-backed and shared-memory parts, and its peak so far.
FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")
#: From ``/proc/self/smaps_rollup`` (MiB): the proportional and the unique set size.
ROLLUP = ("Pss", "Uss")
#: The model every rank trains (small: the floor is what does not depend on it).
TRAIN_ARGS = ["--model", "gcn", "--layers", "2", "--hidden", "64", "--epochs", "2"]


def memory_status(
    path: str = "/proc/self/status", rollup: str = "/proc/self/smaps_rollup"
) -> dict[str, float]:
    """This process's resident memory now, MiB: ``VmRSS`` and its anonymous, file-backed and
    shared-memory parts (the :data:`FIELDS` of ``/proc/self/status``), and from
    ``smaps_rollup`` the :data:`ROLLUP` fields: ``Pss`` (every page divided by the processes
    mapping it) and ``Uss`` (``Private_Clean + Private_Dirty``: pages no other process maps,
    what this rank alone adds to its node; the shared library pages its peers map too are not
    in it)."""
    out = dict.fromkeys(FIELDS + ROLLUP, 0.0)
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in out:
                out[key] = int(rest.split()[0]) / 1024
    try:
        with open(rollup) as f:
            for line in f:
                key, _, rest = line.partition(":")
                fields = rest.split()
                if not fields or not fields[0].isdigit():
                    continue
                if key == "Pss":
                    out["Pss"] = int(fields[0]) / 1024
                elif key in ("Private_Clean", "Private_Dirty"):
                    out["Uss"] += int(fields[0]) / 1024
    except OSError:  # no smaps_rollup (an old kernel): the status fields alone
        pass
    return out


def _resident_kib() -> tuple[int, int]:
    """Resident and anonymous KiB now (``/proc/self/statm``: resident less shared pages)."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    page = os.sysconf("SC_PAGE_SIZE") // 1024
    return int(fields[1]) * page, (int(fields[1]) - int(fields[2])) * page


class _MeteredLoader(importlib.abc.Loader):
    """A module's loader, seen by :class:`ImportMeter` (everything else passes through)."""

    def __init__(self, inner: Any, name: str, meter: ImportMeter) -> None:
        self._inner, self._name, self._meter = inner, name, meter

    def __getattr__(self, key: str) -> Any:
        return getattr(self._inner, key)

    def create_module(self, spec: Any) -> Any:
        """Start the module's count (an extension's library loads here), then create it."""
        self._meter.enter(self._name)
        try:
            return self._inner.create_module(spec)
        except BaseException:
            self._meter.leave(None)
            raise

    def exec_module(self, module: Any) -> None:
        """Run the module; its count ends with it."""
        try:
            self._inner.exec_module(module)
        except BaseException:
            self._meter.leave(None)
            raise
        self._meter.leave(module)


class ImportMeter(importlib.abc.MetaPathFinder):
    """Counts each imported module's own resident memory: what ``VmRSS`` grew by while the
    module was created and run, less what its own imports grew it by (KiB, :attr:`own`); and
    calls ``after[name](module)`` once module ``name`` has loaded (how a rank's stages are
    noted without importing anything before the command does).

    Install it first on ``sys.meta_path``; it finds nothing itself, it wraps the loader that
    the finders after it return. Imports from two threads at once would mix their counts
    (a rank imports from its main thread).
    """

    def __init__(self, after: dict[str, Callable[[Any], None]] | None = None) -> None:
        self.own: collections.Counter[str] = collections.Counter()
        self.own_anon: collections.Counter[str] = collections.Counter()
        self.after = dict(after or {})
        self._stack: list[list[Any]] = []  # [name, (rss, anon) at entry, children's growth]

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        """The spec the other finders give, its loader metered."""
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _MeteredLoader(spec.loader, name, self)
                return spec
        return None

    def enter(self, name: str) -> None:
        """A module starts loading."""
        self._stack.append([name, _resident_kib(), (0, 0)])

    def leave(self, module: Any) -> None:
        """The innermost module loading is done (``module``; ``None``: it failed)."""
        name, start, children = self._stack.pop()
        now = _resident_kib()
        grown = (now[0] - start[0], now[1] - start[1])
        self.own[name] += grown[0] - children[0]
        self.own_anon[name] += grown[1] - children[1]
        if self._stack:
            outer = self._stack[-1][2]
            self._stack[-1][2] = (outer[0] + grown[0], outer[1] + grown[1])
        if module is not None and name in self.after:
            self.after.pop(name)(module)

    def by_package(self, anonymous: bool = False) -> dict[str, float]:
        """Own growth (``anonymous``: its anonymous part) summed per top-level package, MiB,
        largest first."""
        sums: collections.Counter[str] = collections.Counter()
        for name, kib in (self.own_anon if anonymous else self.own).items():
            sums[name.split(".")[0]] += kib
        return {k: v / 1024 for k, v in sums.most_common()}


def rank_main(out: Path, argv: list[str], breakdown: bool) -> int:
    """One rank: ``fullgraph`` ``argv`` in this process, the stages noted; writes
    ``OUT/rank-<r>.json`` (stages, and with ``breakdown`` the import counts). Nothing of
    fullgraph is imported before ``fullgraph.cli.main`` imports it: the stages are noted by
    wrapping three functions as their modules load."""
    marks: dict[str, dict[str, float]] = {"interpreter": memory_status()}

    def wrap(owner: Any, attr: str, before: str | None, after: str | None) -> None:
        real = getattr(owner, attr)

        def noted(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                marks.setdefault(before, memory_status())
            result = real(*args, **kwargs)
            if after is not None:
                marks.setdefault(after, memory_status())
            return result

        setattr(owner, attr, noted)

    meter = ImportMeter(
        {
            "fullgraph.run.rank_start": lambda m: wrap(m, "start_rank", "imports", "rank start"),
            "fullgraph.training.config": lambda m: wrap(
                m.TrainData, "load_part", "before part", None
            ),
            "fullgraph.training.trainer": lambda m: wrap(m.Trainer, "fit", None, "after epochs"),
        }
    )
    sys.meta_path.insert(0, meter)
    import fullgraph.cli as cli

    code = cli.main(argv)
    sys.meta_path.remove(meter)
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    record: dict[str, Any] = {"stages": marks, "modules": len(sys.modules)}
    if breakdown:
        record["packages"] = meter.by_package()
        record["packages_anon"] = meter.by_package(anonymous=True)
        record["largest"] = {k: v / 1024 for k, v in meter.own.most_common(15)}
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    return code


def _venv_tool(name: str) -> str:
    tool = Path(sys.executable).parent / name
    return str(tool) if tool.exists() else name


def prepare(work: Path, ranks: list[int]) -> dict[int, Path]:
    """The tiny graph and its METIS parts for every P (made once under ``work``)."""
    fullgraph = _venv_tool("fullgraph")
    data = work / "data"
    if not (data / "tiny").exists():
        run_checked([fullgraph, "data", "synth", "--preset", "tiny", "--name", "tiny", "--root",
                     str(data)])  # fmt: skip
    parts = {}
    for p in ranks:
        parts[p] = work / "parts" / f"tiny-{p}"
        if not (parts[p] / "meta.json").exists():
            run_checked([fullgraph, "partition", "--dataset", "tiny", "--root", str(data),
                         "--parts", str(p), "--out", str(parts[p])])  # fmt: skip
    return parts


def rank_command(parts: Path, ranks: int, out: Path, breakdown: bool) -> list[str]:
    """The ``mpirun`` line that measures every rank of one P."""
    flags = ["--rank", str(out), *(["--breakdown"] if breakdown else [])]
    return [
        _venv_tool("mpirun"),
        "-n",
        str(ranks),
        *bench_command("rank_floor", *flags, "--"),
        "train",
        "--parts",
        str(parts),
        *TRAIN_ARGS,
        "--threads",
        "1",
    ]


def plan_floor(stdout: str) -> float | None:
    """The ``process floor`` (MiB) of rank 0's ``memory plan`` line, if printed."""
    found = re.search(r"memory plan: .*process floor (\d+) MiB", stdout)
    return float(found.group(1)) if found else None


def measure(parts: Path, ranks: int, out: Path, breakdown: bool) -> dict[str, Any]:
    """Run one P; every rank's record and the plan's floor."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank-*.json"):
        old.unlink()
    cmd = rank_command(parts, ranks, out, breakdown)
    # with the pages dropped, a module's import re-touches pages an earlier one loaded and
    # the counts mix: a breakdown keeps them (what the imports bring, as they come)
    env = child_env({LIBRARY_PAGES_ENV: "keep"} if breakdown else None)
    print("  $ " + ("FULLGRAPH_LIBRARY_PAGES=keep " if breakdown else "") + " ".join(cmd))
    proc = run_checked(cmd, env=env, timeout=600)
    records = {r: json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)}
    return {"ranks": records, "plan_floor": plan_floor(proc.stdout)}


def report(ranks: int, result: dict[str, Any], writer: CSVWriter | None) -> list[str]:
    """The table lines of one P (and its CSV rows)."""
    lines = []
    for r, record in sorted(result["ranks"].items()):
        for stage, _ in STAGES:
            s = record["stages"].get(stage)
            if s is None:
                continue
            lines.append(
                f"P={ranks} rank {r}  {stage:13s} VmRSS {s['VmRSS']:6.0f}  anon "
                f"{s['RssAnon']:5.0f}  file {s['RssFile']:5.0f}  shmem {s['RssShmem']:3.0f}  "
                f"peak so far {s['VmHWM']:4.0f}  uss {s.get('Uss', 0.0):4.0f}  pss "
                f"{s.get('Pss', 0.0):4.0f} MiB"
            )
            if writer is not None:
                for field in FIELDS + ROLLUP:
                    value = s.get(field, 0.0)
                    writer.write("rank_floor", stage, field, "MiB", f"P{ranks}/rank{r}", value,
                                 ranks)  # fmt: skip
        if "packages" in record:
            anon = record.get("packages_anon", {})
            top = ", ".join(
                f"{k} {v:.1f} ({anon.get(k, 0.0):.1f})"
                for k, v in list(record["packages"].items())[:12]
            )
            lines.append(f"P={ranks} rank {r}  imports, own MiB (anonymous) per package: {top}")
    if result["plan_floor"] is not None:
        lines.append(f"P={ranks} memory plan's process floor (rank 0): {result['plan_floor']:.0f}")
        if writer is not None:
            writer.write("rank_floor", "plan", "process_floor", "MiB", f"P{ranks}/rank0",
                         result["plan_floor"], ranks)  # fmt: skip
    return lines


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The options; the words after ``--`` (a rank's ``fullgraph`` command line) apart."""
    argv = sys.argv[1:] if argv is None else argv
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="2,4", help="P values, comma-separated")
    ap.add_argument("--breakdown", action="store_true", help="count each import's memory")
    ap.add_argument("--work", default=None, help="where the tiny graph and parts go (kept)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--rank", default=None, help="(internal) run one rank, records to DIR")
    a = ap.parse_args(argv)
    a.ranks = [int(p) for p in str(a.ranks).split(",") if p]
    if not a.ranks or min(a.ranks) < 1:
        ap.error("--ranks: positive counts, e.g. 2,4")
    return a, rest


def main(argv: list[str] | None = None) -> int:
    """Measure every P of ``--ranks``; print the table; write the CSV rows."""
    a, rest = parse_args(argv)
    if a.rank is not None:
        return rank_main(Path(a.rank), rest, a.breakdown)
    print(f"# {command_line()}\n# {machine_name()}, load {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rank-floor-") as tmp:
        work = Path(a.work) if a.work else Path(tmp)
        parts = prepare(work, a.ranks)
        writer = CSVWriter(Path(a.out) / "rank_floor.csv")
        for p in a.ranks:
            result = measure(parts[p], p, work / "records" / f"P{p}", a.breakdown)
            for line in report(p, result, writer):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
