"""Files ``torch.load`` opens as they are, with a sha256 checksum fullgraph checks first.

``torch.save`` writes a zip archive. A zip archive may end with a comment (its
end-of-central-directory record says how long), which readers skip: fullgraph writes the
archive, then the comment ``fullgraph sha256=<64 hex digits>`` naming the digest of every byte
before the comment-length field. ``torch.load(path, weights_only=True)``, ``zipfile`` and every
other zip reader open the file unchanged; :func:`read_torch_file` checks the digest before it
unpickles anything, so a flipped bit is an error instead of a weight of -3.7e37.

Checkpoints of format 2 (a ``FULLGRAPH-CHECKPOINT 2 sha256=...`` header line before the
archive, which plain ``torch.load`` cannot read) are still read and recognised.

Every writer of such files writes its own kind (:func:`torch_file_kind`: a checkpoint, a
rank's checkpoint state, a model file of ``fullgraph train``, a PyG export), and ``--force``
replaces only a file of the writer's own kind (:func:`not_of_kinds`): a model file never
replaces a checkpoint or an export's weights, and the other way round.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from fullgraph.atomic import is_plain_file
from fullgraph.errors import ConfigError

#: How the archive comment of a file fullgraph wrote begins.
COMMENT_PREFIX = b"fullgraph sha256="
_COMMENT_LEN = len(COMMENT_PREFIX) + 64
#: End-of-central-directory record: its signature, and its size without the comment.
_EOCD_SIGNATURE = b"PK\x05\x06"
_EOCD_SIZE = 22
#: The header of format-2 checkpoints (read, never written).
LEGACY_MAGIC = b"FULLGRAPH-CHECKPOINT 2 sha256="
_LEGACY_HEADER_LEN = len(LEGACY_MAGIC) + 64 + 1
_LEGACY_ANY_VERSION = b"FULLGRAPH-CHECKPOINT "


def encode_torch_file(obj: Any) -> bytes:
    """The bytes of ``torch.save(obj)`` with the checksum comment (see the module docstring)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    raw = buf.getvalue()
    if raw[-_EOCD_SIZE:-18] != _EOCD_SIGNATURE or raw[-2:] != b"\0\0":
        raise RuntimeError("torch.save wrote no zip archive without a comment")  # a torch change
    body = raw[:-2]
    comment = COMMENT_PREFIX + hashlib.sha256(body).hexdigest().encode()
    return body + len(comment).to_bytes(2, "little") + comment


def _split(raw: bytes) -> tuple[memoryview, str] | None:
    """``(the bytes the digest covers, the recorded digest)`` of a file fullgraph wrote, else
    ``None``."""
    tail = len(COMMENT_PREFIX) + 64
    if len(raw) < _EOCD_SIZE + tail:
        return None
    eocd = len(raw) - tail - _EOCD_SIZE
    if raw[eocd : eocd + 4] != _EOCD_SIGNATURE or raw[eocd + 20 : eocd + 22] != tail.to_bytes(
        2, "little"
    ):
        return None
    comment = raw[eocd + _EOCD_SIZE :]
    if not comment.startswith(COMMENT_PREFIX):
        return None
    return memoryview(raw)[: eocd + 20], comment[len(COMMENT_PREFIX) :].decode("ascii", "replace")


def not_a_torch_file(path: Path) -> str | None:
    """``None`` for a file fullgraph wrote with :func:`encode_torch_file` (or a format-2
    checkpoint), whole or corrupted inside; else why not (for the ``--force`` recognisers)."""
    if not is_plain_file(path):
        return "it is not a regular file"
    with open(path, "rb") as f:
        head = f.read(len(_LEGACY_ANY_VERSION))
        if head == _LEGACY_ANY_VERSION:
            return None
        size = f.seek(0, 2)
        f.seek(max(0, size - _EOCD_SIZE - _COMMENT_LEN))
        tail = f.read()
    if _split(tail) is None:
        return "it carries no fullgraph checksum"
    return None


#: What :func:`torch_file_kind` returns -> the noun of the messages.
KIND_NOUNS = {
    "checkpoint": "a checkpoint of `fullgraph train`",
    "rank state": "a rank's checkpoint state",
    "fullgraph-model": "a model file of `fullgraph train`",
    "fullgraph-pyg": "the weights of a `fullgraph export`",
}


def torch_file_kind(path: Path) -> str | None:
    """Which file fullgraph wrote at ``path`` (one that carries its checksum): ``checkpoint``,
    ``rank state``, or the ``format`` it names (``fullgraph-model``, ``fullgraph-pyg``);
    ``other`` for a fullgraph file of none of these; ``None`` where the archive cannot be read
    (damaged: its kind is unknown).

    Only the archive's pickle is read (the tensors are mapped, not loaded), without checking
    the digest: a file damaged inside its tensors still says what it is.
    """
    with open(path, "rb") as f:
        if f.read(len(_LEGACY_ANY_VERSION)) == _LEGACY_ANY_VERSION:
            return "checkpoint"  # format 2: only checkpoints were written so
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # damaged: torch says so in many ways
        return None
    if not isinstance(obj, dict):
        return "other"
    if isinstance(obj.get("format"), str):
        return obj["format"]
    if "optimizer" in obj and "epoch" in obj:
        return "checkpoint"
    if set(obj) == {"residuals"}:
        return "rank state"
    return "other"


