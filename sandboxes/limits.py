"""A process-wide concurrency limit and token-bucket rate limit for sandbox executions.

Every backend (``LocalSandbox`` and what is built on it, ``SandboxFusionSandbox``, ``DockerSandbox``)
passes each execution through one :class:`Limiter` before it takes one of its own slots, so all envs
and sandboxes of a process share one budget, e.g. "at most 64 executions at once, at most 200 started
per second" against a remote SandboxFusion service or a busy host. The time spent waiting here is
added to ``ExecResult.queue_s`` and reported on its own as ``info["limiter_wait_s"]``.

The process-wide limiter is :func:`global_limiter`; it is unlimited until :func:`configure` (or the
environment variables ``CHATGYM_SANDBOX_MAX_CONCURRENCY`` / ``CHATGYM_SANDBOX_RATE`` /
``CHATGYM_SANDBOX_BURST``, read at first use) sets it. Across processes (Ray workers) each process has
its own; a shared budget there needs a sandbox service (``chatgym serve-sandbox``) whose own limiter
all workers go through.

The bucket is the reservation form of the token bucket (GCRA; ITU-T I.371 "virtual scheduling"):
tokens refill at ``rate`` per second up to ``burst``; an acquire takes one token now, possibly going
into debt, and waits until the debt is paid. So waits are computed in O(1), are exact, and requests
are served first come, first served.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from chatgym.sandboxes.slots import SlotPool


class TokenBucket:
    """Token bucket with reservations.

    Args:
        rate: tokens added per second (> 0); the long-run rate of acquisitions.
        burst: bucket size in tokens (>= 1): how many acquisitions may start at once after idling.
        clock: monotonic time source in seconds (injectable for tests).

    Raises:
        ValueError: a non-positive ``rate`` or a ``burst`` below 1.
    """

    def __init__(self, rate: float, burst: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not (isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a finite number of tokens per second > 0, got {rate!r}")
        if not (isinstance(burst, (int, float)) and burst >= 1 and math.isfinite(burst)):
            raise ValueError(f"burst must be a finite number >= 1, got {burst!r}")
        self.rate, self.burst, self.clock = float(rate), float(burst), clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take one token now; return how many seconds the caller must wait before it may start."""
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def refund(self) -> None:
        """Give back a token taken by :meth:`reserve` (its caller was cancelled before starting)."""
        with self._lock:
            self._tokens = min(self.burst, self._tokens + 1.0)


class Limiter:
    """At most ``max_concurrency`` executions at once, started at most ``rate`` per second.

    Safe to share across threads and event loops (the concurrency part is a :class:`SlotPool`).

    Args:
        max_concurrency: executions in flight at once; None = unlimited.
        rate: executions started per second (token bucket); None = unlimited.
        burst: token bucket size (default: ``max(1, rate)``, i.e. one second's worth).
        clock: time source for the bucket (tests).

    Raises:
        ValueError: a bad argument, naming it.
    """

    def __init__(
        self,
        max_concurrency: int | None = None,
        rate: float | None = None,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_concurrency is not None and (
            not isinstance(max_concurrency, int) or isinstance(max_concurrency, bool) or max_concurrency < 1
        ):
            raise ValueError(f"max_concurrency must be an int >= 1 or None, got {max_concurrency!r}")
        self.max_concurrency = max_concurrency
        self._pool = SlotPool(max_concurrency) if max_concurrency else None
        self.bucket = None
        if rate is not None:
            self.bucket = TokenBucket(rate, burst if burst is not None else max(1.0, float(rate)), clock)
        elif burst is not None:
            raise ValueError("burst needs a rate")
        self._in_flight = 0
        self._count_lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Executions holding the limiter now."""
        return self._in_flight

    @property
    def unlimited(self) -> bool:
        return self._pool is None and self.bucket is None

    @asynccontextmanager
    async def hold(self):
        """``async with limiter.hold() as waited:`` — ``waited()`` is the seconds spent waiting."""
        t0 = time.monotonic()
        slot = None
        if self._pool is not None:
            slot = await self._pool.acquire()
        try:
            if self.bucket is not None:
                delay = self.bucket.reserve()
                if delay > 0:
                    try:
                        await asyncio.sleep(delay)
                    except asyncio.CancelledError:
                        self.bucket.refund()
                        raise
            waited = time.monotonic() - t0
            with self._count_lock:
                self._in_flight += 1
            try:
                yield lambda: waited
            finally:
                with self._count_lock:
                    self._in_flight -= 1
        finally:
            if slot is not None:
                self._pool.release(slot)


_GLOBAL: Limiter | None = None
_GLOBAL_LOCK = threading.Lock()


def _env_number(name: str, kind: type) -> float | int | None:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be a {kind.__name__}, got {raw!r}") from None


def global_limiter() -> Limiter:
    """The process-wide limiter every sandbox backend uses by default."""
    global _GLOBAL
    with _GLOBAL_LOCK:
        if _GLOBAL is None:
            _GLOBAL = Limiter(
                _env_number("CHATGYM_SANDBOX_MAX_CONCURRENCY", int),
                _env_number("CHATGYM_SANDBOX_RATE", float),
                _env_number("CHATGYM_SANDBOX_BURST", float),
            )
        return _GLOBAL


def configure(
    max_concurrency: int | None = None, rate: float | None = None, burst: float | None = None
) -> Limiter:
    """Replace the process-wide limiter (executions already waiting keep the old one).

    Args: as :class:`Limiter`. Returns the new limiter.
    """
    global _GLOBAL
    limiter = Limiter(max_concurrency, rate, burst)
    with _GLOBAL_LOCK:
        _GLOBAL = limiter
    return limiter
