"""Length-prefixed JSON frames between ``LocalSandbox`` and its zygote.

A frame is a 4-byte big-endian payload length followed by that many bytes of UTF-8 JSON (one object).
Stdlib only: the zygote imports this module standalone, outside the ``chatgym`` package.
"""

from __future__ import annotations

import json
import marshal
import os
import struct

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30  # bytes; a frame this large means a corrupt stream, not a real message


def encode(msg: dict) -> bytes:
    """One frame (header + JSON payload) for ``msg``."""
    data = json.dumps(msg, separators=(",", ":")).encode()
    return HEADER.pack(len(data)) + data


def read_frame(stream) -> dict | None:
    """Read one frame from a binary file object (blocking); ``None`` at end of stream.

    Raises:
        ValueError: the stream ends inside a frame or announces a frame over ``MAX_FRAME`` bytes.
    """
    head = stream.read(HEADER.size)
    if not head:
        return None
    if len(head) != HEADER.size:
        raise ValueError("truncated frame header")
    (n,) = HEADER.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
    data = stream.read(n)
    if len(data) != n:
        raise ValueError(f"truncated frame: expected {n} bytes, got {len(data)}")
    return json.loads(data)


def encode_marshal(msg: dict) -> bytes:
    """A frame with a ``marshal`` payload: for zygote -> child only, where the writer is trusted
    and decoding speed matters (``marshal`` must never read data from a less trusted writer)."""
    data = marshal.dumps(msg)
    return HEADER.pack(len(data)) + data


def read_marshal_fd(fd: int) -> dict | None:
    """Read one ``encode_marshal`` frame from a blocking fd; ``None`` at EOF."""
    head = _read_exact(fd, HEADER.size)
    if not head:
        return None
    (n,) = HEADER.unpack(head)
    data = _read_exact(fd, n)
    if len(data) != n:
        raise ValueError(f"truncated frame: expected {n} bytes, got {len(data)}")
    return marshal.loads(data)


def _read_exact(fd: int, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


class FrameDecoder:
    """Incremental decoder for a non-blocking reader: ``feed(bytes)`` returns the complete frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise ValueError(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
            if len(self._buf) < HEADER.size + n:
                break
            out.append(json.loads(bytes(self._buf[HEADER.size : HEADER.size + n])))
            del self._buf[: HEADER.size + n]
        return out


def pack_files(files: dict[str, str | bytes] | None) -> list[list[str]]:
    """``{path: str | bytes}`` as JSON-safe ``[path, "t"|"b", text-or-base64]`` triples."""
    import base64  # lazily: the zygote (and so every fork) need not load binascii

    out = []
    for path, content in (files or {}).items():
        if isinstance(content, bytes):
            out.append([path, "b", base64.b64encode(content).decode()])
        else:
            out.append([path, "t", content])
    return out


def unpack_file(kind: str, payload: str) -> bytes:
    """Inverse of one ``pack_files`` entry: the file's bytes (text is written as UTF-8)."""
    if kind != "b":
        return payload.encode()
    import base64

    return base64.b64decode(payload)
