"""A cache of compiled Python sources for the zygote (stdlib only)."""

from __future__ import annotations

import marshal
from collections import OrderedDict

from . import child


class CompileCache:
    """Marshalled code objects of Python sources seen more than once (a grading harness, a test
    file): a child then unmarshals in ~0.1 ms instead of compiling (~1-4 ms for 6 KB here).

    The first sighting of a source only counts it (unique code, the common case, is compiled in
    the child, in parallel, not here); from the second on it is compiled once in the zygote.
    Bounded: ``size`` entries each way, sources up to ``max_chars``, least recently used evicted.
    """

    def __init__(self, size: int = 64, max_chars: int = 1 << 20) -> None:
        self.size, self.max_chars = size, max_chars
        self.code: OrderedDict[str, bytes | None] = OrderedDict()  # None: does not compile
        self.seen: OrderedDict[str, None] = OrderedDict()

    def get(self, source: str) -> bytes | None:
        if len(source) > self.max_chars:
            return None
        if source in self.code:
            self.code.move_to_end(source)
            return self.code[source]
        if source not in self.seen:
            self.seen[source] = None
            _trim(self.seen, self.size)
            return None
        del self.seen[source]
        try:
            self.code[source] = marshal.dumps(child.compile_solution(source))
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
            self.code[source] = None  # let the child report it, with its usual traceback
        _trim(self.code, self.size)
        return self.code[source]


def _trim(d: OrderedDict, size: int) -> None:
    while len(d) > size:
        d.popitem(last=False)
