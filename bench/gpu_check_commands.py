"""The commands of bench/gpu_check.py's steps other than fullgraph's own, for the machine's Python.

    python -m bench.gpu_check_commands env --json FILE [--require-cuda]   # versions, the device
    python -m bench.gpu_check_commands install --work DIR     # fullgraph importable, no network
    python -m bench.gpu_check_commands make-parts --preset products --out DIR   # no METIS
    python -m bench.gpu_check_commands collectives --transport nccl   # NCCL on a world of one

Each imports torch or fullgraph inside, so that the driver (which imports neither) reports
whatever goes wrong here as the step's failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: pyproject's package-dir: the subpackages that do not live under fullgraph/.
PACKAGE_DIRS = {f"fullgraph.{d}": d for d in ("kernels", "partition", "datasets")}
#: Modules whose versions the env step reports.
VERSIONS = "torch triton numba torch_geometric mpi4py pytest pytest_timeout scipy numpy".split()


def env_info(args: argparse.Namespace) -> int:
    """Versions, the CUDA device, nvidia-smi; ``--require-cuda`` fails without a device."""
    info: dict[str, object] = {"python": sys.version.split()[0], "executable": sys.executable}
    for mod in VERSIONS:
        try:
            info[mod] = getattr(__import__(mod), "__version__", "installed")
        except Exception as exc:  # an import that fails is a finding, not a crash
            info[mod] = f"not importable: {type(exc).__name__}: {exc}"
    smi = shutil.which("nvidia-smi")
    info["nvidia_smi"] = "not found"
    if smi:
        q = "--query-gpu=name,memory.total,driver_version,clocks.max.memory"
        p = subprocess.run([smi, q, "--format=csv,noheader"], capture_output=True, text=True)
        info["nvidia_smi"] = (p.stdout or p.stderr).strip()
    ok = not args.require_cuda
    try:
        import torch

        info["cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info["device"] = torch.cuda.get_device_name(0)
            info["capability"] = f"{p.major}.{p.minor}"
            info["memory_gib"] = round(p.total_memory / 2**30, 1)
            info["multiprocessors"] = p.multi_processor_count
            ok = True
    except Exception as exc:
        info["cuda_available"] = f"torch failed: {type(exc).__name__}: {exc}"
        ok = False
    for k, v in info.items():
        print(f"{k}: {v}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(info, indent=1) + "\n")
    if not ok:
        print("no CUDA device: the GPU steps will fail", file=sys.stderr)
    return 0 if ok else 1


def imports_here(env: dict[str, str] | None = None) -> str | None:
    """None when a fresh interpreter, started in the checkout as the steps are, imports
    fullgraph's packages from this checkout; else why not."""
    code = (
        "import fullgraph, fullgraph.kernels, fullgraph.partition, fullgraph.datasets, "
        "fullgraph.cli; print(fullgraph.__file__); print(fullgraph.kernels.__file__)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO
    )
    if p.returncode != 0:
        return (p.stderr.strip().splitlines() or ["import failed"])[-1]
    files = [Path(x).resolve() for x in p.stdout.split()]
    if not all(REPO in f.parents for f in files):
        return f"fullgraph imports from elsewhere: {', '.join(map(str, files))}"
    return None


FINDER = '''"""Written by bench/gpu_check_commands.py: fullgraph's package-dir, no install."""
import importlib.abc
import importlib.util
import sys

DIRS = {dirs!r}


class PackageDirFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in DIRS:
            return None
        return importlib.util.spec_from_file_location(
            name, DIRS[name] + "/__init__.py", submodule_search_locations=[DIRS[name]]
        )


sys.meta_path.insert(0, PackageDirFinder())
'''


def write_finder(work: Path) -> Path:
    """``work/shim/sitecustomize.py``: maps ``fullgraph.kernels`` etc. to their directories
    (what an editable install's finder does); ``PYTHONPATH=work/shim:REPO`` then imports this
    checkout from any directory."""
    shim = work / "shim"
    shim.mkdir(parents=True, exist_ok=True)
    dirs = {name: str(REPO / d) for name, d in PACKAGE_DIRS.items()}
    (shim / "sitecustomize.py").write_text(FINDER.format(dirs=dirs))
    return shim


