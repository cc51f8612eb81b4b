"""Files ``torch.load`` opens as they are, with a sha256 checksum fullgraph checks first.

``torch.save`` writes a zip archive. A zip archive may end with a comment (its
end-of-central-directory record says how long), which readers skip: fullgraph writes the
archive, then the comment ``fullgraph sha256=<64 hex digits>`` naming the digest of every byte
before the comment-length field. ``torch.load(path, weights_only=True)``, ``zipfile`` and every
other zip reader open the file unchanged; :func:`read_torch_file` checks the digest before it
unpickles anything, so a flipped bit is an error instead of a weight of -3.7e37.

Checkpoints of format 2 (a ``FULLGRAPH-CHECKPOINT 2 sha256=...`` header line before the
archive, which plain ``torch.load`` cannot read) are still read and recognised.
"""

from __future__ import annotations

import hashlib
import io
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
