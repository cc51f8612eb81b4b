"""The vocabulary of setup steps: each verb makes a function that tampers with the case dir.

A table names a step as ``(verb, *args)``; ``setup`` turns a row's steps into one function.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .commands import argv
from .records import Step
from .workspace import run_or_exit

Setup = Callable[[Path], None]
NPZ = "data/amazon_photo/raw/amazon_electronics_photo.npz"


def _flip_byte(rel: str, offset: int = -40) -> Setup:
    def setup(w: Path) -> None:
        path = w / rel
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x40
        path.write_bytes(bytes(data))

    return setup


def _write(rel: str, data: bytes) -> Setup:
    def setup(w: Path) -> None:
        (w / rel).parent.mkdir(parents=True, exist_ok=True)
        (w / rel).write_bytes(data)

    return setup


def _write_gz(rel: str, data: bytes) -> Setup:
    def setup(w: Path) -> None:
        _write(rel, gzip.compress(data))(w)

    return setup


def _truncate(rel: str, keep: int) -> Setup:
    return lambda w: (w / rel).write_bytes((w / rel).read_bytes()[:keep])


def _remove(rel: str) -> Setup:
    def setup(w: Path) -> None:
        path = w / rel
        shutil.rmtree(path) if path.is_dir() else path.unlink()

    return setup


def _copy(src: str, dst: str) -> Setup:
    def setup(w: Path) -> None:
        shutil.copytree(w / src, w / dst)

    return setup


def _drop_processed() -> Setup:
    return lambda w: shutil.rmtree(w / "data" / "tiny" / "processed", ignore_errors=True)


def _edit_meta(key: str, scale: float | None = None, value: object = None) -> Setup:
    def setup(w: Path) -> None:
        path = w / "p2" / "meta.json"
        meta = json.loads(path.read_text())
        meta[key] = value if scale is None else type(meta[key])(meta[key] * scale)
        path.write_text(json.dumps(meta, indent=2))

    return setup


def _edit_part_meta(rank: int, key: str, value: object) -> Setup:
    def setup(w: Path) -> None:
        path = w / "p2" / "meta.json"
        meta = json.loads(path.read_text())
        meta["parts"][rank][key] = value
        path.write_text(json.dumps(meta, indent=2))

    return setup


def _npy_set(rel: str, index: int, value: float, add: bool = False) -> Setup:
    def setup(w: Path) -> None:
        a = np.load(w / rel)
        a[index] = a[index] + value if add else value
        np.save(w / rel, a)

    return setup


def _gz_lines(rel: str, transform: Callable[[list[str]], list[str]]) -> Setup:
    """Rewrite the lines of a gzipped CSV; its dataset's ``processed`` cache goes."""

    def setup(w: Path) -> None:
        path = w / rel
        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        path.write_bytes(gzip.compress(("\n".join(transform(lines)) + "\n").encode()))
        shutil.rmtree(path.parents[1] / "processed", ignore_errors=True)

    return setup


def _npz_edit(**changes: Callable[[np.ndarray], np.ndarray]) -> Setup:
    def setup(w: Path) -> None:
        path = w / NPZ
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
        for key, fn in changes.items():
            arrays[key] = fn(arrays[key])
        np.savez(path, **arrays)

    return setup


def _npz_set(key: str, index: int, value: float, dtype: str | None = None) -> Setup:
    def change(a: np.ndarray) -> np.ndarray:
        a = a.astype(dtype or a.dtype)
        a[index] = value
        return a

    return _npz_edit(**{key: change})


def _train_node_in_test() -> Setup:
    """The first training node of ``tiny``'s split appended to its test nodes."""

    def setup(w: Path) -> None:
        split = w / "data" / "tiny" / "split"
        scheme = next(p for p in split.iterdir() if p.is_dir())
        first_train = gzip.decompress((scheme / "train.csv.gz").read_bytes()).decode().split()[0]
        test = gzip.decompress((scheme / "test.csv.gz").read_bytes()).decode()
        (scheme / "test.csv.gz").write_bytes(gzip.compress((test + first_train + "\n").encode()))
        shutil.rmtree(w / "data" / "tiny" / "processed", ignore_errors=True)

    return setup


