"""One harness for the workers of the multi-process tests: named tasks, named arguments.

A worker is a module beside the tests that use it (``tests/training/train_worker.py``,
``tests/distributed/comm_worker.py``, ``tests/pyg/pyg_worker.py``,
``tests/minibatch/minibatch_worker.py``). It registers its tasks in one :class:`Tasks` and
hands them to the shared :func:`main`::

    TASKS = Tasks()

    @TASKS.task
    def exact(*, parts: Path, transports: list[str]) -> dict[str, np.ndarray]: ...

    if __name__ == "__main__":
        sys.exit(main(TASKS))

A task takes keyword-only arguments, each annotated ``str``, ``int``, ``float``, ``Path`` or
``list[...]`` of one of them; they become the options ``--name VALUE`` (``--name V1 V2 ...``
for a list; ``_`` in a name is spelt ``-``). The task runs on every rank and returns its result;
:func:`main` saves rank 0's to ``--out`` by its suffix: ``.npz`` (a dict of arrays), ``.npy``
(one array) or ``.json``.

A test launches a task with :func:`run_task`, which reads the result back the same way::

    result = run_task(train_worker.exact, ranks=2, out=tmp_path / "result.npz", timeout=200,
                      parts=small_partitions[2], transports=["mpi", "gloo"])

which runs ``mpirun -n 2 python tests/training/train_worker.py --task exact
--out .../result.npz --parts ... --transports mpi gloo`` (``ranks=None``: one plain ``python``
process, no launcher). By hand: ``PYTHONPATH=tests mpirun -n 2 .venv/bin/python
tests/training/train_worker.py --task exact --out /tmp/r.npz --parts P --transports mpi``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

TESTS = Path(__file__).resolve().parent
#: The types a task argument may have (also as the items of a ``list``).
SCALARS = (str, int, float, Path)


class Tasks(dict[str, Callable[..., Any]]):
    """A worker's tasks by name; :meth:`task` registers a function under its own name."""

    def task(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: register ``fn`` (its arguments checked by :func:`_options`)."""
        _options(fn)
        self[fn.__name__] = fn
        return fn


def _options(fn: Callable[..., Any]) -> dict[str, tuple[type, bool, inspect.Parameter]]:
    """Parameter name -> (item type, is a list, the parameter) of task ``fn``; refuses what
    cannot be an option (positional parameters, unsupported annotations)."""
    hints = typing.get_type_hints(fn)
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind is not p.KEYWORD_ONLY:
            raise TypeError(f"task {fn.__name__}: parameter {p.name} must be keyword-only")
        kind = hints.get(p.name)
        many = typing.get_origin(kind) is list
        item = typing.get_args(kind)[0] if many else kind
        if item not in SCALARS:
            raise TypeError(f"task {fn.__name__}: parameter {p.name} has type {kind}")
        out[p.name] = (item, many, p)
    return out


def _parser(fn: Callable[..., Any]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"--task {fn.__name__}", description=fn.__doc__)
    for name, (item, many, param) in _options(fn).items():
        flag = "--" + name.replace("_", "-")
        extra: dict[str, Any] = {"nargs": "+"} if many else {}
        if param.default is param.empty:
            extra["required"] = True
        else:
            extra["default"] = param.default
        parser.add_argument(flag, dest=name, type=item, **extra)
    return parser


def _argv(fn: Callable[..., Any], args: dict[str, Any]) -> list[str]:
    """``--name VALUE`` options of ``args`` for task ``fn``, checked against its signature."""
    options = _options(fn)
    inspect.signature(fn).bind(**args)  # unknown or missing arguments fail here, not in ranks
    argv = []
    for name, value in args.items():
        values = list(value) if options[name][1] else [value]
        argv += ["--" + name.replace("_", "-"), *map(str, values)]
    return argv


def save(result: Any, path: Path) -> None:
    """Write a task's result by the suffix of ``path``: ``.npz``, ``.npy`` or ``.json``."""
    path = Path(path)
    if path.suffix == ".npz":
        np.savez(path, **result)
    elif path.suffix == ".npy":
        np.save(path, result)
    elif path.suffix == ".json":
        path.write_text(json.dumps(result))
    else:
        raise ValueError(f"no result format for {path} (use .npz, .npy or .json)")


def load(path: Path) -> Any:
    """Read what :func:`save` wrote (an ``.npz`` as a dict of arrays)."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path) as got:
            return dict(got)
    if path.suffix == ".npy":
        return np.load(path)
    return json.loads(path.read_text())


def main(tasks: Tasks, argv: list[str] | None = None) -> int:
    """Entry point of every worker: ``--task NAME --out FILE --name value ...``.

    Runs torch and numba single-threaded (idle OpenMP workers spin; oversubscribed ranks must
    not), calls the task with its named arguments and saves rank 0's result to ``--out``.
    """
    import numba
    import torch

    from fullgraph.distributed.launch import detect_launch

    top = argparse.ArgumentParser(prog=Path(sys.argv[0]).name)
    top.add_argument("--task", required=True, choices=sorted(tasks))
    top.add_argument("--out", required=True, type=Path)
    known, rest = top.parse_known_args(argv)
    fn = tasks[known.task]
    args = _parser(fn).parse_args(rest)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    result = fn(**vars(args))
    if detect_launch().rank == 0:
        save(result, known.out)
    return 0


def communicators(transports: list[str]) -> Iterator[tuple[str, Any]]:
    """(transport, its communicator) for each transport in turn (60 s timeout); each is
    closed before the next is created."""
    from fullgraph.distributed import create_communicator
    from fullgraph.distributed.launch import detect_launch

    info = detect_launch()
    for transport in transports:
        comm = create_communicator(transport, info, timeout_s=60)
        yield transport, comm
        comm.close()


def run_task(
    task: Callable[..., Any],
    *,
    ranks: int | None,
    out: Path,
    timeout: float = 120.0,
    **args: Any,
) -> Any:
    """Run ``task`` of its worker on ``ranks`` ranks and return rank 0's result.

    Args:
        task: a registered task function (``train_worker.exact``): its module's file is run.
        ranks: ``mpirun -n ranks``; ``None`` runs one plain ``python`` process.
        out: the result file (``.npz``, ``.npy`` or ``.json``).
        timeout: seconds before the job is killed and the test fails.
        **args: the task's named arguments.

    Returns:
        The result, read back by :func:`load`. A failed or timed-out job fails the test with
        its output.
    """
    from mp_utils import run_mpi, run_python

    script = inspect.getfile(task)
    argv = [script, "--task", task.__name__, "--out", str(out), *_argv(task, args)]
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path}  # the worker imports this module (and conftest)
    if ranks is None:
        run_python(argv, timeout, env=env)
    else:
        run_mpi(ranks, argv, timeout, env=env)
    return load(out)


class Tol(typing.NamedTuple):
    """A tolerance of :func:`assert_matches_one_process`: ``|got - want| <= atol + rtol *
    |want|`` entry by entry (:func:`numpy.testing.assert_allclose`'s rule, NaN equal to NaN);
    ``of_max``: ``atol`` is a share of the largest ``|want|`` of that quantity."""

    rtol: float = 0.0
    atol: float = 0.0
    of_max: bool = False


#: The tolerance of a quantity that must be equal entry for entry (:func:`numpy.array_equal`).
EXACT = None


def _difference(got: np.ndarray, want: np.ndarray, tol: Tol | None) -> str | None:
    """What is wrong with ``got`` against ``want`` under ``tol`` (``None``: nothing)."""
    if got.shape != want.shape:
        return f"shape {got.shape}, one process {want.shape}"
    if tol is EXACT:
        bad = ~((got == want) | (_isnan(got) & _isnan(want)))
        rule = "exactly"
    else:
        scale = float(np.abs(want).max()) if tol.of_max and want.size else 1.0
        atol = tol.atol * scale
        bad = ~np.isclose(got, want, rtol=tol.rtol, atol=atol, equal_nan=True)
        rule = f"to rtol={tol.rtol:g}, atol={atol:g}"
    if not bad.any():
        return None
    off = (
        np.abs(got.astype(np.float64) - want.astype(np.float64))
        if got.dtype.kind in "biuf"
        else bad
    )
    at = np.unravel_index(int(np.argmax(np.where(bad, off, -1))), bad.shape) if bad.ndim else ()
    return (
        f"{int(bad.sum())} of {bad.size} entries differ {rule}; the largest "
        f"at {list(map(int, at))}: {got[at].item()!r}, one process {want[at].item()!r}"
    )


def _isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a) if a.dtype.kind in "fc" else np.zeros(a.shape, dtype=bool)


def assert_matches_one_process(
    got: Any,
    want: Any,
    tolerances: typing.Mapping[str, Tol | tuple[float, float] | None],
    *,
    names: Iterable[str] | None = None,
    where: str,
    tolerance_of: typing.Mapping[str, Tol | tuple[float, float] | None] | None = None,
) -> None:
    """Fail unless the P-rank results ``got`` equal the one-process results ``want``.

    The comparison every exactness test makes: each quantity (``"gcn/logits"``) of a P-rank
    run against the same quantity of one process, each within its tolerance. Every quantity is
    checked before the test fails, and the failure names each that differs, where (``where``:
    the run, e.g. ``"P=2, mpi"``; a key that holds one rank's rows names the rank), by how
    much and at which entry.

    Args:
        got: the P-rank results by key (a dict of arrays, e.g. :func:`run_task`'s), or one
            array where ``tolerances`` names one quantity.
        want: the one-process results, keyed as ``got`` (or one array).
        tolerances: quantity -> :class:`Tol` (or ``(rtol, atol)``), or :data:`EXACT`.
        names: with names, the keys are ``f"{name}/{quantity}"`` for each name and quantity
            (``"gcn/logits"``); without, the quantities are the keys.
        where: the run compared, for the failure message.
        tolerance_of: key -> the tolerance of that key where it is not its quantity's.
    """
    if not isinstance(got, typing.Mapping):
        (only,) = tolerances
        got, want = {only: got}, {only: want}
    prefixes = [""] if names is None else [f"{name}/" for name in names]
    keys = [(prefix + quantity, quantity) for prefix in prefixes for quantity in tolerances]
    failures = []
    for key, quantity in keys:
        tol = (tolerance_of or {}).get(key, tolerances[quantity])
        tol = tol if tol is EXACT else Tol(*tol)
        if key not in got or key not in want:
            side = "the P-rank result" if key not in got else "the one-process result"
            failures.append(f"{key}: missing from {side}")
            continue
        wrong = _difference(np.asarray(got[key]), np.asarray(want[key]), tol)
        if wrong:
            failures.append(f"{key}: {wrong}")
    assert not failures, (
        f"{where}: {len(failures)} of {len(keys)} quantities differ from one process:\n  "
        + "\n  ".join(failures)
    )
