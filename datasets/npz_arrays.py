"""Reading ``.npz`` archives of arrays safely: no pickle, every array checked before use.

Shared by the gnn-benchmark and heterophilous readers: an archive (or one inside a ``.zip``)
is opened without pickle, and each array is checked for presence, dtype, shape, range and
finiteness, so malformed files fail with one line naming the file and the array.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from pathlib import Path

import numpy as np

from fullgraph.errors import DataError

_ZIP_HEADERS = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first entry, or an empty zip
_CORRUPT = (zipfile.BadZipFile, ValueError, OSError, EOFError, zlib.error, KeyError)


def corrupt_archive(what: str, exc: BaseException) -> DataError:
    """The one-line error for an archive ``what`` that could not be read (``exc``)."""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, OSError) and exc.errno is not None:
        return DataError(f"{what}: cannot read ({exc.strerror or msg}); check the file")
    return DataError(
        f"{what}: not a readable .npz archive ({msg}); it is truncated or corrupted, "
        f"replace it with the dataset's original file"
    )


def read_npz(source: Path | bytes, what: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (a file, or its bytes) that loads without pickle.

    Arrays stored as Python objects (names, strings) are skipped: the readers need none.

    Raises:
        DataError: not an ``.npz`` (no zip header: a text file, an ``.npy``), or a truncated or
            corrupted archive; ``what`` names it.
    """
    try:
        if isinstance(source, bytes):
            head = source[:4]
        else:
            with open(source, "rb") as fh:
                head = fh.read(4)
    except OSError as exc:
        raise corrupt_archive(what, exc) from exc
    if head not in _ZIP_HEADERS:
        raise DataError(
            f"{what}: not an .npz archive (it does not start with a zip header); replace it "
            f"with the dataset's original file"
        )
    out = {}
    try:
        with np.load(
            io.BytesIO(source) if isinstance(source, bytes) else source, allow_pickle=False
        ) as f:
            for k in f.files:
                try:
                    out[k] = f[k]
                except ValueError as exc:
                    if "allow_pickle" not in str(exc):
                        raise
    except _CORRUPT as exc:
        raise corrupt_archive(what, exc) from exc
    return out


def open_npz(raw: Path, npz_name: str, zip_name: str) -> tuple[dict, Path]:
    """Numeric arrays of ``raw/npz_name``, or of the npz inside ``raw/zip_name``."""
    npz_path, zip_path = raw / npz_name, raw / zip_name
    if npz_path.is_file():
        return read_npz(npz_path, str(npz_path)), npz_path
    if zip_path.is_file():
        try:
            with zipfile.ZipFile(zip_path) as z:
                members = [m for m in z.namelist() if m.endswith(".npz")]
                if not members:
                    raise DataError(
                        f"{zip_path}: holds no .npz file (expected {npz_name}); replace it with "
                        f"the dataset's original archive"
                    )
                member = npz_name if npz_name in members else members[0]
                data = z.read(member)
        except _CORRUPT as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if isinstance(exc, OSError) and exc.errno is not None:
                raise DataError(f"{zip_path}: cannot read ({exc.strerror or msg})") from exc
            raise DataError(
                f"{zip_path}: not a readable zip archive ({msg}); it is truncated or "
                f"corrupted, replace it with the dataset's original archive"
            ) from exc
        return read_npz(data, f"{zip_path} ({member})"), zip_path
    raise DataError(f"missing file: expected {npz_path} (or {zip_path})")


def need_arrays(arrays: dict, keys: tuple[str, ...], path: Path) -> None:
    """Raise :class:`DataError` naming the arrays of ``keys`` that ``arrays`` lacks."""
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise DataError(
            f"{path}: missing arrays {missing} (holds {sorted(arrays)}); is it the right file?"
        )


def numbers(arrays: dict, key: str, path: Path, ndim: int) -> np.ndarray:
    """``arrays[key]`` checked to be a real-valued array of ``ndim`` dimensions."""
    a = arrays[key]
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_) or np.iscomplexobj(a):
        raise DataError(f"{path}: {key} holds {a.dtype} values, expected numbers")
    if a.ndim != ndim:
        raise DataError(f"{path}: {key} has shape {a.shape}, expected {ndim} dimensions")
    return a


