"""The process-wide limiter: token-bucket waits (exact, on a hand-driven clock), the concurrency
cap shared by separate sandboxes, and queue time reported in ExecResult."""

import asyncio
import time

import pytest

from chatgym.sandboxes import limits
from chatgym.sandboxes.limits import Limiter, TokenBucket
from chatgym.sandboxes.local.sandbox import LocalSandbox


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_waits_are_exact():
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=2, clock=clock)
    # Two tokens in the bucket; then each acquire is one more token of debt, paid at 10/s:
    # debt 1 -> 0.1 s, debt 2 -> 0.2 s, debt 3 -> 0.3 s.
    assert [bucket.reserve() for _ in range(5)] == [0.0, 0.0, 0.1, 0.2, 0.3]
    clock.t += 0.5  # debt 3 - 0.5 s * 10/s = 2 tokens back: -3 + 5 = 2 (the cap), so two free starts
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.1]
    clock.t += 10.0  # a long idle refills only up to burst
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.1]
    bucket.refund()  # a cancelled waiter gives its token back: the next one waits what it would have
    assert bucket.reserve() == 0.1


@pytest.mark.parametrize(
    "kwargs, match",
    [({"rate": 0}, "rate"), ({"rate": 1, "burst": 0.5}, "burst"), ({"max_concurrency": 0}, "max_concurrency"),
     ({"burst": 3}, "burst needs a rate")],
)  # fmt: skip
def test_bad_limiter_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Limiter(**kwargs)


async def test_rate_limit_spaces_starts():
    lim = Limiter(rate=20, burst=1)  # one start now, then one per 50 ms
    starts = []

    async def one():
        async with lim.hold() as waited:
            starts.append((time.monotonic(), waited()))

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(4)))
    offsets = sorted(s - t0 for s, _ in starts)
    for got, want in zip(offsets, [0.0, 0.05, 0.10, 0.15], strict=True):
        assert want - 0.002 <= got <= want + 0.5  # never early; late only by scheduling (busy CI)
    assert lim.in_flight == 0


async def test_concurrency_cap_and_cancellation():
    lim = Limiter(max_concurrency=2)
    peak = 0
    gate = asyncio.Event()

    async def one():
        nonlocal peak
        async with lim.hold():
            peak = max(peak, lim.in_flight)
            await gate.wait()

    tasks = [asyncio.create_task(one()) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert lim.in_flight == 2
    tasks[4].cancel()  # a waiter cancelled while queued leaves no slot taken
    gate.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert peak == 2 and lim.in_flight == 0


@pytest.fixture
def global_limit():
    old = limits._GLOBAL
    yield limits.configure(max_concurrency=1)
    limits._GLOBAL = old


async def test_global_limit_is_shared_by_separate_sandboxes(global_limit):
    a, b = LocalSandbox(max_concurrency=2), LocalSandbox(max_concurrency=2)
    try:
        await asyncio.gather(a.start(), b.start())
        code = "import time; time.sleep(0.3)"
        ra, rb = await asyncio.gather(a.run(code), b.run(code))
        waits = sorted([ra.info["limiter_wait_s"], rb.info["limiter_wait_s"]])
        # One global slot: the second run waits for the whole first run (>= its 0.3 s sleep).
        assert waits[0] < 0.1 and waits[1] >= 0.3
        assert max(ra.queue_s, rb.queue_s) >= waits[1]  # queue_s includes the limiter's wait
        assert ra.ok and rb.ok and global_limit.in_flight == 0
    finally:
        await asyncio.gather(a.close(), b.close())


async def test_sandbox_specific_limiter():
    lim = Limiter(max_concurrency=1)
    async with LocalSandbox(max_concurrency=3, limiter=lim) as sb:
        res = await asyncio.gather(*(sb.run("import time; time.sleep(0.2)") for _ in range(3)))
    waits = sorted(r.info["limiter_wait_s"] for r in res)
    # Serialised by the limiter, not by the sandbox's 3 slots: about 0, 0.2, 0.4 s.
    assert waits[0] < 0.1 and 0.2 <= waits[1] < waits[2] and waits[2] >= 0.4