def not_of_kinds(path: Path, *kinds: str) -> str | None:
    """``None`` for a file fullgraph wrote of one of ``kinds`` (:func:`torch_file_kind`), or
    one of its files too damaged to say (the writer may replace it); else why not."""
    reason = not_a_torch_file(path)
    if reason is not None:
        return reason
    kind = torch_file_kind(path)
    if kind is None or kind in kinds:
        return None
    return f"it is {KIND_NOUNS.get(kind, 'another file of fullgraph')}"


def read_torch_file(
    path: str | Path, *, weights_only: bool = True, what: str = "file", remedy: str = ""
) -> Any:
    """Read a file fullgraph wrote, checking its sha256 before unpickling.

    Args:
        path: the file.
        weights_only: unpickle tensors and plain containers only (``torch.load``'s safe mode).
        what: what the file is, for messages (``checkpoint``, ``model file``).
        remedy: the other way out, for the messages of a file that is not ours or fails its
            checksum (``"start over with --force"``).

    Returns:
        The saved object, its tensors on the CPU.

    Raises:
        ConfigError: the file is missing, unreadable, carries no fullgraph checksum, fails it,
            or cannot be unpickled.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path} ({exc.strerror})") from None
    if raw.startswith(LEGACY_MAGIC) and len(raw) >= _LEGACY_HEADER_LEN:
        body: memoryview = memoryview(raw)[_LEGACY_HEADER_LEN:]
        digest = raw[len(LEGACY_MAGIC) : _LEGACY_HEADER_LEN - 1].decode("ascii", "replace")
        archive: memoryview = body
    else:
        found = _split(raw)
        if found is None:
            raise ConfigError(
                f"{path} is not a fullgraph {what} (it carries no fullgraph checksum: truncated "
                f"or another file){'; ' + remedy if remedy else ''}"
            )
        body, digest = found
        archive = memoryview(raw)
    if hashlib.sha256(body).hexdigest() != digest:
        raise ConfigError(
            f"{path} fails its sha256 checksum (corrupted or modified); restore a good copy"
            f"{' or ' + remedy if remedy else ''}"
        )
    try:
        return torch.load(io.BytesIO(archive), map_location="cpu", weights_only=weights_only)
    except Exception as exc:
        raise ConfigError(f"cannot read {what} {path} ({exc})") from exc


def named_values(obj: object, prefix: str = "") -> dict[str, torch.Tensor | float]:
    """The tensors and floats inside nested dicts and lists, by dotted name.

    ``{"exp_avg": [t0, t1], "lr": 0.01}`` -> ``{"exp_avg.0": t0, "exp_avg.1": t1, "lr": 0.01}``;
    other leaves (ints, strings, ``None``) are left out.
    """
    if isinstance(obj, torch.Tensor | float):
        return {prefix: obj}
    items: Iterable[tuple[object, object]] = ()
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list | tuple):
        items = enumerate(obj)
    out: dict[str, torch.Tensor | float] = {}
    for key, value in items:
        out.update(named_values(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def value_problem(found: Any, expected: torch.Tensor | float | None = None) -> str | None:
    """Why ``found`` cannot stand for ``expected`` (a tensor or float), else ``None``.

    A tensor must have ``expected``'s dtype and shape (when ``expected`` is given) and hold no
    NaN or infinity; a float must be finite.
    """
    if isinstance(expected, torch.Tensor) and not isinstance(found, torch.Tensor):
        return f"is a {type(found).__name__}, expected a {expected.dtype} tensor"
    if isinstance(found, float):
        return None if math.isfinite(found) else f"is {found}"
    if not isinstance(found, torch.Tensor):
        return None
    if isinstance(expected, torch.Tensor):
        if found.dtype != expected.dtype:
            return f"is {found.dtype}, expected {expected.dtype}".replace("torch.", "")
        if found.shape != expected.shape:
            return f"has shape {tuple(found.shape)}, expected {tuple(expected.shape)}"
    if not (found.is_floating_point() or found.is_complex()):
        return None
    nan = int(torch.isnan(found).sum())
    inf = int(torch.isinf(found).sum())
    if not nan and not inf:
        return None
    counts = " and ".join(f"{n} {word}" for n, word in ((nan, "NaN"), (inf, "inf")) if n)
    return f"has {counts} (of {found.numel()} values)"


def check_values(
    found: dict[str, Any],
    expected: Mapping[str, torch.Tensor | float] | None = None,
    *,
    where: str | Path,
    what: str = "parameter",
    remedy: str = "",
) -> None:
    """Refuse a saved state whose tensors or floats are not what the model needs.

    Args:
        found: the saved values by name (a ``state_dict``, or :func:`named_values` of one).
        expected: the values the model holds by name (dtypes and shapes to match; meta tensors
            do), or ``None`` to check finiteness only. Names on one side only are refused.
        where: the file, for the message.
        what: what the values are (``parameter``, ``optimiser state``).
        remedy: the way out, appended to the message.

    Raises:
        ConfigError: one line naming the file and the first bad value (missing, unexpected,
            another dtype or shape, NaN or infinity).
    """
    tail = f"; {remedy}" if remedy else ""
    if expected is not None:
        missing = [k for k in expected if k not in found]
        extra = [k for k in found if k not in expected]
        if missing:
            raise ConfigError(f"{where}: {what} {missing[0]!r} is missing{tail}")
        if extra:
            raise ConfigError(f"{where}: {what} {extra[0]!r} is not in the model{tail}")
    for name, value in found.items():
        problem = value_problem(value, None if expected is None else expected.get(name))
        if problem is not None:
            raise ConfigError(f"{where}: {what} {name!r} {problem}{tail}")