def integers(arrays: dict, key: str, path: Path, ndim: int = 1) -> np.ndarray:
    """``arrays[key]`` as int64, checked to hold whole numbers only."""
    a = numbers(arrays, key, path, ndim)
    if not np.issubdtype(a.dtype, np.integer) and a.dtype != np.bool_:
        whole = np.isfinite(a) & (a == np.round(a)) & (np.abs(a) < 2**62)
        if not whole.all():
            v = a.reshape(-1)[np.argmin(whole.reshape(-1))].item()
            raise DataError(f"{path}: {key} holds {v!r}, expected integers")
    return a.astype(np.int64, copy=False)


#: The largest float32: the readers keep features and edge values as float32, so a float64
#: value beyond it (1e308) would become an infinity.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_finite(a: np.ndarray, key: str, path: Path) -> None:
    """Raise :class:`DataError` when array ``key`` holds a value that is not a finite float32
    (NaN, an infinity, or beyond float32's range), naming its first position."""
    if not np.issubdtype(a.dtype, np.floating):
        return
    ok = np.abs(a) <= FLOAT32_MAX  # False for NaN as well
    if not ok.all():
        where = np.unravel_index(int(np.argmin(ok)), a.shape)
        at = ", ".join(str(int(i)) for i in where)
        raise DataError(
            f"{path}: {key}[{at}] is {a[where].item()!r}, not a finite float32 (NaN, inf, or "
            f"beyond +-3.4e38; {int(ok.size - np.count_nonzero(ok))} such value(s) in all); "
            f"values must be finite"
        )


def labels(arrays: dict, key: str, path: Path, n: int) -> np.ndarray:
    """Array ``key`` as ``n`` non-negative integer class labels (int64)."""
    y = integers(arrays, key, path)
    if y.shape[0] != n:
        raise DataError(f"{path}: {key} has {y.shape[0]} entries but the graph has {n} nodes")
    if y.size and y.min() < 0:
        v = int(np.argmin(y))
        raise DataError(f"{path}: {key} gives node {v} the negative label {int(y[v])}")
    return y


def csr_arrays(arrays: dict, prefix: str, path: Path) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Check the CSR pieces ``<prefix>_{data,indices,indptr,shape}`` before scipy sees them.

    Returns:
        ``(indptr, indices, (rows, cols))``, int64.

    Raises:
        DataError: naming the file and the array: a missing piece, a shape that is not two
            non-negative integers, a row pointer of the wrong length, not starting at 0,
            decreasing or not ending at the number of entries, a column outside the shape,
            data of another length than the indices or not finite.
    """
    need_arrays(
        arrays, tuple(f"{prefix}_{k}" for k in ("data", "indices", "indptr", "shape")), path
    )
    shape = integers(arrays, f"{prefix}_shape", path)
    if shape.shape != (2,) or shape.min() < 0:
        raise DataError(
            f"{path}: {prefix}_shape is {shape.tolist()}, expected two non-negative sizes"
        )
    rows, cols = int(shape[0]), int(shape[1])
    indptr = integers(arrays, f"{prefix}_indptr", path)
    indices = integers(arrays, f"{prefix}_indices", path)
    data = numbers(arrays, f"{prefix}_data", path, 1)
    name = f"{prefix}_indptr"
    if indptr.shape[0] != rows + 1:
        raise DataError(
            f"{path}: {name} has {indptr.shape[0]} entries, expected {prefix}_shape[0] + 1 = "
            f"{rows + 1}"
        )
    if indptr[0] != 0:
        raise DataError(f"{path}: {name} starts at {int(indptr[0])}, expected 0")
    step = np.diff(indptr)
    if step.size and step.min() < 0:
        r = int(np.argmin(step))
        raise DataError(f"{path}: {name} decreases at row {r} (a CSR row pointer never does)")
    if indptr[-1] != indices.shape[0]:
        raise DataError(
            f"{path}: {name} ends at {int(indptr[-1])} but {prefix}_indices has "
            f"{indices.shape[0]} entries"
        )
    if indices.size and (indices.min() < 0 or indices.max() >= cols):
        bad = int(indices.min()) if indices.min() < 0 else int(indices.max())
        raise DataError(
            f"{path}: {prefix}_indices holds column {bad}, outside [0, {cols}) of {prefix}_shape"
        )
    if data.shape[0] != indices.shape[0]:
        raise DataError(
            f"{path}: {prefix}_data has {data.shape[0]} entries but {prefix}_indices has "
            f"{indices.shape[0]}"
        )
    check_finite(data, f"{prefix}_data", path)
    return indptr, indices, (rows, cols)
