"""A concurrency limit that hands out slot numbers and works across event loops and threads.

``asyncio.Semaphore`` binds to one event loop, but a sandbox may be shared by an env stepped through
its private loop (``ChatEnv.step``) and a collector on another. This pool is guarded by a
``threading.Lock`` and wakes each waiter on its own loop (``call_soon_threadsafe``). The slot number
picks the sandbox uid a run executes as, so two concurrent runs never share a uid.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque


class SlotPool:
    """``n`` slots numbered ``0..n-1``; ``await acquire()`` waits FIFO for a free one."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {n}")
        self._free = list(range(n - 1, -1, -1))
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        return len(self._free)

    async def acquire(self) -> int:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free and not self._waiters:
                return self._free.pop()
            fut = loop.create_future()
            self._waiters.append((loop, fut))
        try:
            return await fut
        except asyncio.CancelledError:
            with self._lock:
                try:
                    self._waiters.remove((loop, fut))
                except ValueError:
                    pass  # already handed a slot: _hand sees the cancelled future and releases it
            raise

    def release(self, slot: int) -> None:
        """Give ``slot`` back (from any thread)."""
        with self._lock:
            while self._waiters:
                loop, fut = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._hand, fut, slot)
                    return
                except RuntimeError:  # that waiter's loop is closed
                    continue
            self._free.append(slot)

    def _hand(self, fut: asyncio.Future, slot: int) -> None:
        if fut.done():  # cancelled between release() and now
            self.release(slot)
        else:
            fut.set_result(slot)