def _full_tmpfs(rel: str) -> Setup:
    """A 32 KiB tmpfs at ``rel``, 28 KiB of it filled (root only; check ``unmount`` it)."""

    def setup(w: Path) -> None:
        (w / rel).mkdir()
        mount = ["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(w / rel)]
        subprocess.run(mount, check=True)
        (w / rel / "filler").write_bytes(b"\0" * 28 * 1024)

    return setup


def _musae_copy() -> Setup:
    """A small GitHub MUSAE copy under the name it is distributed with (``github_musae``)."""

    def setup(w: Path) -> None:
        raw = w / "data" / "github_musae" / "raw"
        raw.mkdir(parents=True)
        edges = "".join(f"{i},{(i * 7 + 3) % 200}\n" for i in range(200))
        (raw / "edges.csv").write_text("id_1,id_2\n" + edges)
        targets = "".join(f"{i},dev{i},{i % 2}\n" for i in range(200))
        (raw / "target.csv").write_text("id,name,ml_target\n" + targets)

    return setup


def _torch_edit(rel: str, key: str, change: Callable[[object], object]) -> Setup:
    """Rewrite a file fullgraph wrote (model file, checkpoint) with ``change`` applied to the
    value at ``key`` (dotted: ``state_dict.layers.0.lin.weight``, ``optimizer.exp_avg.1``;
    a name with dots inside is matched whole); saved with a valid checksum, as a run would."""
    from fullgraph.run.torch_file import encode_torch_file, read_torch_file

    def edit(node: object, parts: list[str]) -> None:
        for i in range(len(parts), 0, -1):  # the longest name first (state_dict keys)
            name = ".".join(parts[:i])
            index = int(name) if isinstance(node, list) and name.isdigit() else name
            if (isinstance(node, dict) and name in node) or isinstance(index, int):
                if i == len(parts):
                    node[index] = change(node[index])  # type: ignore[index]
                else:
                    edit(node[index], parts[i:])  # type: ignore[index]
                return
        raise KeyError(f"{key} not in {rel}")

    def setup(w: Path) -> None:
        state = read_torch_file(w / rel, weights_only=False)
        edit(state, key.split("."))
        (w / rel).write_bytes(encode_torch_file(state))

    return setup


def _first_entry(value: float) -> Callable[[object], object]:
    def change(t: object) -> object:
        t = t.clone()  # type: ignore[attr-defined]
        t.view(-1)[0] = value
        return t

    return change


def _retyped(dtype: str) -> Callable[[object], object]:
    import torch

    return lambda t: t.to(getattr(torch, dtype))  # type: ignore[attr-defined]


#: verb -> function of the step's arguments that makes the setup.
SETUP_STEPS: dict[str, Callable[..., Setup]] = {
    # files
    "write": _write,  # rel, bytes
    "write gz": _write_gz,  # rel, bytes (gzipped)
    "flip byte": _flip_byte,  # rel[, offset=-40]: corrupt one byte
    "truncate": _truncate,  # rel, bytes kept
    "remove": _remove,  # rel (file or directory)
    "copy": _copy,  # src dir, dst dir
    "run": lambda template: lambda w: run_or_exit(argv(template), w),  # a command that must work
    # the tiny dataset's CSVs
    "drop processed": _drop_processed,  # the tiny dataset's processed cache
    "gz insert": lambda rel, i, line: _gz_lines(rel, lambda ls: [*ls[:i], line, *ls[i:]]),
    "gz set line": lambda rel, i, line: _gz_lines(rel, lambda ls: [*ls[:i], line, *ls[i + 1 :]]),
    "gz append": lambda rel, line: _gz_lines(rel, lambda ls: [*ls, line]),
    "gz replace first": lambda rel, line: _gz_lines(rel, lambda ls: [line, *ls[1:]]),
    "gz drop last": lambda rel: _gz_lines(rel, lambda ls: ls[:-1]),
    "gz nan first row": lambda rel: _gz_lines(
        rel, lambda ls: [",".join(["nan"] * len(ls[0].split(","))), *ls[1:]]
    ),
    "train node in test": _train_node_in_test,
    # the partition's meta.json
    "scale meta": lambda key, factor: _edit_meta(key, factor),
    "set meta": lambda key, value: _edit_meta(key, None, value),
    "set part meta": _edit_part_meta,  # rank, key, value
    "npy set": _npy_set,  # rel, index, value: one entry of a part's array (checksum not kept)
    "npy add": lambda rel, index, delta: _npy_set(rel, index, delta, add=True),
    # the .npz dataset
    "npz set": _npz_set,  # key, index, value[, dtype the array is stored as]
    "npz reverse": lambda key: _npz_edit(**{key: lambda a: a[::-1].copy()}),
    "npz drop tail": lambda key, n: _npz_edit(**{key: lambda a: a[:-n]}),
    "npz no edges": lambda: _npz_edit(
        adj_data=lambda a: a[:0], adj_indices=lambda a: a[:0], adj_indptr=np.zeros_like
    ),
    # files fullgraph wrote (model file, checkpoint), checksum kept valid
    "set tensor": lambda rel, key, value: _torch_edit(rel, key, _first_entry(value)),
    "retype tensor": lambda rel, key, dtype: _torch_edit(rel, key, _retyped(dtype)),
    "cut tensor": lambda rel, key: _torch_edit(rel, key, lambda t: t[:-1].clone()),
    "set value": lambda rel, key, value: _torch_edit(rel, key, lambda _: value),
    "gz scale": lambda rel, k: _gz_lines(rel, lambda ls: [repr(float(x) * k) for x in ls]),
    "gz fill": lambda rel, value: _gz_lines(rel, lambda ls: [value for _ in ls]),
    # other datasets, the machine
    "musae copy": _musae_copy,
    "full tmpfs": _full_tmpfs,  # rel: a full 32 KiB tmpfs mounted there
}


def setup(steps: tuple[Step, ...]) -> Setup | None:
    """One function running ``steps`` in order (``None`` for no steps)."""
    if not steps:
        return None
    fns = [SETUP_STEPS[verb](*args) for verb, *args in steps]

    def run(w: Path) -> None:
        for fn in fns:
            fn(w)

    return run
