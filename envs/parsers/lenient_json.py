"""JSON the way models write it: read one value from the middle of a text, repairing bad escapes.

Decoding uses ``strict=False`` (raw newlines and tabs inside strings are accepted: models write code
with them) and rejects ``NaN`` / ``Infinity`` (not JSON). A backslash that starts no valid JSON escape
(``"\\d+"``, ``"C:\\data"``) is repaired to a literal backslash, because an invalid escape has no other
meaning.
"""

from __future__ import annotations

import json
import re
from typing import Any


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# strict=False: models write code with raw newlines/tabs inside JSON strings.
_DECODER = json.JSONDecoder(strict=False, parse_constant=_reject_constant)

# A backslash followed by a valid JSON escape (kept), or by anything else (group 1 is None: repaired).
_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{4}|["\\/bfnrt])?')
_WS = re.compile(r"\s*")


def skip_ws(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()


def repair_escapes(s: str) -> tuple[str, list[int]]:
    """Double every backslash that starts no valid JSON escape.

    Returns the repaired text and, for each added backslash, its index in the repaired text (so an
    end offset in the repaired text can be mapped back to the original).
    """
    parts: list[str] = []
    added: list[int] = []
    last = 0
    for m in _ESCAPE.finditer(s):
        if m.group(1) is None:
            parts.append(s[last : m.start()])
            added.append(m.start() + len(added) + 1)
            parts.append("\\\\")
            last = m.end()
    parts.append(s[last:])
    return "".join(parts), added


def decode_json(text: str, pos: int) -> tuple[Any, int]:
    """Decode one JSON value starting at ``text[pos]``; return it and the index just past it.

    Raises:
        ValueError (``json.JSONDecodeError`` for syntax errors): the text at ``pos`` is not JSON,
            even after repairing invalid backslash escapes.
    """
    try:
        return _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as exc:
        first = exc
    fixed, added = repair_escapes(text[pos:])
    if not added:
        raise first
    try:
        value, end = _DECODER.raw_decode(fixed, 0)
    except RecursionError:
        raise first from None
    # After the repair, the error that remains is the one worth reporting.
    return value, pos + end - sum(a < end for a in added)


def loads(text: str) -> Any:
    """Decode a whole string as one JSON value (surrounding whitespace allowed). Raises ValueError."""
    value, end = decode_json(text, skip_ws(text, 0))
    if skip_ws(text, end) != len(text):
        raise ValueError("extra data after the JSON value")
    return value


def json_error(exc: ValueError) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