def install(args: argparse.Namespace) -> int:
    """Make fullgraph importable from this checkout, without the network: nothing when it is,
    else ``pip install --no-deps -e .`` (no build isolation: pip could not fetch setuptools),
    else the finder of :func:`write_finder`, which the driver puts on the later steps' path."""
    why = imports_here()
    if why is None:
        print(f"fullgraph imports from {REPO}: nothing to install")
        return 0
    print(f"fullgraph: {why}; installing it (editable, no dependencies)")
    for extra in (["--no-build-isolation"], []):
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *extra, "-e", str(REPO)]
        print("$ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode == 0 and (why := imports_here()) is None:
            print("installed (editable)")
            return 0
    shim = write_finder(Path(args.work))
    path = [str(shim), str(REPO), os.environ.get("PYTHONPATH", "")]
    why = imports_here({**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))})
    if why is None:
        print(f"pip failed; the next steps import fullgraph through {shim}/sitecustomize.py")
        return 0
    print(f"fullgraph still not importable: {why}", file=sys.stderr)
    return 1


def make_parts(args: argparse.Namespace) -> int:
    """Generate a synthetic preset in memory and write it as a partition (no METIS).

    At products size this skips the text (OGB) layout that ``fullgraph data synth`` writes and
    ``load`` parses again (minutes on one core), which none of the GPU steps needs.
    """
    from fullgraph.datasets.synthetic import generate
    from fullgraph.partition import format_report, partition_graph

    t0 = time.perf_counter()
    g = generate(args.preset, seed=args.seed)
    print(
        f"generated {args.preset}: {g.num_nodes:,} nodes, {len(g.indices):,} CSR entries in "
        f"{time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    meta = partition_graph(g, args.parts, args.out, method=args.method, seed=args.seed, force=True)
    print(format_report(meta))
    print(f"wrote {args.out} in {time.perf_counter() - t0:.1f} s in all")
    return 0


def collectives(args: argparse.Namespace) -> int:
    """One rank: build fullgraph's communicator for ``--transport``, run the backend's own
    collectives on the group it made (NCCL's kernels on the GPU for ``nccl``), check them."""
    import torch
    import torch.distributed as dist

    from fullgraph.distributed import LaunchInfo, create_communicator

    comm = create_communicator(args.transport, LaunchInfo(0, 1, 0, 1, "none"), 60.0, "probe")
    device = torch.device("cuda", torch.cuda.current_device()) if args.transport == "nccl" else None
    x = torch.arange(1 << 20, dtype=torch.float32, device=device)
    reduced, exchanged = x.clone(), torch.empty_like(x)
    dist.all_reduce(reduced)
    dist.all_to_all_single(exchanged, x)
    gathered = comm.allgather_object({"rank": comm.rank, "device": str(x.device)})
    comm.close()
    ok = torch.equal(x, reduced) and torch.equal(x, exchanged)
    ok = ok and gathered == [{"rank": 0, "device": str(x.device)}]
    nccl = torch.cuda.nccl.version() if args.transport == "nccl" else "-"
    print(
        f"{args.transport} on {x.device}: all_reduce, all_to_all_single, all_gather_object "
        f"{'return their input' if ok else 'DIFFER'} (torch {torch.__version__}, nccl {nccl})"
    )
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env", help="versions and the CUDA device")
    e.add_argument("--json", help="also write them here")
    e.add_argument("--require-cuda", action="store_true", help="fail without a CUDA device")
    e.set_defaults(func=env_info)
    i = sub.add_parser("install", help="make fullgraph importable from this checkout")
    i.add_argument("--work", required=True, help="where the fallback finder may go (work/shim)")
    i.set_defaults(func=install)
    m = sub.add_parser("make-parts", help="generate a preset, write a partition (no METIS)")
    m.add_argument("--preset", required=True, help="synthetic preset (tiny, arxiv, products)")
    m.add_argument("--out", required=True, help="partition directory")
    m.add_argument("--parts", type=int, default=1, help="parts (default 1)")
    m.add_argument("--method", default="contiguous", choices=["contiguous", "random"])
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=make_parts)
    c = sub.add_parser("collectives", help="a transport's collectives on a world of one rank")
    c.add_argument("--transport", default="nccl", choices=["nccl", "gloo"])
    c.set_defaults(func=collectives)
    args = p.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
